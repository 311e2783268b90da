package api

import (
	"bufio"
	"context"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// watchedDispatcher starts tunnels on one fake stream without keeping their
// requests, and closes freed once the first tunnel's body bytes have been
// garbage collected.
type watchedDispatcher struct {
	st      *fakeStream
	started chan struct{}
	freed   chan struct{}
}

func (d *watchedDispatcher) StartRun(dispatch.Target, *iop.RunRequest) (dispatch.Stream, error) {
	return nil, dispatch.ErrNotReady
}

func (d *watchedDispatcher) StartTunnel(_ dispatch.Target, req *iop.ProviderTunnelRequest) (dispatch.Stream, error) {
	runtime.AddCleanup(&req.Body[0], func(freed chan struct{}) { close(freed) }, d.freed)
	close(d.started)
	return d.st, nil
}

// H11: the client's body is needed only for a re-dispatch, which
// happens only before any byte reached the client. Once the first event
// went out the Edge drops it, so a long stream does not keep a long prompt
// (here the tunnel's body is the client's own bytes: the model needs no
// splice).
func TestBodyDroppedAfterFirstByte(t *testing.T) {
	leakcheck.Check(t)
	st := newFakeStream("run-1")
	t.Cleanup(st.kill)
	d := &watchedDispatcher{st: st, started: make(chan struct{}), freed: make(chan struct{})}
	fp := newFakePool(protocol.TypeOpenAICompat) // target "tiny:latest"
	cfg := testConfig(nil)
	r := &rig{fp: fp, p: fp, st: st, cfg: cfg}
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: d, Now: fixedNow, NewID: seqIDs()})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)

	body := `{"model":"tiny:latest","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", 2048) + `"}]}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := r.sendAsync(ctx, "/v1/chat/completions", body)
	waitClosed(t, d.started, "the tunnel's start")
	st.frames(fStart(200, "Content-Type", "text/event-stream"), fBody([]byte("data: {\"n\":1}\n\n")))
	var res result
	select {
	case res = <-done:
	case <-time.After(waitFor):
		t.Fatal("no response headers")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.resp.Body.Close()
	line, err := bufio.NewReader(res.resp.Body).ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}

	// The stream is still open: the handler waits for the next frame.
	deadline := time.After(waitFor)
	for freed := false; !freed; {
		runtime.GC()
		select {
		case <-d.freed:
			freed = true
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatal("the request body is still reachable after the first byte reached the client")
		}
	}
	st.frames(fEnd())
}
