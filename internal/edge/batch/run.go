package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/internal/protocol"
)

// The driver: one goroutine per batch that has not ended (launch, Start's
// resume), which validates its input, runs its lines through the handler
// as its key, at most MaxInFlight at once, retries a line refused for now
// and writes its files (SPEC X2, X3, X5).

// Retry-After bounds of a line refused for now (429, 503): the line waits
// and runs again, until the batch stops or its window ends.
const (
	minRetry = 250 * time.Millisecond
	maxRetry = 30 * time.Second
)

// Start resumes every batch of the store that has not ended (SPEC X3),
// logging each one it resumes (batch id, key, status, request counts) so
// that an operator sees after a restart what goes on running.
func (m *Manager) Start() {
	for _, r := range m.o.Store.Live() {
		m.o.Logger.Info("batch resumed", "batch", r.ID, "principal", r.Owner, "status", string(r.Status),
			"total", r.Counts.Total, "completed", r.Counts.Completed, "failed", r.Counts.Failed)
		m.launch(r)
	}
}

func (m *Manager) launch(r Record) {
	a := &active{rec: r, owner: r.Owner, stopped: make(chan struct{}), ended: make(chan struct{})}
	if r.Status == Cancelling || r.Status == Finalizing && r.Goal == Expired {
		a.stopOnce.Do(func() { close(a.stopped) })
	}
	m.mu.Lock()
	m.live[r.ID] = a
	m.mu.Unlock()
	m.wg.Add(1)
	go m.drive(a)
}

// drive runs batch a to its end, or until Close (SPEC X2, X3).
func (m *Manager) drive(a *active) {
	defer m.wg.Done()
	defer func() {
		m.mu.Lock()
		delete(m.live, a.rec.ID)
		m.mu.Unlock()
		close(a.ended)
	}()
	rec := a.snapshot()
	j, _, err := m.o.Store.OpenJournal(rec.ID)
	if err != nil {
		m.o.Logger.Error("batch journal unreadable; the batch waits for a restart", "batch", rec.ID, "err", err)
		return
	}
	a.j.Store(j)
	defer j.Close()
	in, _, err := m.o.Store.Content(rec.Owner, rec.InputFileID)
	var lines []line
	if err == nil {
		lines, err = scan(in, rec.Endpoint, m.o.MaxLineBytes)
		defer in.Close()
	}
	if a.status() == Validating {
		if err != nil {
			_ = m.step(a, EvInvalid, func(r *Record) {
				r.Errors = append(r.Errors, BatchError{Code: "invalid_file", Message: "the input file cannot be read: " + err.Error()})
			})
			return
		}
		model := ""
		for _, l := range lines {
			if l.err != "" && !j.Done(l.no) {
				if j.Append(Entry{Line: l.no, Record: errorRecord(rec.ID, l, "invalid_request", fmt.Sprintf("line %d: %s", l.no, l.err))}) == nil {
					m.counts(rec.Owner).failed.Add(1)
				}
			}
			if model == "" && l.err == "" {
				model = l.model
			}
		}
		_ = m.step(a, EvValidated, func(r *Record) { r.Model, r.Counts.Total = model, int64(len(lines)) })
	}
	if a.status() == InProgress {
		if err != nil {
			m.o.Logger.Error("batch input unreadable; the batch waits for a restart", "batch", rec.ID, "err", err)
			return
		}
		m.runLines(a, in, lines)
	}
	if m.ctx.Err() != nil {
		return
	}
	if s := a.status(); s == Cancelling || s == Finalizing {
		if err := m.write(a, lines); err != nil {
			m.o.Logger.Error("batch files not written; the batch waits for a restart", "batch", rec.ID, "err", err)
			return
		}
		_ = m.step(a, EvWritten, nil)
		j.Close()
		m.o.Store.RemoveJournal(rec.ID)
	}
}

