# shellcheck shell=bash
# ./run.sh bench fairness: one fleet shared by keys that flood it (fair
# share and priority classes, requirements G1-G3). Sourced by
# scripts/bench.sh (ROOT, log, BENCH_* set there). Not part of CI.
#
# One model group "tiny-loop" on one node; its provider(s):
#   demo (default)  one demo backend on FAIR_BACKEND (127.0.0.1:28611),
#                   -token-delay FAIR_TOKEN_DELAY (20ms), an openai_compat
#                   adapter of capacity FAIR_CAPACITY (8);
#   real            FAIR_REPLICAS="URL=CAPACITY URL=CAPACITY": one adapter
#                   per running server (e.g. llama-server), nothing started.
# The edge (FAIR_HTTP 127.0.0.1:28612, admin FAIR_ADMIN 127.0.0.1:29612,
# nodes FAIR_NODE_LISTEN 127.0.0.1:27612) has queue.max_waiters
# FAIR_MAX_WAITERS (128) and six keys: interactive, batch (class batch),
# flood-1 and flood-2 (weight 1), flood-3 (weight 2), and fifo.
#
# Three phases of FAIR_SECONDS (30) each, on the same stack (iopbench
# fairness; one JSON line each in .run/bench/fairness.jsonl, the tables in
# .run/bench/fairness.md):
#   alone  the probe only: key interactive, one request of max_tokens 5
#          every 0.5 s;
#   fifo   the probe and every flood under the one key fifo: one key is
#          one first-come-first-served queue (what every key got before
#          fair share);
#   fair   the same load under their own keys: batch keeps
#          FAIR_BATCH_STREAMS (64) requests of max_tokens 50 in flight,
#          flood-1..3 FAIR_FLOOD_STREAMS (16) each.
# The Go benchmark of the scheduler (BenchmarkFairShare) runs last.

FAIR_BACKEND=${FAIR_BACKEND:-127.0.0.1:28611}
FAIR_HTTP=${FAIR_HTTP:-127.0.0.1:28612}
FAIR_ADMIN=${FAIR_ADMIN:-127.0.0.1:29612}
FAIR_NODE_LISTEN=${FAIR_NODE_LISTEN:-127.0.0.1:27612}

