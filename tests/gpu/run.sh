#!/usr/bin/env bash
# Every GPU check and benchmark in one call, for the H200 machine (see docs/GPU.md).
# Expects, next to this script (tests/gpu/stage.sh puts them in .gpu/): libkalos.so (release
# build), kalos_ct.py, correctness.py, bench.py, python/kalos (the Python package) and c_harness
# (the multi-process C harness from tests/c/).
# Usage: bash run.sh [doctor|correctness|probe|breakdown|bench|harness|concurrency|multi|ncu|filter|int8|shards]...
# (default: all but breakdown, concurrency, multi and ncu). Logs go to $OUT.
# doctor: kalosd doctor, a compile of every kernel variant with the machine's own NVRTC
# (kalosd doctor --compile), and kalosd serve --backend cuda answering a recall.
# probe: gpu_probe (examples/gpu_probe.rs), the batch engine in-process under the settings in
# $PROBE_SETTINGS (pipe:gemm_sms:score16), each checked against the first.
# concurrency: concurrency.py, P = 1..64 conc_client processes (tests/gpu/conc_client.c) recalling
# single queries from one server, next to in-process torch batches of B = P (CONC_* settings in
# its header); $OUT/concurrency.json and concurrency.png.
# multi: multi_bench.py, one client sending batches of Q = 1..64 queries, the cost of each Q
# against one query, torch on the same table beside it (MB_* settings in its header).
# ncu: ncu.sh, Nsight Compute profiles of the single-query scan and the multi-query pass at
# 1M x 768 f16 (NCU_Q, NCU_KERNELS), summarised in $OUT/ncu_summary.txt.
# filter: filter_bench.py, 1M x 768 f16 recalls under filters matching 50% .. 0.01% of rows,
# torch mask-then-topk beside them, and the engine's filtered-search phases (FB_ARGS).
# int8: int8_bench.py, the int8 scan against the exact scan and torch at 1M x 768 f16 (INT8_ARGS);
# With embed/ staged (stage.sh's KALOS_EMBED), also the MiniLM embeddings (embed_torch.py on the
# GPU) and their recall through the GPU's int8 scan with the numpy models beside it
# (int8_recall.py --backend cuda --dtype f16 --simulate, R in $RECALL_R): $OUT/int8_recall.json.
# shards: shards_bench.py, device shards: 1M x 768 f16 on one GPU, in 2 shards on it, and G x 1M
# over the host's G GPUs (G >= 2), torch on one and on G GPUs beside them (SHB_* settings).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$HERE/out}"; mkdir -p "$OUT"; export OUT
export PYTHONUNBUFFERED=1
# KALOS_RUN_LIB: the library the Python scripts load (default: the staged build); a "before"
# build staged by stage.sh's KALOS_BASE_REV is base/libkalos.so, for before/after runs of a bench:
#   KALOS_RUN_LIB=$PWD/base/libkalos.so OUT=$OUT/before bash run.sh filter; OUT=$OUT/after bash run.sh filter
RUN_LIB="${KALOS_RUN_LIB:-$HERE/libkalos.so}"
export KALOS_LIB="$RUN_LIB" KALOS_LIBRARY="$RUN_LIB"
export PYTHONPATH="$HERE/python${PYTHONPATH:+:$PYTHONPATH}"   # the kalos package (stage.sh)
export KALOS_COMMIT="$(cat "$HERE/COMMIT" 2>/dev/null | tr '\n' ' ')"
export KALOS_CUDA_REPORT=1
WHAT="${*:-doctor correctness probe bench harness}"
cd "$HERE"
{
  date -u; uname -a
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  df -h /dev/shm | tail -1; nproc; python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
  ldconfig -p | grep -E 'libnvrtc|libcublas\.|libcuda\.' | head -5
} > "$OUT/env.txt" 2>&1
head -3 "$OUT/env.txt"
RC=0
D_RES="not run"; C_RES="not run"; P_RES="not run"; B_RES="not run"; H_RES="not run"; N_RES="not run"; M_RES="not run"
F_RES="not run"; I_RES="not run"; S_RES="not run"; U_RES="not run"
if [[ " $WHAT " == *" doctor "* ]]; then
  ./kalosd doctor --compile > "$OUT/doctor.log" 2>&1; r=$?
  grep -vE "^FAIL|^ " "$OUT/doctor.log" | head -12
  grep -A12 "^FAIL" "$OUT/doctor.log" | head -40
  # A standalone server on the GPU, and a client recalling from it.
  name="doctor-$$"
  ./kalosd serve --name "$name" --dim 128 --backend cuda --synthetic 20000 > "$OUT/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do grep -q "serving" "$OUT/serve.log" && break; sleep 0.1; done
  python3 -c "
