#!/usr/bin/env bash
# Java vs C recall round trip against one kalosd in another process (same run, same store).
#
#   bindings/java/bench/run.sh [N] [DIM] [K] [ITERS]      (defaults 10000 128 10 20000)
#
# Needs target/release/{kalosd,libkalos.so} (built if missing) and bindings/java/target/classes
# (mvn compile; built if missing). Prints one line per path: p50_us / p99_us / mean_us.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
N="${1:-10000}"; DIM="${2:-128}"; K="${3:-10}"; ITERS="${4:-20000}"; WARM=$((ITERS / 10))
rel="$root/target/release"
if [[ ! -x "$rel/kalosd" || ! -f "$rel/libkalos.so" ]]; then
  (cd "$root" && nice cargo build --release)
fi
if [[ ! -d "$root/bindings/java/target/classes/io/kalos" ]]; then
  (cd "$root/bindings/java" && mvn -q -B compile)
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
gcc -O2 -o "$out/recall_bench" "$here/recall_bench.c" -I"$root/include" -L"$rel" -lkalos -Wl,-rpath,"$rel"
JAVA="${JAVA:-java}"   # e.g. a jlink'd runtime on a machine without a JDK
if [[ -n "${RECALLBENCH_CLASSES:-}" ]]; then
  cp "$RECALLBENCH_CLASSES"/*.class "$out/"
else
  javac -d "$out" -cp "$root/bindings/java/target/classes" "$here/RecallBench.java"
fi
name="jbench-$$"
"$rel/kalosd" serve --name "$name" --dim "$DIM" --metric ip --capacity $((N + 1000)) ${KALOSD_ARGS:-} > "$out/kalosd.log" 2>&1 &
kpid=$!
trap 'kill $kpid 2>/dev/null || true; wait $kpid 2>/dev/null || true; rm -rf "$out"' EXIT
for _ in $(seq 100); do grep -q "kalosd: serving" "$out/kalosd.log" && break; sleep 0.1; done
grep "kalosd: serving" "$out/kalosd.log"
export KALOS_LIBRARY="$rel/libkalos.so"
jcp="$root/bindings/java/target/classes:$out"
# Java first fills the store, then both languages run the same loop, ROUNDS times, interleaved
# (C first, then Java, each round), so drift on a busy machine hits both alike.
"$JAVA" -cp "$jcp" RecallBench "$name" "$N" "$K" 1 0 | grep '^#'
for r in $(seq "${ROUNDS:-3}"); do
  echo "# round $r"
  "$out/recall_bench" "$name" "$K" "$ITERS" "$WARM"
  "$JAVA" -cp "$jcp" RecallBench "$name" "$N" "$K" "$ITERS" "$WARM" | grep -v '^#'
done
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $("$JAVA" -version 2>&1 | head -1)"
