"""The kernels of the random Hadamard rotation of 16-element groups (:func:`~.hadamard.rotate_group`):
the rotation itself and the amax of the rotated input. The row kernels of the rotated input are
the row kernels' own (:mod:`.rows`), which rotate each run of blocks into a scratch row first."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..._jit import jit, u32_and
from .hadamard import rotate_group
from .spec import source_of


@cache
def rotate_kernel(source: str) -> Any:
    """Kernel ``(x, out, signs, inverse, t0, t1)``: the rotation (or its inverse) of every
    16-element group of the rows of (A, L) ``x`` (L a multiple of 16) into the float32 patterns
    ``out`` (uint32, the same shape; it may be ``x`` itself for a float32 ``x``). A task is a group."""
    src = source_of(source)
    kind = src.kind

    @jit
    def kernel(x, out, signs, inverse, t0, t1):  # pragma: no cover - compiled
        t = np.empty(16, np.float64)
        ng = x.shape[1] // 16
        for task in range(t0, t1):
            r = task // ng
            g = (task - r * ng) * 16
            rotate_group(x[r], g, out[r], g, signs, t, kind, src.codec, inverse)

    return kernel


@cache
def rotated_amax_kernel(source: str) -> Any:
    """Kernel ``(x, out, signs, chunk, t0, t1)``: ``out[task]`` = the largest finite |y| pattern of
    the rotation y of groups ``[task * chunk, (task + 1) * chunk)`` of (A, L) ``x``."""
    src = source_of(source)
    kind = src.kind

    @jit
    def kernel(x, out, signs, chunk, t0, t1):  # pragma: no cover - compiled
        t = np.empty(16, np.float64)
        buf = np.empty(16, np.uint32)
        ng = x.shape[1] // 16
        for task in range(t0, t1):
            m = np.uint32(0)
            for group in range(task * chunk, min(task * chunk + chunk, x.shape[0] * ng)):
                r = group // ng
                rotate_group(x[r], (group - r * ng) * 16, buf, 0, signs, t, kind, src.codec, False)
                for k in range(16):
                    v = u32_and(buf[k], 0x7FFFFFFF)
                    m = v if (v > m) & (v < np.uint32(0x7F800000)) else m
            out[task] = m

    return kernel
