package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Exporter defaults.
const (
	DefaultTimeout    = 5 * time.Second // one export request (tracing.timeout_ms)
	DefaultQueueSpans = 2048            // spans waiting for export (tracing.queue_spans)
	DefaultBatchSpans = 512             // spans per export request
	DefaultInterval   = time.Second     // how often waiting spans are sent
	// FinalFlush bounds the last export at shutdown.
	FinalFlush = time.Second
	// maxBackoff bounds the wait after failed exports (1 s doubling) and a
	// collector's Retry-After.
	maxBackoff = 30 * time.Second
	// maxTries: a batch the collector could not take for a retryable
	// reason (a connect error, a timeout, 429, 502, 503, 504) is sent at
	// most this often, then dropped.
	maxTries = 3
	// maxResponse bounds the collector's answer read (bytes).
	maxResponse = 64 << 10
)

// DropReason is why spans were dropped (the reason label of
// iop_edge_trace_spans_dropped_total).
type DropReason uint8

// The drop reasons.
const (
	DropQueueFull    DropReason = iota // the queue held QueueSpans spans
	DropExportFailed                   // the collector refused the batch, or failed maxTries times, or shutdown came
	DropRejected                       // the collector took the batch but rejected these (partialSuccess.rejectedSpans)
	DropNodeInvalid                    // a node's span broke a bound (NodeSpans)
	nDropReasons
)

var dropNames = [nDropReasons]string{"queue_full", "export_failed", "rejected", "node_invalid"}

func (r DropReason) String() string { return dropNames[r] }

// exportResult is the result label of iop_edge_trace_export_requests_total.
type exportResult uint8

const (
	resultOK        exportResult = iota // 2xx
	resultRetryable                     // connect error, timeout, 429, 502, 503, 504
	resultFailed                        // any other status
	nResults
)

var resultNames = [nResults]string{"ok", "retryable", "failed"}

// Options configure an Exporter. Endpoint is required.
type Options struct {
	// Endpoint is the URL export requests are POSTed to: the collector's
	// OTLP/HTTP traces URL (Endpoint, below, from tracing.otlp_endpoint).
	Endpoint string
	// Timeout bounds one export request, connect included; 0 =
	// DefaultTimeout.
	Timeout time.Duration
	// QueueSpans bounds the spans waiting; 0 = DefaultQueueSpans.
	QueueSpans int
	// BatchSpans bounds the spans of one export request; 0 =
	// DefaultBatchSpans.
	BatchSpans int
	// Interval is how often waiting spans are sent (sooner when a batch is
	// full); 0 = DefaultInterval.
	Interval time.Duration
	Resource Resource
	// Client sends the export requests; nil = a client of the Exporter's
	// own (no proxy from the environment, Timeout per request). Tests
	// pass one.
	Client *http.Client
	// Logger gets one line when the collector stops taking spans and one
	// when it takes them again, never one per span; nil discards.
	Logger *slog.Logger
}

// Endpoint is the traces URL of a collector base URL
// (tracing.otlp_endpoint): base + "/v1/traces", like the OpenTelemetry
// SDKs' OTEL_EXPORTER_OTLP_ENDPOINT; a base whose path already ends in
// /v1/traces is used as it is.
func Endpoint(base string) string {
	if strings.HasSuffix(base, "/v1/traces") {
		return base
	}
	return strings.TrimSuffix(base, "/") + "/v1/traces"
}

// Exporter sends finished spans to an OpenTelemetry collector over
// OTLP/HTTP with the JSON encoding, off the request path: Export never
// blocks and never does I/O (it appends to a bounded queue under a mutex
// held for the append; a full queue drops the spans and counts them), and
// one goroutine (Run) sends batches, one request at a time, each bounded by
// Options.Timeout. A collector that is down, slow or refusing costs the
// requests nothing: the queue fills, further spans are dropped and counted,
// the exporter backs off (1 s doubling to 30 s, or the collector's
// Retry-After up to that). Memory is bounded by QueueSpans spans (each a few
// hundred bytes of names and bounded attributes) plus one encoded batch.
type Exporter struct {
	o      Options
	client *http.Client
	log    *slog.Logger

	mu    sync.Mutex
	queue []Span // FIFO; the head is the next batch, tail appended by Export
	wake  chan struct{}

	// Owned by Run.
	batch []Span
	body  []byte
	tries int // of the head batch
	fails int // consecutive failed export requests

	exported atomic.Uint64
	dropped  [nDropReasons]atomic.Uint64
	requests [nResults]atomic.Uint64
	lastNs   atomic.Int64 // the last export request's duration
}

