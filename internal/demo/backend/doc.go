// Package backend is the project's demo backend: a small DETERMINISTIC
// STAND-IN for a real model server, not a model. It answers with fixed text
// in the byte formats that real Ollama 0.17 and llama.cpp llama-server write
// (the captures in testdata/, listed in testdata/README.md), so that
// ./run.sh, the e2e suite and the benchmark have an upstream on machines where
// no inference server can be installed: real formats, not mocks.
//
// The package owns the HTTP handler (Backend) and its Serve loop. It must
// never be imported by the edge or node binaries' logic, never load model
// weights, never call out to the network, and never read the environment or
// flags (only cmd demo-backend does).
//
// # Routes and which real server each one mimics
//
// Ollama native (Ollama 0.17.4 bytes):
//
//	POST /api/chat       NDJSON when "stream" is absent or true, one JSON object when false;
//	                     tool calls as {"id":"call_xxxxxxxx","function":{"index":0,...,"arguments":{...}}};
//	                     usage as prompt_eval_count/eval_count, durations in ns, done_reason stop|length;
//	                     with "logprobs": true a "logprobs" array per token line (the whole answer's
//	                     on the non-stream object), each token at -8.8e-13 with its bytes, top
//	                     alternatives the token itself and "<unk>" (at most those two)
//	POST /api/embed      {"model","embeddings":[[1,0,0,…]],…,"prompt_eval_count"}: 128 dimensions
//	                     (the tiny models' n_embd), truncated to "dimensions"
//	GET  /api/tags       installed models (name:tag), sorted by name
//	GET  /api/ps         models used since start ("loaded"), expires_at = last use + 5 min
//	GET  /api/version    {"version":"0.17.4"}
//
// OpenAI/Anthropic-compatible, llama-server flavour for successes (one flavour
// per route, chosen because it differs most from OpenAI's own and so tests
// adapters hardest):
//
//	GET  /v1/models                 llama-server shape: {"models":[...],"object":"list","data":[...]}
//	POST /v1/chat/completions       SSE: first chunk {"role":"assistant","content":null}, then one
//	                                chunk per token, a finish_reason chunk, with
//	                                stream_options.include_usage a usage chunk with "choices":[]
//	                                (and "timings"; without it "timings" rides on the finish chunk),
//	                                then "data: [DONE]". Tool-call ids are 32 alphanumerics.
//	POST /v1/messages               Anthropic shape; the stream ends with message_delta + message_stop,
//	                                no [DONE]; tool calls become a tool_use block (input_json_delta)
//	POST /v1/messages/count_tokens  {"input_tokens":N}
//	POST /v1/responses              llama-server's Responses: sorted keys, no sequence_number; the
//	                                function_call item's call_id is "fc_<id>" and it has no id;
//	                                status "completed" even on the token limit
//	POST /v1/completions            llama-server's text_completion chunks, an empty chunk for the
//	                                end-of-sequence token, usage and timings on the finish chunk
//	POST /v1/embeddings             Ollama 0.17.4's /v1 shape (llama-server answers 501 there
//	                                without --embeddings)
//	GET  /health                    {"status":"ok"}
//
// Errors on the /v1 OpenAI routes use the error object that Ollama's /v1
// writes ({"error":{"message","type","param","code"}}): 400
// invalid_request_error for bad JSON (llama-server's 500 on bad JSON is
// deliberately not mimicked), 404 api_error for an unknown model. /v1/messages
// errors use Anthropic's {"type":"error","error":{"type","message"}}; /api/*
// errors use Ollama's {"error":"..."}.
//
// With Options.APIKey set (the binary's -api-key-file), the /v1 routes but
// /v1/models and /v1/health require the key as llama-server's --api-key
// does (Authorization: Bearer, or X-Api-Key) and answer llama-server's 401
// {"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}
// without it; /api/* stays open, as Ollama has no keys.
//
// Two extra routes serve humans and out-of-process tests: GET / says that this
// is the demo stand-in, and GET /_demo/stats returns
// {"active":N,"started":N,"ended":N,"prompt_tokens":N,"cached_tokens":N}
// (active excludes the stats request; the token counters sum the chat
// requests' prompt tokens and the part served from the prefix cache).
//
// # Models
//
//	tiny       answers "Hello from tiny-gguf! This reply is deterministic." as the 7 tokens
//	           "Hello", " from", " tiny-gguf!", " This", " reply", " is", " deterministic."
//	           plus an end-of-sequence token (completion tokens 8, as the captures count)
//	tiny-tool  with a non-empty "tools" array: exactly one call get_weather({"city": "Paris"})
//	           (completion tokens 4); without tools it answers like tiny
//	tiny-loop  repeats " lorem", " ipsum", " dolor", " sit", " amet," until the token limit
//	           (max_tokens, max_completion_tokens or Ollama options.num_predict; default 64)
//	           and stops with finish_reason "length" / done_reason "length" / stop_reason "max_tokens"
//
// Names resolve with or without the ":latest" tag; any other tag is unknown.
// Every model honours the token limit: tiny with max_tokens 4 stops after
// "Hello from tiny-gguf! This" with reason length. Prompt tokens are a
// deterministic function of the request: 16 + Σ over messages (and an
// Anthropic "system") of 4 + ceil(content bytes / 4), + ceil(tools bytes / 4).
// The response's "model" echoes the requested name without the fault suffix.
//
// # Prefix cache (R1)
//
// With Options.PrefixCache > 0 each Backend models a real server's prompt
// cache (see prefixCache): a chat request whose prompt starts with a
// prompt this instance processed before — up to a message boundary, the
// answer it generated included — reports those prompt tokens as cached,
// where llama-server does: usage.prompt_tokens_details.cached_tokens and
// timings.cache_n (timings.prompt_n is the rest) on /v1/chat/completions,
// cache_read_input_tokens (input_tokens is the rest) on /v1/messages.
// Ollama's native prompt_eval_count stays the whole prompt. With
// Options.PrefillPerToken each uncached prompt token costs that much time
// before the first byte of the answer, so routing that keeps a
// conversation on one instance shows up as a shorter time to first token.
// Several Backends are several instances with separate caches.
//
// # Slots
//
// With Options.Slots > 0 the chat routes share one instance's compute the
// way llama-server's slots share its threads (engine): at most Slots
// requests are served at once, a later one waits for a free slot; every
// step decodes one token for each generating slot — on a CPU (Parallel 1)
// each busy slot adds a TokenDelay to every step, so N generating slots
// are each served N times slower — and carries the queued prompt tokens in
// turn, up to Batch per step, so a prompt waits for the prompts before it
// and a stream stalls while a prompt is processed. Without Slots each
// request is paced on its own (TokenDelay, PrefillPerToken).
//
// # Fault injection
//
// Faults ride on the model name so they pass unchanged through a gateway:
// "tiny+stall=3", "tiny-loop+reset=10", "tiny+slowheaders=2s+status=503".
//
//	stall=N        send N content tokens (a tool call counts as one), then send nothing more
//	               and hold the connection open until the client goes away (N may exceed
//	               the answer: the stream then stalls before its terminal chunk)
//	reset=N        after N content tokens hijack and close the TCP connection: a stream ends
//	               without its terminal chunk or chunked-encoding trailer; a non-stream
//	               request gets no response at all
//	slowheaders=D  wait D (a Go duration, at most 10m) before the status line
//	status=S       answer HTTP S (400-599) with an error body in the route's shape
//
// Reset needs an HTTP/1.1 connection; where it cannot hijack (HTTP/2) it
// aborts the response with http.ErrAbortHandler instead. Stall and reset
// apply to stream and non-stream requests alike (non-stream
// requests "generate" N tokens, with the token delay, before the fault). A
// malformed suffix is a 400 naming the bad part.
//
// # Goroutines and shared state
//
// ServeHTTP runs on net/http's goroutine for the request and starts none; a
// request's state (type call) is owned by that goroutine. Serve owns one
// goroutine running http.Server.Serve and returns only after it has exited.
// Shared between requests: atomic counters, the buffer pool, and the /api/ps
// use times guarded by Backend.mu (held only to read or write that map).
//
// # Performance
//
// Static JSON fragments are rendered once in New; a request renders into one
// pooled buffer (which first held its body) and flushes after every chunk of
// a stream. Options.TokenDelay spaces tokens; Options.PadBytes pads
// non-stream answers for benchmarks.
package backend
