package edge

import (
	"testing"
	"time"

	"iop/internal/edge/events"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
)

// N4, H8–H10: provider health changes the pool applies reach
// the droppable fan-out as provider.* events naming node and provider;
// changes the pool refuses publish nothing.
func TestProviderEvents(t *testing.T) {
	k := pool.Key{Node: "gpu-1", Provider: "ollama"}
	p := pool.New(pool.Config{Nodes: []string{"gpu-1"}, Resources: []pool.Resource{{Key: k, Type: "ollama", Capacity: 1,
		LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}}}}, pool.SystemClock())
	bus := &events.Bus{}
	ch, cancel := bus.Subscribe(8)
	defer cancel()
	p.NodeReady("gpu-1", 1)
	ov, ej := overlayEvents{p, bus}, ejectEvents{p, bus}
	steps := []struct {
		name string
		do   func() bool
		want string // event type, "" = none
	}{
		{"H8 overlay set", func() bool { return ov.SetOverlay(k, 1, 1) }, events.TypeProviderUnavailable},
		{"H8 stale overlay refused", func() bool { return !ov.SetOverlay(k, 1, 1) }, ""},
		{"H10 overlay cleared", func() bool { return ov.ClearOverlay(k, 1, 2) }, events.TypeProviderAvailable},
		{"ejected", func() bool { return ej.Eject(k, time.Unix(1800000000, 0), "status") }, events.TypeProviderCooling},
		{"readmitted", func() bool { return ej.Readmit(k) }, events.TypeProviderReadmitted},
		{"readmit of a provider not ejected", func() bool { return !ej.Readmit(k) }, ""},
	}
	for _, s := range steps {
		if !s.do() {
			t.Fatalf("%s: the pool answered otherwise", s.name)
		}
		select {
		case ev := <-ch:
			if s.want == "" || ev.Type != s.want || ev.Node != "gpu-1" || ev.Provider != "ollama" {
				t.Errorf("%s: event %+v, want %q for gpu-1/ollama", s.name, ev, s.want)
			}
		default:
			if s.want != "" {
				t.Errorf("%s: no %s event", s.name, s.want)
			}
		}
	}
}
