package tracing

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
)

func testSpans(n int) []Span {
	out := make([]Span, n)
	t0 := time.Unix(1767225600, 0)
	for i := range out {
		out[i] = Span{TraceID: NewTraceID(), SpanID: NewSpanID(), Name: "s", Kind: KindInternal, Start: t0, End: t0}
	}
	return out
}

// runExporter starts e.Run and returns its stop, which cancels and waits
// (failing the test when Run does not return within FinalFlush + 2 s).
func runExporter(t *testing.T, e *Exporter) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(FinalFlush + 2*time.Second):
			t.Fatal("Exporter.Run did not return within its final flush bound")
		}
	}
}

// The queue is bounded: spans that do not fit are dropped whole and
// counted (queue_full); Export never waits.
func TestExporterQueueBound(t *testing.T) {
	e := New(Options{Endpoint: "http://127.0.0.1:1/v1/traces", QueueSpans: 4})
	e.Export(testSpans(3))
	e.Export(testSpans(2))
	e.Export(testSpans(1))
	if q, d := e.Queued(), e.Dropped(DropQueueFull); q != 4 || d != 2 {
		t.Errorf("queued %d dropped %d, want 4 and 2", q, d)
	}
	e.Drop(DropNodeInvalid, 3)
	got := map[string]float64{}
	for _, m := range e.Metrics() {
		for k, v := range m.Samples() {
			got[m.Name+"{"+k+"}"] = v
		}
	}
	for k, want := range map[string]float64{
		MetricDropped + `{reason="queue_full"}`:   2,
		MetricDropped + `{reason="node_invalid"}`: 3,
		MetricQueued + "{}":                       4,
		MetricExported + "{}":                     0,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}

// Spans reach the collector as OTLP JSON (POST /v1/traces,
// application/json), batched; a partialSuccess is counted as rejected.
func TestExporterSends(t *testing.T) {
	leakcheck.Check(t)
	got := make(chan otlpJSON, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s %s", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		var req otlpJSON
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("decode: %v", err)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"partialSuccess":{"rejectedSpans":"1","errorMessage":"one too many"}}`)
		got <- req
	}))
	defer srv.Close()
	e := New(Options{Endpoint: Endpoint(srv.URL), BatchSpans: 3, Interval: time.Hour, Client: srv.Client()})
	stop := runExporter(t, e)
	e.Export(testSpans(2))
	e.Export(testSpans(2)) // 4 ≥ the batch: sent without waiting for the interval
	select {
	case req := <-got:
		if n := len(req.ResourceSpans[0].ScopeSpans[0].Spans); n != 3 {
			t.Errorf("first batch has %d spans, want 3", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no export request")
	}
	stop() // the final flush sends the fourth
	select {
	case req := <-got:
		if n := len(req.ResourceSpans[0].ScopeSpans[0].Spans); n != 1 {
			t.Errorf("final batch has %d spans, want 1", n)
		}
	default:
		t.Fatal("the final flush sent nothing")
	}
	if x, r := e.Exported(), e.Dropped(DropRejected); x != 2 || r != 2 {
		t.Errorf("exported %d rejected %d, want 2 and 2", x, r)
	}
}

// A collector that is down (a closed port), answers 503 forever or never
// answers: Export never waits, spans are dropped and counted, Run ends
// within its bound.
func TestExporterCollectorDown(t *testing.T) {
	leakcheck.Check(t)
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return "http://" + addr
	}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc // nil: the closed port
	}{
		{"closed port", nil},
		{"503 forever", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }},
		{"never answers", func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body); <-r.Context().Done() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := closed()
			var seen atomic.Int32
			if tc.handler != nil {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					seen.Add(1)
					tc.handler(w, r)
				}))
				defer srv.Close()
				url = srv.URL
			}
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tried := make(chan struct{}, 64)
			client := &http.Client{Timeout: 200 * time.Millisecond, Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := base.RoundTrip(r)
				select {
				case tried <- struct{}{}:
				default:
				}
				return resp, err
			})}
			e := New(Options{Endpoint: Endpoint(url), QueueSpans: 8, BatchSpans: 4, Interval: 10 * time.Millisecond,
				Timeout: 200 * time.Millisecond, Client: client})
			stop := runExporter(t, e)
			for range 50 {
				e.Export(testSpans(2)) // never waits for the collector
			}
			select {
			case <-tried:
			case <-time.After(5 * time.Second):
				t.Fatal("no export request ended within 5 s")
			}
			stop()
			if q := e.Queued(); q != 0 {
				t.Errorf("%d spans still queued after Run returned", q)
			}
			if e.Exported() != 0 || e.Dropped(DropQueueFull) != 92 || e.Dropped(DropExportFailed) != 8 {
				t.Errorf("exported %d, queue_full %d, export_failed %d: want 0, 92 and 8",
					e.Exported(), e.Dropped(DropQueueFull), e.Dropped(DropExportFailed))
			}
			if e.requests[resultOK].Load() != 0 || e.requests[resultRetryable].Load() == 0 {
				t.Errorf("requests ok %d retryable %d", e.requests[resultOK].Load(), e.requests[resultRetryable].Load())
			}
			if tc.handler != nil && seen.Load() == 0 {
				t.Error("the collector saw no request")
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A retryable answer keeps the batch for at most maxTries sends, with the
// backoff doubling from 1 s (or the collector's Retry-After) between them;
// a non-retryable one drops it at once. The exporter logs the collector
// going down once and coming back once.
func TestExporterRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls []time.Time
		status := []int{503, 429, 503, 400, 200}
		start := time.Now()
		i := 0
		client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls = append(calls, time.Now())
			code := 200
			if i < len(status) {
				code = status[i]
			}
			i++
			h := http.Header{}
			if code == 429 {
				h.Set("Retry-After", "7")
			}
			return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
		})}
		var logs strings.Builder
		e := New(Options{Endpoint: "http://collector/v1/traces", Interval: time.Second, Client: client,
			Logger: newTextLogger(&logs)})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); e.Run(ctx) }()
		e.Export(testSpans(2)) // batch A: 503, 429 (Retry-After 7), 503 → dropped
		time.Sleep(20 * time.Second)
		synctest.Wait()
		e.Export(testSpans(1)) // batch B: 400 → dropped at once
		time.Sleep(40 * time.Second)
		synctest.Wait()
		e.Export(testSpans(1)) // batch C: 200
		time.Sleep(40 * time.Second)
		synctest.Wait()
		cancel()
		<-done
		if len(calls) != 5 {
			t.Fatalf("%d export requests, want 5", len(calls))
		}
		gaps := []time.Duration{calls[1].Sub(calls[0]), calls[2].Sub(calls[1])}
		if calls[0].Sub(start) != time.Second || gaps[0] != time.Second || gaps[1] != 7*time.Second {
			t.Errorf("first send after %v, retries after %v: want 1 s, then 1 s, then 7 s (Retry-After)", calls[0].Sub(start), gaps)
		}
		if d := e.Dropped(DropExportFailed); d != 3 {
			t.Errorf("export_failed %d, want 3 (batch A after 3 tries, batch B at once)", d)
		}
		if x := e.Exported(); x != 1 {
			t.Errorf("exported %d, want 1", x)
		}
		if n := strings.Count(logs.String(), "does not take spans"); n != 1 {
			t.Errorf("%d 'down' lines, want 1 (once per outage):\n%s", n, logs.String())
		}
		if n := strings.Count(logs.String(), "takes spans again"); n != 1 {
			t.Errorf("%d 'back' lines, want 1:\n%s", n, logs.String())
		}
	})
}

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://c:4318":                "http://c:4318/v1/traces",
		"http://c:4318/":               "http://c:4318/v1/traces",
		"https://c/otlp":               "https://c/otlp/v1/traces",
		"http://c:4318/v1/traces":      "http://c:4318/v1/traces",
		"http://c:4318/otlp/v1/traces": "http://c:4318/otlp/v1/traces",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

func newTextLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
