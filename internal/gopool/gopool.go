// Package gopool keeps goroutines that finished a task for the next one,
// so that a per-request goroutine of the node (a run or tunnel, which
// makes the provider call) starts on a stack that already grew to what a
// request needs. A fresh goroutine starts small and grows by copying its stack,
// about twice per request on the node's tunnel path (each growth walks and
// adjusts every frame); a kept goroutine grows again only after a garbage
// collection shrank its idle stack.
//
// A Pool runs each task at once, on its most recently idle goroutine or a
// new one: it never queues a task and never bounds how many run; it keeps
// at most MaxIdle goroutines waiting for a task. Close ends the idle ones
// and waits for every goroutine it started. It owns no package-level state
// and is safe for concurrent use; a task that panics takes the process
// down as on a goroutine of its own.
package gopool

import "sync"

// Pool runs tasks on goroutines it keeps; see the package doc.
type Pool struct {
	maxIdle int

	mu     sync.Mutex
	idle   []chan func() // one per goroutine waiting for a task; the last is the most recently idle
	closed bool
	wg     sync.WaitGroup // the goroutines started and not ended
}

// New returns a Pool that keeps at most maxIdle goroutines waiting (none
// for maxIdle ≤ 0: every task gets a new goroutine, as with go).
func New(maxIdle int) *Pool {
	return &Pool{maxIdle: max(maxIdle, 0)}
}

// Go runs f on a goroutine of the pool: the most recently idle one, or a
// new one when none is idle. It never blocks on f or on other tasks.
// After Close, f runs on a new goroutine that ends with f and that Close
// does not wait for.
func (p *Pool) Go(f func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		go f()
		return
	}
	if n := len(p.idle); n > 0 {
		next := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		next <- f // buffered: the goroutine takes it when it runs
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go p.run(f, make(chan func(), 1))
}

// run is one goroutine of the pool: f, then each task handed to it on
// next, until the pool is closed or already keeps MaxIdle goroutines.
func (p *Pool) run(f func(), next chan func()) {
	defer p.wg.Done()
	for {
		f()
		f = nil // the task's closure is not kept while idle
		p.mu.Lock()
		if p.closed || len(p.idle) >= p.maxIdle {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, next)
		p.mu.Unlock()
		if f = <-next; f == nil { // Close
			return
		}
	}
}

// Idle reports how many goroutines wait for a task.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// Close ends the idle goroutines and waits until every goroutine the pool
// started has ended: those running a task end when it returns. Calling it
// again is harmless; it must not be called from a task of the same pool.
func (p *Pool) Close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, next := range idle {
		close(next)
	}
	p.wg.Wait()
}
