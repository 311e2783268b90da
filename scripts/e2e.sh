# shellcheck shell=bash
# ./run.sh e2e: the end-to-end suite. Builds bin/edge, bin/node and
# bin/demo-backend, then runs the Go suite in internal/e2e/sdk (a separate
# module that requires the official OpenAI and Anthropic Go SDKs, so the
# product's go.mod stays protobuf-only). The suite starts the demo backend
# (or uses the real server named by IOP_OLLAMA_URL / IOP_OPENAI_URL, see
# scripts/demo.sh), the edge and a node as processes on free loopback ports,
# drives them with the SDKs, kills and restarts them, and stops everything it
# started. Extra arguments go to `go test` (e.g. -run TestSDK).
# Sourced by run.sh.

e2e_main() {
  cmd_build
  log "e2e: official SDK clients against bin/edge + bin/node (internal/e2e/sdk)"
  (cd "$ROOT/internal/e2e/sdk" && IOP_E2E=1 IOP_BIN="$ROOT/bin" go test -count=1 -v -timeout 10m "$@" ./...)
}
