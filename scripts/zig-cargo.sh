#!/usr/bin/env bash
# The CARGO that setuptools-rust runs when scripts/package.sh builds the wheel for an older
# glibc (KALOS_MANYLINUX=2_28): `build` and `rustc` go through cargo-zigbuild, for the target
# x86_64-unknown-linux-gnu.$KALOS_ZIG_GLIBC (zig links against that glibc's symbol versions);
# every other subcommand (metadata, ...) is plain cargo.
set -euo pipefail
sub=$1
shift
target="x86_64-unknown-linux-gnu.${KALOS_ZIG_GLIBC:?set KALOS_ZIG_GLIBC, e.g. 2.28}"
case $sub in
  build) exec cargo-zigbuild zigbuild --target "$target" "$@" ;;
  rustc) exec cargo-zigbuild rustc --target "$target" "$@" ;;
  *) exec cargo "$sub" "$@" ;;
esac
