#!/usr/bin/env bash
# CI of the Go binding: builds libkalos.so + kalosd if missing, then
#   go vet, go test -race (the whole suite, kalosd tests included), the same under
#   cgocheck2, the example, and the C benchmark program (compiled, not run).
# Stores opened with role auto live in a temporary XDG_DATA_HOME (scripts/tmp-data-home.sh).
# Usage: bindings/go/ci.sh            (from anywhere; needs go >= 1.24, gcc, cargo)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LIB=$(realpath -m "${CARGO_TARGET_DIR:-$ROOT/target}")/release
# Role-auto stores go to a temporary XDG_DATA_HOME, removed on exit; the run fails if the
# user's own ~/.local/share/kalos gains an entry.
source "$ROOT/scripts/tmp-data-home.sh"
tmp_data_home_begin
trap tmp_data_home_end EXIT

if [[ ! -f $LIB/libkalos.so || ! -f $LIB/kalosd ]]; then
  echo "== cargo build --release"
  (cd "$ROOT" && nice cargo build --release)
fi

# The package takes its cgo flags from pkg-config (`#cgo pkg-config: kalos`): this kalos.pc
# names include/ and the library just built, with an rpath, so test binaries find it at run time.
PC=$LIB/pkgconfig
mkdir -p "$PC"
"$HERE/gen-pc.sh" "$ROOT/include" "$LIB" > "$PC/kalos.pc"
export PKG_CONFIG_PATH=$PC${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export KALOSD=$LIB/kalosd KALOS_REQUIRE_KALOSD=1 KALOS_LIB_DIR=$LIB
export CGO_ENABLED=1

cd "$HERE"
echo "== gofmt"
unformatted=$(gofmt -l "$HERE" "$ROOT/examples/go")
[[ -z $unformatted ]] || { echo "gofmt needed: $unformatted" >&2; exit 1; }
echo "== go vet"
go vet ./...
echo "== go test -race"
go test -race -count=1 -timeout 600s ./...

echo "== go test with GOEXPERIMENT=cgocheck2 (full cgo pointer checks)"
GOEXPERIMENT=cgocheck2 go test -count=1 -timeout 600s ./...

echo "== example"
(cd "$ROOT/examples/go" && go vet ./... && go build -o "$ROOT/target/kalos-go-example" . &&
  go test -race -count=1 ./...)

echo "== C benchmark program"
gcc -O2 -Wall -Wextra -Werror -I "$ROOT/include" "$HERE/bench/recall_bench.c" -L "$LIB" -lkalos \
  -o "$ROOT/target/recall_bench"
tmp_data_home_end
echo "ci.sh: OK"