// New returns an Exporter for o; Run starts its goroutine.
func New(o Options) *Exporter {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.QueueSpans <= 0 {
		o.QueueSpans = DefaultQueueSpans
	}
	if o.BatchSpans <= 0 {
		o.BatchSpans = DefaultBatchSpans
	}
	o.BatchSpans = min(o.BatchSpans, o.QueueSpans)
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	e := &Exporter{o: o, client: o.Client, log: o.Logger, wake: make(chan struct{}, 1),
		queue: make([]Span, 0, o.QueueSpans)}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.client == nil {
		d := &net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}
		e.client = &http.Client{Timeout: o.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 1, IdleConnTimeout: 90 * time.Second,
				TLSHandshakeTimeout: o.Timeout, ResponseHeaderTimeout: o.Timeout, ForceAttemptHTTP2: true}}
	}
	return e
}

// Export queues spans for export, or drops them all (counted as
// queue_full) when they do not fit. It never blocks on I/O; safe for
// concurrent use. The Exporter keeps the Span values (their attribute
// slices included): the caller must not change them after.
func (e *Exporter) Export(spans []Span) {
	if len(spans) == 0 {
		return
	}
	e.mu.Lock()
	fits := len(e.queue)+len(spans) <= e.o.QueueSpans
	if fits {
		e.queue = append(e.queue, spans...)
	}
	full := !fits || len(e.queue) >= e.o.BatchSpans
	e.mu.Unlock()
	if !fits {
		e.dropped[DropQueueFull].Add(uint64(len(spans)))
	}
	if full { // a full batch, or a full queue, goes out now
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// Drop counts n spans dropped for r before they reached Export (a node's
// invalid spans).
func (e *Exporter) Drop(r DropReason, n int) {
	if n > 0 {
		e.dropped[r].Add(uint64(n))
	}
}

// Queued is the number of spans waiting.
func (e *Exporter) Queued() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queue)
}

// Run sends the queued spans until ctx is done, then sends what is left
// once more and drops (export_failed) what that could not send: an export
// in flight when ctx ends and the last one have FinalFlush together, so Run
// returns at most FinalFlush after ctx ends. The Exporter's one goroutine:
// the caller starts it and waits for it.
func (e *Exporter) Run(ctx context.Context) {
	defer e.client.CloseIdleConnections()
	// Exports run on pctx, which ends FinalFlush after ctx: an export in
	// flight at shutdown may finish (so its spans are not sent twice).
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	exited := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		t := time.NewTimer(FinalFlush)
		defer t.Stop()
		select {
		case <-t.C:
			pcancel()
		case <-exited:
		}
	})
	defer func() {
		close(exited)
		stopWatch()
		pcancel()
	}()
	t := time.NewTimer(e.o.Interval)
	defer t.Stop()
	var backoff time.Duration
	for {
		wake := e.wake
		if backoff > 0 {
			wake = nil // a full batch waits for the backoff too
		}
		select {
		case <-ctx.Done():
			e.send(pctx, true)
			e.mu.Lock()
			n := len(e.queue)
			clear(e.queue)
			e.queue = e.queue[:0]
			e.mu.Unlock()
			e.Drop(DropExportFailed, n)
			return
		case <-t.C:
		case <-wake:
			if !t.Stop() {
				<-t.C
			}
		}
		backoff = e.send(pctx, false)
		wait := e.o.Interval
		if backoff > 0 {
			wait = backoff
		}
		t.Reset(wait)
	}
}

// send exports batches from the queue's head until it is empty or an
// export fails; it returns how long to wait before the next try (0 after
// success). final: the shutdown's flush, which drops a failed batch at
// once.
func (e *Exporter) send(ctx context.Context, final bool) time.Duration {
	for {
		e.mu.Lock()
		n := min(len(e.queue), e.o.BatchSpans)
		e.batch = append(e.batch[:0], e.queue[:n]...)
		e.mu.Unlock()
		if n == 0 {
			return 0
		}
		res, rejected, retryAfter := e.post(ctx, e.batch)
		e.requests[res].Add(1)
		switch {
		case res == resultOK:
			e.exported.Add(uint64(n - rejected))
			e.Drop(DropRejected, rejected)
			e.pop(n)
			if e.fails > 0 {
				e.log.Info("trace collector takes spans again", "endpoint", e.o.Endpoint, "failed_exports", e.fails)
			}
			e.fails = 0
			continue
		case res == resultFailed || final || e.tries+1 >= maxTries:
			e.Drop(DropExportFailed, n)
			e.pop(n)
		default:
			e.tries++
		}
		if e.fails++; e.fails == 1 {
			e.log.Warn("trace collector does not take spans; they are queued up to tracing.queue_spans and dropped beyond",
				"endpoint", e.o.Endpoint, "result", resultNames[res])
		}
		if final {
			return 0
		}
		d := min(time.Second<<min(e.fails-1, 5), maxBackoff)
		if retryAfter > d {
			d = min(retryAfter, maxBackoff)
		}
		return d
	}
}

