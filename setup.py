"""Building a wheel compiles the common kernels into the package's read-only compiled tier
(``neuron_kernels/_compiled/<numba, Python, platform>/<CPU level>/``, docs/performance.md
"Compiled kernels"), for the levels in ``NEURON_KERNELS_COMPILED_LEVELS`` (comma-separated;
default ``x86-64-v3``; empty: none, a pure wheel as before). Such a wheel is tagged for its Python
and platform. Editable installs and sdists compile nothing here: numba compiles on first use."""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py


def _levels() -> list[str]:
    raw = os.environ.get("NEURON_KERNELS_COMPILED_LEVELS", "x86-64-v3")
    return [level.strip() for level in raw.split(",") if level.strip()]


class BuildPyWithCompiledTier(build_py):
    """build_py, then the compiled tier into the built package (wheels only)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode or not _levels():
            return
        sys.path.insert(0, os.path.abspath(self.build_lib))
        try:
            from neuron_kernels.tools.warmup import build_compiled_tier

            dest = os.path.join(self.build_lib, "neuron_kernels", "_compiled")
            for level in _levels():
                manifest = build_compiled_tier(dest, level)
                print(f"compiled tier {manifest['tag']}/{level}: {manifest['kernels']} kernels")
        finally:
            sys.path.remove(os.path.abspath(self.build_lib))


class PlatformWheel(bdist_wheel):
    """A wheel with a compiled tier is for one Python and platform."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if _levels():
            self.root_is_pure = False


setup(cmdclass={"build_py": BuildPyWithCompiledTier, "bdist_wheel": PlatformWheel})
