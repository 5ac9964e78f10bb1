#!/usr/bin/env bash
# Builds and runs the C harness against $CARGO_TARGET_DIR/release/libkalos.so (default
# target/release; built if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
LIB="$(realpath -m "${CARGO_TARGET_DIR:-target}")/release"
[[ -f "$LIB/libkalos.so" ]] || cargo build --release
# The harness's role-auto stores go to a temporary XDG_DATA_HOME (scripts/tmp-data-home.sh).
source scripts/tmp-data-home.sh
tmp_data_home_begin
trap tmp_data_home_end EXIT
mkdir -p tests/c/build
for std in "gcc -std=c99" "g++ -x c++"; do
  echo '#include "kalos.h"
int main(void){return 0;}' | $std -Wall -Wextra -Werror -pedantic -Iinclude -x "$([[ $std == g++* ]] && echo c++ || echo c)" - -o tests/c/build/header_only
done
gcc -std=c99 -O2 -Wall -Wextra -Werror -Iinclude tests/c/harness.c -L"$LIB" -lkalos \
  -Wl,-rpath,"$LIB" -lm -o tests/c/build/harness
gcc -std=c99 -O2 -Wall -Wextra -Werror -Iinclude examples/quickstart.c -L"$LIB" -lkalos \
  -Wl,-rpath,"$LIB" -o tests/c/build/quickstart
tests/c/build/harness
tests/c/build/quickstart >/dev/null
tmp_data_home_end
