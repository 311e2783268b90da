package adapter_test

// The stall observation (SPEC O1, O2): the "response stalled" log line is
// a local observation of the final stall evidence, taken before the
// terminal, that changes nothing on the wire and that a failing logger
// cannot hold back.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
)

// observer is a slog.Handler standing for whatever watches the node's log:
// it records every Warn record, and fails as told (panics in Enabled or
// Handle, returns an error, or blocks in Handle until release is closed).
type observer struct {
	mu      sync.Mutex
	records []slog.Record
	onWarn  func(slog.Record) // called in Handle, before any failure

	panicEnabled, panicHandle, fail bool
	block                           chan struct{} // non-nil: Handle waits for it to close
	blocked                         atomic.Int32  // Handle calls now waiting on block
}

func (o *observer) Enabled(context.Context, slog.Level) bool {
	if o.panicEnabled {
		panic("observer: Enabled broke")
	}
	return true
}

func (o *observer) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		o.mu.Lock()
		o.records = append(o.records, r.Clone())
		o.mu.Unlock()
		if o.onWarn != nil {
			o.onWarn(r)
		}
	}
	switch {
	case o.panicHandle:
		panic("observer: Handle broke")
	case o.block != nil:
		o.blocked.Add(1)
		<-o.block
		o.blocked.Add(-1)
	case o.fail:
		return errors.New("observer: write failed")
	}
	return nil
}

func (o *observer) WithAttrs([]slog.Attr) slog.Handler { return o }
func (o *observer) WithGroup(string) slog.Handler      { return o }

func (o *observer) stallRecords() []slog.Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []slog.Record
	for _, r := range o.records {
		if r.Message == "response stalled" {
			out = append(out, r)
		}
	}
	return out
}

// attrs returns r's attributes as strings.
func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	return m
}

// observers are the loggers a node may run with: none at all (discard), a
// working one, and each way one can fail. Call it inside the bubble that
// uses them (a channel made outside one does not block durably).
func observers() []struct {
	name string
	o    *observer // nil: slog.DiscardHandler
} {
	return []struct {
		name string
		o    *observer
	}{
		{"discard", nil},
		{"recording", &observer{}},
		{"Handle returns an error", &observer{fail: true}},
		{"Handle panics", &observer{panicHandle: true}},
		{"Enabled panics", &observer{panicEnabled: true}},
		{"Handle blocks", &observer{block: make(chan struct{})}},
	}
}

