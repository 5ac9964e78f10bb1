#!/usr/bin/env bash
# Writes a pkg-config file for libkalos to stdout.
#   gen-pc.sh INCLUDE_DIR LIB_DIR [VERSION] > kalos.pc
# The Go package takes its cgo flags from it (`#cgo pkg-config: kalos`); scripts/install.sh
# writes the installed one with it (directories relative to ${pcfiledir}), ci.sh one for
# include/ and the cargo target directory. The Libs line also sets an rpath, so binaries
# built this way find libkalos.so at run time without LD_LIBRARY_PATH or ldconfig.
set -euo pipefail
inc=$1 lib=$2 ver=${3:-$(sed -n 's/^version = "\(.*\)"$/\1/p' "$(dirname "$0")/../../Cargo.toml" | head -1)}
cat <<PC
includedir=$inc
libdir=$lib

Name: kalos
Description: Kalos memory-recall sidecar (C API)
URL: https://github.com/kalos-dev/kalos
Version: $ver
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lkalos
PC
