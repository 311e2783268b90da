package transport

// Timer tests run in a testing/synctest bubble: connections are net.Pipe
// pairs (synctest-aware, unbuffered) carrying real TLS with a PKI made
// inside the bubble, so the fake clock drives the heartbeat, liveness and
// register→ready timers deterministically. synctest.Test itself fails if
// any goroutine of the bubble is left behind.

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/events"
	"iop/internal/edge/registry"
	iop "iop/proto/gen/iop"
)

// pipeListener hands out the server ends of net.Pipe pairs.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial() (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

func newPipeHarness(t *testing.T, cfgIntervalMs, nodeTimeoutMs, timeoutMs int, modify func(*Options)) *harness {
	pl := newPipeListener()
	var cfg = testConfig(t, cfgIntervalMs, nodeTimeoutMs, timeoutMs, 4)
	return newHarness(t, harnessOpts{ln: pl, dial: pl.dial, cfg: cfg, modify: modify})
}

// drain reads everything the edge sends until the connection closes,
// answering pings with pongs when answer is set (like a real node). It
// reports the pings it saw and when the connection closed.
func (n *fakeNode) drain(answer bool) <-chan drained {
	out := make(chan drained, 1)
	go func() {
		var d drained
		for {
			env := new(iop.Envelope)
			if err := n.r.ReadEnvelope(env); err != nil {
				d.closedAt = time.Now()
				out <- d
				return
			}
			if p := env.GetPing(); p != nil {
				d.pings++
				if answer {
					n.mu.Lock()
					err := n.w.WriteEnvelope(&iop.Envelope{Kind: &iop.Envelope_Pong{Pong: &iop.HeartbeatPong{Nonce: p.GetNonce()}}})
					n.mu.Unlock()
					if err != nil {
						d.closedAt = time.Now()
						out <- d
						return
					}
				}
			}
		}
	}()
	return out
}

type drained struct {
	pings    int
	closedAt time.Time
}

// L7: a ready node that goes silent (socket open, still reading) is fenced
// exactly heartbeat.timeout_ms (default 20 s) after its last frame — not
// before, and within the bound; its connection is closed and
// node.disconnected says why.
func TestHalfOpenFencedAtTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newPipeHarness(t, 0, 0, 0, nil) // defaults: 5 s interval, 20 s timeout
		n := h.dial("gpu-1")
		n.connect("gpu-1")
		silentSince := time.Now()
		d := n.drain(false)
		if got := <-h.hooks; got != (hookCall{"ready", "gpu-1", 1}) {
			t.Fatalf("hook = %v, want ready", got)
		}
		if got := <-h.hooks; got != (hookCall{"fence", "gpu-1", 1}) {
			t.Fatalf("hook = %v, want fence", got)
		}
		if el := time.Since(silentSince); el != 20*time.Second {
			t.Fatalf("fenced %v after the last frame, want exactly 20s", el)
		}
		res := <-d
		if el := res.closedAt.Sub(silentSince); el != 20*time.Second {
			t.Fatalf("connection closed %v after the last frame, want 20s", el)
		}
		if res.pings < 3 || res.pings > 4 { // at 5, 10, 15 (and maybe 20) s
			t.Fatalf("edge sent %d pings in 20s at a 5s interval, want 3 or 4", res.pings)
		}
		<-h.events // node.connected
		if e := <-h.events; e.Type != events.TypeDisconnected || e.Reason != registry.ErrHeartbeatTimeout.Error() ||
			!e.Time.Equal(silentSince.Add(20*time.Second)) {
			t.Fatalf("event = %+v, want node.disconnected for heartbeat timeout at +20s", e)
		}
		if st := h.node("gpu-1"); st.Connected {
			t.Fatalf("gpu-1 = %+v after the fence", st)
		}
		h.stop()
	})
}

