# shellcheck shell=bash
# The main job (./run.sh with no arguments): build, mint dev PKI, start an
# inference backend and the edge (enrollment on, a node template for
# gpu-*), join node gpu-1 with the two commands docs/operating.md gives an
# operator (edge tokens create, then the node join line it prints), start
# it, wait until it is ready, send one chat completion and one streamed
# chat completion, print both answers, then keep serving until Ctrl-C.
# Sourced by run.sh.
#
# Backend choice:
#   IOP_OLLAMA_URL   a real Ollama (native /api/chat and its /v1 layer)
#   IOP_OPENAI_URL   a real OpenAI-compatible server (llama-server, vLLM…);
#                    IOP_OPENAI_PROFILE picks its profile (default llamacpp)
#   IOP_OPENAI_TOOL_URL, IOP_OPENAI_LOOP_URL
#                    the tool / loop model's own OpenAI-compatible server
#                    (llama-server runs one model per port); default
#                    IOP_OPENAI_URL. Each gets its own adapter (oa-tool,
#                    oa-loop) for the groups of that model.
#   otherwise, if an Ollama answers at 127.0.0.1:11434, that one;
#   otherwise the project's demo backend, a deterministic stand-in.
#   IOP_DEMO_TARGET (default tiny), IOP_DEMO_TOOL_TARGET (tiny-tool) and
#   IOP_DEMO_LOOP_TARGET (tiny-loop) name the backend models.
# Addresses: IOP_HTTP_ADDR (127.0.0.1:8080), IOP_ADMIN_ADDR (127.0.0.1:9090),
# IOP_NODE_ADDR (127.0.0.1:7443), IOP_DEMO_BACKEND_ADDR (127.0.0.1:18434).

DEMO_KEY=iop-demo-key
DEMO_KEY_SHA256=$(printf '%s' "$DEMO_KEY" | sha256sum | cut -d' ' -f1)
RUN_DIR="$ROOT/.run"

demo_pids=()
demo_cleanup() {
  local pid
  for pid in "${demo_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${demo_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  demo_pids=()
}

