// Package exchange serves one admitted client request from its lease to
// its last release (SPEC Q2, Q3, H8, H11, H12, T2, T3, T5, E4, C2, C6): it
// acquires the lease (waiting in the model group's queue), sends the
// request to the lease's node as a tunnel or a normalized run, relays the
// node's stream to the client through the path's sink, and re-dispatches a
// failure before the first byte to a provider not tried yet, or to a
// fallback group when its own cannot serve it any more (V1). Its caller is
// internal/edge/api, which admits the request (body, head, key scope,
// schedule, token reservation) and hands over an Exchange with every input
// set.
//
// It owns: exactly one release of every lease (Pool.Release, or
// ReleaseRefused after an over-capacity refusal; a cancelled stream's
// lease is held until the node confirms), exactly one terminal outcome per
// request, the re-dispatch (the attempt machine, attempt.go: pure, no I/O,
// its table test TestAttemptMachine), the one reading of each node
// envelope (classify.go), the relay (its watchers: the client, the lease's
// fence, the response-wait timer), the run and tunnel sinks (run.go,
// tunnel.go), the credential lease per attempt (start.go), passive
// health's verdicts and the stall records, and each attempt's trace span.
//
// It never: routes (the pool picks, and routing.DecideFallback picks a
// fallback group from the pool's group states; exchange asks with the
// same request, or carries the fallback out), authenticates or reads a body (api does both before
// Serve), touches a node socket (it talks to internal/edge/dispatch only),
// forwards client credentials or X-Iop-* headers (T4), or logs keys or
// bodies (P4). It never imports internal/edge/api: what it needs of the
// rest of the Edge comes in Deps, interfaces and functions; the rule api →
// exchange → reply is checked by ./run.sh test.
//
// # Goroutines
//
// Serve runs on the request's own goroutine and returns when the request
// is answered. It starts one goroutine only: handOff, for a stream
// cancelled before its terminal, which keeps the lease until the node's
// terminal (or the session's loss, the fence, Deps.CancelDrainTimeout)
// and then releases it; it is counted through Deps.Detach. The fence
// watcher is a context.AfterFunc callback and the response-wait timer a
// time.AfterFunc, both stopped before relay returns.
//
// # Files
//
// From the ground up (each file uses only those above it in this list,
// but attempt.go and classify.go, which use each other):
//
//   - deps.go: Deps and the interfaces it takes.
//   - attempt.go, classify.go: the pure machine and the one reading of an
//     envelope (and of a node terminal's client error).
//   - engine.go: Engine, the errors, Schedule, PoolError.
//   - exchange.go: Endpoint, Exchange, the sink interface.
//   - run.go, tunnel.go: the sinks of the two paths (SPEC T2, T5).
//   - relay.go: relay, deliver, the attempt machine's effects, the
//     hand-off, the attempt's span.
//   - fallback.go: the move to another model group on arrival and after
//     admission (SPEC V1–V3), its counters, and take: every Acquire,
//     with the fallbacks the attempt machine asks for on the way.
//   - redispatch.go: reacquire and the answer when no candidate is left.
//   - start.go: the request on its lease by lease type (SPEC Q3), its
//     credential lease (C2).
//   - serve.go: Serve and the first Acquire.
package exchange
