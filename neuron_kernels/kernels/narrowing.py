"""float64 and integers to float32 patterns, without the double rounding a plain conversion
would add: rounded "to odd" (one correct rounding to any smaller format follows), or truncated
with the rest kept as a 32-bit fraction of the float32 ulp (stochastic rounding needs every bit)."""

from __future__ import annotations

import numpy as np

from .._jit import f32_bits, f32_from_bits, jit, u32_and, u32_or, u32_shl, u32_shr, u32_sub

__all__ = ["f64_to_f32_odd", "int_to_f32_odd", "f64_to_f32_truncated", "f64_rest"]


@jit
def f64_to_f32_odd(x):  # pragma: no cover - compiled
    """float64 -> float32 pattern rounded to odd: truncate, then set the last bit if inexact.

    A later rounding to at most 21 significand bits then equals one correct rounding of ``x``
    in every mode. Beyond float32's range this gives the largest finite float32 (odd), which
    is past every target's overflow threshold.
    """
    y = np.float32(x)
    b = f32_bits(y)
    back = np.float64(y)
    b = u32_sub(b, 1) if abs(back) > abs(x) else b
    return u32_or(b, 1) if (back != x) & (x == x) else b


@jit
def int_to_f32_odd(x):  # pragma: no cover - compiled
    """Integer -> float32 pattern rounded to odd, with no rounding on the way: a magnitude below
    2^53 is a float64 as it is; from 2^53 on, float32's ulp is at least 2^30, so the bits below
    2^21 only decide the odd bit, and the rest (at most 43 significant bits) is a float64."""
    neg = x < 0
    m = np.uint64(0) - np.uint64(x) if neg else np.uint64(x)
    low = m & np.uint64(0x1FFFFF)
    if m < np.uint64(1 << 53):
        b = f64_to_f32_odd(np.float64(m))
    else:
        b = u32_or(f64_to_f32_odd(np.float64(m - low)), low != np.uint64(0))
    return u32_or(b, 0x80000000) if neg else b


@jit
def f64_to_f32_truncated(x):  # pragma: no cover - compiled
    """float64 -> float32 pattern rounded toward zero; +-inf from 2^128 on (past every target's
    largest value, as float32's own infinity is); NaN as numpy converts it."""
    y = np.float32(x)
    b = f32_bits(y)
    b = u32_sub(b, 1) if abs(np.float64(y)) > abs(x) else b
    return u32_or(u32_and(b, 0x80000000), 0x7F800000) if abs(x) >= 2.0**128 else b


@jit
def f64_rest(x, u):  # pragma: no cover - compiled
    """The part of ``|x|`` below its truncation ``u`` (:func:`f64_to_f32_truncated`), as a 32-bit
    fraction of the float32 ulp at ``u``: ``floor(2^32 * (|x| - |u|) / ulp)``. The difference is
    exact in float64 and the scaling is by a power of two, so this is exact; 0 for inf and NaN.
    A non-zero ``x`` that truncates to zero gets at least 1 (a sticky bit, too small to change any
    rounding) so that e8m0, which has no zero, can tell it from zero."""
    e1 = max(u32_and(u32_shr(u, 23), 0xFF), 1)
    # times 2^(182 - e1) (ulp = 2^(e1 - 150)), as two float32 powers of two (each exponent in
    # [-36, 91]): exact, and branch-free where ldexp is a library call per element
    k = 182 - np.int64(e1)
    half = k >> 1
    p1 = np.float64(f32_from_bits(u32_shl(np.uint32(127 + half), 23)))
    p2 = np.float64(f32_from_bits(u32_shl(np.uint32(127 + k - half), 23)))
    rest = (abs(x) - abs(np.float64(f32_from_bits(u)))) * p1 * p2
    bits = np.uint32(rest) if (rest >= 0.0) & (rest < 4294967296.0) else np.uint32(0)
    return u32_or(bits, 1) if (u32_and(u, 0x7FFFFFFF) == 0) & (x != 0) else bits
