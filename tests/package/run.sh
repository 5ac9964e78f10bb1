#!/usr/bin/env bash
# The `package` suite (scripts/test.sh package): builds every artifact with scripts/package.sh,
# then installs each one in a temporary directory outside the checkout and uses it from there,
# with no KALOS_*, CARGO_*, CGO_*, PKG_CONFIG_PATH or LD_LIBRARY_PATH from the caller:
#   C       the tarball unpacked as a prefix; consumer.c built with `pkg-config --cflags --libs
#           kalos`; the soname, the program's DT_NEEDED and its run are checked
#   Python  a fresh venv with only the wheel (and numpy) installed; consumer.py run from /:
#           __version__, bundled library, the C recall fast path in use, __all__, a store, the
#           kalosd console command; then
#           KALOS_LIBRARY pointing at the tarball's library overrides the bundled one
#   Go      a new module requiring the binding at the crate version from dist/goproxy
#           (GOPROXY=file://..., its own module cache), linked through pkg-config, run
#   Java    Consumer.java compiled and run with only the jar on its classpath
# KALOS_PACKAGE_SKIP_BUILD=1 tests what dist/ holds without building it again.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DIST="$(realpath -m "${KALOS_DIST:-$ROOT/dist}")"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
[[ -n ${KALOS_PACKAGE_SKIP_BUILD:-} ]] || "$ROOT/scripts/package.sh"

OUT="$(mktemp -d /tmp/kalos-package-test.XXXXXX)"
cleanup() {
  # The Go module cache is read-only unless -modcacherw; make it removable either way.
  chmod -R u+w "$OUT" 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
cd "$OUT"
unset KALOS_LIBRARY CARGO_TARGET_DIR LD_LIBRARY_PATH PKG_CONFIG_PATH CGO_CFLAGS CGO_LDFLAGS PYTHONPATH KALOSD
STORE="pkg-$$"
pass=0
ok() { echo "package: $*"; pass=$((pass + 1)); }

echo "== C: tarball + pkg-config"
tar -xzf "$DIST/kalos-$VERSION-linux-x86_64.tar.gz" -C "$OUT"
PREFIX="$OUT/kalos-$VERSION-linux-x86_64"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
[[ $(pkg-config --modversion kalos) == "$VERSION" ]]
SOVER=$(readelf -d "$PREFIX/lib/libkalos.so.$VERSION" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ $SOVER == libkalos.so.0.* || $SOVER == libkalos.so.[1-9]* ]] || { echo "bad soname: '$SOVER'" >&2; exit 1; }
[[ -L $PREFIX/lib/$SOVER && -L $PREFIX/lib/libkalos.so && -f $PREFIX/include/kalos.h && -x $PREFIX/bin/kalosd ]]
cp "$HERE/consumer.c" "$OUT/"
# shellcheck disable=SC2046  # pkg-config's output is a list of words
gcc -std=c99 -Wall -Wextra -Werror consumer.c $(pkg-config --cflags --libs kalos) -o c-consumer
readelf -d c-consumer | grep -q "Shared library: \[$SOVER\]" || { echo "c-consumer does not need $SOVER" >&2; exit 1; }
./c-consumer "$STORE-c" "$VERSION"
ok "C program built with pkg-config runs against the tarball ($SOVER)"

echo "== Python: wheel in a fresh venv, used from /"
# With KALOS_MANYLINUX (as in CI) the wheel must carry exactly that tag.
WHEEL=$(ls "$DIST"/kalos-"$VERSION"-cp39-abi3-manylinux_"${KALOS_MANYLINUX:-*}"_x86_64.whl)
python3 -m venv "$OUT/venv"
"$OUT/venv/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL"
cp "$HERE/consumer.py" "$OUT/"
(cd / && "$OUT/venv/bin/python" "$OUT/consumer.py" "$STORE-py" "$VERSION")
lib="$PREFIX/lib/libkalos.so.$VERSION"
got=$(cd / && KALOS_LIBRARY="$lib" "$OUT/venv/bin/python" -c 'import kalos; print(kalos.library_path)')
[[ $got == "$lib" ]] || { echo "KALOS_LIBRARY did not override the bundled library: $got" >&2; exit 1; }
"$OUT/venv/bin/kalosd" --help >/dev/null
ok "wheel $(basename "$WHEEL"): import from /, C fast path, store, kalosd command, KALOS_LIBRARY override"

echo "== Go: module from dist/goproxy, cgo through pkg-config"
mkdir -p "$OUT/goapp"
cp "$HERE/go/main.go" "$OUT/goapp/"
printf 'module example.com/kalosconsumer\n\ngo 1.24\n' > "$OUT/goapp/go.mod"
(
  cd "$OUT/goapp"
  export GOPROXY="file://$DIST/goproxy" GONOSUMDB=github.com/kalos-dev GOTOOLCHAIN=local GOFLAGS=-modcacherw \
    GOMODCACHE="$OUT/gomodcache" CGO_ENABLED=1
  go get "github.com/kalos-dev/kalos/bindings/go@v$VERSION"
  go build -o go-consumer .
  readelf -d go-consumer | grep -q "Shared library: \[$SOVER\]" || { echo "go-consumer does not need $SOVER" >&2; exit 1; }
  readelf -d go-consumer | grep -q "runpath: \[$PREFIX/" || { echo "go-consumer has no runpath into $PREFIX" >&2; exit 1; }
  ./go-consumer "$STORE-go" "$VERSION"
)
ok "Go program (go get v$VERSION from the proxy tree, pkg-config) runs against the tarball"
unset PKG_CONFIG_PATH

echo "== Java: only the jar on the classpath"
mkdir -p "$OUT/java"
cp "$HERE/Consumer.java" "$OUT/java/"
JAR="$DIST/kalos-$VERSION.jar"
(
  cd "$OUT/java"
  javac -Xlint:all -Werror -cp "$JAR" -d . Consumer.java
  java -cp "$JAR:." Consumer "$STORE-java" "$VERSION"
)
ok "Java program with only $(basename "$JAR") on the classpath"

echo "package: $pass passed, 0 failed"
