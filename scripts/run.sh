#!/usr/bin/env bash
# README command 1: install what is missing, build, start txl-server on the
# bundled model and stream a generation from it with txl-client.
#   KEEP_SERVING=1 scripts/run.sh   leaves the server running afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${MODEL:-model/bundled/shakespeare_char.pt}
LISTEN=${LISTEN:-127.0.0.1:50051}
HTTP_LISTEN=${HTTP_LISTEN:-127.0.0.1:8080}
PROMPT=${PROMPT:-$'ROMEO:\n'}

# Idle OpenMP workers sleep instead of spinning (docs/PERFORMANCE.md).
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} "$BUILD_DIR/server/txl-server" --model "$MODEL" --listen "$LISTEN" --metrics_listen 127.0.0.1:9464 \
  --http_listen "$HTTP_LISTEN" &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  "$BUILD_DIR/client/txl-client" --server "$LISTEN" health >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { echo "run.sh: txl-server exited" >&2; exit 1; }
  sleep 0.2
done
"$BUILD_DIR/client/txl-client" --server "$LISTEN" info | head -20
session=$("$BUILD_DIR/client/txl-client" --server "$LISTEN" create)
echo "== streaming a generation (session $session)"
"$BUILD_DIR/client/txl-client" --server "$LISTEN" --session "$session" --max_new_tokens 300 \
  --temperature 0.8 --seed 7 generate "$PROMPT"
echo "== the same session continues; only the new text is sent"
"$BUILD_DIR/client/txl-client" --server "$LISTEN" --session "$session" --max_new_tokens 200 \
  --temperature 0.8 --seed 8 generate $'\nJULIET:\n'
"$BUILD_DIR/client/txl-client" --server "$LISTEN" sessions get "$session"
if command -v curl >/dev/null; then
  echo "== the same server over HTTP (OpenAI-style; docs/HTTP.md); playground: http://$HTTP_LISTEN/"
  curl -s "http://$HTTP_LISTEN/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "ROMEO:", "max_tokens": 60, "temperature": 0.8, "seed": 9}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])'
fi
if [ "${KEEP_SERVING:-0}" = 1 ]; then
  echo "== txl-server keeps serving on $LISTEN, HTTP and the playground on http://$HTTP_LISTEN/" \
    "(metrics on 127.0.0.1:9464); Ctrl-C stops it"
  wait $server
fi
