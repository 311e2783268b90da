# shellcheck shell=bash
# ./run.sh bench [quick|hold|creds|affinity|fairness|batches|hostile|managed]: the end-to-end
# performance benchmark of edge + node against a direct call (full: ~14 min; quick: ~3.5 min, for
# iteration; hold: the slow-stream runs only; creds: the credential plane's
# added latency, ~3 min; affinity: the cache-aware routing figures (R1),
# scripts/bench_affinity.sh; fairness: keys sharing one fleet (G1-G3),
# scripts/bench_fairness.sh, ~2 min; batches: a batch's lines/s against a
# client's and an interactive key's time to first token beside a batch (X5),
# scripts/bench_batches.sh, ~6 min; hostile: held declared-large bodies (B1),
# ~10 s; managed: managed models' cold and warm first tokens and how soon
# /status shows a load (U2, U3, U6) on the demo backend and, when the
# real-backends kit built it, the real llama-server, ~1 min).
# Sourced by run.sh (which sets ROOT and log). Not part of CI.
#
# Separate processes on loopback, all started and stopped here:
#   demo backend (fast)  127.0.0.1:28434  -token-delay 0 -pad-bytes 1024 (1,024-byte answers)
#   demo backend (slow)  127.0.0.1:28435  -token-delay $BENCH_SLOW_DELAY (slow streams)
#   floor                127.0.0.1:28081  iopbench floor: httputil.ReverseProxy → fast backend
#   edge                 127.0.0.1:28080  (admin 127.0.0.1:29090 with admin.pprof, nodes 127.0.0.1:27443)
#   node gpu-1           dials the edge over mTLS; adapters oa/ol (and oa-b/ol-b) → fast, slow-oa/slow-ol → slow
# and the load generators (iopbench from internal/bench/loadgen, its own Go
# module with vegeta; Debian's wrk). Paths, measured in the same run with
# rounds alternating (odd rounds a→d, even rounds d→a):
#   a   POST fast backend /v1/chat/completions         (direct)
#   a2  POST fast backend /api/chat, "stream":true      (direct, the request the node makes for d)
#   b   POST floor /v1/chat/completions                 (one stdlib hop, compared with a)
#   c   POST edge, model bench-oa: openai_compat tunnel (compared with a)
#   d   POST edge, model bench: ollama run path          (compared with a2, and with a)
# and the passive-health pairs (every mode but hold): BENCH_PAIR_N
# requests at concurrency BENCH_PAIR_C to a group of two providers on the
# fast backend, both healthy (e: tunnel, f: run path) or the first answering
# 503 to everything (e5, f5: target "tiny+status=503").
#
# Everything lands in .run/bench/: results.jsonl (one JSON line per
# measurement), results.md (the tables), profiles/ (edge pprof, node perf),
# logs. Knobs (environment): BENCH_SECONDS (per fixed-rate run; full 10,
# quick 5), BENCH_ROUNDS (3 / 1), BENCH_RATES ("500 1000 2000"),
# BENCH_HOLD ("1000 10000" / "1000"), BENCH_SLOW_DELAY (1s),
# BENCH_HOLD_TOKENS (15), BENCH_STREAM_RATE (50 streams/s), BENCH_PAIR_N
# (1000), BENCH_PAIR_C (10),
# BENCH_PRODUCT_ENV (extra environment for the edge and node only, e.g.
# "GOMAXPROCS=1").
#
# Mode creds (SPEC C1–C6) starts a second edge and node beside the first, the
# same config with the credential plane on (a secret store with one slot
# used by every adapter; a sealed, signed lease per request):
#   edge (plane on)      127.0.0.1:28180  (admin 127.0.0.1:29190, nodes 127.0.0.1:27543)
# and measures paths c and d on both at BENCH_RATES (default 1000) in
# alternating rounds: ck and dk are c and d with the plane on, and the
# report's Δ vs c / vs d is the plane's added latency.

