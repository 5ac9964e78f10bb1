#!/usr/bin/env bash
# Kalos over NATS JetStream on one machine (docs/CLUSTER.md): a 3-node nats-server cluster with
# JetStream, 3 kalosd each holding 2 of 3 shards, and a client (examples/cluster_client.rs)
# writing through one host and recalling through another: read-your-writes, a forwarded
# recall, scatter-gather, and their latencies.
#   scripts/cluster-demo.sh           the demo
#   BENCH=1 scripts/cluster-demo.sh   also a plain single-host kalosd for comparison and the
#                                     catch-up rate of a replica killed with -9 (docs/BENCHMARKS.md)
# nats-server v2.15.3 is taken from PATH or $(go env GOPATH)/bin, else installed there with
# `go install`. ROWS, DIM, QUERIES and PORT (first of 6 consecutive ports) override the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-20000}
DIM=${DIM:-64}
QUERIES=${QUERIES:-2000}
PORT=${PORT:-14222}
export PATH="$PATH:$(go env GOPATH 2>/dev/null)/bin"
command -v nats-server >/dev/null || go install github.com/nats-io/nats-server/v2@v2.15.3
cargo build --release --bin kalosd --example cluster_client
KALOSD=$(realpath "${CARGO_TARGET_DIR:-target}")/release/kalosd
CLIENT=$(realpath "${CARGO_TARGET_DIR:-target}")/release/examples/cluster_client
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ROUTES="nats://127.0.0.1:$((PORT + 3)),nats://127.0.0.1:$((PORT + 4)),nats://127.0.0.1:$((PORT + 5))"
URLS="nats://127.0.0.1:$PORT,nats://127.0.0.1:$((PORT + 1)),nats://127.0.0.1:$((PORT + 2))"
for i in 0 1 2; do
  nats-server -n "n$i" -a 127.0.0.1 -p $((PORT + i)) -js -sd "$WORK/js$i" --cluster_name kalos-demo \
    --cluster "nats://127.0.0.1:$((PORT + 3 + i))" --routes "$ROUTES" >"$WORK/nats$i.log" 2>&1 &
  PIDS+=($!)
done

NAMES=()
# start_kalosd NODE SHARDS: a kalosd named cdemo-NODE-$$ holding SHARDS; waits until it serves.
start_kalosd() {
  local node=$1 shards=$2 name="cdemo-$1-$$"
  mkdir -p -m 700 "$WORK/data-$node"
  "$KALOSD" serve --name "$name" --dim "$DIM" --capacity $((ROWS * 4)) --data-dir "$WORK/data-$node" \
    --cluster "$URLS" --cluster-store "cdemo$$" --shard-count 3 --shards "$shards" --node "$node" \
    >"$WORK/kalosd-$node.out" 2>>"$WORK/kalosd-$node.log" &
  PIDS+=($!)
  eval "PID_$node=$!"
  for _ in $(seq 1 300); do
    grep -q "serving" "$WORK/kalosd-$node.out" && return 0
    sleep 0.1
  done
  cat "$WORK/kalosd-$node.log"
  return 1
}
start_kalosd a 0,1
start_kalosd b 1,2
start_kalosd c 2,0
NAMES=("cdemo-a-$$" "cdemo-b-$$" "cdemo-c-$$")
echo "cluster: nats-server x3 ($URLS), kalosd x3 (${NAMES[*]}), shards 0,1 / 1,2 / 2,0"

SINGLE=()
if [[ -n ${BENCH:-} ]]; then
  mkdir -p -m 700 "$WORK/single"
  "$KALOSD" serve --name "cdemo-single-$$" --dim "$DIM" --capacity $((ROWS * 4)) \
    --data-dir "$WORK/single" >"$WORK/single.out" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 300); do grep -q "serving" "$WORK/single.out" && break; sleep 0.1; done
  SINGLE=(--single "cdemo-single-$$")
fi

# The first write waits until the shards' streams exist (the hosts create them at start).
for _ in $(seq 1 100); do
  "$CLIENT" --hosts "${NAMES[0]}" --shards 3 --holds 0,1 --phase load --rows 1 >/dev/null 2>&1 && break
  sleep 0.3
done
"$CLIENT" --hosts "$(IFS=,; echo "${NAMES[*]}")" --shards 3 --holds 0,1:1,2:2,0 --rows "$ROWS" --queries "$QUERIES" "${SINGLE[@]}"

if [[ -n ${BENCH:-} ]]; then
  # Catch-up: kill -9 host c, write through a while it is down, restart it, time until it has
  # applied everything (from its checkpoint: the log shows where each shard resumed).
  kill -9 "$PID_c"
  sleep 0.5
  LOAD=$("$CLIENT" --hosts "${NAMES[0]}" --shards 3 --holds 0,1 --phase load --rows "$ROWS")
  echo "$LOAD"
  TOKEN=${LOAD##*token=}
  T0=$(date +%s.%N)
  start_kalosd c 2,0
  "$CLIENT" --hosts "${NAMES[2]}" --shards 3 --holds 2,0 --phase wait --token "$TOKEN"
  echo "restart to caught up: $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }') s (process start, local recovery, log tail)"
  grep "catching up from" "$WORK/kalosd-c.log" | sed 's/.*msg="cluster: /  /; s/"$//'
fi
