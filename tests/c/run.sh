#!/usr/bin/env bash
# Builds and runs the C harness against target/release/libkalos.so (built if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -f target/release/libkalos.so ]] || cargo build --release
mkdir -p tests/c/build
for std in "gcc -std=c99" "g++ -x c++"; do
  echo '#include "kalos.h"
int main(void){return 0;}' | $std -Wall -Wextra -Werror -pedantic -Iinclude -x "$([[ $std == g++* ]] && echo c++ || echo c)" - -o tests/c/build/header_only
done
gcc -std=c99 -O2 -Wall -Wextra -Werror -Iinclude tests/c/harness.c -Ltarget/release -lkalos \
  -Wl,-rpath,"$PWD/target/release" -lm -o tests/c/build/harness
gcc -std=c99 -O2 -Wall -Wextra -Werror -Iinclude examples/quickstart.c -Ltarget/release -lkalos \
  -Wl,-rpath,"$PWD/target/release" -o tests/c/build/quickstart
tests/c/build/harness
tests/c/build/quickstart >/dev/null
