// Command demo-backend runs the project's demo backend: a DETERMINISTIC
// STAND-IN for a model server (Ollama native /api/* and llama-server-style
// /v1/*), not a model. See package iop/internal/demo/backend for routes,
// models and the fault suffixes.
//
//	demo-backend -listen 127.0.0.1:11434 [-token-delay 20ms] [-pad-bytes 1024] [-seed N] [-loop-tokens 64] [-api-key-file FILE]
//	             [-prefix-cache 4096] [-prefill-per-token 1ms] [-models tiny,tiny-tool,tiny-loop,tiny-think,tiny-agent]
//	             [-slots 8 [-batch 2048] [-parallel 1]] [-load-delay 2s]
//
// -slots N makes the chat routes share the instance's compute as
// llama-server's N slots do (per-token time grows with the busy slots, a
// prompt waits for those queued before it; see the backend package's
// engine); -parallel P lets a step decode P tokens at the cost of one (a
// GPU's batch). Without -slots each request is paced on its own.
//
// -load-delay D makes it answer llama-server's 503 "Loading model" on
// every route, /health included, for D after start: a stand-in for a
// managed llama-server that is loading its model.
//
// -api-key-file names a file holding an API key that the /v1 routes then
// require, as llama-server's --api-key does (the key is read from a file,
// never from the command line).
//
// The token delay defaults to 20ms (about 50 tokens/s, so a demo stream is
// visibly a stream); benchmarks pass -token-delay 0.
//
// It logs JSON lines to stderr: one at startup saying it is a stand-in, one
// per request start and end. SIGINT or SIGTERM shut it down with exit code 0;
// bad flags exit 2, a listen or serve failure exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"iop/internal/demo/backend"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit code. Cancelling ctx (the
// signals, in main) shuts the server down with code 0.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo-backend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:11434", "TCP address to listen on (host:port)")
	delay := fs.Duration("token-delay", 20*time.Millisecond, "wait before each content token (0 = none)")
	pad := fs.Int("pad-bytes", 0, "pad non-stream text answers to this many body bytes (0 = off)")
	seed := fs.Uint64("seed", 0, "seed of the generated ids")
	loop := fs.Int("loop-tokens", backend.DefaultLoopTokens, "tiny-loop's token limit when a request sets none")
	keyFile := fs.String("api-key-file", "", "file holding an API key the /v1 routes require (llama-server's --api-key)")
	cache := fs.Int("prefix-cache", 0, "prompt prefixes (message boundaries) the instance's prefix cache holds (0 = no cache)")
	prefill := fs.Duration("prefill-per-token", 0, "simulated prefill time per uncached prompt token (0 = none)")
	models := fs.String("models", "tiny,tiny-tool,tiny-loop", "comma-separated models to serve (also tiny-think, tiny-agent)")
	slots := fs.Int("slots", 0, "share the compute among this many slots as llama-server -np does (0 = each request paced on its own)")
	batch := fs.Int("batch", 0, "with -slots: prompt tokens one step processes (0 = 2048, llama-server's n_batch)")
	loadDelay := fs.Duration("load-delay", 0, "answer llama-server's 503 \"Loading model\" on every route for this long after start (a managed process's load)")
	parallel := fs.Int("parallel", 1, "with -slots: generated tokens one step decodes at the cost of one token delay (1 = a CPU; a GPU batches many)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo-backend: unexpected arguments %q\n", fs.Args())
		return 2
	}
	var apiKey string
	if *keyFile != "" {
		k, err := os.ReadFile(*keyFile)
		if err != nil {
			fmt.Fprintf(stderr, "demo-backend: -api-key-file: %v\n", err)
			return 2
		}
		if apiKey = strings.TrimRight(string(k), "\r\n"); apiKey == "" {
			fmt.Fprintf(stderr, "demo-backend: -api-key-file %s is empty\n", *keyFile)
			return 2
		}
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	b, err := backend.New(backend.Options{
		Logger: log, TokenDelay: *delay, PadBytes: *pad, Seed: *seed, LoopTokens: *loop, APIKey: apiKey,
		PrefixCache: *cache, PrefillPerToken: *prefill, Models: strings.Split(*models, ","),
		Slots: *slots, Batch: *batch, Parallel: *parallel, LoadDelay: *loadDelay,
	})
	if err != nil {
		fmt.Fprintf(stderr, "demo-backend: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen failed", "addr", *listen, "error", err)
		return 1
	}
	log.Info("demo-backend listening: a deterministic demo stand-in for a model server, not a model",
		"addr", ln.Addr().String(), "models", strings.Split(*models, ","),
		"token_delay", delay.String(), "pad_bytes", *pad, "api_key_required", apiKey != "",
		"prefix_cache", *cache, "prefill_per_token", prefill.String(), "slots", *slots, "parallel", *parallel)
	if err := b.Serve(ctx, ln); err != nil {
		log.Error("serve failed", "error", err)
		return 1
	}
	log.Info("demo-backend stopped")
	return 0
}
