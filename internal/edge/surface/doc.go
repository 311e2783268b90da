// Package surface holds what every client-surface converter of the Edge
// shares: the client-visible Error and its OpenAI and Anthropic wire shapes,
// JSON string encoding, the request field tables (Field, Disposition) with
// the Shapes of their nested objects and the zero-allocation check of a
// body's members against them at any depth (CheckMembers, DecodeRequest),
// the checks every surface shares (advisory values, sampling ranges, tool
// round trips: CheckToolPairing), inline images (data: URLs and base64 of
// jpeg, png, gif or webp whose bytes are that type; never a URL a node
// would fetch), the streamed-text bookkeeping of an
// encoder (Text), the restoration of assistant tool calls from a run's
// COMPLETE event (SPEC E8, E9), and the Encoder contract that the
// per-surface packages (surface/openai, surface/anthropic,
// surface/responses) implement.
//
// Each surface is a package of pure functions and values: a request body in,
// a normalized iop.RunInput out (or an Error naming the field); run events
// in, response bytes appended to a caller's buffer out. None of them does
// I/O, reads a clock or keeps package-level state.
//
// It must never: write to a connection or an http.ResponseWriter (that is
// internal/edge/api), decide a status for a node failure (api maps a node's
// ERROR terminal), or log anything.
package surface
