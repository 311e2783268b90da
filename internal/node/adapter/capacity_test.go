package adapter_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// holdBackend streams the first chunk of a request whose body says "hold"
// and finishes it when release closes; every other request is answered at
// once. held receives one value per held request.
func holdBackend(t *testing.T) (up *fake, held chan struct{}, release func()) {
	held = make(chan struct{}, 16)
	rel := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(rel) }) }) // a failed test lets its held requests end
	stream := sample(t, "llama_v1_chat_stream.sse")
	up = newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !strings.Contains(string(body), "hold") {
			replay(200, "text/event-stream", stream)(w, r, body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(stream[:200])
		_ = http.NewResponseController(w).Flush()
		held <- struct{}{}
		select {
		case <-rel:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write(stream[200:])
	})
	return up, held, func() { once.Do(func() { close(rel) }) }
}

func edgeSet(t *testing.T, c *adapter.Capacity, edge string, share float64, adapters ...*iop.AdapterConfig) *adapter.Set {
	t.Helper()
	return newSet(t, adapter.Options{Capacity: c, Edge: edge, CapacityShare: share}, adapters...)
}

// runCode runs one request on s's adapter "one" and returns its terminal's
// failure code ("" for COMPLETE).
func runCode(t *testing.T, s *adapter.Set) string {
	t.Helper()
	last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}))
	if last.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE {
		return ""
	}
	return last.GetFailureCode()
}

// E4: an adapter's capacity is the node's: the Sets of every edge (and the
// one a refresh replaces) count against one number, each by its own
// payload's capacity; an edge's capacity_share bounds its own requests;
// over it, the typed over_capacity terminal before any upstream call.
func TestCapacityAcrossEdges(t *testing.T) {
	leakcheck.Check(t)
	up, held, release := holdBackend(t)
	c := adapter.NewCapacity()
	a := edgeSet(t, c, "edge-1 at a:1", 0, compatAdapter("one", llamaProfile(up.URL), 2))
	b := edgeSet(t, c, "edge-2 at b:1", 0, compatAdapter("one", llamaProfile(up.URL), 2))
	h1 := startWork(context.Background(), a, false, "one", "hold-1")
	h2 := startWork(context.Background(), a, true, "one", "hold-2")
	recv(t, held, "the first held request")
	recv(t, held, "the second held request")
	before := len(up.requests())
	if got := runCode(t, b); got != protocol.CodeOverCapacity.String() {
		t.Fatalf("E4: edge 2's request while edge 1 holds the capacity: got %q, want over_capacity", got)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("E4: %d upstream calls for a refused request", n)
	}
	if n := c.InUse("one"); n != 2 {
		t.Fatalf("E4: InUse = %d, want 2", n)
	}

	// A refresh of edge 2 to capacity 3: its requests meet 3 against the
	// node-wide count, edge 1's still meet 2.
	b3 := edgeSet(t, c, "edge-2 at b:1", 0, compatAdapter("one", llamaProfile(up.URL), 3))
	h3 := startWork(context.Background(), b3, false, "one", "hold-3")
	recv(t, held, "the third held request")
	if got := runCode(t, a); got != protocol.CodeOverCapacity.String() {
		t.Fatalf("E4: edge 1 at 3 of its 2: got %q, want over_capacity", got)
	}
	if got := runCode(t, b3); got != protocol.CodeOverCapacity.String() {
		t.Fatalf("E4: edge 2 at 3 of its 3: got %q, want over_capacity", got)
	}

	// An edge with a share of its own still meets the node-wide count.
	d := edgeSet(t, c, "edge-3 at c:1", 0.5, compatAdapter("one", llamaProfile(up.URL), 3))
	if got := runCode(t, d); got != protocol.CodeOverCapacity.String() {
		t.Fatalf("E4: edge 3 with the node at 3 of 3 and none of its share used: got %q, want over_capacity", got)
	}
	release()
	for _, w := range []*work{h1, h2, h3} {
		w.wait(t)
	}
	if n := c.InUse("one"); n != 0 {
		t.Fatalf("E4: InUse = %d after every request ended, want 0", n)
	}
	// A share of 0.5 of 4: 2 of that edge's requests at most.
	up2, held2, release2 := holdBackend(t)
	s := edgeSet(t, adapter.NewCapacity(), "edge-3 at c:1", 0.5, compatAdapter("one", llamaProfile(up2.URL), 4))
	w1 := startWork(context.Background(), s, false, "one", "hold-a")
	w2 := startWork(context.Background(), s, false, "one", "hold-b")
	recv(t, held2, "share request 1")
	recv(t, held2, "share request 2")
	last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}))
	if last.GetFailureCode() != protocol.CodeOverCapacity.String() || !strings.Contains(last.GetError(), "capacity share of 2") {
		t.Fatalf("E4: a third request of a 0.5 share of 4: got %q %q, want over_capacity naming the share", last.GetFailureCode(), last.GetError())
	}
	release2()
	w1.wait(t)
	w2.wait(t)
}

