package pool

import (
	"errors"
	"iop/internal/protocol"
	"slices"
	"strings"
	"testing"
	"time"
)

// Keys and config shared by the state-machine tables.
var (
	kOllama = Key{"gpu-1", "ollama"}
	kLlama  = Key{"gpu-2", "llama"}
	kVLLM   = Key{"gpu-3", "vllm"}
)

var allOps = []string{protocol.OpChatCompletions, protocol.OpMessages, protocol.OpCountTokens, protocol.OpResponses, protocol.OpModels}

// baseConfig: model "tiny" on gpu-1/ollama (cap 2, long 1, chat only, stall
// 60000 ms) then gpu-2/llama (openai_compat, cap 2, long 1, every op);
// model "big" on gpu-2/llama only. Long from 100 tokens.
func baseConfig() Config {
	return Config{
		Nodes: []string{"gpu-1", "gpu-2"},
		Resources: []Resource{
			{Key: kOllama, Type: "ollama", Category: "local_inference", Capacity: 2, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}},
			{Key: kLlama, Type: "openai_compat", Category: "local_inference", Capacity: 2, LongCapacity: 1, Operations: allOps},
		},
		Groups: []Group{
			{Name: "tiny", LongContextTokens: 100, Candidates: []Candidate{
				{Key: kOllama, Target: "tiny-o", StallTimeoutMs: 60000},
				{Key: kLlama, Target: "tiny-l"},
			}},
			{Name: "big", LongContextTokens: 100, Candidates: []Candidate{{Key: kLlama, Target: "big-l", StallTimeoutMs: 5000}}},
		},
		MaxWaiters:  8,
		WaitTimeout: 30 * time.Second,
	}
}

// harness drives a bare state, naming requests so steps read like a script.
// After every transition it applies the effects and checks the invariants.
type harness struct {
	t       *testing.T
	s       *state
	now     time.Time
	leases  map[string]*Lease
	waiters map[string]*waiter
	names   map[*waiter]string
	errs    map[string]error
	granted []string // waiter names in grant order
	fenced  []*Lease
	lifts   []lift // refused providers' windows, in order (refused.go)
}

func newHarness(t *testing.T, cfg Config) *harness {
	return &harness{
		t: t, s: newState(cfg), now: time.Unix(1000, 0),
		leases: map[string]*Lease{}, waiters: map[string]*waiter{},
		names: map[*waiter]string{}, errs: map[string]error{},
	}
}

func chat(model string, tokens int) Request {
	return Request{Model: model, Operation: protocol.OpChatCompletions, PromptTokens: tokens}
}

// acq runs admit (+ enqueue) for a request named name.
func (h *harness) acq(name string, r Request) {
	h.t.Helper()
	l, c, err := h.s.admit(r)
	switch {
	case err != nil:
		h.errs[name] = err
	case l != nil:
		h.leases[name] = l
	default:
		w := newWaiter(r)
		h.s.enqueue(c, w, h.s.waitTimeout)
		h.waiters[name], h.names[w] = w, name
	}
	h.settle()
}

func (h *harness) release(name string, want bool) {
	h.t.Helper()
	if got := h.s.release(h.leases[name]); got != want {
		h.t.Fatalf("release(%s) = %v, want %v", name, got, want)
	}
	h.settle()
}

func (h *harness) ready(node string, gen uint64, want bool) {
	h.t.Helper()
	if got := h.s.ready(node, gen, h.now, 0); got != want {
		h.t.Fatalf("ready(%s, %d) = %v, want %v", node, gen, got, want)
	}
	h.settle()
}

func (h *harness) fence(node string, gen uint64, want int) {
	h.t.Helper()
	if got := h.s.fence(node, gen); got != want {
		h.t.Fatalf("fence(%s, %d) returned %d leases, want %d", node, gen, got, want)
	}
	h.settle()
}

func (h *harness) drain(node string, gen uint64, want bool) {
	h.t.Helper()
	if got := h.s.drain(node, gen); got != want {
		h.t.Fatalf("drain(%s, %d) = %v, want %v", node, gen, got, want)
	}
	h.settle()
}

func (h *harness) cancel(name string, want bool) {
	h.t.Helper()
	if got := h.s.cancel(h.waiters[name]); got != want {
		h.t.Fatalf("cancel(%s) = %v, want %v", name, got, want)
	}
	h.settle()
}

func (h *harness) timeout(name string) {
	h.t.Helper()
	h.s.timeout(h.waiters[name])
	h.settle()
}

func (h *harness) reconfigure(cfg Config) {
	h.t.Helper()
	h.s.reconfigure(cfg)
	h.settle()
}

func (h *harness) overlay(set bool, k Key, gen, seq uint64, want bool) {
	h.t.Helper()
	var got bool
	if set {
		got = h.s.setOverlay(k, gen, seq)
	} else {
		got = h.s.clearOverlay(k, gen, seq)
	}
	if got != want {
		h.t.Fatalf("overlay(set=%v, %v, gen %d, seq %d) = %v, want %v", set, k, gen, seq, got, want)
	}
	h.settle()
}