BENCH_DIR="$ROOT/.run/bench"
BENCH_KEY=iop-bench-key
# Addresses; each may be overridden from the environment (e.g. to run
# beside another benchmark).
BENCH_BACKEND=${BENCH_BACKEND:-127.0.0.1:28434}
BENCH_SLOW=${BENCH_SLOW:-127.0.0.1:28435}
BENCH_FLOOR=${BENCH_FLOOR:-127.0.0.1:28081}
BENCH_HTTP=${BENCH_HTTP:-127.0.0.1:28080}
BENCH_ADMIN=${BENCH_ADMIN:-127.0.0.1:29090}
BENCH_NODE_LISTEN=${BENCH_NODE_LISTEN:-127.0.0.1:27443}
BENCH_K_HTTP=${BENCH_K_HTTP:-127.0.0.1:28180}
BENCH_K_ADMIN=${BENCH_K_ADMIN:-127.0.0.1:29190}
BENCH_K_NODE_LISTEN=${BENCH_K_NODE_LISTEN:-127.0.0.1:27543}
bench_pids=()

bench_cleanup() {
  local pid
  for pid in "${bench_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${bench_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  bench_pids=()
}

bench_tools() {
  if ! command -v wrk >/dev/null 2>&1; then
    log "installing wrk (Debian)"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null && apt-get install -y -qq wrk >/dev/null
    else sudo apt-get update -qq >/dev/null && sudo apt-get install -y -qq wrk >/dev/null; fi
  fi
  if ! command -v perf >/dev/null 2>&1; then
    log "perf not installed: the node is not profiled (apt-get install linux-perf to add it)"
  fi
  mkdir -p "$BENCH_DIR/bin" "$BENCH_DIR/profiles"
  log "building edge, node, demo-backend (with symbols, for perf) and iopbench into .run/bench/bin"
  # Same code as bin/ (./run.sh build); only -s -w is left out so perf can name functions.
  local b
  for b in edge node; do CGO_ENABLED=0 go build -trimpath -o "$BENCH_DIR/bin/$b" "./$b"; done
  CGO_ENABLED=0 go build -trimpath -o "$BENCH_DIR/bin/demo-backend" ./internal/demo/backendcmd
  (cd "$ROOT/internal/bench/loadgen" && go build -o "$BENCH_DIR/bin/iopbench" .)
}

