#!/usr/bin/env bash
# Runs the whole Kalos CPU benchmark (issue 2, item 10) and prints one report.
# usage: benches/run.sh [--quick] [--only empty|10k_128|100k_384|1M_128]
# Peers need: pip install numpy faiss-cpu
set -euo pipefail
cd "$(dirname "$0")/.."
nice cargo build --release --lib --bin kalosd   # libkalos.so for the head-to-head in peers.py
nice cargo bench --bench roundtrip -- "$@"
