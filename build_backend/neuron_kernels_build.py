"""The package's build backend: setuptools', except that building a wheel also asks for what
compiling kernels needs (numba, numpy, ml_dtypes), since a wheel carries a compiled tier of the
common kernels (see ``setup.py``). Editable installs and sdists need only setuptools, as before."""

from __future__ import annotations

from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every hook of setuptools' backend, unchanged

#: What the wheel build imports to compile the tier (the package's own requirements on them).
KERNEL_BUILD_REQUIRES = ["numba>=0.60", "numpy>=1.24", "ml_dtypes>=0.5.0"]


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *KERNEL_BUILD_REQUIRES]
