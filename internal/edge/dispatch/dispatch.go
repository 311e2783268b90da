// Package dispatch is the seam between the Edge's HTTP surface (api) and its
// node transport: the surface asks for a run or tunnel on a leased
// (node, generation) and reads the node's frames back; the transport never
// builds an HTTP response (SPEC T5, P2) and the surface never touches a
// socket. It holds interfaces and sentinels only.
package dispatch

import (
	"context"
	"errors"
	"fmt"

	iop "iop/proto/gen/iop"
)

// Errors a Dispatcher or Stream returns; test with errors.Is.
var (
	// ErrNotReady: the (node, generation) is not the current ready owner,
	// e.g. fenced between lease grant and dispatch (SPEC L3, L9).
	ErrNotReady = errors.New("dispatch: node session not ready")
	// ErrSessionLost: the session ended before the stream's terminal
	// (SPEC E6, L8). The surface ends the request with one error outcome.
	ErrSessionLost = errors.New("dispatch: node session lost")
	// ErrNodeDrained: the session ended after the node announced its
	// drain (NodeDrainingNotice, A3), typically a request dispatched
	// just before the Edge read the notice that reached a node already
	// closing. It is an ErrSessionLost too (errors.Is matches both); the
	// node never started the request.
	ErrNodeDrained = fmt.Errorf("%w after the node announced its drain", ErrSessionLost)
	// ErrSlowConsumer: the stream's receive buffer overflowed because its
	// reader fell behind; the stream was cancelled rather than stall the
	// session's read loop.
	ErrSlowConsumer = errors.New("dispatch: stream reader too slow")
	// ErrSendQueueFull: the request could not be queued to the node.
	ErrSendQueueFull = errors.New("dispatch: node send queue full")
	// ErrProtocol: the node broke the stream's order (SPEC E3, T2: an
	// event before START, seq not increasing, …); the stream was cancelled
	// and the misordered envelope and everything after it dropped.
	ErrProtocol = errors.New("dispatch: node broke the stream protocol")
)

// Target is the leased node session a request goes to.
type Target struct {
	Node       string
	Generation uint64
}

// Stream is one run or tunnel in flight on a node session.
type Stream interface {
	// RunID is the Envelope.run_id the transport assigned.
	RunID() string
	// Recv returns the stream's next envelope (a RunEvent or a
	// ProviderTunnelFrame) in the order the node sent them. After the
	// terminal envelope it returns io.EOF; when the session is lost first,
	// ErrSessionLost; on ctx done, ctx.Err() (the stream stays usable).
	Recv(ctx context.Context) (*iop.Envelope, error)
	// Pending reports whether Recv would return an envelope without
	// waiting: the relay flushes the client response once per burst of
	// frames that arrived together, never holding one back to wait for
	// the next (SPEC T2).
	Pending() bool
	// Cancel sends CancelRequest{reason} to the node once (SPEC T3, E5);
	// a no-op after the terminal or session loss.
	Cancel(reason string)
	// Close unregisters the stream; it cancels first when no terminal was
	// seen. Frames arriving later are dropped. Idempotent.
	Close()
}

// Dispatcher starts streams on node sessions. Implementations assign the
// run id and return ErrNotReady when t is not the current ready owner.
type Dispatcher interface {
	StartRun(t Target, req *iop.RunRequest) (Stream, error)
	StartTunnel(t Target, req *iop.ProviderTunnelRequest) (Stream, error)
}
