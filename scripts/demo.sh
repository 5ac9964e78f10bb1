#!/usr/bin/env bash
# The main job: a kalosd server with a real memory table (100k synthetic memories with payload
# text, 384-d cosine, 100 users), and a client in a separate process that prints recalled
# memories and recall latency percentiles. Usage: scripts/demo.sh [ROWS] [DIM]
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-100000}
DIM=${2:-384}
NAME="demo-$$"
cargo build --release --bin kalosd --example recall_client
LOG=$(mktemp)
target/release/kalosd serve --name "$NAME" --dim "$DIM" --metric cosine --capacity "$ROWS" --synthetic "$ROWS" --seed 42 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; cat "$LOG"; rm -f "$LOG"' EXIT
# kalosd prints "serving" once the table is loaded.
for _ in $(seq 1 1200); do
  grep -q "serving" "$LOG" && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
target/release/examples/recall_client --name "$NAME" --queries "${QUERIES:-5000}" --k 10
