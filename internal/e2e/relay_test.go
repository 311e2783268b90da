package e2e

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relay is an in-test TCP relay between nodes and the Edge's node listener.
// Each accepted connection is one pipe to a fresh connection to the target.
// A frozen pipe stops forwarding in both directions but keeps both sockets
// open and keeps reading them (what it reads is discarded, a close is not
// passed on): a half-open path as a dead NAT or a silent network leaves it.
type relay struct {
	ln       net.Listener
	target   string
	accepted *recorder[time.Time] // when each pipe was accepted
	mu       sync.Mutex
	pipes    []*pipe
	closed   bool
	refusing bool // new connections are closed at once (refuse)
	refused  int
	wg       sync.WaitGroup
}

// pipe is one relayed connection: node side a, Edge side b.
type pipe struct {
	a, b   net.Conn
	frozen atomic.Bool
	// edgeGone is closed when the Edge's side ended (read error) after the
	// pipe froze: the Edge closed the connection it could not hear from.
	edgeGone chan struct{}
	// edgeBytesFrozen counts bytes the Edge sent into the frozen pipe.
	edgeBytesFrozen atomic.Int64
}

func startRelay(t testing.TB, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, accepted: newRecorder[time.Time]()}
	r.wg.Add(1)
	go r.acceptLoop()
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) acceptLoop() {
	defer r.wg.Done()
	for {
		a, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		refuse := r.refusing
		if refuse {
			r.refused++
		}
		r.mu.Unlock()
		if refuse {
			a.Close()
			continue
		}
		b, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			a.Close()
			continue
		}
		p := &pipe{a: a, b: b, edgeGone: make(chan struct{})}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			a.Close()
			b.Close()
			return
		}
		r.pipes = append(r.pipes, p)
		r.wg.Add(2)
		r.mu.Unlock()
		r.accepted.add(time.Now())
		go r.copy(p, p.b, p.a, false) // node → Edge
		go r.copy(p, p.a, p.b, true)  // Edge → node
	}
}

// copy forwards src to dst until src fails. While the pipe is not frozen a
// failure closes both sides; once frozen nothing is passed on.
func (r *relay) copy(p *pipe, dst, src net.Conn, fromEdge bool) {
	defer r.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.frozen.Load() {
				if fromEdge {
					p.edgeBytesFrozen.Add(int64(n))
				}
			} else if _, werr := dst.Write(buf[:n]); werr != nil && !p.frozen.Load() {
				p.a.Close()
				p.b.Close()
				return
			}
		}
		if err != nil {
			if p.frozen.Load() {
				if fromEdge {
					close(p.edgeGone)
				}
				return
			}
			p.a.Close()
			p.b.Close()
			return
		}
	}
}

// freeze freezes every pipe accepted so far and returns them; later
// connections are forwarded normally (a fresh path).
func (r *relay) freeze() []*pipe {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := append([]*pipe(nil), r.pipes...)
	for _, p := range ps {
		p.frozen.Store(true)
	}
	return ps
}

// refuse closes every connection accepted from now on at once (the node's
// redials find no path) until accept; it returns how many it refused so far.
func (r *relay) refuse(on bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusing = on
	return r.refused
}

// cutNodeSide freezes every pipe accepted so far and closes its node side:
// the node sees its connection end at once while the Edge's side stays open
// and silent.
func (r *relay) cutNodeSide() []*pipe {
	ps := r.freeze()
	for _, p := range ps {
		p.a.Close()
	}
	return ps
}

func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	r.ln.Close()
	for _, p := range r.pipes {
		p.a.Close()
		p.b.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
