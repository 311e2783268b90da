package api

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// The client connections the Handler counts against http.max_connections,
// and which of them it sheds when the bound is reached, so that clients
// without a key cannot crowd out clients with one (docs/operating.md,
// "Client connections").
//
// A connection holds a slot from its accept until it closes. While it
// serves no request — just accepted and its first request head not yet
// read, or idle between keep-alive requests — it is quiet, and a quiet
// connection may be shed (closed) to give its slot to another:
//
//   - a new connection beyond the bound takes the slot of the quiet
//     connection that never presented a valid API key and has been quiet
//     longest (idle ones before ones still reading their first head);
//     without one it is over the bound: its requests get a fast 503 (and
//     beyond twice the bound it is closed at accept);
//   - a request that presents a valid key on a connection over the bound
//     takes the slot of the longest-quiet connection without a key, else of
//     the longest-idle connection with one; without either it gets the
//     503.
//
// So connections without a key only ever shed each other at accept, and a
// keyed client's idle connection goes only to another keyed client's
// request. A connection serving a request is never shed. Shedding an idle
// connection races, like any idle timeout, with a request the client may
// be sending on it just then.
//
// Lock order: connTable.mu is a leaf; conn closes happen after it is
// released.
type connTable struct {
	mu      sync.Mutex
	byConn  map[net.Conn]*clientConn // every open connection, until its StateClosed
	counted int                      // connections holding a slot
	over    int                      // connections beyond the bound
	// quiet lists the slot holders serving no request, longest quiet
	// first: [quietFresh] accepted, no request head read yet, no key;
	// [quietIdle] idle after a request without a key; [quietKeyed] idle,
	// a request presented a valid key.
	quiet [nQuiet]connList
}

const (
	quietFresh = iota
	quietIdle
	quietKeyed
	nQuiet
	quietNone = -1
)

// clientConn is one client connection's entry. Its fields are guarded by
// connTable.mu; keyed and over are written under it and read by the
// connection's requests without it.
type clientConn struct {
	c          net.Conn
	keyed      atomic.Bool // a request on it presented a valid API key
	over       atomic.Bool // it holds no slot: its requests get the 503
	shed       bool        // closed by the table; its slot went to another
	list       int8        // its quiet list, quietNone when in none
	prev, next *clientConn
}

// connList is an intrusive FIFO of clientConns.
type connList struct{ first, last *clientConn }

func (t *connTable) push(cc *clientConn, list int8) {
	l := &t.quiet[list]
	cc.list, cc.prev, cc.next = list, l.last, nil
	if l.last != nil {
		l.last.next = cc
	} else {
		l.first = cc
	}
	l.last = cc
}

func (t *connTable) unlist(cc *clientConn) {
	if cc.list == quietNone {
		return
	}
	l := &t.quiet[cc.list]
	if cc.prev != nil {
		cc.prev.next = cc.next
	} else {
		l.first = cc.next
	}
	if cc.next != nil {
		cc.next.prev = cc.prev
	} else {
		l.last = cc.prev
	}
	cc.list, cc.prev, cc.next = quietNone, nil, nil
}

// victim takes the longest-quiet connection of the first non-empty list
// of lists out of the table's lists and marks it shed; nil when all are
// empty. The caller gives its slot to another and closes it.
func (t *connTable) victim(lists ...int8) *clientConn {
	for _, l := range lists {
		if cc := t.quiet[l].first; cc != nil {
			t.unlist(cc)
			cc.shed = true
			return cc
		}
	}
	return nil
}

// accept counts c, a new connection, with max the bound: it holds a slot
// (maybe one shed from a quiet connection without a key, returned to be
// closed) or is over the bound; closeNow says it is beyond twice the bound.
func (t *connTable) accept(c net.Conn, max int) (cc *clientConn, shed *clientConn, closeNow bool) {
	cc = &clientConn{c: c, list: quietNone}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byConn == nil {
		t.byConn = map[net.Conn]*clientConn{}
	}
	t.byConn[c] = cc
	switch {
	case t.counted < max:
		t.counted++
	default:
		if shed = t.victim(quietIdle, quietFresh); shed == nil {
			cc.over.Store(true)
			t.over++
			return cc, nil, t.counted+t.over > 2*max
		}
	}
	t.push(cc, quietFresh)
	return cc, shed, false
}

// state follows a connection's http.ConnState.
func (t *connTable) state(c net.Conn, s http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cc := t.byConn[c]
	if cc == nil {
		return
	}
	switch s {
	case http.StateActive:
		t.unlist(cc)
	case http.StateIdle:
		t.unlist(cc)
		if !cc.over.Load() && !cc.shed {
			list := int8(quietIdle)
			if cc.keyed.Load() {
				list = quietKeyed
			}
			t.push(cc, list)
		}
	case http.StateClosed, http.StateHijacked:
		t.unlist(cc)
		delete(t.byConn, c)
		switch {
		case cc.over.Load():
			t.over--
		case !cc.shed:
			t.counted--
		}
	}
}

// keyed marks cc: a request on it presented a valid key. It is serving
// that request, so it is in no quiet list now.
func (t *connTable) keyed(cc *clientConn) {
	if cc == nil || cc.keyed.Load() {
		return
	}
	t.mu.Lock()
	cc.keyed.Store(true)
	t.mu.Unlock()
}

// claim gives cc, over the bound and serving a request with a valid key, a
// slot: a free one, else one shed from a quiet connection (returned to be
// closed). ok is false when every slot holder is serving a request.
func (t *connTable) claim(cc *clientConn, max int) (ok bool, shed *clientConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !cc.over.Load() {
		return true, nil
	}
	if t.counted < max {
		t.counted++
	} else if shed = t.victim(quietIdle, quietFresh, quietKeyed); shed == nil {
		return false, nil
	} // else the shed connection's slot is cc's
	t.over--
	cc.over.Store(false)
	return true, shed
}

// open reports the connections counted: holding a slot, and over the
// bound.
func (t *connTable) open() (counted, over int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counted, t.over
}
