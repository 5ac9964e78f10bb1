"""Wheel tagging only (metadata is in pyproject.toml).

When kalos/libkalos.so is present (build_wheel.sh copies it in), the wheel carries a native
library: it is tagged py3-none-<platform> instead of the pure py3-none-any.
"""

from pathlib import Path

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

BUNDLED = any((Path(__file__).parent / "kalos" / n).is_file() for n in ("libkalos.so", "libkalos.dylib"))


class Wheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        if BUNDLED:
            self.root_is_pure = False

    def get_tag(self):
        py, abi, plat = super().get_tag()
        return ("py3", "none", plat) if BUNDLED else (py, abi, plat)


setup(cmdclass={"bdist_wheel": Wheel})