// runLines runs a's lines not yet answered, at most MaxInFlight at once,
// until each is answered, the batch stops (cancel, revoked key, window
// ended) or the Manager closes.
func (m *Manager) runLines(a *active, in *os.File, lines []line) {
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	rec := a.snapshot()
	j := a.j.Load()
	expiry := time.NewTimer(time.Unix(rec.ExpiresAt, 0).Sub(m.o.Now()))
	defer expiry.Stop()
	tick := time.NewTicker(m.o.CheckEvery)
	defer tick.Stop()
	sem := make(chan struct{}, m.o.MaxInFlight)
	var wg sync.WaitGroup
	// watch handles what may stop the batch; it reports whether it did.
	watch := func() bool {
		select {
		case <-a.stopped:
			return true
		case <-ctx.Done():
			return true
		default:
		}
		if m.o.KeyActive != nil {
			if err := m.o.KeyActive(rec.Owner); err != nil {
				_ = m.step(a, EvRevoked, func(r *Record) {
					r.Errors = append(r.Errors, BatchError{Code: "api_key_revoked", Message: "the batch's key can no longer make requests: " + err.Error()})
				})
				return true
			}
		}
		return false
	}
	stopped := false
dispatch:
	for i := range lines {
		l := lines[i]
		if l.err != "" || j.Done(l.no) {
			continue
		}
		if watch() {
			stopped = true
			break
		}
		for acquired := false; !acquired; {
			select {
			case sem <- struct{}{}:
				acquired = true
			case <-a.stopped:
				stopped = true
				break dispatch
			case <-ctx.Done():
				stopped = true
				break dispatch
			case <-expiry.C:
				_ = m.step(a, EvExpired, nil)
			case <-tick.C:
				if watch() {
					stopped = true
					break dispatch
				}
			}
		}
		wg.Add(1)
		a.inFlight.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem; a.inFlight.Add(-1) }()
			if e, ok := m.runLine(ctx, a, in, l); ok {
				if err := j.Append(e); err == nil {
					c := m.counts(rec.Owner)
					if e.OK {
						c.completed.Add(1)
					} else {
						c.failed.Add(1)
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-a.stopped:
			stopped = true
			cancel()
		case <-ctx.Done():
			stopped = true
		case <-expiry.C:
			_ = m.step(a, EvExpired, nil)
		case <-tick.C:
			if watch() {
				stopped = true
				cancel()
			}
		}
	}
	if m.ctx.Err() != nil {
		return
	}
	if stopped {
		_ = m.step(a, EvDrained, nil)
		return
	}
	_ = m.step(a, EvAnswered, nil)
}

// runLine serves line l as a's key through the handler, and returns its
// journal entry; ok is false when the line did not end (the batch stopped
// or the Manager closed): it is not answered and runs again if the batch
// resumes. A 429 or 503 (a bound of the key, the queue, no provider now)
// waits its Retry-After and runs again (SPEC X5); a 503 model_unavailable
// (every provider tried said it cannot load the model, SPEC U3) is the
// line's answer.
func (m *Manager) runLine(ctx context.Context, a *active, in *os.File, l line) (Entry, bool) {
	rec := a.snapshot()
	raw := make([]byte, l.n)
	if _, err := in.ReadAt(raw, l.off); err != nil {
		return Entry{Line: l.no, Record: errorRecord(rec.ID, l, "internal_error", "the line could not be read again: "+err.Error())}, true
	}
	var req lineRequest
	_ = json.Unmarshal(raw, &req) // scan checked it
	for {
		w, aborted := m.serve(ctx, rec, req.Body)
		if ctx.Err() != nil {
			return Entry{}, false
		}
		if aborted {
			return Entry{Line: l.no, Record: errorRecord(rec.ID, l, "internal_error", "the request was aborted")}, true
		}
		if (w.status == http.StatusTooManyRequests || w.status == http.StatusServiceUnavailable) && !modelUnavailable(w) {
			m.counts(rec.Owner).retried.Add(1)
			t := time.NewTimer(retryAfter(w.header.Get("Retry-After")))
			select {
			case <-ctx.Done():
				t.Stop()
				return Entry{}, false
			case <-t.C:
			}
			continue
		}
		return answer(rec.ID, l, w), true
	}
}

// serve runs one request of the batch's key through the handler.
func (m *Manager) serve(ctx context.Context, rec Record, body []byte) (w *recorder, aborted bool) {
	r, _ := http.NewRequestWithContext(m.o.AsPrincipal(ctx, rec.Owner), http.MethodPost, rec.Endpoint, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(PriorityHeader, PriorityBatch)
	r.RemoteAddr = "batch"
	w = &recorder{header: http.Header{}}
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			aborted = true
		}
	}()
	m.handler.ServeHTTP(w, r)
	return w, false
}

// modelUnavailable reports whether w is the edge's 503 model_unavailable:
// the providers tried cannot load the line's model (it never fits, they
// have no file for it, its load failed), which running the line again
// every second until the 24-hour window ends would not change.
func modelUnavailable(w *recorder) bool {
	if w.status != http.StatusServiceUnavailable {
		return false
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal(w.body.Bytes(), &e) == nil && e.Error.Code == string(protocol.CodeModelUnavailable)
}

func retryAfter(v string) time.Duration {
	d := time.Second
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		d = time.Duration(s) * time.Second
	}
	return min(max(d, minRetry), maxRetry)
}
