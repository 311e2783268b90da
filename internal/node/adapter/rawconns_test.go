package adapter_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// rawConns is what the raw-TCP fakes of a backend's connection behaviour
// share: a loopback listener, a count of accepted connections, and at
// cleanup the listener and every connection still open closed and every
// serving goroutine waited for (no goroutine left behind).
type rawConns struct {
	ln    net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	open  map[net.Conn]bool
}

// listen starts the accept loop; serve runs on its own goroutine per
// connection and must call done(c) when it returns.
func (r *rawConns) listen(t *testing.T, serve func(c net.Conn)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.ln, r.open = ln, map[net.Conn]bool{}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.conns.Add(1)
			r.mu.Lock()
			r.open[c] = true
			r.mu.Unlock()
			r.wg.Add(1)
			go serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for c := range r.open {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
}

// done forgets c, closes it and ends its serving goroutine's count.
func (r *rawConns) done(c net.Conn) {
	r.mu.Lock()
	delete(r.open, c)
	r.mu.Unlock()
	c.Close()
	r.wg.Done()
}

func (r *rawConns) url() string { return "http://" + r.ln.Addr().String() }
