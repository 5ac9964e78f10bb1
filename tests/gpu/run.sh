#!/usr/bin/env bash
# Every GPU check and benchmark in one call, for the H200 machine (see docs/GPU.md).
# Expects, next to this script: libkalos.so (release build), kalos_ct.py, correctness.py,
# bench.py, and optionally c_harness (the multi-process C harness from tests/c/).
# Usage: bash run.sh [correctness|bench|harness]...   (default: all). Logs go to $OUT.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$HERE/out}"; mkdir -p "$OUT"; export OUT
export PYTHONUNBUFFERED=1
export KALOS_LIB="$HERE/libkalos.so"
WHAT="${*:-correctness bench harness}"
cd "$HERE"
{
  date -u; uname -a
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  df -h /dev/shm | tail -1; nproc; python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
  ldconfig -p | grep -E 'libnvrtc|libcublas\.|libcuda\.' | head -5
} > "$OUT/env.txt" 2>&1
head -3 "$OUT/env.txt"
RC=0
C_RES="not run"; B_RES="not run"; H_RES="not run"
if [[ " $WHAT " == *" correctness "* ]]; then
  timeout 330 python3 correctness.py ${CORRECTNESS_SUITES:-} > "$OUT/correctness.log" 2>&1; r=$?
  grep -E "^(FAIL|INFO|suite|CORRECTNESS)" "$OUT/correctness.log" | cut -c1-400 | tail -40
  C_RES="$(grep '^CORRECTNESS' "$OUT/correctness.log" || echo "crashed/timed out rc=$r")"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" bench "* ]]; then
  timeout 300 python3 bench.py > "$OUT/bench.log" 2>&1; r=$?
  grep -vE "^(READY)" "$OUT/bench.log" | tail -25
  B_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" harness "* ]]; then
  if [ -x ./c_harness ]; then
    KALOS_BACKEND=cuda timeout 120 ./c_harness > "$OUT/harness.log" 2>&1; r=$?
    tail -5 "$OUT/harness.log"; H_RES="rc=$r (KALOS_BACKEND=cuda)"; [ $r -ne 0 ] && RC=1
  else
    H_RES="no tests/c harness binary shipped"
  fi
fi
echo "== summary =="
echo "correctness: $C_RES"
echo "bench:       $B_RES"
echo "C harness:   $H_RES"
exit $RC