// E4: one adapter name is one backend on a node: a payload naming another
// type or base URL under a name another edge's payload runs is refused,
// naming both edges and the field; the claim goes with the last Set of
// that edge.
func TestAdapterConflictAcrossEdges(t *testing.T) {
	leakcheck.Check(t)
	c := adapter.NewCapacity()
	one := func(base string) *iop.AdapterConfig { return compatAdapter("one", llamaProfile(base), 1) }
	a := edgeSet(t, c, "edge-1 at a:1", 0, one("http://127.0.0.1:1"), ollamaAdapter("o", "http://127.0.0.1:3", 1))
	rows := []struct {
		name    string
		adapter *iop.AdapterConfig
		want    string
	}{
		{"E4 another base URL", one("http://127.0.0.1:2"),
			`adapter "one": another edge runs another backend under this adapter name: edge edge-2 at b:1 sent base_url "http://127.0.0.1:2", edge edge-1 at a:1 runs "http://127.0.0.1:1"`},
		{"E4 another type", ollamaAdapter("one", "http://127.0.0.1:1", 1),
			`edge edge-2 at b:1 sent type "ollama", edge edge-1 at a:1 runs "openai_compat"`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{row.adapter}},
				adapter.Options{Capacity: c, Edge: "edge-2 at b:1"})
			if !errors.Is(err, adapter.ErrAdapterConflict) || !strings.Contains(err.Error(), row.want) {
				t.Fatalf("got %v, want ErrAdapterConflict containing %q", err, row.want)
			}
			// E4: the advice is one that works: the other edge's payload
			// runs the old backend until that edge changes too, and then
			// its own refresh meets this edge's (still the old one), so a
			// backend changed edge by edge reaches the node only when it
			// starts.
			if msg := err.Error(); strings.Contains(msg, "change it on every edge") || !strings.Contains(msg, "another name") || !strings.Contains(msg, "restart") {
				t.Errorf("E4: the refusal %q does not say to give the other backend another name or restart the node", msg)
			}
		})
	}
	// The same edge may change its own backend (a refresh); another edge
	// may name the same one.
	a2, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{one("http://127.0.0.1:2")}}, adapter.Options{Capacity: c, Edge: "edge-1 at a:1"})
	if err != nil {
		t.Fatalf("a refresh of edge 1 to another base URL: %v", err)
	}
	if _, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ollamaAdapter("o", "http://127.0.0.1:3", 1)}},
		adapter.Options{Capacity: c, Edge: "edge-2 at b:1"}); err != nil {
		t.Fatalf("edge 2 naming the backend edge 1's first Set still runs: %v", err)
	}
	a.Close() // edge 1's first Set ends: its claim on "o" goes, its claim on "one" is a2's
	b, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ollamaAdapter("o", "http://127.0.0.1:9", 1)}},
		adapter.Options{Capacity: c, Edge: "edge-2 at b:1"})
	if err != nil {
		t.Fatalf("after edge 1 stopped running %q: %v", "o", err)
	}
	b.Close()
	if _, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{one("http://127.0.0.1:1")}},
		adapter.Options{Capacity: c, Edge: "edge-2 at b:1"}); !errors.Is(err, adapter.ErrAdapterConflict) {
		t.Fatalf("edge 1's refreshed Set claims %q: got %v, want a conflict", "one", err)
	}
	a2.Close()
}

