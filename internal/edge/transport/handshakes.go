package transport

import (
	"container/list"
	"net"
	"sync"
)

// handshakes is the set of accepted node_listen connections whose TLS
// handshake has not ended, oldest first, bounded by Options.MaxHandshakes
// the way http.max_connections bounds the client listener: at the bound a
// new connection takes the slot of the one that has been in its handshake
// longest, which is closed. Refusing the new one instead would let anyone
// who reaches the port and holds MaxHandshakes connections open (each
// renewed before HandshakeTimeout, some 26 a second at the defaults) keep
// every node from reconnecting; shedding the oldest means such a peer has
// to open MaxHandshakes connections within one real node's handshake
// (a round trip or two) to keep it out.
//
// Lock order: mu is a leaf; the shed connection is closed after it is
// released.
type handshakes struct {
	mu sync.Mutex
	l  list.List // of net.Conn
}

// admit adds c, a connection just accepted, with max the bound (> 0). At
// the bound it takes the oldest connection out of the set and returns it
// for the caller to close (its handshake then fails and its goroutine
// ends as any refused handshake's). e is c's entry for done.
func (h *handshakes) admit(c net.Conn, max int) (e *list.Element, shed net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.l.Len() >= max {
		shed = h.l.Remove(h.l.Front()).(net.Conn)
	}
	return h.l.PushBack(c), shed
}

// done takes e out of the set: its handshake ended (either way), or its
// connection was closed before one began. Calling it for an entry that was
// shed, or twice, does nothing.
func (h *handshakes) done(e *list.Element) {
	h.mu.Lock()
	h.l.Remove(e) // a no-op for an element no longer in h.l
	h.mu.Unlock()
}

// len reports the connections in their handshake.
func (h *handshakes) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.l.Len()
}
