"""Exact conversions between block formats that need no rounding: MXFP4 to NVFP4.

An MXFP4 block of 32 E2M1 codes with the scale 2^k is two NVFP4 blocks of 16 with the same codes
(the same nibbles, in the same bytes) and the float8_e4m3fn scale 2^(k - g) under a per-tensor
scale 2^g, whenever 2^(k - g) is a float8_e4m3fn value: a power of two from 2^-9 (its smallest
subnormal) to 2^8. So a weight converts exactly when the scale exponents of its blocks that hold a
non-zero code span at most 17 binades, with ``g`` = the highest exponent minus 8 (at least -126,
so that the per-tensor scale and its reciprocal are normal float32 numbers).

:func:`mx_extremes` reads what that takes from a piece of an MX weight (and its finite amax, the
largest code's value times its block's scale, exact in float32); :func:`nvfp4_scales` gives the
NVFP4 scale bytes of a piece. Blocks without a non-zero code take the scale the package's NVFP4
gives an all-zero block (its lower clamp, the scale format's smallest normal); a NaN block (scale
byte 0xFF) the NaN scale.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..casting import cast
from ..formats import FORMATS, BlockFormat

__all__ = ["relayable", "mx_extremes", "nvfp4_scales", "per_tensor_exponent", "block_magnitudes", "LOWEST", "HIGHEST"]

_E4M3, _E8M0 = FORMATS["float8_e4m3fn"], FORMATS["float8_e8m0fnu"]
#: The exponents of the float8_e4m3fn powers of two: its smallest subnormal (2^-9) to the largest
#: power of two up to its largest value (2^8).
LOWEST, HIGHEST = int(math.log2(_E4M3.smallest_subnormal)), math.floor(math.log2(_E4M3.max))
#: The lowest per-tensor exponent: float32's smallest normal (whose reciprocal is finite).
_LOWEST_PER_TENSOR = int(math.log2(FORMATS["float32"].smallest_normal))
#: The e8m0 byte of a NaN block, and the exponent bias.
_NAN_BYTE, _BIAS = _E8M0.nan_code, _E8M0.bias


def relayable(src: BlockFormat, dst: BlockFormat) -> bool:
    """Whether weights of ``src`` (an MX format of packed 4-bit codes) go into ``dst`` (the same
    packed elements in smaller blocks that divide ``src``'s, float8_e4m3fn scales under a
    per-tensor scale: NVFP4) as their codes, with scales re-laid."""
    return (
        src.is_mx
        and src.packable
        and dst.packable
        and dst.per_tensor_scale
        and dst.element == src.element
        and not dst.float_scales
        and src.block_size % dst.block_size == 0
    )


@functools.cache
def _magnitudes(element: str) -> np.ndarray:
    """The float32 value of each magnitude (the code without its sign bit) of a 4-bit element."""
    return cast(np.arange(8, dtype=np.uint8).view(element), "float32").astype(np.float32)


def block_magnitudes(codes: np.ndarray, block_bytes: int) -> np.ndarray:
    """The largest magnitude (0..7) of each block of packed 4-bit codes (rows, bytes) -> (rows,
    blocks), as uint8. Blocks of 8 bytes (NVFP4's 16 codes) are read as 64-bit words, 16 nibbles at
    a time: a nibble's magnitude m (3 bits) is at least t when m + 8 - t carries into the nibble's
    top bit, so three such tests find the largest (4, then 2, then 1 more): about twice as fast as
    a reduction over 8 bytes; over 16 (MX's 32 codes) numpy's reduction is the faster."""
    rows, width = codes.shape
    if block_bytes != 8 or width % 8 or not codes.flags.c_contiguous:
        mags = np.maximum(codes & np.uint8(0x07), (codes >> np.uint8(4)) & np.uint8(0x07))
        return np.asarray(mags.reshape(rows, -1, block_bytes).max(axis=2), np.uint8)
    m = codes.view(np.uint64) & _LOW3
    top = np.zeros(m.shape, np.uint64)
    for step in (4, 2, 1):
        carry = m + (np.uint64(8 - step) - top) * _ONES  # m + 8 - (top + step), nibble by nibble
        top += ((carry & _TOPS) != 0).astype(np.uint64) * np.uint64(step)
    return top.astype(np.uint8)


_ONES, _LOW3, _TOPS = np.uint64(0x1111111111111111), np.uint64(0x7777777777777777), np.uint64(0x8888888888888888)


def mx_extremes(codes: np.ndarray, scales: np.ndarray, bf: BlockFormat) -> tuple[int | None, int | None, float]:
    """(lowest, highest) scale exponent over the blocks of ``codes`` (uint8 rows x packed bytes of
    the 4-bit MX format ``bf``) that hold a non-zero code, None for none; and their finite amax.
    ``scales``: the e8m0 bytes, rows x blocks. NaN blocks count for neither."""
    mags = block_magnitudes(codes, bf.block_size // 2)
    live = (mags != 0) & (scales != _NAN_BYTE)
    if not live.any():
        return None, None, 0.0
    exps = scales[live].astype(np.int64) - _BIAS
    values = _magnitudes(bf.element)[mags[live]].astype(np.float64) * np.exp2(exps.astype(np.float64))
    with np.errstate(over="ignore"):
        values = values.astype(np.float32)  # exact, or inf beyond float32 (as dequantised)
    finite = values[np.isfinite(values)]
    return int(exps.min()), int(exps.max()), float(finite.max()) if finite.size else 0.0


def per_tensor_exponent(lowest: int | None, highest: int | None) -> int | None:
    """The exponent ``g`` of the per-tensor scale under which every block exponent from ``lowest``
    to ``highest`` has a float8_e4m3fn scale 2^(k - g); None if they span too many binades. A
    weight without a non-zero code takes 0."""
    if lowest is None or highest is None:
        return 0
    g = max(highest - HIGHEST, _LOWEST_PER_TENSOR)
    return g if lowest - g >= LOWEST else None


def nvfp4_scales(codes: np.ndarray, scales: np.ndarray, src: BlockFormat, dst: BlockFormat, g: int) -> np.ndarray:
    """The float8_e4m3fn scale bytes (rows x blocks of ``dst``) of the MX piece ``codes`` / ``scales``
    under the per-tensor scale 2^g (:func:`per_tensor_exponent` of the whole weight)."""
    mags = block_magnitudes(codes, src.block_size // 2)
    exps = scales.astype(np.int64) - _BIAS - g
    empty, nan = _scale_byte(dst, dst.scale_format.smallest_normal), _scale_byte(dst, np.nan)
    powers = cast(np.exp2(np.clip(exps, LOWEST, HIGHEST)).astype(np.float32), dst.scale).view(np.uint8)
    out = np.where(mags == 0, empty, powers)
    out = np.where(scales == _NAN_BYTE, nan, out).astype(np.uint8)
    return np.repeat(out, src.block_size // dst.block_size, axis=1)


@functools.cache
def _scale_byte(dst: BlockFormat, value: float) -> np.uint8:
    """The scale byte of ``value`` in ``dst``'s scale format; its smallest normal is what the
    package's quantiser gives an all-zero block (the scale's lower clamp)."""
    byte: np.uint8 = np.asarray(cast(np.array([value], np.float32), dst.scale)).view(np.uint8)[0]
    return byte
