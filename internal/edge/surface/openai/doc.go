// Package openai is the OpenAI chat completions surface of the run path
// (SPEC Q3, T5; OpenAI API reference, "Create chat completion"): ChatInput
// turns a request body into the normalized iop.RunInput an ollama provider
// takes, and Chat encodes the run's events as a chat.completion or a stream
// of chat.completion.chunk events.
//
// It owns the chat request's field table (which fields are translated,
// which are refused with a 400 naming them) and the exact bytes of the
// chat response. It must never do I/O, read a clock (the caller passes
// "created" and the id source) or decide a status for a node failure.
package openai