// pop removes the head batch of n spans.
func (e *Exporter) pop(n int) {
	e.tries = 0
	clear(e.batch)
	e.mu.Lock()
	k := copy(e.queue, e.queue[n:])
	clear(e.queue[k:])
	e.queue = e.queue[:k]
	e.mu.Unlock()
}

// post sends one export request and classifies the answer (OTLP/HTTP
// "Response"): 2xx with an optional partialSuccess.rejectedSpans; 429,
// 502, 503 and 504 (and no answer at all) are retryable, with the
// answer's Retry-After; any other status is not.
func (e *Exporter) post(ctx context.Context, spans []Span) (res exportResult, rejected int, retryAfter time.Duration) {
	e.body = AppendExport(e.body[:0], e.o.Resource, spans)
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.o.Endpoint, bytes.NewReader(e.body))
	if err != nil {
		return resultFailed, 0, 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "iop-edge")
	start := time.Now()
	resp, err := e.client.Do(req)
	defer func() { e.lastNs.Store(int64(time.Since(start))) }()
	if cap(e.body) > 4<<20 {
		e.body = nil // a rare huge batch's buffer is left to the GC
	}
	if err != nil {
		return resultRetryable, 0, 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	switch s := resp.StatusCode; {
	case s >= 200 && s <= 299:
		return resultOK, min(rejectedSpans(body), len(spans)), 0
	case s == http.StatusTooManyRequests || s == http.StatusBadGateway || s == http.StatusServiceUnavailable || s == http.StatusGatewayTimeout:
		if secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && secs > 0 {
			retryAfter = time.Duration(min(secs, int(maxBackoff/time.Second))) * time.Second
		}
		return resultRetryable, 0, retryAfter
	}
	return resultFailed, 0, 0
}

// rejectedSpans reads partialSuccess.rejectedSpans of an
// ExportTraceServiceResponse in the JSON encoding (an int64: a decimal
// string, or a number); 0 when absent or unreadable.
func rejectedSpans(body []byte) int {
	var r struct {
		PartialSuccess struct {
			RejectedSpans json.RawMessage `json:"rejectedSpans"`
		} `json:"partialSuccess"`
	}
	if len(body) == 0 || json.Unmarshal(body, &r) != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.Trim(string(r.PartialSuccess.RejectedSpans), `"`))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// Metric is one metric family; the shape matches admin.Counter.
type Metric struct {
	Name, Help, Type string
	Samples          func() map[string]float64
}

// Metric names.
const (
	MetricExported = "iop_edge_trace_spans_exported_total"
	MetricDropped  = "iop_edge_trace_spans_dropped_total"
	MetricRequests = "iop_edge_trace_export_requests_total"
	MetricQueued   = "iop_edge_trace_spans_queued"
	MetricLast     = "iop_edge_trace_export_last_seconds"
)

// Metrics returns the exporter's families: spans exported, spans dropped
// by reason, export requests by result, spans waiting, and the last export
// request's duration.
func (e *Exporter) Metrics() []Metric {
	return []Metric{
		{MetricExported, "Spans the trace collector accepted.", "counter", func() map[string]float64 {
			return map[string]float64{"": float64(e.exported.Load())}
		}},
		{MetricDropped, "Spans dropped, by reason (queue_full, export_failed, rejected, node_invalid).", "counter", func() map[string]float64 {
			out := make(map[string]float64, nDropReasons)
			for r := range nDropReasons {
				out[`reason="`+r.String()+`"`] = float64(e.dropped[r].Load())
			}
			return out
		}},
		{MetricRequests, "OTLP export requests, by result (ok, retryable, failed).", "counter", func() map[string]float64 {
			out := make(map[string]float64, nResults)
			for r := range nResults {
				out[`result="`+resultNames[r]+`"`] = float64(e.requests[r].Load())
			}
			return out
		}},
		{MetricQueued, "Spans waiting for export (at most tracing.queue_spans).", "gauge", func() map[string]float64 {
			return map[string]float64{"": float64(e.Queued())}
		}},
		{MetricLast, "Duration of the last OTLP export request, seconds.", "gauge", func() map[string]float64 {
			return map[string]float64{"": time.Duration(e.lastNs.Load()).Seconds()}
		}},
	}
}

// Dropped returns the spans dropped for r so far.
func (e *Exporter) Dropped(r DropReason) uint64 { return e.dropped[r].Load() }

// Exported returns the spans the collector accepted so far.
func (e *Exporter) Exported() uint64 { return e.exported.Load() }