bench_wait() { # url tries(×0.1 s)
  local i
  for i in $(seq 1 "$2"); do curl -fsS -m 1 "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

bench_start_stack() {
  local bin="$BENCH_DIR/bin" key_sha
  key_sha=$(printf '%s' "$BENCH_KEY" | sha256sum | cut -d' ' -f1)
  rm -rf "$BENCH_DIR/pki"
  "$bin/edge" pki init -dir "$BENCH_DIR/pki" -edge edge-1 -node gpu-1 >/dev/null
  : >"$BENCH_DIR/edge.log"
  : >"$BENCH_DIR/node.log"
  # The backends log two JSON lines per request; at thousands of requests/s
  # a file would grow by hundreds of MB, so their logs are discarded.
  "$bin/demo-backend" -listen "$BENCH_BACKEND" -token-delay 0 -pad-bytes 1024 >/dev/null 2>&1 &
  bench_pids+=($!)
  "$bin/demo-backend" -listen "$BENCH_SLOW" -token-delay "$BENCH_SLOW_DELAY" >/dev/null 2>&1 &
  bench_pids+=($!)
  "$bin/iopbench" floor -listen "$BENCH_FLOOR" -upstream "http://$BENCH_BACKEND" >"$BENCH_DIR/floor.log" 2>&1 &
  FLOOR_PID=$!
  bench_pids+=($FLOOR_PID)
  bench_wait "http://$BENCH_BACKEND/api/tags" 50 || { log "fast backend did not start"; return 1; }
  bench_wait "http://$BENCH_SLOW/api/tags" 50 || { log "slow backend did not start"; return 1; }
  bench_wait "http://$BENCH_FLOOR/api/tags" 50 || { log "floor did not start; see .run/bench/floor.log"; return 1; }
  local fast="http://$BENCH_BACKEND" slow="http://$BENCH_SLOW"
  cat >"$BENCH_DIR/edge.json" <<JSON
{
  "http_listen": "$BENCH_HTTP",
  "node_listen": "$BENCH_NODE_LISTEN",
  "admin_listen": "$BENCH_ADMIN",
  "admin": {"pprof": true},
  "tls": {"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt", "trust_domain": "iop.local"},
  "api_keys": [{"principal": "bench", "key_sha256": "$key_sha"}],
  "queue": {"max_waiters": 4096},
  "http": {"max_connections": 16384},
  "nodes": [{"id": "gpu-1", "adapters": [
    {"name": "ol",      "type": "ollama",        "capacity": 4096,  "base_url": "$fast"},
    {"name": "oa",      "type": "openai_compat", "profile": "llamacpp", "capacity": 4096,  "base_url": "$fast"},
    {"name": "ol-b",    "type": "ollama",        "capacity": 4096,  "base_url": "$fast"},
    {"name": "oa-b",    "type": "openai_compat", "profile": "llamacpp", "capacity": 4096,  "base_url": "$fast"},
    {"name": "slow-ol", "type": "ollama",        "capacity": 20000, "base_url": "$slow"},
    {"name": "slow-oa", "type": "openai_compat", "profile": "llamacpp", "capacity": 20000, "base_url": "$slow"}
  ]}],
  "models": [
    {"name": "bench",         "providers": [{"node": "gpu-1", "provider": "ol", "target": "tiny"}]},
    {"name": "bench-oa",      "providers": [{"node": "gpu-1", "provider": "oa", "target": "tiny"}]},
    {"name": "bench-loop",    "providers": [{"node": "gpu-1", "provider": "ol", "target": "tiny-loop"}]},
    {"name": "bench-loop-oa", "providers": [{"node": "gpu-1", "provider": "oa", "target": "tiny-loop"}]},
    {"name": "slow",          "providers": [{"node": "gpu-1", "provider": "slow-ol", "target": "tiny-loop"}]},
    {"name": "slow-oa",       "providers": [{"node": "gpu-1", "provider": "slow-oa", "target": "tiny-loop"}]},
    {"name": "pair-oa",       "providers": [{"node": "gpu-1", "provider": "oa-b", "target": "tiny"}, {"node": "gpu-1", "provider": "oa", "target": "tiny"}]},
    {"name": "pair-oa-503",   "providers": [{"node": "gpu-1", "provider": "oa-b", "target": "tiny+status=503"}, {"node": "gpu-1", "provider": "oa", "target": "tiny"}]},
    {"name": "pair",          "providers": [{"node": "gpu-1", "provider": "ol-b", "target": "tiny"}, {"node": "gpu-1", "provider": "ol", "target": "tiny"}]},
    {"name": "pair-503",      "providers": [{"node": "gpu-1", "provider": "ol-b", "target": "tiny+status=503"}, {"node": "gpu-1", "provider": "ol", "target": "tiny"}]}
  ]
}
JSON
  cat >"$BENCH_DIR/node.json" <<JSON
{
  "node_id": "gpu-1",
  "edge_addr": "$BENCH_NODE_LISTEN",
  "tls": {"cert_file": "pki/gpu-1.crt", "key_file": "pki/gpu-1.key", "ca_file": "pki/ca.crt", "expected_edge_name": "edge-1"},
  "reconnect": {"interval_sec": 1, "max_attempts": 0}
}
JSON
  bench_start_product
}

# bench_start_product: edge and node, fresh processes; waits for ready.
# Sets EDGE_PID and NODE_PID. Logs are appended to .run/bench/{edge,node}.log.
bench_start_product() {
  local bin="$BENCH_DIR/bin" i
  env ${BENCH_PRODUCT_ENV:-} "$bin/edge" -config "$BENCH_DIR/edge.json" >>"$BENCH_DIR/edge.log" 2>&1 &
  EDGE_PID=$!
  bench_pids+=($EDGE_PID)
  env ${BENCH_PRODUCT_ENV:-} "$bin/node" -config "$BENCH_DIR/node.json" >>"$BENCH_DIR/node.log" 2>&1 &
  NODE_PID=$!
  bench_pids+=($NODE_PID)
  for i in $(seq 1 150); do
    if curl -fsS -m 1 "http://$BENCH_ADMIN/status" 2>/dev/null | grep -q '"connected":true'; then
      log "stack up: edge pid $EDGE_PID, node pid $NODE_PID"
      return 0
    fi
    sleep 0.2
  done
  log "node did not become ready in 30 s; see .run/bench/edge.log and node.log"
  return 1
}

# bench_start_creds: the plane-on edge and node (mode creds) in
# .run/bench/creds: the stack's config with credentials on, a store key and
# a store whose slot "bench" every adapter uses. Sets KEDGE_PID, KNODE_PID.
bench_start_creds() {
  local bin="$BENCH_DIR/bin" k="$BENCH_DIR/creds" rk i
  rm -rf "$k" && mkdir -p "$k" && cp -r "$BENCH_DIR/pki" "$k/pki"
  "$bin/edge" secrets init -key "$k/store.key" >/dev/null
  # A throwaway secret for the benchmark, piped in as an operator would.
  head -c 24 /dev/urandom | base64 | "$bin/edge" secrets set -store "$k/secrets.json" -key "$k/store.key" -slot bench >/dev/null
  # The raw X25519 key is the last 32 bytes of the PEM's SubjectPublicKeyInfo.
  rk=$(sed '1d;$d' "$k/pki/gpu-1.recipient.pub" | base64 -d | tail -c 32 | base64)
  sed -e "s#$BENCH_HTTP#$BENCH_K_HTTP#; s#$BENCH_ADMIN#$BENCH_K_ADMIN#; s#$BENCH_NODE_LISTEN#$BENCH_K_NODE_LISTEN#" \
      -e "s#\"nodes\": \[{\"id\": \"gpu-1\",#\"credentials\": {\"enabled\": true, \"store_file\": \"secrets.json\", \"store_key_file\": \"store.key\", \"issuer_key_file\": \"pki/issuer.key\"},\n  \"nodes\": [{\"id\": \"gpu-1\", \"lease_recipient_public_key\": \"$rk\",#" \
      -e 's#"type": #"credential_slot": "bench", "type": #' "$BENCH_DIR/edge.json" >"$k/edge.json"
  sed -e "s#$BENCH_NODE_LISTEN#$BENCH_K_NODE_LISTEN#" \
      -e 's#"reconnect":#"credentials": {"recipient_private_key_file": "pki/gpu-1.recipient.key", "issuer_public_key": "pki/issuer.pub"},\n  "reconnect":#' \
      "$BENCH_DIR/node.json" >"$k/node.json"
  env ${BENCH_PRODUCT_ENV:-} "$bin/edge" -config "$k/edge.json" >>"$BENCH_DIR/edge-creds.log" 2>&1 &
  KEDGE_PID=$!
  bench_pids+=($KEDGE_PID)
  env ${BENCH_PRODUCT_ENV:-} "$bin/node" -config "$k/node.json" >>"$BENCH_DIR/node-creds.log" 2>&1 &
  KNODE_PID=$!
  bench_pids+=($KNODE_PID)
  for i in $(seq 1 150); do
    if curl -fsS -m 1 "http://$BENCH_K_ADMIN/status" 2>/dev/null | grep -q '"connected":true'; then
      log "plane-on stack up: edge pid $KEDGE_PID, node pid $KNODE_PID"
      return 0
    fi
    sleep 0.2
  done
  log "plane-on node did not become ready in 30 s; see .run/bench/edge-creds.log and node-creds.log"
  return 1
}

# bench_target PATH KIND: sets T_URL, T_BODY, T_KEY, T_FORMAT, T_TOKENS.
# KIND: ns (one ~1 KB answer), stream (100 chunks), slow (slow stream).
# PATH ck and dk are c and d on the plane-on edge.
bench_target() {
  local path=${1%k} kind=$2 model tokens=100 msg='"messages":[{"role":"user","content":"Say hello."}]'
  T_KEY="" T_FORMAT=sse
  [ "$kind" = slow ] && tokens=$BENCH_HOLD_TOKENS
  T_TOKENS=$tokens
  case $path in
    a)     T_URL="http://$BENCH_BACKEND/v1/chat/completions" ;;
    a2)    T_URL="http://$BENCH_BACKEND/api/chat" ;;
    b)     T_URL="http://$BENCH_FLOOR/v1/chat/completions" ;;
    *)     T_URL="http://$BENCH_HTTP/v1/chat/completions" ;;
  esac
  case $path:$kind in
    a:ns|b:ns|a2:ns) model=tiny ;;
    c:ns) model=bench-oa ;;
    d:ns) model=bench ;;
    e:ns) model=pair-oa ;;
    e5:ns) model=pair-oa-503 ;;
    f:ns) model=pair ;;
    f5:ns) model=pair-503 ;;
    a:*|b:*|a2:*) model=tiny-loop ;;
    c:stream) model=bench-loop-oa ;;
    d:stream) model=bench-loop ;;
    c:slow) model=slow-oa ;;
    d:slow) model=slow ;;
  esac
  [ "$kind" = slow ] && case $path in a|a2|b) T_URL=${T_URL/$BENCH_BACKEND/$BENCH_SLOW}; T_URL=${T_URL/$BENCH_FLOOR/$BENCH_SLOW} ;; esac
  case $path in a|a2|b) ;; *) T_KEY=$BENCH_KEY ;; esac
  if [ "$path" = a2 ]; then
    T_FORMAT=ndjson
    # The node's ollama driver always asks /api/chat for a stream (and the
    # backend pads only non-stream answers), so the direct call for path d
    # is the same request the node makes: stream true, 8 NDJSON lines.
    if [ "$kind" = ns ]; then T_BODY="{\"model\":\"$model\",\"stream\":true,$msg}"
    else T_BODY="{\"model\":\"$model\",\"stream\":true,\"options\":{\"num_predict\":$tokens},$msg}"; fi
  elif [ "$kind" = ns ]; then
    T_BODY="{\"model\":\"$model\",\"stream\":false,$msg}"
  else
    T_BODY="{\"model\":\"$model\",\"stream\":true,\"max_tokens\":$tokens,$msg}"
  fi
  case $1 in ck|dk) T_URL=${T_URL/$BENCH_HTTP/$BENCH_K_HTTP} ;; esac
}

