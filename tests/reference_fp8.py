"""Slow, obviously-correct reference for FP8 E4M3 with float scales: one scale per tile of a 2-D
array (``fp8_block``: 128 x 128 tiles, ``fp8_channel``: one row or a group of a row,
``fp8_tensor``: the whole matrix are all tiles of some shape here).

Nothing here shares code with the package, and nothing imports it: every step is one float32
operation on numpy scalars (round to nearest even, subnormals kept), taken one element at a time in
Python loops. Element rounding and decoding come from the cast reference ``reference_casts``
(``encode_ref`` / ``decode_ref``), which also rounds a float32 scale to bfloat16 or float16.

The rules
=========

Input: a 2-D array, read as float32 (float16 and bfloat16 widen exactly, float64 is rounded to the
nearest float32, ties to even). Tile (I, J) of ``block_shape=(r, c)`` holds ``x[I*r:(I+1)*r,
J*c:(J+1)*c]``; tiles on the bottom and right edges hold what is left (they may be smaller), and the
scales have shape ``(ceil(R / r), ceil(C / c))``. ``amax`` is the largest magnitude in the tile.

- A tile holding a NaN, +inf or -inf: its scale is a float32 quiet NaN (stored in the scale dtype)
  and every code of the tile is 0x7F (the E4M3 NaN).
- ``scale_mode="divide"``: ``t = amax / 448`` (one float32 division), then rounded to the scale
  dtype to nearest even. A float16 scale too large for float16 is the largest finite float16
  (65504), not infinity (the scale saturates; bfloat16 and float32 cannot overflow here). If the
  rounded scale is zero (an all-zero tile, or a tile whose quotient underflows in the scale dtype)
  it is replaced by the scale dtype's machine epsilon: 2^-23 (float32), 2^-7 (bfloat16), 2^-10
  (float16). Each element becomes ``v = x / s`` (one float32 division by the stored scale read back
  as float32).
- ``scale_mode="reciprocal"`` (float32 scales only): ``m = 448 / amax`` (one float32 division, which
  overflows to +inf for a tiny amax), or ``m = 1`` for an all-zero tile. Each element becomes
  ``v = x * m``, except that a zero element stays the zero of its own sign (so 0 * inf is never
  formed). The stored scale is ``1 / m`` (one float32 division: 0 when m is inf).
- ``scale_mode="pow2"`` (float32 or bfloat16 scales): ``s = 2^e`` for the smallest integer
  ``e >= -126`` with ``amax <= 448 * 2^e`` (compared exactly, in Python's float64); an all-zero
  tile takes the epsilon above. Each element becomes ``v = x / s`` (exact: a power of two).
- Then ``v`` is clamped to [-448, 448] and rounded to float8_e4m3fn with ``rounding``
  (``encode_ref``, saturating). A zero keeps its sign through all of this.
- Dequantisation: ``decode(code) * s`` (one float32 multiplication, s the stored scale read as
  float32); a NaN tile gives NaN.

Stochastic rounding takes ``rand``: uint32 draws of the input's shape, element (i, j) using
``rand[i, j]`` whatever the tiles (``encode_ref`` documents how a draw rounds).

Public names: ``E4M3_MAX``, ``SCALE_EPS``, ``fp8_scale_ref(amax, scale_mode, scale_dtype)``,
``fp8_quantize_ref(x, block_shape, scale_mode, scale_dtype, rounding, rand)`` ->
``(codes, scales)`` and ``fp8_dequantize_ref(codes, scales, block_shape)`` -> float32.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .reference_blocks import _tiles  # the tiles in C order, as the block references visit them
from .reference_casts import decode_ref, encode_ref

#: The largest float8_e4m3fn value: elements are clamped to +-448 and amax is divided by it.
E4M3_MAX = np.float32(448.0)

#: The scale of a tile whose scale would be zero: the scale dtype's machine epsilon (the gap
#: between 1 and the next value), 2^-(mantissa bits).
SCALE_EPS: dict[str, np.float32] = {
    "float32": np.float32(2.0**-23),
    "bfloat16": np.float32(2.0**-7),
    "float16": np.float32(2.0**-10),
}

SCALE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}

SCALE_MODES = ("divide", "reciprocal", "pow2")

E4M3_NAN_CODE = 0x7F

_ONE = np.float32(1.0)
_NAN = np.uint32(0x7FC00000).view(np.float32)


def _f32_div(a, b) -> np.float32:
    """One IEEE float32 division (nearest even; overflow to inf, x / inf = 0)."""
    with np.errstate(all="ignore"):
        return np.float32(np.float32(a) / np.float32(b))


def _f32_mul(a, b) -> np.float32:
    """One IEEE float32 multiplication (nearest even; overflow to inf)."""
    with np.errstate(all="ignore"):
        return np.float32(np.float32(a) * np.float32(b))


def _round_scale(t: np.float32, scale_dtype: str) -> np.float32:
    """The float32 ``t`` rounded to ``scale_dtype`` to nearest even, saturating at its largest
    finite value, returned as the float32 it widens to."""
    if scale_dtype == "float32":
        return np.float32(t)
    code = encode_ref(np.array([t], dtype=np.float32), scale_dtype, "nearest_even", saturate=True)
    return decode_ref(code, scale_dtype)[0]


def _check_options(scale_mode: str, scale_dtype: str) -> None:
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {tuple(SCALE_DTYPES)}, got {scale_dtype!r}")
    if scale_mode == "reciprocal" and scale_dtype != "float32":
        raise ValueError("the reciprocal rule stores float32 scales only")
    if scale_mode == "pow2" and scale_dtype == "float16":
        raise ValueError("the pow2 rule stores float32 or bfloat16 scales only")


def fp8_scale_ref(amax, scale_mode: str = "divide", scale_dtype: str = "float32") -> tuple[np.float32, np.float32]:
    """(what every element of a tile of finite ``amax`` is scaled by, the stored scale as float32).

    ``divide`` and ``pow2``: (s, s), elements divided by s. ``reciprocal``: (m, 1 / m), elements
    multiplied by m.
    """
    _check_options(scale_mode, scale_dtype)
    amax = np.float32(amax)
    if not math.isfinite(float(amax)) or amax < 0:
        raise ValueError(f"amax must be finite and non-negative, got {amax!r}")
    if scale_mode == "reciprocal":
        m = _ONE if amax == 0 else _f32_div(E4M3_MAX, amax)
        return m, _f32_div(_ONE, m)
    if scale_mode == "pow2":
        if amax == 0:
            return SCALE_EPS[scale_dtype], SCALE_EPS[scale_dtype]
        e = -126
        while float(amax) > 448.0 * 2.0**e:
            e += 1
        s = np.float32(2.0**e)
        return s, s
    s = _round_scale(_f32_div(amax, E4M3_MAX), scale_dtype)
    if s == 0:
        s = SCALE_EPS[scale_dtype]
    return s, s


def _scaled_element(x: np.float32, factor: np.float32, scale_mode: str) -> np.float32:
    """One element before rounding: x / s or x * m, then clamped to [-448, 448]."""
    if x == 0:
        return x  # a zero keeps its sign (and 0 * inf is never formed)
    v = _f32_mul(x, factor) if scale_mode == "reciprocal" else _f32_div(x, factor)
    if v > E4M3_MAX:
        return E4M3_MAX
    if v < -E4M3_MAX:
        return -E4M3_MAX
    return v


def _as_float32_2d(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = np.asarray(x).astype(np.float32)
    if x32.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {x32.shape}")
    return x32


def _block_shape(block_shape) -> tuple[int, int]:
    r, c = block_shape
    if not (isinstance(r, (int, np.integer)) and isinstance(c, (int, np.integer)) and r > 0 and c > 0):
        raise ValueError(f"block_shape must be two positive ints, got {block_shape!r}")
    return int(r), int(c)


def _scales_shape(shape: tuple[int, int], block_shape: tuple[int, int]) -> tuple[int, int]:
    return -(-shape[0] // block_shape[0]), -(-shape[1] // block_shape[1])


def fp8_quantize_ref(
    x,
    block_shape,
    scale_mode: str = "divide",
    scale_dtype: str = "float32",
    rounding: str = "nearest_even",
    rand=None,
) -> tuple[np.ndarray, np.ndarray]:
    """Quantise the 2-D ``x`` with one float scale per ``block_shape`` tile (see the module docstring).

    Returns (codes: uint8 of x's shape, scales: ``scale_dtype`` of the tile grid's shape).
    """
    _check_options(scale_mode, scale_dtype)
    x32 = _as_float32_2d(x)
    bs = _block_shape(block_shape)
    if rounding == "stochastic":
        if rand is None:
            raise ValueError("rounding='stochastic' needs rand (one uint32 per element)")
        rand = np.asarray(rand)
        if rand.shape != x32.shape or rand.dtype.kind not in "ui":
            raise ValueError(f"rand must be integers of shape {x32.shape}")
    codes = np.zeros(x32.shape, dtype=np.uint8)
    scales = np.zeros(_scales_shape(x32.shape, bs), dtype=np.float32)
    for bi, bj, cells in _tiles(x32.shape, bs):
        vals = [x32[i, j] for i, j in cells]
        if any(not math.isfinite(float(v)) for v in vals):
            scales[bi, bj] = _NAN
            for i, j in cells:
                codes[i, j] = E4M3_NAN_CODE
            continue
        amax = max(abs(float(v)) for v in vals)  # exact: each |v| is a float32
        factor, stored = fp8_scale_ref(amax, scale_mode, scale_dtype)
        scales[bi, bj] = stored
        scaled = np.array([_scaled_element(v, factor, scale_mode) for v in vals], dtype=np.float32)
        draws = None if rand is None else np.array([int(rand[i, j]) for i, j in cells], dtype=np.uint32)
        tile_codes = encode_ref(scaled, "float8_e4m3fn", rounding, saturate=True, rand=draws)
        for (i, j), code in zip(cells, tile_codes.tolist()):
            codes[i, j] = code
    with np.errstate(invalid="ignore"):
        return codes, scales.astype(SCALE_DTYPES[scale_dtype])


def fp8_dequantize_ref(codes, scales, block_shape) -> np.ndarray:
    """float32 values ``decode(code) * s`` of 2-D codes and their tiles' scales (any scale dtype)."""
    codes = np.asarray(codes)
    bs = _block_shape(block_shape)
    if codes.ndim != 2 or codes.dtype != np.uint8:
        raise ValueError(f"codes must be 2-D uint8, got {codes.dtype} of shape {codes.shape}")
    with np.errstate(invalid="ignore"):
        s32 = np.asarray(scales).astype(np.float32)
    if s32.shape != _scales_shape(codes.shape, bs):
        raise ValueError(f"scales must have shape {_scales_shape(codes.shape, bs)}, got {s32.shape}")
    with np.errstate(invalid="ignore"):
        elements = decode_ref(codes, "float8_e4m3fn")
    out = np.zeros(codes.shape, dtype=np.float32)
    for bi, bj, cells in _tiles(codes.shape, bs):
        for i, j in cells:
            out[i, j] = _f32_mul(elements[i, j], s32[bi, bj])
    return out
