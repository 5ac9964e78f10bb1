#!/usr/bin/env bash
# Tuning sweep on the H200 (same files as run.sh, staged by stage.sh): how a single query reaches
# the GPU (KALOS_SQ_MODE), kernel phase times (KALOS_PROF)
# and the batch path's score-tile size (KALOS_TILE_MB). CONFIGS="name|ENV=.. ENV=..|tables;...". No torch peer
# here (run.sh measures it). Add KALOS_BATCH_PROFILE=1 to a config for the engine-side batch
# profile (it re-runs the GEMMs and filters inside each batch request, so that config's client
# batch q/s is not comparable).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"; cd "$HERE"
OUT="${OUT:-$HERE/out}"; mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 KALOS_LIB="$HERE/libkalos.so" KALOS_LIBRARY="$HERE/libkalos.so" KALOS_CUDA_REPORT=1
export PYTHONPATH="$HERE/python" BENCH_NREQ=${BENCH_NREQ:-1000} BENCH_NO_TORCH=1
run() {  # name, env..., BENCH_ONLY value last
  local name="$1"; shift
  echo "== $name ($*)"
  env "$@" timeout ${T_TUNE:-150} python3 bench.py > "$OUT/tune-$name.log" 2>&1
  grep -E "kalos p50 |C client|batch [0-9]+:|batches alternating|kernel phases|batched searches|^ERROR|Traceback|Error" "$OUT/tune-$name.log" | cut -c1-400 | head -16
  grep -E "batch profile: 1024|batch host phases" "$OUT/tune-$name.log" | cut -c1-260 | tail -4
  grep "round trips" "$OUT/tune-$name.log" | sed 's/.*round trips[^:]*:/  gpu:/' | head -4
}
S="10k x 128 f32,100k x 768 f16"; L="$S,1M x 768 f16"
if [ -n "${CONFIGS:-}" ]; then :; else
CONFIGS="plain||$L;prof|KALOS_PROF=1|$S;batchprof|KALOS_BATCH_PROFILE=1|1M x 768 f16"
fi
IFS=';' read -ra CFG <<< "$CONFIGS"
for c in "${CFG[@]}"; do
  IFS='|' read -r name envs only <<< "$c"
  # shellcheck disable=SC2086
  run "$name" $envs "BENCH_ONLY=$only"
done
