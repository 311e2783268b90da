package adapter

import (
	"fmt"
	"testing"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// E4: the node's capacity count of an adapter name goes with the last Set
// that names it: an edge that sends payload after payload with fresh
// adapter names (a compromised one, or a generator of names) leaves no
// count behind, so the node's memory does not grow with the names it was
// ever sent; a name another edge's Set still runs keeps its count.
func TestE4CapacityCountsGoWithTheirLastSet(t *testing.T) {
	profile := &iop.ConcreteProtocolProfile{
		Name: "llamacpp", BaseUrl: "http://127.0.0.1:1", AuthHeader: "Authorization", AuthScheme: "Bearer",
		ModelsPath: "/v1/models", ChatCompletionsPath: "/v1/chat/completions", HealthPath: "/health",
	}
	payload := func(names ...string) *iop.NodeConfigPayload {
		p := &iop.NodeConfigPayload{}
		for _, n := range names {
			p.Adapters = append(p.Adapters, &iop.AdapterConfig{Name: n, Type: protocol.TypeOpenAICompat, Capacity: 2,
				OpenaiCompat: &iop.OpenAICompatAdapterConfig{ProtocolProfile: profile}})
		}
		return p
	}
	c := NewCapacity()
	set := func(edge string, names ...string) *Set {
		t.Helper()
		s, err := NewSet(payload(names...), Options{Capacity: c, Edge: edge})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	counted := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.counts)
	}
	other := set("edge-2 at b:1", "shared")
	prev := set("edge-1 at a:1", "shared")
	for i := range 50 { // each refresh replaces the previous Set, then it is closed
		next := set("edge-1 at a:1", "shared", fmt.Sprintf("fresh-%d", i))
		prev.Close()
		prev = next
	}
	if n := counted(); n != 2 {
		t.Errorf("E4: %d adapter names counted after 50 refreshes with a fresh name each, want 2 (shared, the last fresh one)", n)
	}
	prev.Close()
	if n := counted(); n != 1 {
		t.Errorf("E4: %d names counted with only edge 2's Set left, want 1 (shared)", n)
	}
	other.Close()
	if n := counted(); n != 0 {
		t.Errorf("E4: %d names counted after every Set closed, want 0", n)
	}
}
