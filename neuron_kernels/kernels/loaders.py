"""Where a kernel's float32 patterns come from: the source kinds, and one loader per kind.

The table :data:`LOADERS` holds the loader of each kind; a kernel made for one kind closes over its
loader (:func:`loader`) and compiles that path only. :func:`load` is the same table read with the
kind as a run-time value, for the block kernels' shared helpers, which serve every source of one
row type: numba cannot index a table of functions by a run-time value, so it is written as a
switch, each of whose branches calls the table's own entry (``tests/test_casts_sources.py``
checks the two agree on every kind).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._jit import f16_to_f32_bits, f32_bits, jit, u32_and, u32_or, u32_shl
from ..formats import Format
from .codec import decode
from .narrowing import f64_to_f32_odd, f64_to_f32_truncated, int_to_f32_odd

__all__ = ["LOADERS", "loader", "load", "source_of_codes"]

# The source kinds: what a kernel reads, and how it makes a float32 pattern of it.
SOURCE_F32 = 0  # a float32 (or tfloat32/float32r) array
SOURCE_F64_NEAREST = 1  # float64, rounded to float32 to nearest even first (the block formats' reading)
SOURCE_F64_ODD = 2  # float64, rounded to float32 "to odd": one correct rounding follows
SOURCE_CODES = 3  # codes of a small format, decoded exactly
SOURCE_INT = 4  # integers, converted to float32 (round to nearest even): for float32 targets
SOURCE_F64_SPLIT = 5  # float64 truncated to float32, the rest kept as 32 more bits (stochastic rounding)
SOURCE_BF16 = 6  # bfloat16 codes: the top half of a float32 pattern
SOURCE_F16 = 7  # float16 codes: the hardware conversion, NaN payloads kept
SOURCE_INT_ODD = 8  # integers, rounded to float32 "to odd" (exactly, see int_to_f32_odd): one correct rounding follows


def source_of_codes(fmt: Format) -> int:
    """The source kind of arrays of codes of ``fmt``: the fast paths of bfloat16 (a shift) and
    float16 (the hardware conversion), else the generic decoder."""
    return {"bfloat16": SOURCE_BF16, "float16": SOURCE_F16}.get(fmt.name, SOURCE_CODES)


@jit
def f16_to_f32(x):  # pragma: no cover - compiled
    """float16 code -> float32 pattern, exact: the hardware conversion, except that a NaN keeps
    its payload bits as they are (the conversion would make a signalling NaN quiet)."""
    h = u32_and(x, 0xFFFF)
    nan = u32_or(u32_or(u32_shl(u32_and(h, 0x8000), 16), 0x7F800000), u32_shl(u32_and(h, 0x3FF), 13))
    return nan if u32_and(h, 0x7FFF) > np.uint32(0x7C00) else f16_to_f32_bits(h)


@jit
def _load_pattern(x, c):  # pragma: no cover - compiled
    return x


@jit
def _load_rounded(x, c):  # pragma: no cover - compiled
    return f32_bits(np.float32(x))


@jit
def _load_f64_odd(x, c):  # pragma: no cover - compiled
    return f64_to_f32_odd(x)


@jit
def _load_int_odd(x, c):  # pragma: no cover - compiled
    return int_to_f32_odd(x)


@jit
def _load_f64_truncated(x, c):  # pragma: no cover - compiled
    return f64_to_f32_truncated(x)


@jit
def _load_bf16(x, c):  # pragma: no cover - compiled
    return u32_shl(x, 16)


@jit
def _load_f16(x, c):  # pragma: no cover - compiled
    return f16_to_f32(x)


LOADERS = {
    SOURCE_F32: _load_pattern,
    SOURCE_F64_NEAREST: _load_rounded,
    SOURCE_INT: _load_rounded,
    SOURCE_F64_ODD: _load_f64_odd,
    SOURCE_INT_ODD: _load_int_odd,
    SOURCE_F64_SPLIT: _load_f64_truncated,
    SOURCE_BF16: _load_bf16,
    SOURCE_F16: _load_f16,
    SOURCE_CODES: decode,
}


def loader(source: int) -> Any:
    """The compiled ``(x, codec) -> float32 pattern`` of one source item of kind ``source``
    (``SOURCE_*``; codes are decoded with the source's :class:`Codec`)."""
    return LOADERS[source]


@jit
def load(x, source, c):  # pragma: no cover - compiled
    """The float32 pattern of one source item of kind ``source`` (``SOURCE_*``; codes are decoded
    with the source's :class:`~.codec.Codec` ``c``), the kind a run-time value: the loader of
    :data:`LOADERS` for that kind. A kernel made for one kind calls its :func:`loader`."""
    if source == SOURCE_F32:
        return _load_pattern(x, c)
    if source == SOURCE_F64_NEAREST or source == SOURCE_INT:
        return _load_rounded(x, c)
    if source == SOURCE_F64_ODD:
        return _load_f64_odd(x, c)
    if source == SOURCE_INT_ODD:
        return _load_int_odd(x, c)
    if source == SOURCE_F64_SPLIT:
        return _load_f64_truncated(x, c)
    if source == SOURCE_BF16:
        return _load_bf16(x, c)
    if source == SOURCE_F16:
        return _load_f16(x, c)
    return decode(x, c)
