#!/usr/bin/env bash
# Writes a pkg-config file for libkalos to stdout.
#   gen-pc.sh INCLUDE_DIR LIB_DIR [VERSION] > kalos.pc
# With `-tags kalos_pkgconfig` the Go package takes its cgo flags from it. The Libs line
# also sets an rpath, so binaries built this way find libkalos.so at run time without
# LD_LIBRARY_PATH.
set -euo pipefail
inc=$1 lib=$2 ver=${3:-0.1.0}
cat <<PC
includedir=$inc
libdir=$lib

Name: kalos
Description: Kalos memory-recall sidecar (C API)
Version: $ver
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lkalos
PC
