# shellcheck shell=bash
# ./run.sh e2e: the end-to-end suite. Builds bin/edge, bin/node and
# bin/demo-backend, then runs the Go suite in internal/e2e/sdk (a separate
# module that requires the official OpenAI and Anthropic Go SDKs, so the
# product's go.mod stays protobuf-only). The suite starts the demo backend
# (or uses the real server named by IOP_OLLAMA_URL / IOP_OPENAI_URL, see
# scripts/demo.sh), the edge and a node as processes on free loopback ports,
# drives them with the SDKs, kills and restarts them, and stops everything it
# started. The operator page is checked in a real headless browser:
# Debian's chromium, installed here when missing (IOP_CHROMIUM names another
# binary); its screenshot lands in .run/operator-page.png. First it builds
# the release archives twice and compares them (internal/release,
# IOP_RELEASE_BUILD=1; skipped when arguments are given). Extra arguments
# go to `go test` (e.g. -run TestSDK).
# The real coding agents (Claude Code, Codex CLI; pinned in
# internal/e2e/agents/package.json + package-lock.json) are installed from
# the npm registry with `npm ci` into .run/agents (IOP_AGENTS_DIR names
# another place), outside the product's go.mod, and reinstalled only when
# the lockfile changes; TestAgents runs them (IOP_AGENTS=0 skips that).
# Sourced by run.sh.

ensure_chromium() {
  if [ -n "${IOP_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then return 0; fi
  log "installing chromium (Debian) for the operator page test"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if ! { $sudo apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null; }; then
    log "FAIL: could not install chromium (apt-get install chromium); set IOP_CHROMIUM to a Chromium binary"
    return 1
  fi
}

# ensure_agents installs the pinned agents into $AGENTS_DIR (npm ci from
# the committed lockfile), skipping the install when the installed
# lockfile is the committed one. Sets AGENTS_BIN.
ensure_agents() {
  AGENTS_DIR=${IOP_AGENTS_DIR:-$ROOT/.run/agents}
  AGENTS_BIN="$AGENTS_DIR/node_modules/.bin"
  local src="$ROOT/internal/e2e/agents"
  if agents_installed && cmp -s "$src/package-lock.json" "$AGENTS_DIR/package-lock.json"; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    log "FAIL: npm is needed to install the pinned agents (Node 20+); or set IOP_AGENTS=0"
    return 1
  fi
  log "installing the pinned agents (Claude Code, Codex CLI) into $AGENTS_DIR"
  mkdir -p "$AGENTS_DIR"
  cp "$src/package.json" "$src/package-lock.json" "$AGENTS_DIR/"
  # --ignore-scripts: no package runs code at install. Claude Code's own
  # postinstall (install.cjs) is then run by hand: it only links or copies
  # the native binary its platform package (an optional dependency in the
  # lockfile) already unpacked over the bin/claude.exe placeholder, with no
  # download; without it `claude` is a text stub ("exec format error").
  (cd "$AGENTS_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  (cd "$AGENTS_DIR/node_modules/@anthropic-ai/claude-code" && node install.cjs >/dev/null)
  if ! agents_installed; then
    log "FAIL: the pinned agents did not install runnable binaries into $AGENTS_DIR (claude --version failed)"
    return 1
  fi
}

# agents_installed: both agents' binaries are in place and Claude Code's is
# the native program, not the placeholder its package ships.
agents_installed() {
  [ -x "$AGENTS_BIN/claude" ] && [ -x "$AGENTS_BIN/codex" ] &&
    DISABLE_AUTOUPDATER=1 timeout 60 "$AGENTS_BIN/claude" --version >/dev/null 2>&1
}

e2e_main() {
  cmd_build
  ensure_chromium
  mkdir -p "$ROOT/.run"
  if [ $# -eq 0 ]; then
    log "e2e: the release built twice (both architectures, the second from a copy at another path) is byte-identical"
    IOP_RELEASE_BUILD=1 go test -race -count=1 -timeout 15m -run 'TestReleaseReproducible' ./internal/release
  else
    log "e2e: arguments given: skipping the release reproducibility build"
  fi
  local agents_bin=""
  if [ "${IOP_AGENTS:-1}" != 0 ]; then
    ensure_agents
    agents_bin=$AGENTS_BIN
  fi
  log "e2e: official SDK clients and the real agents against bin/edge + bin/node (internal/e2e/sdk)"
  (cd "$ROOT/internal/e2e/sdk" && IOP_E2E=1 IOP_BIN="$ROOT/bin" IOP_RUN_DIR="$ROOT/.run" IOP_AGENTS_BIN="$agents_bin" \
    IOP_CHROMIUM="${IOP_CHROMIUM:-$(command -v chromium)}" go test -count=1 -v -timeout 15m "$@" ./...)
}