# bench_restart_product: stop edge and node and start fresh ones, so that a
# hold run's "before" RSS is a fresh idle process's, not a heap grown by the
# runs before it (Go returns freed memory to the OS only slowly).
bench_restart_product() {
  kill -TERM "$EDGE_PID" "$NODE_PID" 2>/dev/null || true
  wait "$EDGE_PID" "$NODE_PID" 2>/dev/null || true
  bench_start_product && sleep 1
}

bench_pids_arg() { # [PATH]: the edge and node serving PATH
  case ${1:-} in
    ck|dk) echo "edge=$KEDGE_PID,node=$KNODE_PID,floor=$FLOOR_PID" ;;
    *) echo "edge=$EDGE_PID,node=$NODE_PID,floor=$FLOOR_PID" ;;
  esac
}

# bench_run SUBCOMMAND PATH KIND ROUND [flags…]: one measurement, appended to results.jsonl.
bench_run() {
  local sub=$1 path=$2 kind=$3 round=$4; shift 4
  bench_target "$path" "$kind"
  local out
  if out=$("$BENCH_DIR/bin/iopbench" "$sub" -path "$path" -round "$round" -key "$T_KEY" \
      -url "$T_URL" -body "$T_BODY" -pids "$(bench_pids_arg "$path")" "$@" \
      $( [ "$sub" = stream ] || [ "$sub" = hold ] && echo "-format $T_FORMAT -tokens $T_TOKENS" ) \
      2>>"$BENCH_DIR/iopbench.log"); then
    echo "$out" >>"$BENCH_DIR/results.jsonl"
    printf '[bench] %-6s %-2s r%s %s\n' "$sub" "$path" "$round" "$(echo "$out" | cut -c1-220)" >&2
  else
    log "FAILED: $sub $path round $round (see .run/bench/iopbench.log)"
  fi
}

