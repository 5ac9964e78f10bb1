#!/usr/bin/env bash
# Tuning sweep on the H200 (same files as run.sh): single-query grid shape and load flavour.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"; cd "$HERE"
OUT="${OUT:-$HERE/out}"; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1 KALOS_LIB="$HERE/libkalos.so" KALOS_CUDA_REPORT=1
export BENCH_ONLY="10k x 128 f32,100k x 768 f16,1M x 768 f16" BENCH_NREQ=1000
for cfg in "A default|" "B grid3|KALOS_GRID_PER_SM=3" "C ldna|KALOS_NVRTC_EXTRA=-DLDNA=1" "D grid3+ldna+rows256|KALOS_GRID_PER_SM=3 KALOS_NVRTC_EXTRA=-DLDNA=1 KALOS_MIN_ROWS=256"; do
  name="${cfg%%|*}"; envs="${cfg#*|}"
  echo "== $name ($envs)"
  env $envs timeout 100 python3 bench.py > "$OUT/tune-${name%% *}.log" 2>&1
  grep -E "^(10k|100k|1M) .*(kalos p50|batch)" "$OUT/tune-${name%% *}.log" | cut -c1-150
  grep "round trips" "$OUT/tune-${name%% *}.log" | sed 's/.*p50/gpu p50/' | head -3
done
