// Package responses is the OpenAI Responses surface of the run path
// (OpenAI API reference, "Responses"): Input turns a /v1/responses body
// into the normalized iop.RunInput an ollama provider takes, and Encoder
// encodes the run's events as a response object or its event stream.
//
// The run path is stateless: a request that needs stored state
// (previous_response_id, conversation, store: true, background) is a 400
// naming the field. The package owns the Responses request's field table
// (Fields) and the exact bytes of the Responses output. It must never do
// I/O, read a clock or decide a status for a node failure.
package responses