// E4: the gate between edges through the Sets of two edges: a refusal
// tells each edge its fair share (capacity over the edges that want the
// adapter); the retry of an edge refused below its share takes the slot
// the other frees, and once it is in a free slot goes to any edge without
// a capacity_share, even one above its fair share (work-conserving; the
// hold of the last slots for a due retry, and its end after holdWindow,
// are TestE4GateTieBreakForTheLastSlots). An edge with a capacity_share is
// held to it (a hard split) even with a slot free.
func TestE4GateWorkConservingBetweenEdges(t *testing.T) {
	// step is one request of edge e ("a" or "b"): held (it runs until
	// ended) or run to its terminal; end instead ends one held request.
	type step struct {
		edge      string
		hold, end bool
		code      string // the terminal's failure code; "" = COMPLETE
		fair      uint32 // the refusal's fair share
		says      string // in the refusal's error
	}
	over := protocol.CodeOverCapacity.String()
	for _, tc := range []struct {
		name     string
		capacity int32
		shareA   float64
		shareB   float64
		steps    []step
	}{
		{name: "the refused edge's retry takes the freed slot, then a free slot goes to any edge", capacity: 2, steps: []step{
			{edge: "a", hold: true}, {edge: "a", hold: true},
			{edge: "b", code: over, fair: 1, says: "its capacity of 2"}, // full: b is told its share, 1
			{end: true}, // a holds 1, its share; a slot is free
			{edge: "b"}, // b's retry
			{edge: "a"}, // a, above its share, takes the free slot (before: refused, fair share of 1 while b waits)
		}},
		{name: "full: the edge above its share is told its share", capacity: 4, steps: []step{
			{edge: "a", hold: true}, {edge: "a", hold: true}, {edge: "a", hold: true},
			{edge: "b", hold: true},
			{edge: "b", code: over, fair: 2},
			{edge: "a", code: over, fair: 2, says: "its capacity of 4"},
		}},
		{name: "a lone edge is told the whole capacity", capacity: 2, steps: []step{
			{edge: "a", hold: true}, {edge: "a", hold: true},
			{edge: "a", code: over, fair: 2},
		}},
		{name: "capacity_share is a hard split: refused at its share with a slot free", capacity: 4, shareA: 0.5, shareB: 0.5, steps: []step{
			{edge: "a", hold: true}, {edge: "a", hold: true},
			{edge: "a", code: over, fair: 2, says: "its capacity share of 2"},
			{edge: "b", hold: true}, {edge: "b"},
		}},
		{name: "a share and none: the one without takes what is free", capacity: 4, shareA: 0.25, steps: []step{
			{edge: "a", hold: true},
			{edge: "a", code: over, fair: 1, says: "its capacity share of 1"},
			{edge: "b", hold: true}, {edge: "b", hold: true}, {edge: "b", hold: true},
			{edge: "b", code: over, says: "its capacity of 4"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			// Each held request waits for one token of free: the test
			// ends them one at a time.
			held, free := make(chan struct{}, 8), make(chan struct{})
			stream := sample(t, "llama_v1_chat_stream.sse")
			up := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if !strings.Contains(string(body), "hold") {
					replay(200, "text/event-stream", stream)(w, r, body)
					return
				}
				held <- struct{}{}
				select {
				case <-free:
				case <-r.Context().Done():
					return
				}
				replay(200, "text/event-stream", stream)(w, r, body)
			})
			c := adapter.NewCapacity()
			sets := map[string]*adapter.Set{
				"a": edgeSet(t, c, "edge-1 at a:1", tc.shareA, compatAdapter("one", llamaProfile(up.URL), tc.capacity)),
				"b": edgeSet(t, c, "edge-2 at b:1", tc.shareB, compatAdapter("one", llamaProfile(up.URL), tc.capacity)),
			}
			var running []*work
			finished := make(chan *work, len(tc.steps))
			defer func() {
				for range running {
					free <- struct{}{}
				}
				for _, w := range running {
					w.wait(t)
				}
			}()
			for i, st := range tc.steps {
				switch {
				case st.end:
					free <- struct{}{}
					w := recv(t, finished, "the end of a held request")
					for k := range running {
						if running[k] == w {
							running = append(running[:k], running[k+1:]...)
							break
						}
					}
				case st.hold && st.code == "":
					w := startWork(context.Background(), sets[st.edge], false, "one", fmt.Sprintf("hold-%d", i))
					select {
					case <-held:
					case <-w.done:
						t.Fatalf("E4: step %d: edge %s's held request ended: %v", i, st.edge, w.events[len(w.events)-1])
					case <-time.After(5 * time.Second):
						t.Fatalf("E4: step %d: edge %s's held request did not reach the backend", i, st.edge)
					}
					running = append(running, w)
					go func() { <-w.done; finished <- w }()
				default:
					last, _ := checkRun(t, runAll(context.Background(), sets[st.edge], &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}))
					got := last.GetFailureCode()
					if last.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE {
						got = ""
					}
					if got != st.code || (st.fair != 0 && last.GetFairShare() != st.fair) || !strings.Contains(last.GetError(), st.says) {
						t.Fatalf("E4: step %d, edge %s: %q fair share %d %q, want %q fair share %d naming %q",
							i, st.edge, got, last.GetFairShare(), last.GetError(), st.code, st.fair, st.says)
					}
				}
			}
		})
	}
}