# demo_start_stack: build, PKI, backend, configs, edge, node; waits for ready.
# Sets DEMO_HTTP, DEMO_ADMIN. Logs go to .run/*.log.
demo_start_stack() {
  DEMO_HTTP=${IOP_HTTP_ADDR:-127.0.0.1:8080}
  DEMO_ADMIN=${IOP_ADMIN_ADDR:-127.0.0.1:9090}
  local node_addr=${IOP_NODE_ADDR:-127.0.0.1:7443}
  local backend_addr=${IOP_DEMO_BACKEND_ADDR:-127.0.0.1:18434}
  local t_tiny=${IOP_DEMO_TARGET:-tiny} t_tool=${IOP_DEMO_TOOL_TARGET:-tiny-tool} t_loop=${IOP_DEMO_LOOP_TARGET:-tiny-loop}
  # tiny-think and tiny-agent exist on the demo backend only; on a real
  # server IOP_DEMO_THINK_TARGET / IOP_DEMO_AGENT_TARGET name a model that
  # thinks / that calls tools (default: the tool model).
  local t_think=${IOP_DEMO_THINK_TARGET:-} t_agent=${IOP_DEMO_AGENT_TARGET:-}
  cmd_build
  mkdir -p "$RUN_DIR"
  if [ ! -f "$RUN_DIR/pki/ca.crt" ]; then
    ./bin/edge pki init -dir "$RUN_DIR/pki" -edge edge-1 >/dev/null
    log "minted dev PKI in .run/pki (the CA and the edge; nodes join with tokens)"
  fi

  local ollama_url="" openai_url="" openai_profile=${IOP_OPENAI_PROFILE:-llamacpp}
  local tool_url=${IOP_OPENAI_TOOL_URL:-} loop_url=${IOP_OPENAI_LOOP_URL:-}
  if [ -z "${IOP_OPENAI_URL:-}" ] && { [ -n "$tool_url" ] || [ -n "$loop_url" ]; }; then
    log "IOP_OPENAI_TOOL_URL and IOP_OPENAI_LOOP_URL need IOP_OPENAI_URL (the server of the plain model)"
    return 1
  fi
  if [ -n "${IOP_OLLAMA_URL:-}" ] || [ -n "${IOP_OPENAI_URL:-}" ]; then
    ollama_url=${IOP_OLLAMA_URL:-}
    openai_url=${IOP_OPENAI_URL:-}
    if [ -z "$openai_url" ]; then openai_url=$ollama_url; openai_profile=ollama; fi
    tool_url=${tool_url:-$openai_url}; loop_url=${loop_url:-$openai_url}
    log "backend: real server(s): ollama=${ollama_url:-none} openai_compat=$openai_url ($openai_profile)"
    if [ "$tool_url" != "$openai_url" ]; then log "backend: $t_tool on its own server: $tool_url"; fi
    if [ "$loop_url" != "$openai_url" ]; then log "backend: $t_loop on its own server: $loop_url"; fi
  elif curl -fsS -m 2 http://127.0.0.1:11434/api/tags >/dev/null 2>&1; then
    ollama_url=http://127.0.0.1:11434; openai_url=$ollama_url; openai_profile=ollama
    tool_url=$openai_url; loop_url=$openai_url
    log "backend: the Ollama answering at 127.0.0.1:11434"
  else
    log "backend: DEMO BACKEND (a deterministic stand-in for a real model server, not a model) on $backend_addr"
    ./bin/demo-backend -listen "$backend_addr" -token-delay "${IOP_DEMO_TOKEN_DELAY:-20ms}" \
      -models tiny,tiny-tool,tiny-loop,tiny-think,tiny-agent >"$RUN_DIR/backend.log" 2>&1 &
    demo_pids+=($!)
    ollama_url="http://$backend_addr"; openai_url="http://$backend_addr"; openai_profile=llamacpp
    t_think=${t_think:-tiny-think}; t_agent=${t_agent:-tiny-agent}
    tool_url=$openai_url; loop_url=$openai_url
    wait_http "http://$backend_addr/api/tags" 50 || { log "demo backend did not start; see .run/backend.log"; return 1; }
  fi

  # The OpenAI-compatible adapters: oa, plus oa-tool / oa-loop when the tool
  # / loop model has a server of its own.
  local compat_adapters oa_tool=oa oa_loop=oa
  compat_adapters="{\"name\": \"oa\", \"type\": \"openai_compat\", \"profile\": \"$openai_profile\", \"capacity\": 8, \"long_capacity\": 2, \"base_url\": \"$openai_url\"}"
  if [ "$tool_url" != "$openai_url" ]; then
    oa_tool=oa-tool
    compat_adapters+=",
    {\"name\": \"oa-tool\", \"type\": \"openai_compat\", \"profile\": \"$openai_profile\", \"capacity\": 8, \"long_capacity\": 2, \"base_url\": \"$tool_url\"}"
  fi
  if [ "$loop_url" != "$openai_url" ]; then
    oa_loop=oa-loop
    compat_adapters+=",
    {\"name\": \"oa-loop\", \"type\": \"openai_compat\", \"profile\": \"$openai_profile\", \"capacity\": 8, \"long_capacity\": 2, \"base_url\": \"$loop_url\"}"
  fi
  local native=ollama native_tool=ollama native_loop=ollama
  DEMO_NATIVE_PATH="native Ollama path"
  if [ -z "$ollama_url" ]; then DEMO_NATIVE_PATH="OpenAI-compatible tunnel: no Ollama named"; fi
  if [ -z "$ollama_url" ]; then # no native Ollama: every group uses the OpenAI-compatible providers
    native=oa; native_tool=$oa_tool; native_loop=$oa_loop
  fi
  local ollama_adapter=""
  [ -n "$ollama_url" ] && ollama_adapter="{\"name\": \"ollama\", \"type\": \"ollama\", \"capacity\": 8, \"long_capacity\": 2, \"base_url\": \"$ollama_url\"},"
  t_think=${t_think:-$t_tiny}; t_agent=${t_agent:-$t_tool}
  cat >"$RUN_DIR/edge.json" <<JSON
{
  "http_listen": "$DEMO_HTTP",
  "node_listen": "$node_addr",
  "admin_listen": "$DEMO_ADMIN",
  "tls": {"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt", "trust_domain": "iop.local"},
  "api_keys": [{"principal": "demo", "key_sha256": "$DEMO_KEY_SHA256"}],
  "keys": {"store_file": "keys.json"},
  "batches": {"dir": "batches"},
  "enrollment": {"ca_key_file": "pki/ca.key"},
  "node_templates": [{"match": "gpu-*", "adapters": [
    $ollama_adapter
    $compat_adapters
  ]}],
  "models": [
    {"name": "tiny",         "providers": [{"node": "gpu-*", "provider": "$native", "target": "$t_tiny"}]},
    {"name": "tiny-tool",    "providers": [{"node": "gpu-*", "provider": "$native_tool", "target": "$t_tool"}]},
    {"name": "tiny-loop",    "providers": [{"node": "gpu-*", "provider": "$native_loop", "target": "$t_loop"}]},
    {"name": "tiny-oa",      "providers": [{"node": "gpu-*", "provider": "oa", "target": "$t_tiny"}]},
    {"name": "tiny-tool-oa", "providers": [{"node": "gpu-*", "provider": "$oa_tool", "target": "$t_tool"}]},
    {"name": "tiny-loop-oa", "providers": [{"node": "gpu-*", "provider": "$oa_loop", "target": "$t_loop"}]},
    {"name": "tiny-think",     "providers": [{"node": "gpu-*", "provider": "$native", "target": "$t_think"}]},
    {"name": "tiny-think-oa",  "providers": [{"node": "gpu-*", "provider": "oa", "target": "$t_think"}]},
    {"name": "tiny-agent",     "providers": [{"node": "gpu-*", "provider": "$native_tool", "target": "$t_agent"}]},
    {"name": "tiny-agent-oa",  "providers": [{"node": "gpu-*", "provider": "$oa_tool", "target": "$t_agent"}]}
  ],
  "model_discovery": [{"node": "gpu-*", "provider": "$native"}]
}
JSON

  ./bin/edge -config "$RUN_DIR/edge.json" >"$RUN_DIR/edge.log" 2>&1 &
  demo_pids+=($!)
  wait_http "http://$DEMO_ADMIN/healthz" 100 || { log "edge did not start; see .run/edge.log"; tail -n 5 "$RUN_DIR/edge.log" >&2; return 1; }
  # The operator's two commands (docs/operating.md): a token for gpu-1, and
  # the line it prints, run on the node's host (here, this one).
  rm -rf "$RUN_DIR/gpu-1"
  local join
  join=$(./bin/edge tokens create -config "$RUN_DIR/edge.json" -node gpu-1 -dir "$RUN_DIR/gpu-1" 2>/dev/null) ||
    { log "edge tokens create failed"; return 1; }
  log "edge tokens create -config .run/edge.json -node gpu-1  →  ${join%% -token *} -token … -dir .run/gpu-1"
  # shellcheck disable=SC2086 # the printed line is one command with its words
  ./bin/$join >"$RUN_DIR/join.log" 2>&1 || { log "node join failed:"; cat "$RUN_DIR/join.log" >&2; return 1; }
  ./bin/node -config "$RUN_DIR/gpu-1/node.json" >"$RUN_DIR/node.log" 2>&1 &
  demo_pids+=($!)
  log "edge: http://$DEMO_HTTP (admin http://$DEMO_ADMIN), node gpu-1 joined into .run/gpu-1; logs in .run/"
  local i
  for i in $(seq 1 150); do
    if curl -fsS -m 1 "http://$DEMO_ADMIN/status" 2>/dev/null | grep -q '"connected":true'; then
      log "node gpu-1 is ready"
      return 0
    fi
    sleep 0.2
  done
  log "node did not become ready in 30 s; last log lines:"
  tail -n 5 "$RUN_DIR/edge.log" "$RUN_DIR/node.log" >&2 || true
  return 1
}

wait_http() { # url tries(×0.1 s)
  local i
  for i in $(seq 1 "$2"); do curl -fsS -m 1 "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

demo_main() {
  trap 'demo_cleanup; exit 130' INT
  trap 'demo_cleanup; exit 143' TERM
  trap demo_cleanup EXIT
  demo_start_stack || exit 1
  echo
  echo "API key (demo): $DEMO_KEY"
  echo "Models: tiny, tiny-tool, tiny-loop, tiny-think, tiny-agent (${DEMO_NATIVE_PATH:-native Ollama path}); tiny-oa, tiny-tool-oa, tiny-loop-oa, tiny-think-oa, tiny-agent-oa (OpenAI-compatible tunnel)"
  echo
  echo "== chat completion (model tiny) =="
  curl -sS -m 60 "http://$DEMO_HTTP/v1/chat/completions" \
    -H "Authorization: Bearer $DEMO_KEY" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","messages":[{"role":"user","content":"Say hello."}]}' \
    | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["message"]["content"] if "choices" in r else r)' 2>/dev/null \
    || echo "(request failed; see .run/edge.log)"
  echo
  echo "== streamed chat completion (model tiny-oa) =="
  curl -sSN -m 60 "http://$DEMO_HTTP/v1/chat/completions" \
    -H "Authorization: Bearer $DEMO_KEY" -H 'Content-Type: application/json' \
    -d '{"model":"tiny-oa","stream":true,"messages":[{"role":"user","content":"Say hello."}]}' \
    | python3 -u -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line == "data: [DONE]":
        break
    if line.startswith("data: "):
        ev = json.loads(line[6:])
        if "error" in ev:
            print("(error: %s)" % ev["error"].get("message")); break
        for c in ev.get("choices") or []:
            print((c.get("delta") or {}).get("content") or "", end="", flush=True)
print()
' || echo "(request failed; see .run/edge.log)"
  echo
  echo "Serving. Try:"
  echo "  curl http://$DEMO_HTTP/v1/chat/completions -H 'Authorization: Bearer $DEMO_KEY' -H 'Content-Type: application/json' -d '{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
  echo "  curl http://$DEMO_ADMIN/status"
  echo "Keys a team can run (key store .run/keys.json; docs/keys.md):"
  echo "  KEY=\$(./bin/edge keys create -config .run/edge.json -name team-a -models 'tiny,*-oa' -tpm 2000 -tokens-per-day 100000 -expires 7d)"
  echo "  curl -i http://$DEMO_HTTP/v1/chat/completions -H \"Authorization: Bearer \$KEY\" -H 'Content-Type: application/json' -d '{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
  echo "  ./bin/edge keys list -config .run/edge.json; ./bin/edge keys usage -config .run/edge.json; ./bin/edge keys revoke -config .run/edge.json -name team-a"
  echo "Add a node (no edit of .run/edge.json): ./bin/edge tokens create -config .run/edge.json -node gpu-2 -dir .run/gpu-2"
  echo "  then run the line it prints, with ./bin/ before it, and: ./bin/node -config .run/gpu-2/node.json"
  echo "Ctrl-C stops everything."
  # Serve until Ctrl-C, or until one process of the stack exits: then say
  # so and stop the rest (the node would otherwise redial a gone edge
  # forever).
  local rc=0
  wait -n "${demo_pids[@]}" 2>/dev/null || rc=$?
  log "a process of the stack exited (status $rc); stopping the rest (logs in .run/)"
  exit 1
}
