#!/usr/bin/env bash
# Recall round-trip benchmark of the Go binding next to the C figure, same run, same server.
#
#   bindings/go/bench.sh              build into target/gobench, then run
#   bindings/go/bench.sh --build      only build (e.g. to copy target/gobench to another host)
#   bindings/go/bench.sh --run        only run what target/gobench holds (no Go or cargo needed)
#
# One kalosd (CPU engine) is started and filled with KALOS_BENCH_N random vectors of
# KALOS_BENCH_DIM; then the C program (bench/recall_bench.c, compiled against
# include/kalos.h) and the Go benchmark (BenchmarkRecall) take turns against it,
# KALOS_BENCH_ROUNDS times. Results are in docs/benchmarks/go.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${KALOS_BENCH_OUT:-$ROOT/target/gobench}
N=${KALOS_BENCH_N:-1000}
DIM=${KALOS_BENCH_DIM:-128}
K=${KALOS_BENCH_K:-10}
ITERS=${KALOS_BENCH_ITERS:-20000}
ROUNDS=${KALOS_BENCH_ROUNDS:-2}
THREADS=${KALOS_BENCH_THREADS:-1}
mode=${1:-all}

if [[ $mode == all || $mode == --build ]]; then
  [[ -f $ROOT/target/release/libkalos.so && -f $ROOT/target/release/kalosd ]] ||
    (cd "$ROOT" && nice cargo build --release)
  mkdir -p "$OUT"
  cp "$ROOT/target/release/libkalos.so" "$ROOT/target/release/kalosd" "$OUT/"
  gcc -O2 -Wall -Wextra -I "$ROOT/include" "$HERE/bench/recall_bench.c" -L "$OUT" -lkalos \
    -Wl,-rpath,'$ORIGIN' -o "$OUT/recall_bench"
  "$HERE/gen-pc.sh" "$ROOT/include" "$OUT" > "$OUT/kalos.pc"   # the binding's cgo flags
  (cd "$HERE" && PKG_CONFIG_PATH="$OUT" go test -c -o "$OUT/kalos.test" .)
  (cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown) > "$OUT/COMMIT"
fi
[[ $mode == --build ]] && exit 0

name=gobench-$$
log=$(mktemp)
"$OUT/kalosd" serve --name "$name" --dim "$DIM" --backend cpu --threads "$THREADS" >"$log" 2>&1 &
kpid=$!
trap 'kill -TERM $kpid 2>/dev/null || true; wait $kpid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do grep -q serving "$log" && break; sleep 0.05; done
grep -q serving "$log" || { cat "$log"; echo "kalosd did not start" >&2; exit 1; }

echo "date:    $(date -u +%Y-%m-%dT%H:%MZ)"
echo "commit:  $(cat "$OUT/COMMIT" 2>/dev/null || echo unknown)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $(uname -r)"
echo "store:   n=$N dim=$DIM k=$K metric=cosine engine=cpu threads=$THREADS (kalosd, another process)"
"$OUT/recall_bench" "$name" --fill "$N" --iters 0 --warmup 0
run_c() { "$OUT/recall_bench" "$name" --k "$K" --iters "$ITERS" --warmup 2000; }
run_go() {
  KALOS_BENCH_STORE=$name KALOS_BENCH_K=$K LD_LIBRARY_PATH="$OUT" "$OUT/kalos.test" \
    -test.run '^$' -test.bench 'BenchmarkRecall|BenchmarkCgoCall' -test.benchtime "${ITERS}x" |
    grep -E '^Benchmark'
}
# Alternate the order so neither side always runs first.
for r in $(seq 1 "$ROUNDS"); do
  echo "--- round $r"
  if (( r % 2 )); then run_c; run_go; else run_go; run_c; fi
done