import sys, numpy as np, kalos
with kalos.open('$name', role='client') as k:
    s = k.stats(); ids, scores = k.recall(np.random.default_rng().standard_normal(128).astype(np.float32), k=5)
    print('serve --backend cuda: engine', s['engine_name'], 'fallback', repr(s['fallback_reason']), 'hits', len(ids))
    sys.exit(0 if s['engine'] == 'cuda' and len(ids) == 5 else 1)
" 2>&1 | tee -a "$OUT/serve.log"; r2=${PIPESTATUS[0]}
  kill -TERM $spid 2>/dev/null; wait $spid
  head -3 "$OUT/serve.log"
  D_RES="compile rc=$r ($(grep -o '[0-9]* of [0-9]* variants compiled' "$OUT/doctor.log")), serve rc=$r2"
  { [ $r -ne 0 ] || [ $r2 -ne 0 ]; } && RC=1
fi
if [[ " $WHAT " == *" correctness "* ]]; then
  timeout ${T_CORR:-480} python3 correctness.py ${CORRECTNESS_SUITES:-} > "$OUT/correctness.log" 2>&1; r=$?
  grep -E "^(FAIL|INFO|suite|CORRECTNESS)" "$OUT/correctness.log" | cut -c1-400 | tail -40
  C_RES="$(grep '^CORRECTNESS' "$OUT/correctness.log" || echo "crashed/timed out rc=$r")"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" probe "* ]] && [ -x ./gpu_probe ]; then
  timeout ${T_PROBE:-150} ./gpu_probe ${PROBE_ARGS:-1000000 768 f16 1024} ${PROBE_SETTINGS:-0:0:0 0:0:1 1:0:1 1:0:0} > "$OUT/probe.log" 2>&1; r=$?
  cat "$OUT/probe.log" | cut -c1-260; P_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" breakdown "* ]]; then
  # A batch's client / server / engine time from a separate process (batch_breakdown.py), the
  # defaults alternated with plain stores in the client's copy (KALOS_COPY_NT=0).
  for nt in 1 0 1 0; do
    KALOS_COPY_NT=$nt timeout ${T_BREAKDOWN:-60} python3 batch_breakdown.py ${BREAKDOWN_ARGS:-1000000 768 1 1024 100} 2>&1 \
      | grep -E "batch_breakdown|batched searches of 1024|Error" | sed "s/^/KALOS_COPY_NT=$nt /" | cut -c1-330 | tee -a "$OUT/breakdown.log"
  done
fi
if [[ " $WHAT " == *" bench "* ]]; then
  timeout ${T_BENCH:-240} python3 bench.py > "$OUT/bench.log" 2>&1; r=$?
  grep -vE "^(READY)" "$OUT/bench.log" | grep -v "round trips" | tail -22; grep "round trips" "$OUT/bench.log" | cut -c1-200 | head -12
  # With KALOS_CLIENT_TRACE=1 the client printed each batch call's phases: their p50 / p99.
  [ "${KALOS_CLIENT_TRACE:-}" = 1 ] && python3 trace_summary.py "$OUT/bench.log"
  B_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" harness "* ]]; then
  if [ -x ./c_harness ]; then
    # auto: every server that can use the GPU does (forked children of a process that already
    # initialised CUDA cannot: CUDA does not survive fork, they fall back to the CPU engine).
    KALOS_BACKEND=auto timeout ${T_HARNESS:-45} ./c_harness > "$OUT/harness.log" 2>&1; r=$?
    echo "-- KALOS_BACKEND=cuda --" >> "$OUT/harness.log"
    KALOS_BACKEND=cuda timeout ${T_HARNESS:-45} ./c_harness >> "$OUT/harness.log" 2>&1; r2=$?
    grep -E "FAIL|passed" "$OUT/harness.log" | tail -8; H_RES="auto rc=$r, cuda rc=$r2"; [ $r -ne 0 ] && RC=1
  else
    H_RES="no tests/c harness binary shipped"
  fi
