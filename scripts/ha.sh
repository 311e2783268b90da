# shellcheck shell=bash
# ./run.sh ha: two edges and two nodes on loopback, each node serving both
# edges (node config edges[]), so an operator can watch failover: kill one
# edge, see the other keep serving with its node sessions untouched, start
# it again and see the nodes rejoin it (docs/operating.md, "Several
# edges"). Builds, mints a dev PKI with two edge certificates in .run/ha,
# starts the demo backend (or uses IOP_OLLAMA_URL), writes one edge config
# per edge (the same file but for the listen addresses and the certificate)
# and serves until Ctrl-C, which stops everything it started.
# Addresses: edge-1 IOP_HTTP_ADDR (127.0.0.1:8080), IOP_ADMIN_ADDR
# (127.0.0.1:9090), IOP_NODE_ADDR (127.0.0.1:7443); edge-2 IOP_HA_HTTP_ADDR
# (127.0.0.1:8081), IOP_HA_ADMIN_ADDR (127.0.0.1:9091), IOP_HA_NODE_ADDR
# (127.0.0.1:7444); the demo backend IOP_DEMO_BACKEND_ADDR (127.0.0.1:18434).
# Sourced by run.sh.

HA_KEY=iop-demo-key
HA_DIR="$ROOT/.run/ha"

ha_cleanup() {
  local f pid
  for f in "$HA_DIR"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
  done
  for f in "$HA_DIR"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    rm -f "$f"
  done
}

# ha_start NAME CMD...: start CMD in the background, logging to
# .run/ha/NAME.log, its pid in .run/ha/NAME.pid.
ha_start() {
  local name=$1; shift
  "$@" >>"$HA_DIR/$name.log" 2>&1 &
  echo $! >"$HA_DIR/$name.pid"
}

