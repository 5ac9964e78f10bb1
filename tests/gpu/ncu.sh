#!/usr/bin/env bash
# Nsight Compute profiles of the search kernels at 1M x 768 f16 (a tuning aid; run.sh ncu).
# For each Q in $NCU_Q (default "1 2 8"), multi_bench.py sends batches of Q queries under ncu
# (--set full, clocks left alone), which profiles one launch of the kernels that answer them
# after 20 launches of warm-up: the single-query scan for Q = 1, the multi-query pass and its
# merge for Q = 2..16 ($NCU_KERNELS overrides the regex). NCU_Q may also name i8 (the int8 scan's
# single-query kernel, int8_bench.py at 1M x 768 f16, $NCU_INT8_ARGS) and n4 (the same with the
# 4-bit first pass, KALOS_INT8_NIBBLE=256). Writes two files to $OUT (a call of the
# device tool returns at most 8): ncu_summary.txt (ncu_summary.py) and ncu_csv.tgz (the details
# and SASS-source pages as CSV); the .ncu-rep reports stay in /tmp/kalos-ncu.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"; cd "$HERE"
OUT="${OUT:-$HERE/out}"; mkdir -p "$OUT"
export KALOS_LIB="${KALOS_LIB:-$HERE/libkalos.so}" PYTHONPATH="${PYTHONPATH:-$HERE/python}"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu: not found"; exit 1; }
T=/tmp/kalos-ncu; rm -rf "$T"; mkdir -p "$T"
RC=0
I8="${NCU_INT8_ARGS:---n 1000000 --dim 768 --rerank 0 --no-exact --no-batch --queries 60 --recall-queries 10}"
for q in ${NCU_Q:-1 2 8}; do
  nib=0; cmd="python3 multi_bench.py"
  case $q in
    1) re=scan_topk;;
    i8) re=scan_topk; cmd="python3 int8_bench.py $I8";;
    n4) re=scan_topk; cmd="python3 int8_bench.py $I8"; nib=256;;
    [2-8]) re='scan_multi1|multi_merge';;
    *) re='scan_multi2|multi_merge';;
  esac
  re="${NCU_KERNELS:-$re}"
  KALOS_INT8_NIBBLE=$nib MB_Q=$q MB_REPS=30 timeout ${T_NCU:-200} "$NCU" --clock-control none --target-processes all \
    -k "regex:$re" --launch-skip 20 --launch-count 2 --set full --import-source no -f -o "$T/q$q" $cmd \
    > "$T/q$q.log" 2>&1; r=$?
  echo "q=$q kernels /$re/: ncu rc=$r"; [ $r -ne 0 ] && { RC=1; tail -5 "$T/q$q.log"; continue; }
  "$NCU" -i "$T/q$q.ncu-rep" --page details --csv > "$T/q$q.details.csv" 2>&1
  "$NCU" -i "$T/q$q.ncu-rep" --page source --csv --print-source sass > "$T/q$q.sass.csv" 2>&1
done
python3 ncu_summary.py "$T" > "$OUT/ncu_summary.txt" 2>&1 || RC=1
(cd "$T" && tar czf "$OUT/ncu_csv.tgz" ./*.csv)
cat "$OUT/ncu_summary.txt"
exit $RC
