#!/usr/bin/env bash
# iop's one entry point. See README.md.
#   ./run.sh            the main job: build, dev PKI, backend, edge + node, a chat answer
#   ./run.sh test       gofmt, go vet, go test -race ./..., generated-code and import checks
#   ./run.sh build      static binaries into bin/
#   ./run.sh release V  reproducible dist/iop_V_linux_{amd64,arm64}.tar.gz + dist/SHA256SUMS
#   ./run.sh proto      regenerate proto/gen/iop from proto/iop/runtime.proto
#   ./run.sh e2e        built binaries + backend + official SDK clients
#   ./run.sh ha         two edges and two nodes on loopback, to watch failover (scripts/ha.sh)
#   ./run.sh bench      benchmarks (see BENCHMARKS.md)
#   ./run.sh fuzz [s]   every fuzz target for s seconds each (default 10; scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
PROTOC_GEN_GO_VERSION=v1.36.12
export PATH="$PATH:$(go env GOPATH)/bin"

log() { printf '[run.sh] %s\n' "$*" >&2; }

ensure_protoc() {
  if ! command -v protoc >/dev/null 2>&1; then
    log "installing protoc (Debian protobuf-compiler)"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null && apt-get install -y -qq protobuf-compiler >/dev/null
    else sudo apt-get update -qq >/dev/null && sudo apt-get install -y -qq protobuf-compiler >/dev/null; fi
  fi
  local want="protoc-gen-go $PROTOC_GEN_GO_VERSION"
  if [ "$(protoc-gen-go --version 2>/dev/null || true)" != "$want" ]; then
    log "installing protoc-gen-go $PROTOC_GEN_GO_VERSION"
    (cd /tmp && go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION")
  fi
}

gen_proto() { # $1 = output dir
  local out=$1
  mkdir -p "$out"
  protoc -I proto --go_out="$out" --go_opt=paths=source_relative iop/runtime.proto
}

cmd_proto() {
  ensure_protoc
  local tmp; tmp=$(mktemp -d)
  gen_proto "$tmp"
  mkdir -p proto/gen
  rm -rf proto/gen/iop && cp -r "$tmp/iop" proto/gen/iop
  rm -rf "$tmp"
  log "regenerated proto/gen/iop"
}

check_proto() {
  ensure_protoc
  local tmp; tmp=$(mktemp -d)
  gen_proto "$tmp"
  if ! diff -r "$tmp/iop" proto/gen/iop >/dev/null; then
    diff -r "$tmp/iop" proto/gen/iop | head -20 >&2 || true
    rm -rf "$tmp"
    log "FAIL: proto/gen/iop does not match proto/iop/runtime.proto; run ./run.sh proto (never hand-edit proto/gen)"
    return 1
  fi
  rm -rf "$tmp"
  log "generated code matches the schema"
}

check_imports() {
  # internal/edge/** and internal/node/** never import each other (README.md, "Layout").
  local bad=0 pkg deps
  for pkg in $(go list ./internal/edge/... 2>/dev/null); do
    deps=$(go list -deps "$pkg" | grep -E '^iop/internal/node(/|$)' || true)
    if [ -n "$deps" ]; then log "FAIL: $pkg imports $deps"; bad=1; fi
  done
  for pkg in $(go list ./internal/node/... 2>/dev/null); do
    deps=$(go list -deps "$pkg" | grep -E '^iop/internal/edge(/|$)' || true)
    if [ -n "$deps" ]; then log "FAIL: $pkg imports $deps"; bad=1; fi
  done
  # The edge's client side: api → exchange → reply and api → reply, never back
  # (internal/edge/exchange's package doc).
  deps=$(go list -deps ./internal/edge/exchange ./internal/edge/reply | grep -E '^iop/internal/edge/api$' || true)
  if [ -n "$deps" ]; then log "FAIL: internal/edge/exchange or reply imports internal/edge/api"; bad=1; fi
  deps=$(go list -deps ./internal/edge/reply | grep -E '^iop/internal/edge/exchange$' || true)
  if [ -n "$deps" ]; then log "FAIL: internal/edge/reply imports internal/edge/exchange"; bad=1; fi
  # Test-support and demo packages never reach the product binaries.
  deps=$(go list -deps ./edge ./node | grep -E '^iop/internal/(leakcheck|samples|proctest|demo|e2e)(/|$)' || true)
  if [ -n "$deps" ]; then log "FAIL: edge/node binaries import test-only packages: $deps"; bad=1; fi
  # go.mod requires only google.golang.org/protobuf.
  local extra
  extra=$(go mod edit -json | grep -o '"Path": *"[^"]*"' | cut -d'"' -f4 | grep -v -e '^iop$' -e '^google.golang.org/protobuf$' || true)
  if [ -n "$extra" ]; then log "FAIL: go.mod requires more than protobuf: $extra"; bad=1; fi
  [ $bad = 0 ] && log "import direction ok"
  return $bad
}

# git_commit prints the HEAD commit, with -dirty when tracked files changed
# (what `edge version` prints as its commit); "unknown" without git.
git_commit() {
  local c
  c=$(git rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then c="$c-dirty"; fi
  echo "$c"
}

cmd_build() {
  mkdir -p bin
  local ver commit
  ver=$(git describe --always --dirty 2>/dev/null || echo dev)
  commit=$(git_commit)
  for b in edge node; do
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$ver -X main.commit=$commit" -o "bin/$b" "./$b"
  done
  if [ -d internal/demo/backendcmd ]; then
    CGO_ENABLED=0 go build -trimpath -o bin/demo-backend ./internal/demo/backendcmd
  fi
  log "built bin/edge bin/node"
}

# cmd_release VERSION: the release archives (internal/release): both
# binaries for linux/amd64 and linux/arm64, deploy/, README.md and docs/,
# byte-identical for the same commit. The archive mtimes are
# SOURCE_DATE_EPOCH, by default the commit's time.
cmd_release() {
  local ver=${1:-} out=${IOP_DIST_DIR:-dist} commit epoch untracked
  if [ -z "$ver" ]; then echo "usage: ./run.sh release VERSION   (e.g. 0.4.0)" >&2; exit 2; fi
  commit=$(git_commit)
  epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD 2>/dev/null || true)}
  if [ -z "$epoch" ]; then log "FAIL: no git commit to take the time from; set SOURCE_DATE_EPOCH"; return 1; fi
  # An untracked file is not in the commit either: a Go file among the
  # packages goes into the binaries (docs/ and deploy/ ship tracked files only).
  untracked=$(git ls-files --others --exclude-standard 2>/dev/null | head -5)
  if [ -n "$untracked" ]; then
    case $commit in *-dirty) ;; unknown) ;; *) commit="$commit-dirty" ;; esac
    log "untracked files (git add or remove them): $(echo $untracked)"
  fi
  case $commit in *-dirty)
    log "warning: uncommitted changes: the archives say commit $commit and cannot be rebuilt from the commit alone" ;;
  esac
  go run ./internal/release -version "$ver" -commit "$commit" -epoch "$epoch" -out "$out"
  cat "$out/SHA256SUMS"
}

