#!/usr/bin/env bash
# Runs the library under the sanitizers of nightly Rust (docs/RELIABILITY.md, "Sanitizers"):
#   asan  the library, kalosd and the Rust tests of the shm/client/server/persist paths built
#         with -Zsanitizer=address (checked build: debug assertions, overflow checks), then the
#         C harness and the quickstart, built with gcc -fsanitize=address,undefined, against
#         that instrumented libkalos.so
#   tsan  the concurrency-heavy Rust tests built with -Zsanitizer=thread and an instrumented
#         standard library (-Zbuild-std, which needs the nightly rust-src component), then the
#         C harness and the quickstart, built with gcc -fsanitize=thread and linked with the
#         toolchain's ThreadSanitizer runtime, against that instrumented libkalos.so
#
#   scripts/sanitize.sh            both
#   scripts/sanitize.sh asan       one of them
#   SANITIZE_SHORT=1 scripts/sanitize.sh   the short version: fewer tests, fuzz smoke cut down
#
# Builds go to $CARGO_TARGET_DIR/asan and $CARGO_TARGET_DIR/tsan (default target/...), apart
# from the normal builds. Exits non-zero on any test failure or sanitizer report. Without a
# nightly toolchain (or, for tsan, without rust-src) it says so and exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
TARGET=$(rustc +nightly -vV 2>/dev/null | sed -n 's/^host: //p')
BASE=$(realpath -m "${CARGO_TARGET_DIR:-target}")
SHORT=${SANITIZE_SHORT:-0}
KINDS=("${@:-asan tsan}")
read -r -a KINDS <<<"${KINDS[*]}"

if [[ -z "$TARGET" ]]; then
  echo "sanitize: no nightly toolchain (rustup toolchain install nightly)" >&2
  exit 2
fi

# Tests of the shm, client, server and persistence paths (not the GPU or NVRTC ones, and not
# header.rs, which runs cbindgen).
ASAN_TESTS=(protocol liveness persist fuzz extremes memory_model smoke idle tools crash engine_cpu copy_plain copy_threads)
TSAN_TESTS=(protocol smoke copy_threads engine_cpu memory_model liveness)
if [[ $SHORT == 1 ]]; then
  ASAN_TESTS=(protocol liveness extremes fuzz smoke)
  TSAN_TESTS=(protocol smoke copy_threads)
  export KALOS_FUZZ_CASES=2000
fi

test_args() { local a=(); for t in "$@"; do a+=(--test "$t"); done; echo "${a[@]}"; }

failed=0
run_asan() {
  local dir=$BASE/asan
  # Leak checking stays off: the tests and the harness end while server threads and forked
  # children still hold their buffers by design.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # shellcheck disable=SC2046
  CARGO_TARGET_DIR=$dir RUSTFLAGS="-Zsanitizer=address" cargo +nightly test --target "$TARGET" \
    --lib $(test_args "${ASAN_TESTS[@]}") -- --test-threads=2 || return 1
  CARGO_TARGET_DIR=$dir RUSTFLAGS="-Zsanitizer=address" cargo +nightly build --target "$TARGET" --lib || return 1
  local lib=$dir/$TARGET/debug out=$dir/c
  mkdir -p "$out"
  # The executable carries the sanitizer runtime (gcc's libasan), which the instrumented
  # library's checks call into.
  gcc -std=c99 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -Wall -Wextra -Werror -Iinclude \
    tests/c/harness.c -L"$lib" -lkalos -Wl,-rpath,"$lib" -lm -o "$out/harness" || return 1
  gcc -std=c99 -O1 -g -fsanitize=address,undefined -Wall -Wextra -Werror -Iinclude \
    examples/quickstart.c -L"$lib" -lkalos -Wl,-rpath,"$lib" -o "$out/quickstart" || return 1
  "$out/harness" || return 1
  "$out/quickstart" >/dev/null || return 1
  # The library's own code must be instrumented: a write past a heap block inside it is caught.
  gcc -O0 -g -fsanitize=address -Iinclude tests/c/asan_canary.c -L"$lib" -lkalos -Wl,-rpath,"$lib" -o "$out/canary" || return 1
  if "$out/canary" 2>"$out/canary.log" || ! grep -q "heap-buffer-overflow" "$out/canary.log" || ! grep -q "kalos_options_init" "$out/canary.log"; then
    echo "sanitize: the canary was not caught inside libkalos.so: the library is not instrumented" >&2
    return 1
  fi
  echo "sanitize: canary caught inside libkalos.so (instrumentation active)"
}

run_tsan() {
  local dir=$BASE/tsan sysroot
  sysroot=$(rustc +nightly --print sysroot)
  if [[ ! -d $sysroot/lib/rustlib/src/rust/library ]]; then
    echo "sanitize: tsan needs the nightly rust-src component (rustup component add rust-src --toolchain nightly)" >&2
    return 2
  fi
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  # shellcheck disable=SC2046
  CARGO_TARGET_DIR=$dir RUSTFLAGS="-Zsanitizer=thread --cfg kalos_no_mremap" cargo +nightly test -Zbuild-std --target "$TARGET" \
    --lib $(test_args "${TSAN_TESTS[@]}") -- --test-threads=2 || return 1
  CARGO_TARGET_DIR=$dir RUSTFLAGS="-Zsanitizer=thread --cfg kalos_no_mremap" cargo +nightly build -Zbuild-std --target "$TARGET" --lib || return 1
  local lib=$dir/$TARGET/debug out=$dir/c
  local rt=$sysroot/lib/rustlib/$TARGET/lib/librustc-nightly_rt.tsan.a
  mkdir -p "$out"
  # The C side is instrumented by gcc but linked with the ThreadSanitizer runtime of the nightly
  # toolchain that built the library (gcc's libtsan is older than the library's instrumentation:
  # it lacks __tsan_memcpy and friends). -rdynamic exports the runtime's interceptors to
  # libkalos.so.
  tsan_link() {
    gcc -std=c99 -O1 -g -fno-omit-frame-pointer -fsanitize=thread -Wall -Wextra -Werror -Iinclude -c "$1" -o "$out/$2.o" &&
      gcc -rdynamic "$out/$2.o" -Wl,--whole-archive "$rt" -Wl,--no-whole-archive -L"$lib" -lkalos -Wl,-rpath,"$lib" \
        -lm -lpthread -ldl -lrt -o "$out/$2"
  }
  tsan_link tests/c/harness.c harness || return 1
  tsan_link examples/quickstart.c quickstart || return 1
  tsan_link tests/c/tsan_canary.c canary || return 1
  "$out/harness" || return 1
  "$out/quickstart" >/dev/null || return 1
  # The library's own code must be instrumented: a race between two of its writes is reported.
  if "$out/canary" 2>"$out/canary.log" || ! grep -q "data race" "$out/canary.log" || ! grep -q "kalos_options_init" "$out/canary.log"; then
    echo "sanitize: the tsan canary was not caught inside libkalos.so: the library is not instrumented" >&2
    return 1
  fi
  echo "sanitize: tsan canary caught inside libkalos.so (instrumentation active)"
}

for k in "${KINDS[@]}"; do
  t0=$SECONDS
  echo "::group:: sanitize $k"
  "run_$k"
  rc=$?
  echo "::endgroup:: sanitize $k rc=$rc ($((SECONDS - t0)) s)"
  if [[ $rc != 0 ]]; then failed=$rc; fi
done
exit $failed
