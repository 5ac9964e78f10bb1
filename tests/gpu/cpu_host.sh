#!/usr/bin/env bash
# The CPU engine on the GPU machine's host cores (issue #29, item 5): for each size, a kalosd
# serving N x DIM f32 on the CPU engine (one engine of 1 thread, of the default count (all cores but
# one on hosts of 8 or more), of every core, or S device shards), the C client
# (bench_recall) recalling k = 10 from another process, and in the same run numpy's matmul +
# argpartition in-process on the same size at 1, 4 and all threads (cpu_peer.py), and faiss-cpu's
# IndexFlatIP.search where faiss imports (installed, or a wheel staged in wheels/).
# Usage (in .gpu/): bash cpu_host.sh [N:DIM:ITERS ...]; results in $OUT/cpu_host.log.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"; cd "$HERE"
OUT="${OUT:-$HERE/out}"; mkdir -p "$OUT"
LOG="$OUT/cpu_host.log"
C=$(nproc)
# Where faiss is not installed: the wheels staged in wheels/ (stage.sh, KALOS_PEER_WHEELS),
# unpacked into one folder on PYTHONPATH.
if ! python3 -c 'import faiss' 2>/dev/null && ls wheels/*.whl > /dev/null 2>&1; then
  dir="${TMPDIR:-/tmp}/kalos-peers"; rm -rf "$dir"
  for w in wheels/*.whl; do python3 -m zipfile -e "$w" "$dir"; done
  export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "cpu_host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), commit $(cat COMMIT 2>/dev/null | tr '\n' ' ')" | tee -a "$LOG"
# Sockets, NUMA nodes and caches: a table first touched by one thread lives on one node.
lscpu 2>/dev/null | grep -Ei '^(socket|numa|l2|l3|thread)' | tr -s ' ' | sed 's/^/  /' | tee -a "$LOG"
for spec in ${*:-10000:128:3000 100000:384:600 1000000:128:200}; do
  IFS=: read -r n d it <<< "$spec"
  for cfg in "threads 1" "threads 0" "threads $C" "shards $((C - 1))"; do
    set -- $cfg
    name="cpuh-$$-$n-$1-$2"
    if [ "$1" = threads ]; then extra="--threads $2"; else extra="--device-shards $2"; fi
    # --threads 0: the engine's default (all cores but one where its workers poll).
    ./kalosd serve --name "$name" --dim "$d" --backend cpu --synthetic "$n" --seed 7 $extra > "$OUT/cpuh-serve.log" 2>&1 &
    spid=$!
    for _ in $(seq 600); do grep -q "serving" "$OUT/cpuh-serve.log" && break; sleep 0.1; done
    r=$(timeout 120 ./bench_recall "$name" "$it" 10 2>&1 | tr '\n' ' ')
    # Where the server's threads last ran (CPU, share of a CPU): threads stacked on one CPU show here.
    ps -L -o psr=,pcpu=,comm= -p $spid 2>/dev/null | sort -n | awk '{printf "%s:%s:%s ", $3, $1, $2}' | sed "s/^/  threads (name:cpu:%cpu): /" >> "$OUT/cpuh-placement.log"
    echo " <- $n x $d $1=$2" >> "$OUT/cpuh-placement.log"
    echo "kalos $n x $d cpu $1=$2: $r" | tee -a "$LOG"
    kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
  done
  for th in 1 4 $C; do
    OMP_NUM_THREADS=$th OPENBLAS_NUM_THREADS=$th MKL_NUM_THREADS=$th timeout 120 python3 cpu_peer.py "$n" "$d" "$it" 2>&1 \
      | sed "s/^/numpy threads=$th /" | tee -a "$LOG"
  done
done
