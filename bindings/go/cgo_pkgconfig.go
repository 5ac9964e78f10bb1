//go:build kalos_pkgconfig

package kalos

// Build with `-tags kalos_pkgconfig` to take the include and library flags from kalos.pc
// (found through PKG_CONFIG_PATH). ci.sh generates one for target/release.

/*
#cgo pkg-config: kalos
*/
import "C"