bench_mem() { # label
  "$BENCH_DIR/bin/iopbench" mem -label "$1" -pids "$(bench_pids_arg)" >>"$BENCH_DIR/results.jsonl"
}

# bench_profile PATH: a 1,000 RPS run of 12 s while the edge's CPU profile
# (10 s, /debug/pprof/profile on the admin listener) and, where perf exists,
# the node's (perf record -g, 10 s) are taken.
bench_profile() {
  local path=$1 prof="$BENCH_DIR/profiles" perfpid=""
  bench_target "$path" ns
  ( sleep 1; curl -fsS -m 30 -o "$prof/edge-$path.pprof" "http://$BENCH_ADMIN/debug/pprof/profile?seconds=10" ) &
  local curlpid=$!
  if command -v perf >/dev/null 2>&1; then
    ( sleep 1; perf record -e cpu-clock -F 499 -g -p "$NODE_PID" -o "$prof/node-$path.perf.data" -- sleep 10 >/dev/null 2>&1 ) &
    perfpid=$!
  fi
  "$BENCH_DIR/bin/iopbench" rate -path "$path" -round 0 -key "$T_KEY" -url "$T_URL" -body "$T_BODY" \
    -rate 1000 -duration 12s -warmup 0 -pids "$(bench_pids_arg)" >"$prof/run-$path.json" 2>>"$BENCH_DIR/iopbench.log" || true
  wait "$curlpid" || log "edge profile for $path failed"
  [ -n "$perfpid" ] && { wait "$perfpid" || true; }
  if [ -s "$prof/edge-$path.pprof" ]; then
    go tool pprof -top -nodecount=45 "$BENCH_DIR/bin/edge" "$prof/edge-$path.pprof" >"$prof/edge-$path.top.txt" 2>&1 || true
    go tool pprof -top -cum -nodecount=45 "$BENCH_DIR/bin/edge" "$prof/edge-$path.pprof" >"$prof/edge-$path.cum.txt" 2>&1 || true
  fi
  if [ -s "$prof/node-$path.perf.data" ]; then
    perf report -i "$prof/node-$path.perf.data" --stdio --no-children --sort symbol 2>/dev/null \
      | grep -E '^ +[0-9]' | head -45 >"$prof/node-$path.top.txt" || true
    perf report -i "$prof/node-$path.perf.data" --stdio --children --sort symbol 2>/dev/null \
      | grep -E '^ +[0-9]' | head -60 >"$prof/node-$path.cum.txt" || true
  fi
  log "profiles for path $path in .run/bench/profiles/ ($(cut -c1-160 "$prof/run-$path.json"))"
}

