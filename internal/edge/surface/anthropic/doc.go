// Package anthropic is the Anthropic Messages surface of the run path
// (Anthropic API reference, "Messages" and "Count Message tokens"): Input
// turns a /v1/messages or /v1/messages/count_tokens body into the
// normalized iop.RunInput an ollama provider takes, Messages encodes the
// run's events as a message object or its event stream, and Count answers
// count_tokens from the token count the backend itself reported.
//
// It owns the Messages request's field table (Fields) and the exact bytes
// of the Messages responses. It must never do I/O, read a clock, guess a
// token count, or decide a status for a node failure.
package anthropic
