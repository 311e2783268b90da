package direct_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/wire"
	"iop/internal/wire/direct"
	iop "iop/proto/gen/iop"
)

// conn records every Write call; err, when set, fails writes.
type conn struct {
	mu        sync.Mutex
	writes    [][]byte
	err       error
	deadlines int
	block     chan struct{} // when not nil, Write waits for it to close
	entered   chan struct{} // closed by the first blocked Write
}

func (c *conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	block, entered := c.block, c.entered
	c.mu.Unlock()
	if block != nil {
		close(entered)
		<-block
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *conn) SetWriteDeadline(time.Time) error {
	c.mu.Lock()
	c.deadlines++
	c.mu.Unlock()
	return nil
}

func (c *conn) snapshot() (writes int, all []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.writes), bytes.Join(c.writes, nil)
}

func run(id string) *iop.Envelope {
	return &iop.Envelope{RunId: id, Kind: &iop.Envelope_CancelRequest{CancelRequest: &iop.CancelRequest{Reason: "x"}}}
}

// frames decodes b into run ids, in order (W1 framing).
func frames(t *testing.T, b []byte) []string {
	t.Helper()
	r := wire.NewReader(bytes.NewReader(b), wire.DefaultMaxFrame)
	var ids []string
	for {
		var env iop.Envelope
		if err := r.ReadEnvelope(&env); err != nil {
			if errors.Is(err, io.EOF) {
				return ids
			}
			t.Fatalf("decode: %v", err)
		}
		ids = append(ids, env.GetRunId())
	}
}

func opts() direct.Options { return direct.Options{WriteTimeout: time.Second} }

// W1: a direct Send with Flush reaches the socket before Send returns, as
// one well-formed frame, under a write deadline.
func TestSendFlushWritesAtOnce(t *testing.T) {
	leakcheck.Check(t)
	c := &conn{}
	w := direct.New(c, opts())
	defer w.Close()
	sent, err := w.Send(run("r1"), direct.Flush)
	if !sent || err != nil {
		t.Fatalf("Send = %v, %v; want true, nil", sent, err)
	}
	n, b := c.snapshot()
	if n != 1 || !slices.Equal(frames(t, b), []string{"r1"}) || c.deadlines == 0 {
		t.Fatalf("writes %d frames %q deadlines %d; want 1 write of r1 under a deadline", n, frames(t, b), c.deadlines)
	}
}

// T2: frames sent with Hold share the flush of the next Flush frame: one
// write for RESPONSE_START, BODY and END of a small answer.
func TestHoldSharesTheNextFlush(t *testing.T) {
	leakcheck.Check(t)
	c := &conn{}
	w := direct.New(c, opts())
	defer w.Close()
	for i, m := range []direct.Mode{direct.Hold, direct.Hold, direct.Flush} {
		if sent, err := w.Send(run(fmt.Sprint("r", i)), m); !sent || err != nil {
			t.Fatalf("Send %d = %v, %v", i, sent, err)
		}
		if n, _ := c.snapshot(); (i < 2 && n != 0) || (i == 2 && n != 1) {
			t.Fatalf("after frame %d: %d writes", i, n)
		}
	}
	if _, b := c.snapshot(); !slices.Equal(frames(t, b), []string{"r0", "r1", "r2"}) {
		t.Fatalf("frames %q", frames(t, b))
	}
}

// T2: a held frame with nothing after it reaches the socket after HoldMax.
func TestHoldFlushedAfterHoldMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &conn{}
		w := direct.New(c, direct.Options{WriteTimeout: time.Second, HoldMax: 20 * time.Millisecond})
		defer w.Close()
		start := time.Now()
		if sent, err := w.Send(run("r1"), direct.Hold); !sent || err != nil {
			t.Fatalf("Send = %v, %v", sent, err)
		}
		time.Sleep(19 * time.Millisecond) // fake clock
		synctest.Wait()
		if n, _ := c.snapshot(); n != 0 {
			t.Fatalf("held frame written after %v", time.Since(start))
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n, b := c.snapshot(); n != 1 || len(frames(t, b)) != 1 {
			t.Fatalf("after HoldMax: %d writes", n)
		}
	})
}

// L5, E3: with a frame queued, Send refuses to overtake it; the queued frame
// and the later one go out in order, in the writer's one flush.
func TestSendDoesNotOvertakeTheQueue(t *testing.T) {
	leakcheck.Check(t)
	c := &conn{}
	w := direct.New(c, opts())
	defer w.Close()
	if !w.Enqueue(run("ready")) {
		t.Fatal("Enqueue refused")
	}
	if sent, _ := w.Send(run("run"), direct.Flush); sent {
		t.Fatal("Send wrote past a queued frame")
	}
	if !w.Enqueue(run("run")) {
		t.Fatal("Enqueue refused")
	}
	n, err := w.Drain(<-w.Queue(), true)
	if n != 2 || err != nil || w.Queued() != 0 {
		t.Fatalf("Drain = %d, %v; queued %d", n, err, w.Queued())
	}
	writes, b := c.snapshot()
	if writes != 1 || !slices.Equal(frames(t, b), []string{"ready", "run"}) {
		t.Fatalf("%d writes, frames %q; want 1 write of ready, run", writes, frames(t, b))
	}
}

