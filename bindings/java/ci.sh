#!/usr/bin/env bash
# CI for the Java binding: builds libkalos.so + kalosd with cargo if missing, then runs the JUnit 5
# suite with Maven against that library.
#
#   bindings/java/ci.sh            # release build (target/release), the default
#   PROFILE=debug bindings/java/ci.sh
#   KALOS_LIBRARY=/abs/libkalos.so bindings/java/ci.sh   # test a library built elsewhere
#
# The tests need: a JDK >= 17, Maven 3.8+, /dev/shm writable (POSIX shared memory).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
profile="${PROFILE:-release}"
libdir="$root/target/$profile"
flag=""
[[ "$profile" == release ]] && flag="--release"

if [[ -z "${KALOS_LIBRARY:-}" ]]; then
  if [[ ! -f "$libdir/libkalos.so" || ! -x "$libdir/kalosd" ]]; then
    echo "ci.sh: building libkalos.so and kalosd ($profile)" >&2
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

echo "ci.sh: testing against $lib" >&2
cd "$here"
# java.library.path is set for System.loadLibrary("kalos"); KALOS_LIBRARY (absolute) wins if set.
exec mvn -q -B test -Dkalos.library.dir="$libdir" -Dkalos.root="$root" "$@"
