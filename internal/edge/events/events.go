// Package events is the Edge's bounded, droppable fan-out of node lifecycle
// events: node.connected on a node's first ready transition and
// node.disconnected when its ready generation is fenced (SPEC N4, L5, L8),
// node.draining when a node shuts down gracefully, and provider health
// changes (provider.unavailable when the runtime-unavailable overlay is set,
// provider.available when a recovery probe clears it, SPEC H8–H10;
// provider.cooling and provider.readmitted around a passive-health
// ejection).
//
// It owns delivery only. Publish never blocks: a subscriber whose buffer is
// full loses the event and the loss is counted. Nothing in the Edge may wait
// for, or depend on, an event being delivered: leases, fencing and queue
// settlement happen before and regardless of Publish (SPEC L10). An Event
// names the node and nothing else about it: no connection id, generation,
// address or credential ever goes into one (SPEC P4, N3).
package events

import (
	"sync"
	"sync/atomic"
	"time"
)

// Event types (SPEC N4).
const (
	TypeConnected    = "node.connected"
	TypeDisconnected = "node.disconnected"
	// TypeDraining: a ready node said it is shutting down (SIGTERM); it
	// gets no new work and its disconnection follows.
	TypeDraining = "node.draining"
	// TypeProviderUnavailable: a provider got the runtime-unavailable
	// overlay (SPEC H8): excluded from candidates.
	TypeProviderUnavailable = "provider.unavailable"
	// TypeProviderAvailable: a recovery probe cleared the overlay (SPEC
	// H10).
	TypeProviderAvailable = "provider.available"
	// TypeProviderCooling: passive health ejected a provider for a cooling
	// window; Reason names why and until when.
	TypeProviderCooling = "provider.cooling"
	// TypeProviderReadmitted: the cooling window ended; a candidate again.
	TypeProviderReadmitted = "provider.readmitted"
)

// Event is one node lifecycle event.
type Event struct {
	// Type is TypeConnected or TypeDisconnected.
	Type string `json:"type"`
	// Node is the node id.
	Node string `json:"node"`
	// Provider is the provider id (adapter instance name) of a provider.*
	// event; empty for node events.
	Provider string `json:"provider,omitempty"`
	// Time is when the Edge made the transition.
	Time time.Time `json:"time"`
	// Reason says why a node disconnected, e.g. "heartbeat timeout";
	// empty for TypeConnected.
	Reason string `json:"reason,omitempty"`
}

// Bus fans events out to subscribers. The zero value is ready to use; a Bus
// must not be copied after first use. All methods are safe for concurrent
// use.
type Bus struct {
	mu   sync.RWMutex // guards subs; held for reading during Publish's non-blocking sends
	subs map[*subscriber]struct{}
	lost atomic.Uint64 // one per (event, subscriber) drop, ever
}

type subscriber struct {
	ch chan Event
}

// Publish offers e to every subscriber without blocking: a subscriber whose
// buffer is full drops it, and the drop is counted (Dropped). It never
// fails and returns after at most one non-blocking send per subscriber.
func (b *Bus) Publish(e Event) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for s := range b.subs {
		select {
		case s.ch <- e:
		default:
			b.lost.Add(1)
		}
	}
}

// Subscribe returns a channel receiving events published from now on, with
// room for buf events (buf < 1 means 1), and a cancel function that
// unsubscribes and closes the channel. cancel is idempotent; the channel
// may still hold buffered events after it.
func (b *Bus) Subscribe(buf int) (<-chan Event, func()) {
	if buf < 1 {
		buf = 1
	}
	s := &subscriber{ch: make(chan Event, buf)}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = make(map[*subscriber]struct{})
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			b.mu.Lock()
			delete(b.subs, s)
			b.mu.Unlock()
			close(s.ch)
		})
	}
}

// Dropped reports how many deliveries were dropped since the Bus was made:
// one per event per subscriber whose buffer was full (a subscriber that was
// cancelled since still counts).
func (b *Bus) Dropped() uint64 { return b.lost.Load() }

// Subscribers reports how many subscriptions are active.
func (b *Bus) Subscribers() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.subs)
}
