"""Registry entries of the numba kernels.

Each entry is a thin wrapper that views the arrays as the unsigned integers the kernel works on
and calls the compiled kernel. The numba modules are imported on the first call, so registering
costs nothing and ``import neuron_kernels`` compiles nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..registry import CastOptions, register_cast


def _exp8() -> Any:
    from . import exp8

    return exp8


@register_cast("float32", "bfloat16")
def float32_to_bfloat16(src: np.ndarray, dst: np.ndarray, options: CastOptions, start: int) -> None:
    _exp8().make_encode_exp8(7, 16)(src.view(np.uint32), dst.view(np.uint16))


@register_cast("float32", "tfloat32")
def float32_to_tfloat32(src: np.ndarray, dst: np.ndarray, options: CastOptions, start: int) -> None:
    _exp8().make_encode_exp8(10, 0)(src.view(np.uint32), dst.view(np.uint32))


@register_cast("bfloat16", "float32")
def bfloat16_to_float32(src: np.ndarray, dst: np.ndarray, options: CastOptions, start: int) -> None:
    _exp8().decode_bfloat16(src.view(np.uint16), dst.view(np.uint32))
