// Package reply is what one client request's answer is written through,
// shared by internal/edge/api (the HTTP front) and internal/edge/exchange
// (an admitted request's attempts): a leaf that imports neither.
//
// It owns: the request's response writer and access record (Recorder: the
// status line, the time of the first byte, principal, model, lease, queue
// wait, tokens, the client leaving, the error written; Books.End writes it
// exactly once: one access-log line, one metrics sample, SPEC A1); the
// client error's one type (Error, which is surface.Error) and its shapes
// (WriteError: OpenAI {"error":{...}} or Anthropic
// {"type":"error","error":{...}}; AppendErrorEvent after bytes); burst
// flushing (Output: one client write per burst of frames, SPEC T2); and the
// request's trace (Trace: its own span, its queue spans, its attempts'
// spans and the node spans they relay; docs/operating.md "Tracing").
//
// It never: decides an outcome (which error, whether to retry), reads a
// request body, talks to the pool or a node, or logs (the access line is
// the caller's logger's).
//
// Goroutines: none. A Recorder, its Trace and an Output belong to the
// request's goroutine; Books is read-only after construction.
package reply
