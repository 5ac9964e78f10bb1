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
# directory, removed at the end, so no test writes into the user's own data directory.
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
XDG_DATA_HOME=$(mktemp -d)
export XDG_DATA_HOME
trap 'rm -rf "$XDG_DATA_HOME" "$SHM_BEFORE"' EXIT

run_suite() {
  local name=$1; shift
  echo "::group:: $name"
  local t0=$SECONDS
  if "$@"; then RESULT[$name]=ok; else RESULT[$name]=FAILED; failed=1; fi
  SECS[$name]=$((SECONDS - t0))
  echo "::endgroup:: $name ${RESULT[$name]} (${SECS[$name]} s)"
}

build() { cargo build --release --all-targets; }

suite_rust() { build && cargo test --release -- --test-threads=2; }
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
exit $failed
