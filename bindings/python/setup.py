"""Builds the native parts of the wheel (metadata is in pyproject.toml).

The platform wheel carries ``kalos/libkalos.so`` (the crate's cdylib, loaded with ctypes) and
the ``kalosd`` executable (installed as a console command), both built by setuptools-rust from
the crate two directories up, and ``kalos._fastcall`` (``kalos/_fastcall.c``: the recall fast
path, a C extension on the stable ABI of CPython 3.9, so the wheel is tagged
``cp39-abi3-<platform>``). The version is the crate's.

``KALOS_PY_NATIVE=0`` builds the package without the Rust parts: it finds ``libkalos.so``
through ``KALOS_LIBRARY`` or a checkout's cargo target directory. The binding's own test script
(``ci.sh``) installs it that way.

Both modes build ``kalos._fastcall`` when a C compiler and ``Python.h`` are there; it is
optional: without it the build goes on and ``kalos`` calls the library through ctypes only
(``kalos/_fastpath.py``).
"""

import os
import re
from pathlib import Path

from setuptools import Extension, setup
from setuptools_rust import Binding, RustBin, RustExtension
from setuptools_rust.build import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
CARGO_TOML = HERE.parent.parent / "Cargo.toml"
NATIVE = os.environ.get("KALOS_PY_NATIVE", "1") != "0"


def crate_version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', CARGO_TOML.read_text(), re.M)
    if not m:
        raise RuntimeError(f"no version in {CARGO_TOML}")
    return m.group(1)


def package_version() -> str:
    ns: dict = {}
    exec((HERE / "kalos" / "_version.py").read_text(), ns)
    return ns["__version__"]


VERSION = crate_version()
if package_version() != VERSION:
    raise RuntimeError(f"kalos/_version.py says {package_version()}, {CARGO_TOML} says {VERSION}")


class BuildRust(build_rust):
    """Names the cdylib ``libkalos.so`` (the name ``kalos/_ffi.py`` loads), not a Python
    extension-module name: it is a plain C library, independent of the Python version."""

    def get_dylib_ext_path(self, ext, target_fname):
        return os.path.join(os.path.dirname(super().get_dylib_ext_path(ext, target_fname)), "libkalos.so")


class Wheel(bdist_wheel):
    """cp39-abi3-<platform>: libkalos.so and kalosd are independent of Python, and
    kalos._fastcall uses only the stable ABI of CPython 3.9."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return ("cp39", "abi3", plat)


rust = []
if NATIVE:
    # The crate types are those of Cargo.toml, so cargo reuses the library that
    # `cargo build --release` built (same unit, same features) instead of compiling it again.
    rust = [
        RustExtension(
            "kalos.libkalos",
            path=str(CARGO_TOML),
            binding=Binding.NoBinding,
            args=["--crate-type", "cdylib", "--crate-type", "rlib"],
        ),
        RustBin("kalosd", path=str(CARGO_TOML)),
    ]

# Py_LIMITED_API is defined in the source; py_limited_api names the file _fastcall.abi3.so.
fastcall = Extension("kalos._fastcall", ["kalos/_fastcall.c"], libraries=["m"], py_limited_api=True, optional=True)

setup(
    version=VERSION,
    ext_modules=[fastcall],
    rust_extensions=rust,
    cmdclass={"build_rust": BuildRust, "bdist_wheel": Wheel},
    zip_safe=False,
)
