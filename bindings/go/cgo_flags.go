//go:build !kalos_pkgconfig

package kalos

// Default build flags: the header and library of this source tree (include/ and
// target/release/), so `go build` works inside a checkout after `cargo build --release`.
// Nonexistent -I/-L directories are ignored by the compiler and linker, so a service that
// gets the library elsewhere adds its own paths through CGO_CFLAGS / CGO_LDFLAGS, or builds
// with `-tags kalos_pkgconfig` to take them from kalos.pc (see README.md). No rpath is baked
// in: at run time the dynamic loader finds libkalos.so through the service's own rpath
// (CGO_LDFLAGS=-Wl,-rpath,DIR), LD_LIBRARY_PATH or the system library path.

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/release -lkalos
*/
import "C"
