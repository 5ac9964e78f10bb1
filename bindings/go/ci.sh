#!/usr/bin/env bash
# CI of the Go binding: builds libkalos.so + kalosd if missing, then
#   go vet, go test -race (the whole suite, kalosd tests included), the pkg-config build,
#   the example, and the C benchmark program (compiled, not run).
# Usage: bindings/go/ci.sh            (from anywhere; needs go >= 1.24, gcc, cargo)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LIB=$(realpath -m "${CARGO_TARGET_DIR:-$ROOT/target}")/release

if [[ ! -f $LIB/libkalos.so || ! -f $LIB/kalosd ]]; then
  echo "== cargo build --release"
  (cd "$ROOT" && nice cargo build --release)
fi

# Build time: the package's default #cgo flags point at include/ and target/release/.
# Run time: the loader finds libkalos.so through LD_LIBRARY_PATH here (a service would
# rather bake an rpath, see README.md).
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KALOSD=$LIB/kalosd KALOS_REQUIRE_KALOSD=1 KALOS_LIB_DIR=$LIB
export CGO_ENABLED=1
# The package's default #cgo LDFLAGS name target/release; this adds the library actually built.
export CGO_LDFLAGS="-L$LIB${CGO_LDFLAGS:+ $CGO_LDFLAGS}"

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

echo "== pkg-config build (-tags kalos_pkgconfig)"
PC=$LIB/pkgconfig
mkdir -p "$PC"
"$HERE/gen-pc.sh" "$ROOT/include" "$LIB" > "$PC/kalos.pc"
PKG_CONFIG_PATH=$PC go vet -tags kalos_pkgconfig ./...
PKG_CONFIG_PATH=$PC go test -tags kalos_pkgconfig -count=1 -run 'TestEveryHeaderStatus|TestVersion' ./...

echo "== example"
(cd "$ROOT/examples/go" && go vet ./... && go build -o "$ROOT/target/kalos-go-example" . &&
  go test -race -count=1 ./...)

echo "== C benchmark program"
gcc -O2 -Wall -Wextra -Werror -I "$ROOT/include" "$HERE/bench/recall_bench.c" -L "$LIB" -lkalos \
  -o "$ROOT/target/recall_bench"
echo "ci.sh: OK"