// E3, T2: many senders, each sending its frames in order by Send or, when
// the connection is busy, Enqueue, with one writer goroutine draining: every
// frame arrives once and each sender's frames keep their order.
func TestConcurrentSendersKeepTheirOrder(t *testing.T) {
	leakcheck.Check(t)
	c := &conn{}
	w := direct.New(c, direct.Options{WriteTimeout: time.Second, Queue: 8, BufferSize: 256})
	defer w.Close()
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for {
			select {
			case env := <-w.Queue():
				if _, err := w.Drain(env, true); err != nil {
					t.Error(err)
					return
				}
			case <-stop:
				return
			}
		}
	}()
	const senders, each = 8, 200
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				env := run(fmt.Sprintf("g%d-%d", g, i))
				m := direct.Flush
				if i%3 == 0 {
					m = direct.Hold
				}
				if sent, err := w.Send(env, m); err != nil {
					t.Error(err)
					return
				} else if !sent && !w.EnqueueWait(env, stop, 10*time.Second) {
					t.Error("EnqueueWait failed")
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-writerDone
	// Write what the writer left when told to stop, and flush held frames.
	for first := true; first || w.Queued() != 0; first = false {
		if _, err := w.Drain(nil, false); err != nil {
			t.Fatal(err)
		}
	}
	_, b := c.snapshot()
	next := make([]int, senders)
	ids := frames(t, b)
	for _, id := range ids {
		var g, i int
		if _, err := fmt.Sscanf(id, "g%d-%d", &g, &i); err != nil {
			t.Fatalf("frame %q", id)
		}
		if i != next[g] {
			t.Fatalf("sender %d: frame %d arrived when %d was due", g, i, next[g])
		}
		next[g]++
	}
	if len(ids) != senders*each {
		t.Fatalf("%d frames, want %d", len(ids), senders*each)
	}
}

// W1, W2: an envelope that cannot be encoded is refused with ErrUnencodable
// and writes nothing; the connection stays usable. Drain reports a queued
// one to OnUnencodable and goes on.
func TestUnencodable(t *testing.T) {
	leakcheck.Check(t)
	c := &conn{}
	var refused []string
	o := opts()
	o.MaxFrame = 64
	o.OnUnencodable = func(env *iop.Envelope, err error) { refused = append(refused, env.GetRunId()) }
	w := direct.New(c, o)
	defer w.Close()
	big := run(strings.Repeat("x", 100))
	if sent, err := w.Send(big, direct.Flush); !sent || !errors.Is(err, direct.ErrUnencodable) || !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Fatalf("Send(too large) = %v, %v; want true, ErrUnencodable wrapping ErrFrameTooLarge", sent, err)
	}
	if sent, err := w.Send(&iop.Envelope{RunId: "r"}, direct.Flush); !sent || !errors.Is(err, wire.ErrNoPayload) {
		t.Fatalf("Send(no payload) = %v, %v", sent, err)
	}
	w.Enqueue(big)
	w.Enqueue(run("ok"))
	if n, err := w.Drain(nil, false); n != 1 || err != nil {
		t.Fatalf("Drain = %d, %v", n, err)
	}
	if _, b := c.snapshot(); !slices.Equal(frames(t, b), []string{"ok"}) || !slices.Equal(refused, []string{big.GetRunId()}) {
		t.Fatalf("frames %q refused %d", frames(t, b), len(refused))
	}
}

// A socket error is returned to the sender and stays: every later write
// fails with it, so whoever writes next ends the connection.
func TestSocketErrorIsSticky(t *testing.T) {
	leakcheck.Check(t)
	boom := errors.New("connection reset")
	c := &conn{err: boom}
	w := direct.New(c, opts())
	defer w.Close()
	if _, err := w.Send(run("r1"), direct.Flush); !errors.Is(err, boom) {
		t.Fatalf("Send = %v, want %v", err, boom)
	}
	c.mu.Lock()
	c.err = nil
	c.mu.Unlock()
	if _, err := w.Send(run("r2"), direct.Flush); !errors.Is(err, boom) {
		t.Fatalf("second Send = %v, want the sticky %v", err, boom)
	}
	w.Enqueue(run("r3"))
	if _, err := w.Drain(nil, false); !errors.Is(err, boom) {
		t.Fatalf("Drain = %v, want %v", err, boom)
	}
}

// A sender never waits for another's socket write: while a direct write is
// blocked, Send reports false at once and the frame can be queued.
func TestSendNeverWaitsForTheLock(t *testing.T) {
	leakcheck.Check(t)
	c := &conn{block: make(chan struct{}), entered: make(chan struct{})}
	w := direct.New(c, opts())
	defer w.Close()
	done := make(chan error, 1)
	go func() {
		_, err := w.Send(run("slow"), direct.Flush)
		done <- err
	}()
	<-c.entered
	if sent, err := w.Send(run("next"), direct.Flush); sent || err != nil {
		t.Fatalf("Send during a blocked write = %v, %v; want false, nil", sent, err)
	}
	c.mu.Lock()
	blk := c.block
	c.block = nil
	c.mu.Unlock()
	close(blk)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