// L7: any inbound frame is liveness: a node that only answers the edge's
// pings stays ready for a minute, with no fence.
func TestNodeAnsweringPingsStaysReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newPipeHarness(t, 0, 0, 0, nil)
		n := h.dial("gpu-1")
		n.connect("gpu-1")
		d := n.drain(true)
		time.Sleep(time.Minute) // advances the bubble's fake clock
		synctest.Wait()
		if got := <-h.hooks; got != (hookCall{"ready", "gpu-1", 1}) {
			t.Fatalf("hook = %v, want ready", got)
		}
		h.noHooks()
		if st := h.node("gpu-1"); !st.Connected {
			t.Fatalf("gpu-1 = %+v after a minute of pongs, want connected", st)
		}
		n.conn.Close()
		if res := <-d; res.pings != 12 {
			t.Fatalf("edge sent %d pings in 60s, want 12", res.pings)
		}
		h.stop()
	})
}

// L3: register→ready within 30 s: a node that registers and keeps
// answering pings but never says ready is closed at 30 s, with no hook and
// no event.
func TestReadyDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newPipeHarness(t, 0, 0, 0, nil)
		start := time.Now()
		n := h.dial("gpu-1")
		if r := n.register("gpu-1"); !r.GetAccepted() {
			t.Fatalf("register refused: %s", r.GetReason())
		}
		res := <-n.drain(true)
		if el := res.closedAt.Sub(start); el != DefaultReadyTimeout {
			t.Fatalf("pending connection closed after %v, want %v", el, DefaultReadyTimeout)
		}
		synctest.Wait()
		h.noHooks()
		h.noEvents()
		if st := h.node("gpu-1"); st.Pending || st.Connected {
			t.Fatalf("gpu-1 = %+v after the ready deadline", st)
		}
		h.stop()
	})
}

// The send-queue policy (docs/wire.md), dispatch.ErrSendQueueFull: with a direct write blocked on a
// peer that stopped reading, the next request queues behind it; a
// refusable request that finds the queue full is refused after its bounded
// wait and the session lives on; a must-deliver CancelRequest that finds it
// full closes the session, and its streams get ErrSessionLost — the blocked
// writer's included.
func TestSendQueueOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newPipeHarness(t, 0, 0, 0, func(o *Options) { o.SendQueue = 1 })
		n := h.dial("gpu-1")
		n.connect("gpu-1") // then the node stops reading
		<-h.hooks
		tgt := dispatch.Target{Node: "gpu-1", Generation: 1}
		first := make(chan dispatch.Stream, 1)
		go func() {
			r1, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
			if err != nil {
				t.Error(err)
			}
			first <- r1
		}()
		synctest.Wait() // r1 is being written (by its caller or the writer) and blocks
		// Later requests queue behind it (one may sit with the writer, which
		// waits for the connection) until the queue is full.
		var queued []dispatch.Stream
		for {
			st, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
			if errors.Is(err, dispatch.ErrSendQueueFull) {
				break
			}
			if err != nil || len(queued) == 3 {
				t.Fatalf("StartRun %d = %v; want queued, then ErrSendQueueFull", len(queued)+2, err)
			}
			queued = append(queued, st)
			synctest.Wait()
		}
		if len(queued) == 0 {
			t.Fatal("refused with nothing queued")
		}
		if _, err := h.srv.Command(context.Background(), "gpu-1", 1, &iop.NodeCommandRequest{}); !errors.Is(err, dispatch.ErrSendQueueFull) {
			t.Fatalf("Command = %v, want ErrSendQueueFull", err)
		}
		h.noHooks()
		if st := h.node("gpu-1"); !st.Connected {
			t.Fatalf("refusable overflow ended the session: %+v", st)
		}
		queued[0].Cancel("client_disconnected") // must-deliver, queue full
		if got := <-h.hooks; got != (hookCall{"fence", "gpu-1", 1}) {
			t.Fatalf("hook = %v, want fence after must-deliver overflow", got)
		}
		r1 := <-first // the closed connection ended its write
		for _, st := range append(queued, r1) {
			if _, err := st.Recv(context.Background()); !errors.Is(err, dispatch.ErrSessionLost) {
				t.Fatalf("Recv on %s = %v, want ErrSessionLost", st.RunID(), err)
			}
			st.Close()
		}
		h.stop()
	})
}
