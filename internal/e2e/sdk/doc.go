// Package sdk is iop's end-to-end suite (`./run.sh e2e`): it starts
// the built bin/edge, bin/node and bin/demo-backend as real processes on free
// loopback ports, with PKI minted by `edge pki init` and configs shaped like
// scripts/demo.sh's, and drives them with the official OpenAI
// (github.com/openai/openai-go/v3) and Anthropic
// (github.com/anthropics/anthropic-sdk-go/v2) Go SDKs. It lives in its own
// module so the product's go.mod stays protobuf-only. ha_test.go runs two
// bin/edge with nodes serving both (node config edges[]) behind a client
// that behaves like an L4 balancer with health checks: an edge killed and
// restarted under load, two edges sharing a provider's capacity, a rolling
// reload; they print their figures (BENCHMARKS.md "Several edges").
//
// Everything is in _test.go files; the tests skip unless IOP_E2E=1. Other
// settings: IOP_BIN (directory of the binaries, default ../../../bin),
// IOP_OLLAMA_URL / IOP_OPENAI_URL / IOP_OPENAI_PROFILE (a real server instead
// of the demo backend; then answers are checked for shape, not text),
// IOP_OPENAI_TOOL_URL / IOP_OPENAI_LOOP_URL (the tool / loop model's own
// OpenAI-compatible server, as llama-server runs one model per port;
// default IOP_OPENAI_URL), IOP_DEMO_TARGET, IOP_DEMO_TOOL_TARGET, IOP_DEMO_LOOP_TARGET (backend model
// names) and IOP_DEMO_TOKEN_DELAY (demo backend, default 20ms).
//
// The suite must never leave a process behind (every child runs in its own
// process group, is stopped with SIGTERM in t.Cleanup and dies with the test
// binary through Pdeathsig), never import product packages (it sees the
// product only through its public surfaces), and never wait on a fixed sleep
// for an event (it polls /status and process logs with deadlines).
package sdk
