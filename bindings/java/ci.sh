#!/usr/bin/env bash
# CI for the Java binding: builds libkalos.so + kalosd with cargo (a no-op when fresh), then runs the JUnit 5
# suite with Maven against that library. Stores opened with role auto live in a temporary
# XDG_DATA_HOME (scripts/tmp-data-home.sh).
#
#   bindings/java/ci.sh            # release build (target/release), the default
#   PROFILE=debug bindings/java/ci.sh
#   KALOS_LIBRARY=/abs/libkalos.so bindings/java/ci.sh   # test a library built elsewhere
#
# The tests need: a JDK >= 17, Maven 3.8+ (Maven Central reachable), cargo, /dev/shm writable.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
profile="${PROFILE:-release}"
libdir="$(realpath -m "${CARGO_TARGET_DIR:-$root/target}")/$profile"
flag=""
[[ "$profile" == release ]] && flag="--release"

if [[ -z "${KALOS_LIBRARY:-}" ]]; then
  # Built when missing, and also when present: cargo is a no-op (about a second) when the build
  # is fresh, and a stale libkalos.so without the Java_io_kalos_* symbols would fail every test
  # with UnsatisfiedLinkError. KALOS_SKIP_BUILD=1 uses what is there as is.
  if [[ ! -f "$libdir/libkalos.so" || ! -x "$libdir/kalosd" || -z "${KALOS_SKIP_BUILD:-}" ]]; then
    echo "ci.sh: cargo build $flag --lib --bin kalosd" >&2
    (cd "$root" && nice cargo build $flag --lib --bin kalosd)
  fi
  lib="$libdir/libkalos.so"
else
  lib="$KALOS_LIBRARY"
  libdir="$(dirname "$lib")"
fi
# The cross-language tests start this kalosd as a child process.
if [[ -z "${KALOSD:-}" && -x "$libdir/kalosd" ]]; then
  export KALOSD="$libdir/kalosd"
fi

# Role-auto stores go to a temporary XDG_DATA_HOME, removed on exit; the run fails if the
# user's own ~/.local/share/kalos gains an entry.
source "$root/scripts/tmp-data-home.sh"
tmp_data_home_begin
trap tmp_data_home_end EXIT

echo "ci.sh: testing against $lib" >&2
cd "$here"
# java.library.path is set for System.loadLibrary("kalos"); KALOS_LIBRARY (absolute) wins if set.
mvn -q -B test -Dkalos.library.dir="$libdir" -Dkalos.root="$root" "$@"
tmp_data_home_end