bench_fairness_main() {
  local secs=${FAIR_SECONDS:-30} cap=${FAIR_CAPACITY:-8} bin="$BENCH_DIR/bin" dir="$BENCH_DIR/fairness"
  local batch=${FAIR_BATCH_STREAMS:-64} flood=${FAIR_FLOOD_STREAMS:-16}
  log "bench fairness: ${secs}s per phase, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  bench_tools
  trap 'bench_cleanup; exit 130' INT
  trap 'bench_cleanup; exit 143' TERM
  trap bench_cleanup EXIT
  rm -rf "$dir" && mkdir -p "$dir"
  "$bin/edge" pki init -dir "$dir/pki" -edge edge-1 -node gpu-1 >/dev/null
  local adapters="" i=0 r url c
  if [ -n "${FAIR_REPLICAS:-}" ]; then
    for r in $FAIR_REPLICAS; do
      url=${r%=*} c=${r##*=} i=$((i + 1))
      adapters+="${adapters:+,}{\"name\": \"r$i\", \"type\": \"openai_compat\", \"profile\": \"llamacpp\", \"capacity\": $c, \"base_url\": \"$url\"}"
      bench_wait "$url/health" 50 || { log "replica $url is not up"; return 1; }
    done
  else
    "$bin/demo-backend" -listen "$FAIR_BACKEND" -token-delay "${FAIR_TOKEN_DELAY:-20ms}" >/dev/null 2>&1 &
    bench_pids+=($!)
    bench_wait "http://$FAIR_BACKEND/api/tags" 50 || { log "demo backend did not start"; return 1; }
    adapters="{\"name\": \"r1\", \"type\": \"openai_compat\", \"profile\": \"llamacpp\", \"capacity\": $cap, \"base_url\": \"http://$FAIR_BACKEND\"}"
    i=1
  fi
  local providers="" j
  for j in $(seq 1 "$i"); do providers+="${providers:+,}{\"node\": \"gpu-1\", \"provider\": \"r$j\", \"target\": \"tiny-loop\"}"; done
  local keys="" k
  for k in interactive:1:interactive batch:1:batch flood-1:1:interactive flood-2:1:interactive flood-3:2:interactive fifo:1:interactive; do
    local name=${k%%:*} rest=${k#*:}
    keys+="${keys:+,}{\"principal\": \"$name\", \"key_sha256\": \"$(printf '%s' "iop-fair-$name" | sha256sum | cut -d' ' -f1)\", \"weight\": ${rest%%:*}, \"class\": \"${rest#*:}\"}"
  done
  cat >"$dir/edge.json" <<JSON
{
  "http_listen": "$FAIR_HTTP", "node_listen": "$FAIR_NODE_LISTEN", "admin_listen": "$FAIR_ADMIN",
  "tls": {"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt", "trust_domain": "iop.local"},
  "api_keys": [$keys],
  "queue": {"max_waiters": ${FAIR_MAX_WAITERS:-128}, "wait_timeout_ms": 120000},
  "nodes": [{"id": "gpu-1", "adapters": [$adapters]}],
  "models": [{"name": "tiny-loop", "providers": [$providers]}]
}
JSON
  cat >"$dir/node.json" <<JSON
{
  "node_id": "gpu-1", "edge_addr": "$FAIR_NODE_LISTEN",
  "tls": {"cert_file": "pki/gpu-1.crt", "key_file": "pki/gpu-1.key", "ca_file": "pki/ca.crt", "expected_edge_name": "edge-1"},
  "reconnect": {"interval_sec": 1, "max_attempts": 0}
}
JSON
  "$bin/edge" -config "$dir/edge.json" >>"$dir/edge.log" 2>&1 &
  bench_pids+=($!)
  "$bin/node" -config "$dir/node.json" >>"$dir/node.log" 2>&1 &
  bench_pids+=($!)
  for j in $(seq 1 150); do
    curl -fsS -m 1 "http://$FAIR_ADMIN/status" 2>/dev/null | grep -q '"connected":true' && break
    sleep 0.2
  done
  curl -fsS -m 1 "http://$FAIR_ADMIN/status" | grep -q '"connected":true' || { log "node did not become ready; see $dir/edge.log"; return 1; }
  local url="http://$FAIR_HTTP/v1/chat/completions" out="$BENCH_DIR/fairness.jsonl"
  : >"$out"
  local common=(-url "$url" -model tiny-loop -duration "${secs}s")
  log "phase alone: the probe only"
  "$bin/iopbench" fairness "${common[@]}" -label alone -probe-key iop-fair-interactive >>"$out" || return 1
  log "phase fifo: every key's load under one key"
  "$bin/iopbench" fairness "${common[@]}" -label fifo -probe-key iop-fair-fifo -jain flood-1,flood-2,flood-3 \
    -flood "batch:iop-fair-fifo:$batch:50:1" -flood "flood-1:iop-fair-fifo:$flood:50:1" \
    -flood "flood-2:iop-fair-fifo:$flood:50:1" -flood "flood-3:iop-fair-fifo:$flood:50:2" >>"$out" || return 1
  log "phase fair: the same load under the keys' own names"
  "$bin/iopbench" fairness "${common[@]}" -label fair -probe-key iop-fair-interactive -jain flood-1,flood-2,flood-3 \
    -flood "batch:iop-fair-batch:$batch:50:1" -flood "flood-1:iop-fair-flood-1:$flood:50:1" \
    -flood "flood-2:iop-fair-flood-2:$flood:50:1" -flood "flood-3:iop-fair-flood-3:$flood:50:2" >>"$out" || return 1
  curl -fsS -m 2 "http://$FAIR_ADMIN/metrics" | grep '^iop_edge_key_queue_wait_seconds_count' >"$dir/key-queue-wait.txt" || true
  bench_cleanup
  "$bin/iopbench" fairness-report -in "$out" | tee "$BENCH_DIR/fairness.md"
  log "the scheduler's cost per grant (go test -bench BenchmarkFairShare ./internal/edge/pool)"
  go test -run '^$' -bench BenchmarkFairShare -benchmem -count "${BENCH_ROUNDS:-3}" ./internal/edge/pool | tee -a "$BENCH_DIR/fairness.md"
}