# bench_hold PATH N: N slow streams on PATH; for the edge paths on a fresh
# edge and node, with the edge's heap profile and goroutine count taken once
# every stream is open (N ÷ 1,000/s ramp + 3 s), and its runtime.MemStats
# (heap?debug=1: StackInuse and HeapInuse, the two parts of the RSS growth).
bench_hold() {
  local p=$1 n=$2 prof="$BENCH_DIR/profiles" snap=""
  if [ "$p" = c ] || [ "$p" = d ]; then
    bench_restart_product || return 1
    ( sleep $((n / 1000 + 3))
      curl -fsS -m 20 -o "$prof/edge-heap-$p-$n.pprof" "http://$BENCH_ADMIN/debug/pprof/heap" || true
      curl -fsS -m 20 -o "$prof/edge-goroutines-$p-$n.txt" "http://$BENCH_ADMIN/debug/pprof/goroutine?debug=1" || true
      curl -fsS -m 20 -o "$prof/edge-heapstats-$p-$n.txt" "http://$BENCH_ADMIN/debug/pprof/heap?debug=1" || true
    ) &
    snap=$!
  fi
  bench_run hold "$p" slow 1 -streams "$n" -ramp 1000
  if [ -n "$snap" ]; then
    wait "$snap" || true
    [ -s "$prof/edge-heap-$p-$n.pprof" ] && go tool pprof -top -sample_index=inuse_space -nodecount=25 \
      "$BENCH_DIR/bin/edge" "$prof/edge-heap-$p-$n.pprof" >"$prof/edge-heap-$p-$n.top.txt" 2>&1
  fi
  return 0
}

