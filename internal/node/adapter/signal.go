package adapter

import "sync"

// Signal is a broadcast that the residency of some model changed (SPEC
// U6): whoever reports residency takes C, reads the state, and wakes when C
// is closed by the next Notify, so no change between the read and the wait
// is lost. One Signal serves every Set of a node (Options.Residency) and
// its managed backends (their OnChange). The zero value is ready; it is
// safe for concurrent use.
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// NewSignal returns a Signal.
func NewSignal() *Signal { return &Signal{} }

// C is closed at the next Notify.
func (g *Signal) C() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return g.ch
}

// Notify wakes every holder of C. It never blocks, so it may be called
// with other locks held (a managed backend's, from its OnChange).
func (g *Signal) Notify() {
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}
