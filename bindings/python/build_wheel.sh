#!/usr/bin/env bash
# Builds a wheel of the Python binding with libkalos.so bundled inside (discovery order 1).
#   bindings/python/build_wheel.sh [OUT_DIR]     (default: bindings/python/dist)
# Uses target/release/libkalos.so (builds it with `cargo build --release` if missing).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${1:-$HERE/dist}"
LIB="${CARGO_TARGET_DIR:-$ROOT/target}/release/libkalos.so"
[ -f "$LIB" ] || (cd "$ROOT" && nice cargo build --release)
cp "$LIB" "$HERE/kalos/libkalos.so"
trap 'rm -f "$HERE/kalos/libkalos.so"; rm -rf "$HERE/build" "$HERE"/*.egg-info' EXIT
"${PYTHON:-python3}" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$HERE" 2>/dev/null \
  || "${PYTHON:-python3}" -m pip wheel -q --no-deps -w "$OUT" "$HERE"
ls -1 "$OUT"/kalos-*.whl