bench_main() {
  local mode=${1:-full}
  case $mode in
    full|quick|hold|creds) ;;
    affinity) source "$ROOT/scripts/bench_affinity.sh"; bench_affinity_main; return ;;
    fairness) source "$ROOT/scripts/bench_fairness.sh"; bench_fairness_main; return ;;
    batches) source "$ROOT/scripts/bench_batches.sh"; bench_batches_main; return ;;
    managed) # U2, U3, U6: managed models (BENCHMARKS.md "Managed models")
      log "bench managed: load average $(cut -d' ' -f1-3 /proc/loadavg)"
      go test -run '^$' -bench BenchmarkManagedSwitch -benchtime "${BENCH_SWITCHES:-20}x" -count "${BENCH_ROUNDS:-3}" ./internal/e2e/
      local r
      for r in $(seq 1 "${BENCH_ROUNDS:-3}"); do # the real llama-server (skipped, with the reason, when the kit did not build it)
        go test -count=1 -run TestManagedRealLlamaServer -v ./internal/e2e/ | grep -E 'FIGURE|SKIP|FAIL|^ok' || true
      done
      log "bench managed: load average $(cut -d' ' -f1-3 /proc/loadavg)"
      return ;;
    hostile) # B1: held declared-large bodies against a whole Edge (BENCHMARKS.md "Hostile clients")
      log "bench hostile: load average $(cut -d' ' -f1-3 /proc/loadavg)"
      go test -run '^$' -bench BenchmarkHeldBodies -benchtime 1x -count "${BENCH_ROUNDS:-3}" ./internal/e2e/
      return ;;
    *) echo "usage: ./run.sh bench [quick|hold|creds|affinity|fairness|batches|hostile|managed]" >&2; return 2 ;;
  esac
  if [ "$mode" = creds ]; then bench_creds; return; fi
  local secs rounds holds paths_odd="a a2 b c d" paths_even="d c b a2 a"
  if [ "$mode" = quick ]; then secs=${BENCH_SECONDS:-5}; rounds=${BENCH_ROUNDS:-1}; holds=${BENCH_HOLD:-1000}
  else secs=${BENCH_SECONDS:-10}; rounds=${BENCH_ROUNDS:-3}; holds=${BENCH_HOLD:-1000 10000}; fi
  [ "$mode" = hold ] && rounds=0
  local pair_n=${BENCH_PAIR_N:-1000} pair_c=${BENCH_PAIR_C:-10}
  local rates=${BENCH_RATES:-500 1000 2000}
  BENCH_SLOW_DELAY=${BENCH_SLOW_DELAY:-1s}
  BENCH_HOLD_TOKENS=${BENCH_HOLD_TOKENS:-15}
  local stream_rate=${BENCH_STREAM_RATE:-50}

  # 10,000 streams need ~10,000 descriptors in each of the client, edge, node and backend.
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  log "bench $mode: $rounds round(s), ${secs}s per rate, rates $rates, holds $holds; ulimit -n $(ulimit -n); load average $(cut -d' ' -f1-3 /proc/loadavg)"

  bench_tools
  trap 'bench_cleanup; exit 130' INT
  trap 'bench_cleanup; exit 143' TERM
  trap bench_cleanup EXIT
  bench_start_stack || return 1
  : >"$BENCH_DIR/results.jsonl"
  : >"$BENCH_DIR/iopbench.log"
  local t0=$SECONDS
  sleep 1
  bench_mem idle

  local round rate p order
  for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order=$paths_odd; else order=$paths_even; fi
    for rate in $rates; do
      for p in $order; do bench_run rate "$p" ns "$round" -rate "$rate" -duration "${secs}s"; done
    done
    for p in $order; do bench_run wrk "$p" ns "$round" -duration "$([ "$mode" = quick ] && echo 3s || echo 5s)"; done
    for p in $order; do bench_run stream "$p" stream "$round" -rate "$stream_rate" -duration "$([ "$mode" = quick ] && echo 3s || echo 4s)"; done
    # Passive health: healthy pair, then the pair with a 503er.
    if [ $((round % 2)) = 1 ]; then order="e e5 f f5"; else order="f5 f e5 e"; fi
    for p in $order; do bench_run conc "$p" ns "$round" -n "$pair_n" -c "$pair_c"; done
  done
  if [ "$rounds" -gt 0 ]; then
    bench_profile c
    bench_profile d
    bench_mem "after the runs above (HWM = their peak)"
  fi

  # Slow streams: each edge path on a freshly started edge and node.
  local n
  for n in $holds; do
    if [ "$n" -ge 10000 ]; then bench_hold a "$n"; fi
    for p in c d; do bench_hold "$p" "$n" || return 1; done
  done

  "$BENCH_DIR/bin/iopbench" report -in "$BENCH_DIR/results.jsonl" >"$BENCH_DIR/results.md"
  log "done in $((SECONDS - t0)) s; load average $(cut -d' ' -f1-3 /proc/loadavg); tables in .run/bench/results.md"
  cat "$BENCH_DIR/results.md"
}

