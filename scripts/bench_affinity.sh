# shellcheck shell=bash
# ./run.sh bench affinity: the cache-aware routing figures (R1).
# Sourced by scripts/bench.sh (ROOT, log, BENCH_* set there). Not part of CI.
#
# Workload (iopbench affinity): BENCH_AFF_CONVS (50) conversations ×
# BENCH_AFF_TURNS (5) turns, BENCH_AFF_CONC (8) conversations at a time, a
# shared system prompt of BENCH_AFF_SYSTEM (1536) bytes, user messages of
# BENCH_AFF_USER (256) bytes, max_tokens BENCH_AFF_MAX_TOKENS (64), at most
# BENCH_AFF_TIMEOUT (10m) per mode, against
# one model group of two replicas (affinity_epsilon BENCH_AFF_EPSILON, 0.5).
# For each routing mode in BENCH_AFF_MODES
# ("least_loaded prefix_affinity") the replicas, the edge and the node start
# fresh (empty caches, empty affinity tables), so the modes are comparable.
# A mode may carry an affinity_balance after a colon, e.g.
# "prefix_affinity:0" (the holder takes every turn, as before the cost of
# a turn was weighed); otherwise BENCH_AFF_BALANCE (unset = the default).
#
# Replicas, each its own provider (adapter r1, r2 on node gpu-1, capacity
# BENCH_AFF_CAPACITY, default 8):
#   demo (default)  two demo backends on BENCH_AFF_R1/BENCH_AFF_R2
#                   (127.0.0.1:28501/28502) with -prefix-cache 65536,
#                   -prefill-per-token BENCH_AFF_PREFILL (500us),
#                   -token-delay BENCH_AFF_TOKEN_DELAY (2ms) and -slots
#                   BENCH_AFF_SLOTS (= the capacity: one instance's compute
#                   shared by its slots as llama-server's is; 0 = each
#                   request paced on its own); targets
#                   tiny-loop and tiny-loop:latest (one name per replica,
#                   so responses tell the replica apart).
#   real            set BENCH_LLAMA_SERVER (llama-server binary) and
#                   BENCH_LLAMA_MODEL (one .gguf, e.g. from gguf-gen -mode
#                   random with a larger -embd/-layers): two llama-server
#                   instances on the same ports with --alias r1 / r2,
#                   -np BENCH_AFF_CAPACITY slots, -c BENCH_LLAMA_CTX (131072: the
#                   prompt cache holds at most n_ctx tokens, and 50 conversations
#                   of ~3,000 tokens must fit)
#                   and -t BENCH_LLAMA_THREADS (1) each; their default prompt
#                   cache (--cache-ram) is on.
# Cached prompt tokens are the backends' own reports
# (usage.prompt_tokens_details.cached_tokens); results land in
# .run/bench/affinity.jsonl, the table in .run/bench/affinity.md and one
# line per request in .run/bench/affinity-trace-MODE.jsonl.

bench_affinity_start_replicas() { # $1 = mode label (for logs)
  local bin="$BENCH_DIR/bin" i addr
  AFF_REPLICA_PIDS=()
  for i in 1 2; do
    addr=$([ $i = 1 ] && echo "$BENCH_AFF_R1" || echo "$BENCH_AFF_R2")
    if [ -n "${BENCH_LLAMA_SERVER:-}" ]; then
      "$BENCH_LLAMA_SERVER" -m "$BENCH_LLAMA_MODEL" --alias "r$i" --jinja --host "${addr%:*}" --port "${addr##*:}" \
        -np "$BENCH_AFF_CAPACITY" -c "${BENCH_LLAMA_CTX:-131072}" -t "${BENCH_LLAMA_THREADS:-1}" \
        >>"$BENCH_DIR/affinity-r$i.log" 2>&1 &
    else
      "$bin/demo-backend" -listen "$addr" -token-delay "$BENCH_AFF_TOKEN_DELAY" -prefix-cache 65536 \
        -prefill-per-token "$BENCH_AFF_PREFILL" -slots "${BENCH_AFF_SLOTS:-$BENCH_AFF_CAPACITY}" >/dev/null 2>&1 &
    fi
    AFF_REPLICA_PIDS+=($!)
    bench_pids+=($!)
  done
  for addr in "$BENCH_AFF_R1" "$BENCH_AFF_R2"; do
    bench_wait "http://$addr/health" 600 || { log "replica $addr did not start (mode $1)"; return 1; }
  done
}

