#!/usr/bin/env bash
# Builds what the H200 machine needs and stages it in .gpu/ (git-ignored), which the device
# tool carries over: libkalos.so, the C harness, the GPU scripts and the Python package.
# Then, on the device:  bash .gpu/run.sh [correctness|bench|harness|concurrency]...
# Options (environment): KALOS_BASE_REV, a revision whose library is staged as .gpu/base/ for
# before/after runs; KALOS_VARIANTS="<name>=<rev> ...", more such revisions, each in .gpu/<name>/;
# KALOS_PEER_WHEELS, a folder of wheels for cpu_host.sh's faiss peer; KALOS_EMBED, a bundle of
# tests/quality/make_bundle.py (44 MB for the 121k subset), staged as .gpu/embed/ for run.sh int8.
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${CARGO_TARGET_DIR:-target}"
cargo build --release
cargo build --release --example gpu_probe
mkdir -p tests/c/build
gcc -std=c99 -O2 -Wall -Wextra -Werror -Iinclude tests/c/harness.c -L$T/release -lkalos \
  -Wl,-rpath,'$ORIGIN' -lm -o tests/c/build/harness_gpu
gcc -O2 -Wall -Wextra -Werror -Iinclude examples/python/bench_recall.c -L$T/release -lkalos -Wl,-rpath,'$ORIGIN' \
  -o tests/c/build/bench_recall_gpu
gcc -O2 -Wall -Wextra -Werror -Iinclude tests/gpu/conc_client.c -L$T/release -lkalos -Wl,-rpath,'$ORIGIN' \
  -o tests/c/build/conc_client_gpu
rm -rf .gpu && mkdir -p .gpu/python
cp $T/release/libkalos.so tests/gpu/*.py tests/gpu/*.sh tests/gpu/*.cu .gpu/
cp tests/c/build/harness_gpu .gpu/c_harness
cp tests/c/build/bench_recall_gpu .gpu/bench_recall
cp tests/c/build/conc_client_gpu .gpu/conc_client
cp $T/release/kalosd $T/release/examples/gpu_probe .gpu/
cp tests/quality/embed_torch.py tests/quality/int8_recall.py .gpu/
cp -r bindings/python/kalos .gpu/python/
find .gpu/python -name __pycache__ -prune -exec rm -rf {} +
# The recall fast path's C extension, on CPython's stable ABI: this build serves the machine's
# Python 3.12 as well (the package falls back to ctypes without it).
rm -f .gpu/python/kalos/*.so .gpu/python/kalos/*.c
gcc -O2 -Wall -Wextra -Werror -shared -fPIC \
  -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
  bindings/python/kalos/_fastcall.c -lm -o .gpu/python/kalos/_fastcall.abi3.so
# faiss-cpu for cpu_host.sh's peer (the GPU machine has no network and no faiss): the wheels in
# the folder KALOS_PEER_WHEELS (`pip download faiss-cpu packaging --no-deps --only-binary=:all:
# --python-version 3.12 -d DIR`; numpy is the machine's), unpacked there by cpu_host.sh.
if [ -n "${KALOS_PEER_WHEELS:-}" ]; then
  mkdir -p .gpu/wheels && cp "$KALOS_PEER_WHEELS"/*.whl .gpu/wheels/
fi
if [ -n "${KALOS_EMBED:-}" ]; then
  mkdir -p .gpu/embed && cp "$KALOS_EMBED"/* .gpu/embed/
fi
# Libraries of other revisions for before/after runs (run.sh's KALOS_RUN_LIB), each built in a
# scratch worktree: KALOS_BASE_REV=<rev> into .gpu/base/, and KALOS_VARIANTS="<name>=<rev> ..."
# into .gpu/<name>/. Each folder also gets conc_client, which loads the libkalos.so beside it
# (concurrency.py's CONC_CLIENT), so a change on the client side is measured too.
stage_rev() {
  local name="$1" rev="$2" td tmp
  # A target directory of their own, shared by every staged revision (the dependencies are
  # compiled once): in the main one, a revision's build would replace target/release/libkalos.so,
  # and cargo, finding HEAD's own build still fresh, would not put HEAD's back.
  td="$(realpath "$T")/stage-revs"; tmp="$(mktemp -d)"
  git worktree add --detach -q "$tmp/w" "$rev"
  (cd "$tmp/w" && CARGO_TARGET_DIR="$td" cargo build --release --lib)
  mkdir -p ".gpu/$name" && cp "$td/release/libkalos.so" ".gpu/$name/" && strip ".gpu/$name/libkalos.so"
  cp .gpu/conc_client ".gpu/$name/"
  git rev-parse --short "$rev" > ".gpu/$name/COMMIT"
  git worktree remove --force "$tmp/w" && rm -rf "$tmp"
}
if [ -n "${KALOS_BASE_REV:-}" ]; then stage_rev base "$KALOS_BASE_REV"; fi
for v in ${KALOS_VARIANTS:-}; do stage_rev "${v%%=*}" "${v#*=}"; done
# Debug info is most of the size: stripped, two staged builds fit in one device call's carry.
strip .gpu/libkalos.so .gpu/kalosd .gpu/gpu_probe .gpu/c_harness .gpu/bench_recall .gpu/conc_client
git rev-parse --short HEAD > .gpu/COMMIT
git diff --quiet HEAD -- src kernels tests/gpu || echo "+dirty" >> .gpu/COMMIT
du -sh .gpu
