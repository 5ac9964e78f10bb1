#!/usr/bin/env bash
# Runs every test of the repository (what CI runs). The NVRTC kernel compile check is part of
# the rust suite (tests/nvrtc_compile.rs); the package suite builds every artifact
# (scripts/package.sh) and uses each one installed outside the checkout. Each suite runs even
# when an earlier one failed; the script exits non-zero if any failed and prints a summary
# table last.
#   scripts/test.sh            all suites
#   scripts/test.sh rust c     only the named suites
#   scripts/test.sh sanitize   the optional suite, not part of "all suites": scripts/sanitize.sh
#                              (ASan and TSan builds on nightly Rust; SANITIZE_SHORT=1 for the
#                              short version). Its cold builds take well over the few minutes a
#                              CI run can spare on 2 cores (docs/RELIABILITY.md, "Sanitizers").
# The suites must clean up after themselves: any /dev/shm/kalos.* entry that is there after the
# run and was not there before fails the run (the "shm" row). Stores opened with role auto and
# no data_dir live under $XDG_DATA_HOME/kalos/: the run points XDG_DATA_HOME at a temporary
# directory, removed at the end (scripts/tmp-data-home.sh), and a new entry in the user's own
# data directory fails the run (the "data" row).
#
# Build once: every native cargo command of the suites (build() below, cargo test,
# bindings/java/ci.sh, scripts/package.sh) resolves the library, kalosd and their dependencies
# to the same compilation units, so only the first compiles them (Cargo.toml's dependency
# notes say how). The rust suite checks it: after cargo test has built its targets, build()
# must find every unit fresh. The benches are compiled by clippy (.ci/run) only.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
ALL=(rust c python go java package)
SUITES=("${@:-${ALL[@]}}")
declare -A RESULT
declare -A SECS
failed=0
shm_list() { find /dev/shm -maxdepth 1 -name 'kalos.*' -printf '%f\n' 2>/dev/null | sort; }
SHM_BEFORE=$(mktemp)
shm_list >"$SHM_BEFORE"
# The cluster tests (tests/cluster.rs in the rust suite, and the cross-language one of the python
# suite, bindings/python/tests/test_cluster.py) run nats-server, pinned (docs/CLUSTER.md):
# installed with the Go toolchain when it is not on PATH (about a minute on 2 cores).
export PATH="$PATH:$(go env GOPATH 2>/dev/null)/bin"
if [[ " ${SUITES[*]} " =~ \ (rust|python)\  ]] && ! command -v nats-server >/dev/null; then
  go install github.com/nats-io/nats-server/v2@v2.15.3
fi
source scripts/tmp-data-home.sh
tmp_data_home_begin
trap 'tmp_data_home_end; rm -f "$SHM_BEFORE"' EXIT

run_suite() {
  local name=$1; shift
  echo "::group:: $name"
  local t0=$SECONDS
  if "$@"; then RESULT[$name]=ok; else RESULT[$name]=FAILED; failed=1; fi
  SECS[$name]=$((SECONDS - t0))
  echo "::endgroup:: $name ${RESULT[$name]} (${SECS[$name]} s)"
}

# libkalos.so and kalosd: what the c, python, go, java and package suites use.
build() { cargo build --release --lib --bin kalosd "$@"; }

# Fails when build() compiles anything after cargo test built its targets: a dependency feature
# enabled only through a dev-dependency would make the two compile kalos separately and
# overwrite each other's libkalos.so at every switch.
build_shared() {
  local stale
  stale=$(build --message-format=json |
    grep '"reason":"compiler-artifact"' | grep '"fresh":false' | sed 's/.*"package_id":"\([^"]*\)".*/\1/')
  [[ -z $stale ]] && return 0
  echo "test.sh: cargo build --release --lib --bin kalosd compiled again after cargo test:" >&2
  echo "$stale" >&2
  return 1
}

suite_rust() { build && cargo test --release --no-run && build_shared && cargo test --release -- --test-threads=2; }
suite_c() { build && tests/c/run.sh; }
suite_python() { build && bindings/python/ci.sh; }
suite_go() { build && bindings/go/ci.sh; }
suite_java() { build && bindings/java/ci.sh; }
suite_package() { build && tests/package/run.sh; }
suite_sanitize() { scripts/sanitize.sh; }

for s in "${SUITES[@]}"; do
  run_suite "$s" "suite_$s"
done

LEFT=$(comm -13 "$SHM_BEFORE" <(shm_list))
if tmp_data_home_end; then DATA_RESULT=ok; else DATA_RESULT=FAILED; failed=1; fi
if [ -n "$LEFT" ]; then
  echo "test.sh: the run left these entries in /dev/shm:" >&2
  echo "$LEFT" >&2
  SHM_RESULT=FAILED
  failed=1
else
  SHM_RESULT=ok
fi

echo
echo "suite      result   seconds"
for s in "${SUITES[@]}"; do
  printf "%-10s %-8s %s\n" "$s" "${RESULT[$s]}" "${SECS[$s]}"
done
printf "%-10s %-8s %s\n" "shm" "$SHM_RESULT" "-"
printf "%-10s %-8s %s\n" "data" "$DATA_RESULT" "-"
exit $failed