# bench_creds: mode creds — paths c and d with the credential plane off
# (the first stack) and on (the second: ck, dk), at BENCH_RATES (default
# 1000) for BENCH_SECONDS (10) in BENCH_ROUNDS (3) alternating rounds.
bench_creds() {
  local secs=${BENCH_SECONDS:-10} rounds=${BENCH_ROUNDS:-3} rates=${BENCH_RATES:-1000} round rate p order
  BENCH_SLOW_DELAY=${BENCH_SLOW_DELAY:-1s}
  BENCH_HOLD_TOKENS=${BENCH_HOLD_TOKENS:-15}
  ulimit -n 65536 2>/dev/null || true
  log "bench creds: $rounds round(s), ${secs}s per rate, rates $rates; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  bench_tools
  trap 'bench_cleanup; exit 130' INT
  trap 'bench_cleanup; exit 143' TERM
  trap bench_cleanup EXIT
  : >"$BENCH_DIR/edge-creds.log"
  : >"$BENCH_DIR/node-creds.log"
  bench_start_stack || return 1
  bench_start_creds || return 1
  : >"$BENCH_DIR/results.jsonl"
  : >"$BENCH_DIR/iopbench.log"
  local t0=$SECONDS
  sleep 1
  for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="a a2 c ck d dk"; else order="dk d ck c a2 a"; fi
    for rate in $rates; do
      for p in $order; do bench_run rate "$p" ns "$round" -rate "$rate" -duration "${secs}s"; done
    done
  done
  if grep -q 'credential lease rejected' "$BENCH_DIR/node-creds.log"; then
    log "WARNING: the plane-on node rejected leases; see .run/bench/node-creds.log"
  fi
  "$BENCH_DIR/bin/iopbench" report -in "$BENCH_DIR/results.jsonl" >"$BENCH_DIR/results.md"
  log "done in $((SECONDS - t0)) s; load average $(cut -d' ' -f1-3 /proc/loadavg); tables in .run/bench/results.md"
  cat "$BENCH_DIR/results.md"
}