// stalledWire runs one stalled run or tunnel (3 chunks, then nothing; the
// probe says available) on a Set logging to h and returns every event or
// frame it emitted, each marshalled deterministically, and when the
// terminal went out on the bubble's clock.
func stalledWire(t *testing.T, h slog.Handler, tunnel bool) ([][]byte, time.Duration) {
	var chats atomic.Int32
	client := pipeClient(t, upstream(plan{chunks: 3}, &chats), false)
	s := newSet(t, adapter.Options{HTTPClient: client, Logger: slog.New(h)}, compatAdapter("llama", llamaProfile("http://upstream"), 1))
	start := time.Now()
	f := fly(context.Background(), s, "run-1", knobs{tunnel: tunnel, adapter: "llama", stallMs: 10000}, nil)
	<-f.ended
	at := f.endedAt.Sub(start)
	<-f.returned
	if code, _, _, _ := f.end(t); code != protocol.CodeResponseStalled.String() {
		t.Fatalf("terminal %s, want response_stalled", code)
	}
	var out [][]byte
	msgs := []proto.Message{}
	for _, ev := range f.events {
		msgs = append(msgs, ev)
	}
	for _, fr := range f.frames {
		msgs = append(msgs, fr)
	}
	for _, m := range msgs {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out, at
}

// O1: the stall observation adds nothing to the wire: the events of a
// stalled run and the frames of a stalled tunnel are byte for byte the same
// whether the node logs nowhere, to a working logger, or to one that fails
// in any way.
func TestO1StallObservationAddsNothingToTheWire(t *testing.T) {
	for _, tunnel := range []bool{false, true} {
		t.Run("tunnel="+strconv.FormatBool(tunnel), func(t *testing.T) {
			leakcheck.Check(t)
			var want [][]byte
			for i := range observers() {
				synctest.Test(t, func(t *testing.T) {
					ob := observers()[i]
					var h slog.Handler = slog.DiscardHandler
					if ob.o != nil {
						h = ob.o
					}
					if ob.o != nil && ob.o.block != nil {
						defer close(ob.o.block) // the stuck logger returns before the bubble ends
					}
					got, _ := stalledWire(t, h, tunnel)
					if want == nil {
						want = got
						return
					}
					if len(got) != len(want) {
						t.Fatalf("O1 %s: %d messages on the wire, want %d as with no logger", ob.name, len(got), len(want))
					}
					for i := range got {
						if !bytes.Equal(got[i], want[i]) {
							t.Errorf("O1 %s: message %d differs from the one sent with no logger:\n got %x\nwant %x", ob.name, i, got[i], want[i])
						}
					}
				})
			}
		})
	}
}

// O2: the node observes the final stall evidence before it builds and
// sends the terminal, and a failing observer never suppresses it: the log
// line is written before the terminal, with the terminal's idle_ms,
// provider_health and fence; a logger whose Handle returns an error, or
// whose Enabled or Handle panics, changes nothing (the terminal at the same
// instant, one terminal); one that blocks delays the terminal by at most
// adapter.ObserveBudget.
func TestO2ObserverFailureNeverSuppressesTerminal(t *testing.T) {
	const stall = 10 * time.Second
	for _, tunnel := range []bool{false, true} {
		for i, ob := range observers() {
			if ob.o == nil {
				continue
			}
			t.Run(ob.name+"/tunnel="+strconv.FormatBool(tunnel), func(t *testing.T) {
				leakcheck.Check(t)
				synctest.Test(t, func(t *testing.T) {
					o := observers()[i].o
					if o.block != nil {
						defer close(o.block)
					}
					var chats atomic.Int32
					client := pipeClient(t, upstream(plan{chunks: 3}, &chats), false)
					s := newSet(t, adapter.Options{HTTPClient: client, Logger: slog.New(o)}, compatAdapter("llama", llamaProfile("http://upstream"), 1))
					var sentAtObservation atomic.Bool
					var terminalSent atomic.Bool
					o.onWarn = func(slog.Record) { sentAtObservation.Store(terminalSent.Load()) }
					start := time.Now()
					f := fly(context.Background(), s, "run-1", knobs{tunnel: tunnel, adapter: "llama", stallMs: 10000},
						func() { terminalSent.Store(true) })
					<-f.returned
					code, fail, _, _ := f.end(t) // one terminal, last
					if code != protocol.CodeResponseStalled.String() {
						t.Fatalf("O2 terminal %s, want response_stalled", code)
					}
					at := f.endedAt.Sub(start)
					want := stall
					if o.block != nil {
						want = stall + adapter.ObserveBudget
					}
					if at != want {
						t.Errorf("O2 terminal after %v, want %v", at, want)
					}
					if o.panicEnabled {
						if n := len(o.stallRecords()); n != 0 {
							t.Errorf("%d stall records past a panicking Enabled", n)
						}
						return
					}
					recs := o.stallRecords()
					if len(recs) != 1 {
						t.Fatalf("O2 %d stall log records, want 1", len(recs))
					}
					if sentAtObservation.Load() {
						t.Error("O2 the terminal was sent before the stall evidence was observed")
					}
					got := attrs(recs[0])
					for k, v := range map[string]string{"run_id": "run-1", "adapter": "llama", "idle_ms": strconv.FormatInt(fail.GetIdleMs(), 10),
						"provider_health": fail.GetProviderHealth(), "fence": fail.GetFence()} {
						if got[k] != v {
							t.Errorf("O2 the observation's %s = %q, the terminal's %q", k, got[k], v)
						}
					}
				})
			})
		}
	}
}

// O2: loggers that never return do not pile up: once 4 stall lines are
// stuck in a blocked logger, a later stall's line is dropped and its
// terminal is not delayed at all.
func TestO2StuckObservationsBounded(t *testing.T) {
	leakcheck.Check(t)
	synctest.Test(t, func(t *testing.T) {
		o := &observer{block: make(chan struct{})}
		defer close(o.block)
		var chats atomic.Int32
		client := pipeClient(t, upstream(plan{}, &chats), false)
		s := newSet(t, adapter.Options{HTTPClient: client, Logger: slog.New(o)}, compatAdapter("llama", llamaProfile("http://upstream"), 1))
		for i := range 6 {
			start := time.Now()
			f := fly(context.Background(), s, "run-"+strconv.Itoa(i), knobs{adapter: "llama", stallMs: 10000}, nil)
			<-f.returned
			want := 10*time.Second + adapter.ObserveBudget
			if i >= 4 {
				want = 10 * time.Second
			}
			if at := f.endedAt.Sub(start); at != want {
				t.Errorf("stall %d: terminal after %v, want %v", i, at, want)
			}
		}
		synctest.Wait()
		if n := o.blocked.Load(); n != 4 {
			t.Errorf("%d stall lines stuck in the logger, want at most 4", n)
		}
	})
}