bench_affinity_stop() {
  local pid
  for pid in "$EDGE_PID" "$NODE_PID" "${AFF_REPLICA_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$EDGE_PID" "$NODE_PID" "${AFF_REPLICA_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}

bench_affinity_config() { # $1 = routing mode[:affinity_balance]
  local key_sha t1=tiny-loop t2=tiny-loop:latest routing=${1%%:*} balance=${BENCH_AFF_BALANCE:-}
  [ "$routing" != "$1" ] && balance=${1#*:}
  local balance_json=""
  [ -n "$balance" ] && balance_json=" \"affinity_balance\": $balance,"
  [ -n "${BENCH_LLAMA_SERVER:-}" ] && { t1=r1; t2=r2; }
  key_sha=$(printf '%s' "$BENCH_KEY" | sha256sum | cut -d' ' -f1)
  cat >"$BENCH_DIR/edge.json" <<JSON
{
  "http_listen": "$BENCH_HTTP",
  "node_listen": "$BENCH_NODE_LISTEN",
  "admin_listen": "$BENCH_ADMIN",
  "tls": {"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt", "trust_domain": "iop.local"},
  "api_keys": [{"principal": "bench", "key_sha256": "$key_sha"}],
  "queue": {"max_waiters": 4096, "wait_timeout_ms": 600000},
  "nodes": [{"id": "gpu-1", "adapters": [
    {"name": "r1", "type": "openai_compat", "profile": "llamacpp", "capacity": $BENCH_AFF_CAPACITY, "base_url": "http://$BENCH_AFF_R1"},
    {"name": "r2", "type": "openai_compat", "profile": "llamacpp", "capacity": $BENCH_AFF_CAPACITY, "base_url": "http://$BENCH_AFF_R2"}
  ]}],
  "models": [
    {"name": "conv", "routing": "$routing", "affinity_epsilon": ${BENCH_AFF_EPSILON:-0.5},$balance_json "providers": [
      {"node": "gpu-1", "provider": "r1", "target": "$t1"},
      {"node": "gpu-1", "provider": "r2", "target": "$t2"}]}
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
  AFF_REPLICAS="$t1,$t2"
}

bench_affinity_main() {
  BENCH_AFF_R1=${BENCH_AFF_R1:-127.0.0.1:28501}
  BENCH_AFF_R2=${BENCH_AFF_R2:-127.0.0.1:28502}
  BENCH_AFF_CAPACITY=${BENCH_AFF_CAPACITY:-8}
  BENCH_AFF_PREFILL=${BENCH_AFF_PREFILL:-500us}
  BENCH_AFF_TOKEN_DELAY=${BENCH_AFF_TOKEN_DELAY:-2ms}
  local modes=${BENCH_AFF_MODES:-least_loaded prefix_affinity} mode
  local kind=demo
  [ -n "${BENCH_LLAMA_SERVER:-}" ] && kind="llama-server $(basename "${BENCH_LLAMA_MODEL:?BENCH_LLAMA_MODEL is required with BENCH_LLAMA_SERVER}")"
  log "bench affinity ($kind): modes $modes; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  bench_tools
  trap 'bench_cleanup; exit 130' INT
  trap 'bench_cleanup; exit 143' TERM
  trap bench_cleanup EXIT
  rm -rf "$BENCH_DIR/pki"
  "$BENCH_DIR/bin/edge" pki init -dir "$BENCH_DIR/pki" -edge edge-1 -node gpu-1 >/dev/null
  : >"$BENCH_DIR/affinity.jsonl"
  local t0=$SECONDS
  for mode in $modes; do
    bench_affinity_config "$mode"
    bench_affinity_start_replicas "$mode" || return 1
    : >"$BENCH_DIR/edge.log"
    : >"$BENCH_DIR/node.log"
    bench_start_product || return 1
    log "affinity: $mode (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    "$BENCH_DIR/bin/iopbench" affinity -url "http://$BENCH_HTTP/v1/chat/completions" -model conv -key "$BENCH_KEY" \
      -label "$mode" -replicas "$AFF_REPLICAS" -conversations "${BENCH_AFF_CONVS:-50}" -turns "${BENCH_AFF_TURNS:-5}" \
      -concurrency "${BENCH_AFF_CONC:-8}" -system-bytes "${BENCH_AFF_SYSTEM:-1536}" -user-bytes "${BENCH_AFF_USER:-256}" \
      -max-tokens "${BENCH_AFF_MAX_TOKENS:-64}" -timeout "${BENCH_AFF_TIMEOUT:-10m}" -trace "$BENCH_DIR/affinity-trace-$mode.jsonl" >>"$BENCH_DIR/affinity.jsonl" 2>>"$BENCH_DIR/iopbench.log" ||
      log "iopbench affinity $mode failed; see .run/bench/iopbench.log"
    curl -fsS -m 5 "http://$BENCH_ADMIN/status" >"$BENCH_DIR/affinity-status-$mode.json" 2>/dev/null || true
    log "affinity: $mode decisions $(grep -o '"decisions":{[^}]*}' "$BENCH_DIR/affinity-status-$mode.json" 2>/dev/null || echo '?')"
    bench_affinity_stop
  done
  "$BENCH_DIR/bin/iopbench" report -in "$BENCH_DIR/affinity.jsonl" >"$BENCH_DIR/affinity.md"
  log "done in $((SECONDS - t0)) s; load average $(cut -d' ' -f1-3 /proc/loadavg); table in .run/bench/affinity.md"
  cat "$BENCH_DIR/affinity.md"
}
