package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// cancelBound is how long the test allows between a client leaving and the
// upstream request ending. The product's bound is 100 ms from noticing;
// this one is loose for a loaded 2-core machine under -race.
const cancelBound = 3 * time.Second

// readChunks reads SSE data lines from resp until n chunks with non-empty
// content have arrived.
func readChunks(resp *http.Response, n int) error {
	br := bufio.NewReader(resp.Body)
	seen := 0
	for seen < n {
		line, err := br.ReadString('\n')
		if err != nil {
			return fmt.Errorf("after %d content chunks: %w", seen, err)
		}
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			seen++
		}
	}
	return nil
}

// TestClientDisconnect proves T3 and Q4: a client that leaves while queued,
// before the first byte or mid-stream leaks nothing — its waiter is removed,
// the upstream request ends, and every lease count returns to 0 — on both
// dispatch paths.
func TestClientDisconnect(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{TokenDelay: 5 * time.Millisecond, LoopTokens: 100000})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 1), compatAdapter("oa", url, 1)}}},
		[]config.Model{
			modelGroup("loop", provider("gpu-1", "ollama", "tiny-loop")),
			modelGroup("loop-oa", provider("gpu-1", "oa", "tiny-loop")),
			modelGroup("slow", provider("gpu-1", "ollama", "tiny+slowheaders=1m")),
			modelGroup("slow-oa", provider("gpu-1", "oa", "tiny+slowheaders=1m")),
		}, nil)
	_, adm, api := startReady(t, p, cfg, logs)

	// upstreamEnd waits for the end of the first upstream request started
	// after mark (a backend Stats().Started value).
	upstreamEnd := func(t *testing.T, mark uint64, what string) backend.RequestEnd {
		return bp.waitEnd(t, cancelBound, what, func(e backend.RequestEnd) bool { return e.Seq > mark })
	}
	// waitUpstreamStarted waits until the backend accepted a request after mark.
	waitUpstreamStarted := func(t *testing.T, mark uint64) {
		eventually(t, 5*time.Second, "upstream request started", func() (bool, string) {
			st := bp.b.Stats()
			return st.Started > mark, fmt.Sprintf("%+v", st)
		})
	}
	checkInFlightZero := func(t *testing.T) {
		adm.waitGauges(t, cancelBound, 0, 0)
		d := adm.mustStatus(t)
		ns, _ := d.node("gpu-1")
		for _, p := range ns.Providers {
			if p.InFlight != 0 || p.LongInFlight != 0 || p.Queued != 0 {
				t.Errorf("Q2, Q8: provider %s after the request: in_flight=%d long_in_flight=%d queued=%d, want 0",
					p.ProviderID, p.InFlight, p.LongInFlight, p.Queued)
			}
		}
	}

	for _, path := range []struct{ name, suffix string }{{"run", ""}, {"tunnel", "-oa"}} {
		t.Run("Q4 T3 queued waiter leaves/"+path.name, func(t *testing.T) {
			mark := bp.b.Stats().Started
			// Hold the only slot with a long stream.
			holdCtx, holdCancel := context.WithCancel(context.Background())
			defer holdCancel()
			hold, err := api.post(holdCtx, chatRequest{model: "loop" + path.suffix, stream: true})
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Body.Close()
			if err := readChunks(hold, 1); err != nil {
				t.Fatalf("holder stream: %v", err)
			}
			// The second request queues behind it.
			qctx, qcancel := context.WithCancel(context.Background())
			qdone := make(chan error, 1)
			go func() {
				resp, err := api.post(qctx, chatRequest{model: "loop" + path.suffix, stream: true})
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("queued request answered %d before its client left", resp.StatusCode)
				}
				qdone <- err
			}()
			adm.waitGauges(t, 5*time.Second, 1, 1)
			qcancel()
			if err := <-qdone; err == nil || !strings.Contains(err.Error(), "context canceled") {
				t.Errorf("queued client: %v, want its own cancellation", err)
			}
			// Q4: the waiter is gone while the holder still streams.
			adm.waitGauges(t, cancelBound, 1, 0)
			if st := bp.b.Stats(); st.Started != mark+1 {
				t.Errorf("Q4: upstream saw %d requests, want only the holder's", st.Started-mark)
			}
			// T3 mid-stream for the holder, which also frees the slot.
			holdCancel()
			end := upstreamEnd(t, mark, "holder's upstream request end")
			if end.Outcome != backend.OutcomeClientGone {
				t.Errorf("T3: holder's upstream request ended %s, want %s", end.Outcome, backend.OutcomeClientGone)
			}
			checkInFlightZero(t)
		})

		t.Run("T3 before first byte/"+path.name, func(t *testing.T) {
			mark := bp.b.Stats().Started
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				resp, err := api.post(ctx, chatRequest{model: "slow" + path.suffix})
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("answered %d before the client left", resp.StatusCode)
				}
				done <- err
			}()
			waitUpstreamStarted(t, mark)
			adm.waitGauges(t, 5*time.Second, 1, 0)
			left := time.Now()
			cancel()
			if err := <-done; err == nil || !strings.Contains(err.Error(), "context canceled") {
				t.Errorf("client: %v, want its own cancellation", err)
			}
			end := upstreamEnd(t, mark, "upstream request end after the client left")
			t.Logf("upstream request ended %v after the client left", end.End.Sub(left).Round(time.Millisecond))
			if end.Outcome != backend.OutcomeClientGone || end.Status != 0 {
				t.Errorf("T3: upstream request ended %s with status %d, want %s before any status", end.Outcome, end.Status, backend.OutcomeClientGone)
			}
			checkInFlightZero(t)
		})

		t.Run("T3 mid-stream/"+path.name, func(t *testing.T) {
			mark := bp.b.Stats().Started
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := api.post(ctx, chatRequest{model: "loop" + path.suffix, stream: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := readChunks(resp, 3); err != nil {
				t.Fatal(err)
			}
			left := time.Now()
			cancel()
			resp.Body.Close()
			end := upstreamEnd(t, mark, "upstream request end after the client left")
			t.Logf("upstream request ended %v after the client left, %d tokens in", end.End.Sub(left).Round(time.Millisecond), end.Tokens)
			if end.Outcome != backend.OutcomeClientGone || end.Tokens < 3 || end.Tokens > 90000 {
				t.Errorf("T3: upstream request ended %s after %d tokens, want %s soon after 3", end.Outcome, end.Tokens, backend.OutcomeClientGone)
			}
			checkInFlightZero(t)
		})
	}
}
