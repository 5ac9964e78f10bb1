package kalos

// The header and library flags come from pkg-config: kalos.pc from an installed prefix
// (scripts/install.sh, or the tarball that scripts/package.sh builds) found through
// PKG_CONFIG_PATH or the system's pkg-config path. Its Libs carry an rpath, so a binary finds
// libkalos.so at run time without LD_LIBRARY_PATH. Inside the repository, ci.sh writes one for
// include/ and the cargo target directory (gen-pc.sh).

/*
#cgo pkg-config: kalos
*/
import "C"
