"""Numba kernels for the formats that keep float32's 8-bit exponent: bfloat16 and tfloat32.

Encoding rounds the float32 significand to ``mbits`` bits, ties to even, on the uint32 bit
pattern: ``(u + (2^(d-1) - 1) + lsb) >> d << d`` with ``d = 23 - mbits`` and ``lsb`` the last kept
bit. A carry out of the mantissa moves into the exponent, which also turns values at or above
the largest finite value plus half an ulp into infinity, exactly as IEEE rounding does. NaN
becomes the quiet NaN of its sign (the payload is dropped, as ml_dtypes does for bfloat16).
The arithmetic never overflows 32 bits for non-NaN inputs.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from .._jit import jit, u32_add, u32_and, u32_or, u32_shl, u32_shr

__all__ = ["make_encode_exp8", "decode_bfloat16"]


@cache
def make_encode_exp8(mbits: int, store_shift: int) -> Any:
    """Kernel ``(src_u32, dst)`` rounding float32 patterns to ``mbits`` mantissa bits.

    The rounded pattern is shifted right by ``store_shift`` before it is stored: 16 stores
    bfloat16 codes in a uint16 array, 0 stores tfloat32 values in a uint32 (float32) array.
    """
    drop = 23 - mbits
    half_minus_one = (1 << (drop - 1)) - 1
    keep_mask = (0xFFFFFFFF >> drop) << drop

    @jit
    def encode(src, dst):  # pragma: no cover - compiled
        for i in range(src.size):
            u = src[i]
            a = u32_and(u, 0x7FFFFFFF)
            lsb = u32_and(u32_shr(u, drop), 1)
            r = u32_and(u32_add(u32_add(u, half_minus_one), lsb), keep_mask)
            nan = u32_or(u32_and(u, 0x80000000), 0x7FC00000)
            dst[i] = u32_shr(nan if a > 0x7F800000 else r, store_shift)

    return encode


@jit
def decode_bfloat16(src, dst):  # pragma: no cover - compiled
    """bfloat16 codes (uint16) to float32 patterns (uint32): ``code << 16``, NaN payloads kept."""
    for i in range(src.size):
        dst[i] = u32_shl(src[i], 16)