// settle applies s.fx to the harness records and checks invariants.
func (h *harness) settle() {
	h.t.Helper()
	for _, g := range h.s.fx.grants {
		name := h.names[g.w]
		h.leases[name] = g.l
		h.granted = append(h.granted, name)
	}
	for _, f := range h.s.fx.failed {
		h.errs[h.names[f.w]] = f.err
	}
	h.fenced = append(h.fenced, h.s.fx.fenced...)
	h.lifts = append(h.lifts, h.s.fx.lifts...)
	h.s.fx.reset()
	h.checkInvariants()
}

// checkInvariants: counters match the held-lease lists, capacity is never
// exceeded (Q2), queue counts agree, and no queued waiter is servable (the
// pump rule in doc.go).
func (h *harness) checkInvariants() {
	h.t.Helper()
	total := 0
	for k, r := range h.s.resources {
		n, long := 0, 0
		for l := r.leases; l != nil; l = l.next {
			n++
			if l.Long {
				long++
			}
		}
		if n != r.inFlight || long != r.longInFlight {
			h.t.Fatalf("%v: counters in_flight=%d long=%d, held leases %d long %d", k, r.inFlight, r.longInFlight, n, long)
		}
		if c, l := r.caps(); r.configured && (r.inFlight > c || r.longInFlight > l) {
			h.t.Fatalf("Q2 %v: in_flight %d/%d long %d/%d over capacity", k, r.inFlight, c, r.longInFlight, l)
		}
		total += n
	}
	if total != h.s.leases {
		h.t.Fatalf("state.leases = %d, held %d", h.s.leases, total)
	}
	queued := 0
	for _, g := range h.s.groupList {
		for _, c := range g.classes {
			queued += c.n
			if c.n == 0 {
				continue
			}
			if cd, _ := h.s.pick(c, nil, 0); cd != nil {
				h.t.Fatalf("Q5 G1 class %s/%s long=%v has %d waiters and a free live candidate", g.name, c.op, c.long, c.n)
			}
		}
		inFlows := 0
		for t := range g.fair.tiers {
			for _, f := range g.fair.tiers[t].active {
				n := 0
				for _, l := range f.lists {
					n += l.q.n
					for w := l.q.head; w != nil && w.next != nil; w = w.next {
						if w.seq > w.next.seq {
							h.t.Fatalf("G1 key %q's FIFO out of arrival order: %d before %d", f.key, w.seq, w.next.seq)
						}
					}
				}
				if n != f.n || n == 0 {
					h.t.Fatalf("flow %q counts %d waiters, holds %d", f.key, f.n, n)
				}
				inFlows += n
			}
		}
		cn := 0
		for _, c := range g.classes {
			cn += c.n
		}
		if inFlows != cn {
			h.t.Fatalf("group %s: flows hold %d waiters, classes count %d", g.name, inFlows, cn)
		}
	}
	for t := range h.s.skipped {
		if h.s.skipped[t] > h.s.starveGrants {
			h.t.Fatalf("G2 class %v passed over %d times, bound %d", Priorities[t], h.s.skipped[t], h.s.starveGrants)
		}
	}
	keyed := 0
	for _, kc := range h.s.keyWait {
		keyed += kc.n
	}
	if keyed != h.s.waiters {
		h.t.Fatalf("G3 keys count %d waiters, state %d", keyed, h.s.waiters)
	}
	for w := h.s.pinned.head; w != nil; w = w.next {
		queued++
		if !w.pin.live() || w.pin.free(w.cls.long) {
			h.t.Fatalf("pinned waiter %s: its holder %v is free or not live", h.names[w], w.pin.cfg.Key)
		}
	}
	if queued != h.s.waiters || h.s.all.n != h.s.waiters {
		h.t.Fatalf("waiters = %d, classes hold %d, arrival list %d", h.s.waiters, queued, h.s.all.n)
	}
}

func (h *harness) wantLease(name string, k Key) *Lease {
	h.t.Helper()
	l := h.leases[name]
	if l == nil {
		h.t.Fatalf("%s: no lease (err %v), want one on %v", name, h.errs[name], k)
	}
	if l.Key != k {
		h.t.Fatalf("%s: lease on %v, want %v", name, l.Key, k)
	}
	return l
}

func (h *harness) wantQueued(names ...string) {
	h.t.Helper()
	for _, n := range names {
		w := h.waiters[n]
		if w == nil || !w.queued {
			h.t.Fatalf("%s: not queued (lease %v, err %v)", n, h.leases[n], h.errs[n])
		}
	}
}

func (h *harness) wantErr(name string, target error, contains string) {
	h.t.Helper()
	err := h.errs[name]
	if !errors.Is(err, target) {
		h.t.Fatalf("%s: err = %v, want %v", name, err, target)
	}
	if !strings.Contains(err.Error(), contains) {
		h.t.Fatalf("%s: err %q does not mention %q", name, err, contains)
	}
}

func (h *harness) wantGranted(names ...string) {
	h.t.Helper()
	if !slices.Equal(h.granted, names) {
		h.t.Fatalf("grant order = %v, want %v", h.granted, names)
	}
}

func (h *harness) wantStats(leases, waiters int) {
	h.t.Helper()
	if h.s.leases != leases || h.s.waiters != waiters {
		h.t.Fatalf("stats = %d leases, %d waiters; want %d, %d", h.s.leases, h.s.waiters, leases, waiters)
	}
}
