# shellcheck shell=bash
# ./run.sh bench batches: the edge's Batch API on the demo backend
# (requirements X5, G4). Sourced by scripts/bench.sh (ROOT, log, BENCH_*
# set there). Not part of CI.
#
# One model group "tiny-loop" on one node: one demo backend on
# BATCHB_BACKEND (127.0.0.1:28621), -token-delay BATCHB_TOKEN_DELAY (5ms),
# an openai_compat adapter of capacity BATCHB_CAPACITY (16). The edge
# (BATCHB_HTTP 127.0.0.1:28622, admin BATCHB_ADMIN 127.0.0.1:29622, nodes
# BATCHB_NODE_LISTEN 127.0.0.1:27622) has batches.max_in_flight
# BATCHB_IN_FLIGHT (16) and two keys, batch and interactive. Each line and
# request is a chat request of max_tokens BATCHB_MAX_TOKENS (10).
#
# Per round (BATCHB_ROUNDS, 2; even rounds in the reverse order), one
# record each in .run/bench/batches.jsonl (iopbench batches), the tables in
# .run/bench/batches.md:
#   concurrent  BATCHB_LINES (10000) requests sent by a client under key
#               batch, BATCHB_IN_FLIGHT at a time: lines/s;
#   batch       the same lines as one batch of key batch: upload, create,
#               poll every 100 ms until completed: lines/s from the
#               create, and the output checked (each custom_id once, 200);
#   alone       the probe only: key interactive, one streamed request of
#               max_tokens 5 every 100 ms for BATCHB_PROBE_SECONDS (30):
#               time to first token p50/p95/p99;
#   beside      the probe again while a batch of BATCHB_LINES lines runs
#               (it must still be running when the probe ends).

BATCHB_BACKEND=${BATCHB_BACKEND:-127.0.0.1:28621}
BATCHB_HTTP=${BATCHB_HTTP:-127.0.0.1:28622}
BATCHB_ADMIN=${BATCHB_ADMIN:-127.0.0.1:29622}
BATCHB_NODE_LISTEN=${BATCHB_NODE_LISTEN:-127.0.0.1:27622}

bench_batches_main() {
  local bin="$BENCH_DIR/bin" dir="$BENCH_DIR/batches" cap=${BATCHB_CAPACITY:-16} inflight=${BATCHB_IN_FLIGHT:-16}
  local lines=${BATCHB_LINES:-10000} maxt=${BATCHB_MAX_TOKENS:-10} probe=${BATCHB_PROBE_SECONDS:-30} rounds=${BATCHB_ROUNDS:-2}
  log "bench batches: $lines lines, capacity $cap, max_in_flight $inflight, token delay ${BATCHB_TOKEN_DELAY:-5ms}, $rounds round(s); load average $(cut -d' ' -f1-3 /proc/loadavg)"
  bench_tools
  trap 'bench_cleanup; exit 130' INT
  trap 'bench_cleanup; exit 143' TERM
  trap bench_cleanup EXIT
  rm -rf "$dir" && mkdir -p "$dir"
  "$bin/edge" pki init -dir "$dir/pki" -edge edge-1 -node gpu-1 >/dev/null
  "$bin/demo-backend" -listen "$BATCHB_BACKEND" -token-delay "${BATCHB_TOKEN_DELAY:-5ms}" >/dev/null 2>&1 &
  bench_pids+=($!)
  bench_wait "http://$BATCHB_BACKEND/api/tags" 50 || { log "demo backend did not start"; return 1; }
  local keys="" k
  for k in batch interactive; do
    keys+="${keys:+,}{\"principal\": \"$k\", \"key_sha256\": \"$(printf '%s' "iop-batchb-$k" | sha256sum | cut -d' ' -f1)\"}"
  done
  cat >"$dir/edge.json" <<JSON
{
  "http_listen": "$BATCHB_HTTP", "node_listen": "$BATCHB_NODE_LISTEN", "admin_listen": "$BATCHB_ADMIN",
  "tls": {"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt", "trust_domain": "iop.local"},
  "api_keys": [$keys],
  "queue": {"max_waiters": 1024},
  "batches": {"dir": "batches", "max_in_flight": $inflight},
  "nodes": [{"id": "gpu-1", "adapters": [{"name": "r1", "type": "openai_compat", "profile": "llamacpp", "capacity": $cap, "base_url": "http://$BATCHB_BACKEND"}]}],
  "models": [{"name": "tiny-loop", "providers": [{"node": "gpu-1", "provider": "r1", "target": "tiny-loop"}]}]
}
JSON
  cat >"$dir/node.json" <<JSON
{
  "node_id": "gpu-1", "edge_addr": "$BATCHB_NODE_LISTEN",
  "tls": {"cert_file": "pki/gpu-1.crt", "key_file": "pki/gpu-1.key", "ca_file": "pki/ca.crt", "expected_edge_name": "edge-1"},
  "reconnect": {"interval_sec": 1, "max_attempts": 0}
}
JSON
  "$bin/edge" -config "$dir/edge.json" >>"$dir/edge.log" 2>&1 &
  bench_pids+=($!)
  "$bin/node" -config "$dir/node.json" >>"$dir/node.log" 2>&1 &
  bench_pids+=($!)
  local j
  for j in $(seq 1 150); do
    curl -fsS -m 1 "http://$BATCHB_ADMIN/status" 2>/dev/null | grep -q '"connected":true' && break
    sleep 0.2
  done
  curl -fsS -m 1 "http://$BATCHB_ADMIN/status" | grep -q '"connected":true' || { log "node did not become ready; see $dir/edge.log"; return 1; }
  local out="$BENCH_DIR/batches.jsonl" round phase order
  : >"$out"
  local common=(-base "http://$BATCHB_HTTP" -model tiny-loop -lines "$lines" -max-tokens "$maxt")
  for round in $(seq 1 "$rounds"); do
    order="concurrent batch alone beside"
    [ $((round % 2)) = 0 ] && order="beside alone batch concurrent"
    for phase in $order; do
      log "round $round: $phase"
      case $phase in
        concurrent) "$bin/iopbench" batches "${common[@]}" -phase concurrent -key iop-batchb-batch -concurrency "$inflight" >>"$out" || return 1 ;;
        batch) "$bin/iopbench" batches "${common[@]}" -phase batch -key iop-batchb-batch >>"$out" || return 1 ;;
        alone) "$bin/iopbench" batches "${common[@]}" -phase probe -label "probe alone" -probe-key iop-batchb-interactive -probe-every 100ms -duration "${probe}s" >>"$out" || return 1 ;;
        beside) "$bin/iopbench" batches "${common[@]}" -phase probe -label "probe beside a batch" -probe-key iop-batchb-interactive \
          -batch-key iop-batchb-batch -probe-every 100ms -duration "${probe}s" >>"$out" || return 1 ;;
      esac
      tail -n 1 "$out" | cut -c1-240 >&2
    done
  done
  curl -fsS -m 2 "http://$BATCHB_ADMIN/metrics" | grep -E '^iop_edge_(batch_line|key_queue_wait_seconds_count)' >"$dir/metrics.txt" || true
  bench_cleanup
  "$bin/iopbench" batches-report -in "$out" | tee "$BENCH_DIR/batches.md"
  log "done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