ha_wait_connected() { # admin-addr: both nodes connected on that edge
  local i
  for i in $(seq 1 150); do
    if [ "$(curl -fsS -m 1 "http://$1/status" 2>/dev/null | grep -o '"connected":true' | wc -l)" -ge 2 ]; then return 0; fi
    sleep 0.2
  done
  return 1
}

ha_main() {
  local http1=${IOP_HTTP_ADDR:-127.0.0.1:8080} admin1=${IOP_ADMIN_ADDR:-127.0.0.1:9090} node1=${IOP_NODE_ADDR:-127.0.0.1:7443}
  local http2=${IOP_HA_HTTP_ADDR:-127.0.0.1:8081} admin2=${IOP_HA_ADMIN_ADDR:-127.0.0.1:9091} node2=${IOP_HA_NODE_ADDR:-127.0.0.1:7444}
  local backend_addr=${IOP_DEMO_BACKEND_ADDR:-127.0.0.1:18434} backend
  trap 'ha_cleanup; exit 130' INT
  trap 'ha_cleanup; exit 143' TERM
  trap ha_cleanup EXIT
  cmd_build
  mkdir -p "$HA_DIR"
  ha_cleanup
  if [ ! -f "$HA_DIR/pki/ca.crt" ]; then
    ./bin/edge pki init -dir "$HA_DIR/pki" -edge edge-1 -edge edge-2 -node gpu-1 -node gpu-2 >/dev/null
    log "minted a dev PKI with two edge certificates in .run/ha/pki"
  fi
  if [ -n "${IOP_OLLAMA_URL:-}" ]; then
    backend=$IOP_OLLAMA_URL
    log "backend: the Ollama at $backend"
  else
    backend="http://$backend_addr"
    log "backend: DEMO BACKEND (a deterministic stand-in for a real model server, not a model) on $backend_addr"
    ha_start backend ./bin/demo-backend -listen "$backend_addr" -token-delay "${IOP_DEMO_TOKEN_DELAY:-20ms}"
    wait_http "$backend/api/tags" 50 || { log "demo backend did not start; see .run/ha/backend.log"; exit 1; }
  fi
  local sum e http admin nodeaddr
  sum=$(printf '%s' "$HA_KEY" | sha256sum | cut -d' ' -f1)
  for e in 1 2; do
    if [ $e = 1 ]; then http=$http1 admin=$admin1 nodeaddr=$node1; else http=$http2 admin=$admin2 nodeaddr=$node2; fi
    cat >"$HA_DIR/edge-$e.json" <<JSON
{
  "http_listen": "$http", "node_listen": "$nodeaddr", "admin_listen": "$admin",
  "tls": {"cert_file": "pki/edge-$e.crt", "key_file": "pki/edge-$e.key", "ca_file": "pki/ca.crt"},
  "api_keys": [{"principal": "demo", "key_sha256": "$sum"}],
  "nodes": [
    {"id": "gpu-1", "adapters": [{"name": "ollama", "type": "ollama", "capacity": 8, "base_url": "$backend"},
                                 {"name": "oa", "type": "openai_compat", "profile": "llamacpp", "capacity": 8, "base_url": "$backend"}]},
    {"id": "gpu-2", "adapters": [{"name": "ollama", "type": "ollama", "capacity": 8, "base_url": "$backend"},
                                 {"name": "oa", "type": "openai_compat", "profile": "llamacpp", "capacity": 8, "base_url": "$backend"}]}
  ],
  "models": [
    {"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}, {"node": "gpu-2", "provider": "ollama", "target": "tiny"}]},
    {"name": "tiny-oa", "providers": [{"node": "gpu-1", "provider": "oa", "target": "tiny"}, {"node": "gpu-2", "provider": "oa", "target": "tiny"}]}
  ],
  "shutdown": {"drain_timeout_ms": 5000}
}
JSON
  done
  local n
  for n in gpu-1 gpu-2; do
    cat >"$HA_DIR/$n.json" <<JSON
{
  "node_id": "$n",
  "edges": [{"addr": "$node1", "name": "edge-1"}, {"addr": "$node2", "name": "edge-2"}],
  "tls": {"cert_file": "pki/$n.crt", "key_file": "pki/$n.key", "ca_file": "pki/ca.crt"},
  "reconnect": {"interval_sec": 1, "max_attempts": 0}
}
JSON
  done
  ha_start edge-1 ./bin/edge -config "$HA_DIR/edge-1.json"
  ha_start edge-2 ./bin/edge -config "$HA_DIR/edge-2.json"
  ha_start gpu-1 ./bin/node -config "$HA_DIR/gpu-1.json"
  ha_start gpu-2 ./bin/node -config "$HA_DIR/gpu-2.json"
  ha_wait_connected "$admin1" && ha_wait_connected "$admin2" || {
    log "the nodes did not become ready on both edges in 30 s; last log lines:"
    tail -n 5 "$HA_DIR"/*.log >&2 || true
    exit 1
  }
  log "nodes gpu-1 and gpu-2 are ready on both edges"
  local body='{"model":"tiny","messages":[{"role":"user","content":"Say hello."}]}'
  for http in "$http1" "$http2"; do
    printf '%s answers: ' "$http"
    curl -sS -m 30 "http://$http/v1/chat/completions" -H "Authorization: Bearer $HA_KEY" -H 'Content-Type: application/json' -d "$body" \
      | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["message"]["content"] if "choices" in r else r)' 2>/dev/null \
      || echo "(request failed; see .run/ha/)"
  done
  cat <<EOF

edge-1: client http://$http1   admin http://$admin1
edge-2: client http://$http2   admin http://$admin2
API key (demo): $HA_KEY; models tiny (run path) and tiny-oa (tunnel) on gpu-1 and gpu-2; logs in .run/ha/

Watch failover:
  # which edge answers, twice a second (a failed connect shows 000):
  while :; do for h in $http1 $http2; do curl -s -o /dev/null -m 2 -w "\$h %{http_code}  " http://\$h/v1/chat/completions -H 'Authorization: Bearer $HA_KEY' -H 'Content-Type: application/json' -d '$body'; done; echo; sleep 0.5; done
  kill -9 \$(cat .run/ha/edge-1.pid)         # edge-1 dies; edge-2 keeps its node sessions (its /status generations stay)
  curl -s http://$admin2/status              # both nodes still connected to edge-2
  ./bin/edge -config .run/ha/edge-1.json >>.run/ha/edge-1.log 2>&1 & echo \$! > .run/ha/edge-1.pid   # back: the nodes rejoin within 1 s
  kill -TERM \$(cat .run/ha/edge-2.pid)      # a graceful stop: /healthz on $http2 turns 503 while it drains
Ctrl-C stops everything.
EOF
  while :; do sleep 1; done
}
