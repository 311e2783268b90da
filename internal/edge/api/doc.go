// Package api is the Edge's client HTTP front: the OpenAI-compatible and
// Anthropic-compatible endpoints, client authentication and admission
// (SPEC T5, Q3, T3, T4; docs/surfaces.md). Each admitted model request is
// served by internal/edge/exchange (lease, dispatch, relay, re-dispatch);
// the conversions between a surface's requests/responses and the
// normalized run path are pure functions in internal/edge/surface/*; the
// response writer, access record and error shapes are internal/edge/reply's.
//
// It owns: routing and error shapes (OpenAI {"error":{...}}, Anthropic
// {"type":"error","error":{...}}); API-key checks; reading bodies under
// http.max_body_bytes; the head parse; the request's schedule (its key,
// weight, class, local_only) and token reservation; the model lists;
// drain; connection bounds.
//
// It must never: touch a node socket, forward client credentials,
// hop-by-hop or X-Iop-* headers upstream (T4), log keys or bodies (P4), or
// release a lease (the exchange does, exactly once, Q2). Imports run api →
// exchange → reply and api → reply, never back (./run.sh test).
//
// # Files
//
// From the ground up (each file uses only those before it in this list):
//
//   - errors.go: the errors, reject and closeUnread; jsonscan.go: reading
//     body values; endpoints.go: the model endpoints; metrics.go: Metric.
//   - body.go, conns.go, drainer.go: the body read under its bounds, the
//     connection table, the in-flight count (hostile-client bounds).
//   - head.go: the head parse; prefix.go: a conversation's prefix for
//     prefix_affinity; models.go: the model lists' bodies; limits.go,
//     headers.go: the bounds' state and the 431 listener.
//   - handler.go: Options (the interfaces it takes are exchange's),
//     Handler, New, the config view, Metrics.
//   - auth.go: the request's key and authentication; priority.go: the
//     request's class (SPEC G1, G4); drain.go: SIGTERM (Drain, Stop).
//   - bounds.go: the Handler's bounds (connections, heads, bodies);
//     batches.go: the Files and Batch API's hand-off; keys.go: a key's
//     bounds and rate-limit headers (K5, K6).
//   - routes.go: the one endpoint table keyed by path (endpoints, routeOf),
//     route and the model lists' answers; admit.go: a model request up to
//     its exchange (body, head, scope, schedule, reservation).
//   - serve.go: ServeHTTP and /healthz.
//
// # Request lifecycle
//
// ServeHTTP → authenticate → read body (413 over the cap; the buffer grows
// with the bytes received, see body.go) → parseHead (400
// naming the field) → Pool.Acquire (404/400/429/503) → with the credential
// plane on, the route's credential lease (exchange's start.go; 502 when none can
// be issued) → StartTunnel or StartRun by lease type → relay → Stream.Close
// → Pool.Release. relay is the
// only loop: it calls Stream.Recv with a context that ends when the client
// disconnects, the lease is fenced (one watcher goroutine per request, gone
// when relay returns) or the response-wait timer fires (time.AfterFunc, reset
// per envelope); each of those, and a failed write, calls Stream.Cancel at
// once. Exactly one terminal outcome is written per request: a success, an
// error response before any byte, or an error event after bytes.
//
// # Accounting and drain
//
// Every response carries X-Request-Id (access.RequestID: the client's,
// sanitized and bounded, or a new one), which also rides the RunRequest or
// ProviderTunnelRequest to the node. ServeHTTP wraps the ResponseWriter in a
// reply.Recorder that notes the status line and the time of the
// first byte; the rest of the layer fills the same access.Record (principal,
// model, lease, queue wait, tokens, the client leaving, the error written)
// and reply.Books.End writes it exactly once when the handler returns: one access-log
// line (Options.AccessLog) and one Metrics sample, whatever the outcome,
// even when the handler aborts the connection. /healthz is not recorded.
//
// Drain (drain.go) makes every new request a 503 with Retry-After while
// the ones in flight go on; Stop ends what is left through each request's
// context (ErrShutdown): node work is cancelled and the client gets a 503
// or its surface's error event (code edge_shutdown). the edge daemon (edge.Serve) calls them on
// SIGTERM around shutdown.drain_timeout_ms.
//
// # Hostile clients
//
// Memory follows the bytes a peer sent, capped, never what it declared, and
// every per-client resource has a bound (limits.go, internal/edge/limit):
//   - connections: counted by ConnContext/ConnState (conns.go); at
//     http.max_connections a new connection takes the slot of the
//     longest-quiet connection that never presented a valid key, a
//     request with a valid key on a connection beyond the bound takes one
//     from a quiet connection, any other request there gets a fast 503,
//     and beyond twice the bound the connection is closed at accept; the
//     accept loop never waits.
//   - API keys: api_keys[].max_concurrent and requests_per_minute are
//     checked right after authentication, before the body is read (429).
//   - request bodies (body.go): the buffer starts at 4 KiB and doubles as
//     bytes arrive, up to Content-Length or http.max_body_bytes; each growth
//     is reserved against http.max_inflight_body_bytes first (503) and
//     given back when the body is dropped (the first response byte or the
//     request's end). The read has a deadline (408).
//   - node frames reach the surface through dispatch.Stream, whose buffer is
//     bounded by bytes in internal/edge/transport.
//   - conversions: the run path decodes the client body once
//     (surface/openai.ChatInput, bounded by the body); run events are
//     encoded into pooled buffers of one event each; what an encoder holds
//     until COMPLETE (a non-stream answer, text that may be a tool call) is
//     bounded by maxRunText (run.go). The tunnel path copies the body once
//     to splice "model", streams frames through unbuffered and holds a
//     plain body until END up to maxHeldBody (tunnel.go).
//
// Refusals are logged at most ratelog.DefaultBurst lines a second per kind,
// with the count of suppressed lines; a 429's line names the principal,
// never the key (SPEC P4).
//
// # Stalls (SPEC H8, H11)
//
// A response_stalled terminal (RunEvent or ProviderTunnelFrame ERROR) goes
// to Options.Health before the sink sees it: the evidence is validated
// against the lease (transport identity, never payload identity) and a
// validated stall gets provider_id, provider_health and
// recovery_handoff="confirmed". With a confirmed handoff, while the
// request's attempt bound is not used up, nothing was written and the
// client is there, the stalled lease goes back and the request is
// re-dispatched to a provider it has not tried (waiting at most
// RedispatchWait); otherwise the stall is answered: 504 before any byte, an
// error event after bytes. Every lease goes back exactly once.
//
// # Failures before the first byte
//
// The same holds for a provider that could not be reached, reset the
// connection before its response head, answered a failing 5xx
// (outlier_detection.statuses) or 429, broke its response before any byte
// reached the client, or whose node refused or lost the request: the
// failure is kept from the client, the lease goes back and the request goes
// to a provider of its group it has not tried, within models[].max_attempts
// and the request's deadline (attempt.go). Passive health
// (internal/edge/outlier, Options.Outlier) hears each attempt's verdict
// first, so a failing provider is cooling before the pool picks again —
// but only evidence whose typed adapter and target are the lease's (SPEC
// H8), and a failure the request's own input may have caused (a reset
// before the head, 500, 504) only as a suspicion that needs another
// provider's answer to the same request or a second principal's failure
// (attempt.go; docs/config.md, "What cools a provider"). A re-dispatch
// stays within the credential slot of the route the request was bound to
// (SPEC C6).
// With no candidate left the client gets the last failure: the upstream's
// own answer on the tunnel path, its class on the run path (below).
//
// # Statuses
//
// 400 bad input (the message names the field), 401 missing or wrong key,
// 404 unknown model or path, 405 wrong method, 413 body over the cap, 429
// queue full or an API key's max_concurrent / requests_per_minute
// (Retry-After), 502 provider failure before any byte, 503 no live provider
// before the wait timeout (names the model and why), the node's capacity
// gate, a connection beyond http.max_connections or a body beyond
// http.max_inflight_body_bytes (Retry-After), 504 response stalled (failure_code
// response_stalled) or the Edge's response-wait timeout. On the tunnel path
// an upstream status passes through with its body and Retry-After. On the
// run path an upstream status keeps its class with the upstream's message
// (never an upstream address or adapter name): 429 with Retry-After (the
// upstream's, else 1 s), 503 and 504, other 5xx as 502, client errors (400,
// 413, 422 …) as they are; 401/403/404/407 describe the provider's own
// setup and are 502.
package api