cmd_test() {
  check_proto
  check_imports
  local unformatted
  unformatted=$(gofmt -l . 2>&1 || true)
  if [ -n "$unformatted" ]; then
    log "FAIL: not gofmt-formatted (run gofmt -w on them):"; echo "$unformatted" >&2
    return 1
  fi
  log "go vet ./..."
  go vet ./...
  log "go test -race ./..."
  go test -race -count=1 -timeout 15m ./...
}

case "${1:-main}" in
  main) shift || true; source "$ROOT/scripts/demo.sh"; demo_main "$@" ;;
  test) cmd_test ;;
  build) cmd_build ;;
  release) shift; cmd_release "$@" ;;
  proto) cmd_proto ;;
  e2e) shift; source "$ROOT/scripts/e2e.sh"; e2e_main "$@" ;;
  ha) shift; source "$ROOT/scripts/demo.sh"; source "$ROOT/scripts/ha.sh"; ha_main "$@" ;;
  bench) shift; source "$ROOT/scripts/bench.sh"; bench_main "$@" ;;
  fuzz) shift; source "$ROOT/scripts/fuzz.sh"; fuzz_main "$@" ;;
  *) echo "usage: ./run.sh [test|build|release VERSION|proto|e2e|ha|bench|fuzz]" >&2; exit 2 ;;
esac