fi
if [[ " $WHAT " == *" concurrency "* ]]; then
  timeout ${T_CONC:-300} python3 concurrency.py > "$OUT/concurrency.log" 2>&1; r=$?
  grep -E "^(FAIL|WARN|INFO|GPU|== table|  )" "$OUT/concurrency.log" | cut -c1-300 | tail -60
  sed -n '/^== concurrency table/,$p' "$OUT/concurrency.log"
  N_RES="$(grep '^CONCURRENCY' "$OUT/concurrency.log" | cut -c1-400 || true)"; N_RES="${N_RES:-crashed/timed out rc=$r}"
  [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" multi "* ]]; then
  timeout ${T_MULTI:-240} python3 multi_bench.py > "$OUT/multi_bench.log" 2>&1; r=$?
  grep -vE "^READY" "$OUT/multi_bench.log" | cut -c1-300 | tail -24
  M_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" ncu "* ]]; then
  bash ncu.sh > "$OUT/ncu.log" 2>&1; r=$?
  tail -60 "$OUT/ncu.log" | cut -c1-200
  U_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" filter "* ]]; then
  timeout ${T_FILTER:-200} python3 filter_bench.py ${FB_ARGS:---backend cuda --n 1000000 --dim 768 --dtype f16 --queries 500} > "$OUT/filter_bench.log" 2>&1; r=$?
  grep -E "^(\||engine)|filtered searches|Error" "$OUT/filter_bench.log" | cut -c1-300
  F_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
if [[ " $WHAT " == *" int8 "* ]]; then
  timeout ${T_INT8:-300} python3 int8_bench.py ${INT8_ARGS:---n 1000000 --dim 768} > "$OUT/int8_bench.log" 2>&1; r=$?
  grep -E "^(\||int8 bench)|Error|Traceback" "$OUT/int8_bench.log" | cut -c1-300
  I_RES="rc=$r"; [ $r -ne 0 ] && RC=1
  if [ -d embed ]; then
    { [ -f emb/minilm_manpages.npy ] || timeout ${T_EMBED:-240} python3 embed_torch.py embed emb; } \
      > "$OUT/embed.log" 2>&1 \
      && timeout ${T_RECALL:-300} python3 int8_recall.py --npy emb/minilm_manpages.npy --backend cuda \
        --dtype f16 --simulate --queries 2000 --rerank ${RECALL_R:-10,16,20,32,40,64,80} \
        --out "$OUT/int8_recall.json" > "$OUT/int8_recall.log" 2>&1; r=$?
    tail -3 "$OUT/embed.log"; grep -vE "^\s*$" "$OUT/int8_recall.log" | tail -40 | cut -c1-300
    I_RES="$I_RES, recall rc=$r"; [ $r -ne 0 ] && RC=1
  fi
fi
if [[ " $WHAT " == *" shards "* ]]; then
  timeout ${T_SHARDS:-420} python3 shards_bench.py > "$OUT/shards_bench.log" 2>&1; r=$?
  tail -8 "$OUT/shards_bench.log" | cut -c1-300
  S_RES="rc=$r"; [ $r -ne 0 ] && RC=1
fi
echo "== summary =="
echo "doctor:      $D_RES"
echo "correctness: $C_RES"
echo "probe:       $P_RES"
echo "bench:       $B_RES"
echo "C harness:   $H_RES"
echo "concurrency: $N_RES"
echo "multi:       $M_RES"
echo "ncu:         $U_RES"
echo "filter:      $F_RES"
echo "int8:        $I_RES"
echo "shards:      $S_RES"
exit $RC
