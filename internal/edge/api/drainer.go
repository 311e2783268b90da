package api

import (
	"context"
	"sync"
	"sync/atomic"
)

// drainer counts the requests in flight and carries the graceful drain:
// after Drain every new request is refused; Stop ends those still in flight
// through their contexts. The zero value is not ready; see newDrainer.
type drainer struct {
	active   atomic.Int64  // requests inside ServeHTTP
	draining atomic.Bool   // Drain was called
	idle     chan struct{} // cap 1: a request ended with active 0 while draining
	// detached counts the cancel-confirmation goroutines (handOff) still
	// holding a lease; detachedIdle (cap 1) is signalled when it drops to 0.
	detached     atomic.Int64
	detachedIdle chan struct{}
	stop         context.Context
	stopFn       context.CancelFunc
	once         sync.Once
}

func newDrainer() *drainer {
	ctx, cancel := context.WithCancel(context.Background())
	return &drainer{idle: make(chan struct{}, 1), detachedIdle: make(chan struct{}, 1), stop: ctx, stopFn: cancel}
}

// detach counts one cancel-confirmation goroutine in; its done must be
// called when it has released its lease.
func (d *drainer) detach() (done func()) {
	d.detached.Add(1)
	return func() {
		if d.detached.Add(-1) == 0 {
			select {
			case d.detachedIdle <- struct{}{}:
			default:
			}
		}
	}
}

// enter counts one request in; false when the Edge drains (the request is
// counted all the same and must exit).
func (d *drainer) enter() bool {
	d.active.Add(1)
	return !d.draining.Load()
}

func (d *drainer) exit() {
	if d.active.Add(-1) == 0 && d.draining.Load() {
		select {
		case d.idle <- struct{}{}:
		default:
		}
	}
}
