"""Slow, obviously-correct reference for the block formats of ``docs/blocks.md``: NVFP4, 2-D blocks,
the scale policies ("four over six", MSE scale search), Neuron's ``quantize_mx`` and the random
Hadamard rotation (RHT).

Nothing here shares code with the package. Element encoding and decoding come from the cast
reference ``reference_casts`` (one rounding of an exact value); the MX shared exponent of a block
(every ``scale_mode`` of ``docs/blocks.md``) comes from the MX reference ``reference_mx``. Every other
step is written out one element at a time.

Conventions (all functions)
===========================

- Inputs are 2-D arrays (the RHT takes any shape). They are converted to float32 first: float16
  and bfloat16 widen exactly, float64 rounds to nearest even (as ``docs/blocks.md`` says).
- **Codes** are uint8, one per element, unpacked, with the input's shape. NVFP4 and mxfp4 codes are
  E2M1 codes (bit 3 the sign: 0x8 is -0.0, 0xF is -6); ``reference_mx.pack_fp4_ref`` packs them two
  per byte (element 2i in the low nibble), as both specs store them.
- **Scale bytes** are uint8, one per block: for NVFP4 the float8_e4m3fn code of the block scale s
  (0x08 = 2^-6 for an all-zero block, 0x7f = NaN for a block holding a NaN or an infinity; a
  scale search may pick any finite positive code 0x01..0x7e); for MX the e8m0 byte (exponent + 127,
  0x00 for an all-zero block, 0xff for a NaN/inf block).
- **Blocks**: 1-D blocks along the last axis are ``block_shape=(1, block_size)`` (along the first
  axis: ``(block_size, 1)``). With ``block_shape=(r, c)`` tile (I, J) holds the elements
  ``x[I*r:(I+1)*r, J*c:(J+1)*c]``; tiles at the bottom and right edges may be partial (amax over
  their real elements only). Scales have shape ``(ceil(R / r), ceil(C / c))``. Within a tile the
  elements are visited in C order (row by row), which fixes the order of the error sums below.
- **Stochastic rounding**: ``rand`` is a uint32 array of the input's shape; element (i, j) uses
  ``rand[i, j]`` (its C-order index), whatever the block shape. Its magnitude goes up to the next
  representable value iff ``rand < floor(2^32 * f)``, f the discarded fraction of the gap
  (``reference_casts.encode_ref``). Every candidate of a scale policy uses the same draws.
- **Per-tensor scale** (``pts``): the NVFP4 decode multiplier (torchao's ``per_tensor_scale``),
  returned as an ``np.float32`` (or None for single-level).

Public names
============

- ``BlockQuantRef``: the named tuple ``(codes, scales, pts)`` every quantiser returns.
- ``nvfp4_per_tensor_scale_ref(x, pts_bound=448)``: the default pts (below).
- ``nvfp4_scale_byte_ref(amax, pts=None, divisor=6)``: the e4m3fn scale byte of a block.
- ``nvfp4_quantize_ref(x, block_size=16, per_tensor_scale="amax", rounding="nearest_even",
  rand=None, policy=None, pts_bound=448, scale_search=None)`` -> ``BlockQuantRef``: 1-D blocks
  along the last axis of a 2-D array (a partial last block allowed).
- ``nvfp4_dequantize_ref(codes, scales, pts, block_size=16)`` -> float32.
- ``quantize_2d_ref(x, kind, block_shape, *, scale_mode="floor", rounding="nearest_even",
  rand=None, per_tensor_scale="default", pts_bound=448, policy=None, scale_search=None)``
  -> ``BlockQuantRef``: ``kind`` is "nvfp4" or an MX format name (``reference_mx.MX_FORMATS_REF``).
  ``per_tensor_scale="default"`` means "amax" for NVFP4 and none for MX (MX has no per-tensor
  scale: only "default" or None are accepted there). ``scale_mode`` is MX only, ``policy`` NVFP4 only.
- ``dequantize_2d_ref(codes, scales, kind, block_shape, pts=None)`` -> float32.
- ``neuron_quantize_mx_ref(x, fmt="mxfp8_e4m3")`` -> ``(packed, scales)``: Neuron's
  ``nki.isa.quantize_mx`` on a [P, F] tile (below).
- ``pack_x4_ref(codes)``, ``unpack_x4_ref(packed)``: four 8-bit codes per uint32 and back.
- ``neuron_scale_tile_ref(scales, partitions, offset=0)``: logical scales [P/8, F/4] placed on the
  SBUF partitions the instruction writes (below).
- ``hadamard16_ref()``, ``rht_ref(x, signs=None, axis=-1)``, ``rht_inverse_ref(y, signs=None,
  axis=-1)``, ``RHT_DEFAULT_SIGNS``.
- ``block_error_ref(x, dq, metric)``, ``block_errors_ref(x, dq, block_shape, metric)``: float64 sums.
- ``f32_mul``, ``f32_div``: one IEEE float32 operation (the tests check them against exact rounding).

NVFP4 numerics (``docs/blocks.md`` "NVFP4 numerics")
====================================================

Every step is one float32 operation (numpy float32 scalars; ties to even, subnormals kept, overflow
to inf), done in this order. amax is the block's largest |x| (exact).

- Scale, single level: ``t = amax / 6``; ``t = clamp(t, 2^-6, 448)``; ``s = e4m3fn(t)`` (round to
  nearest even; the clamp keeps it finite). Two level: ``t = (amax / 6) / pts`` (the quotient
  rounded, then divided by pts and rounded again), then the same clamp and rounding.
- Elements, single level: ``r = 1 / f32(s)``; ``v = x * r``. Two level: ``r = (1 / pts) / f32(s)``
  (two roundings, in that order); ``v = x * r``. Then ``v = clamp(v, -6, 6)`` and the code is the
  E2M1 encoding of v with ``rounding`` (default nearest even). A zero x gives the zero code of its
  own sign (0x0 / 0x8).
- Dequantisation: single level ``decode(code) * f32(s)``; two level ``m = pts * f32(s)`` first
  (rounded to float32), then ``decode(code) * m`` (rounded).
- Default pts (``per_tensor_scale="amax"``): ``amax_t / (pts_bound * 6)`` in float32, amax_t the
  largest |x| over the tensor's *finite* elements; ``pts_bound`` is 448 (or 256 to leave room for
  four over six's x1.5); a result that is 0 or not finite becomes 1.0. A float given by the caller
  is used as is (rounded to float32 first; it must be positive and finite).
- Special blocks: an all-zero block gets scale byte 0x08 (the clamp gives 2^-6) and signed-zero
  codes; a block holding a NaN or an infinity gets scale byte 0x7f and codes 0, and dequantises to
  NaN (0 * NaN). Float32 subnormal inputs are ordinary values.

What torchao does (read, not copied): ``torchao/prototype/mx_formats/nvfp4_tensor.py``, function
``nvfp4_quantize``, at the v0.18.0 release (commit 5f2baf9d575cf732362594c998c399902942531f) and on
main (commit 36027d82d1ad9949597ea16002ff4940374b1b94, 2026-08-21). The block scale is the block
amax divided by 6 in float32 (a true division). Single level: clamp to [2^-6 (the e4m3fn smallest
normal), 448], cast to float8_e4m3fn, back to float32, and the elements are multiplied by the
float32 reciprocal of that scale, ``x * (1 / s)`` (not divided by s). Two level: the float32 block
scale is divided by the per-tensor scale, clamped and cast the same way; the elements are multiplied
by ``(1 / pts) / s``: the reciprocal of pts first, then divided by the decoded scale, then one
multiply. Then the scaled values are clamped to [-6, 6] and rounded to E2M1 to nearest even.
Dequantisation (``NVFP4Tensor.get_hp_scales`` and ``dequantize``) forms ``pts * s`` in float32 first
and multiplies the decoded element by it. The default per-tensor scale (``per_tensor_amax_to_scale``)
is the amax divided by 448 * 6 in float32. This is exactly the formula of ``docs/blocks.md``, which
this reference follows. Older torchao releases differ: up to 0.16 the elements were *divided*, by
s (single level) and by ``pts * s`` (two level); 0.17 divided by s for single level and already
used ``(1 / pts) / s`` for two level. The multiply-by-reciprocal form arrived on 2026-04-02 (torchao
commit a302c10bb), so "bit for bit torchao" means torchao >= 0.18. Where this reference departs
from torchao on purpose: NaN/inf blocks (torchao clamps an infinite amax to a finite scale, and
has no NaN code for E2M1), partial last blocks (torchao needs the length to be a multiple of 16),
and zeros when the two-level multiplier ``(1 / pts) / s`` overflows to inf (possible once pts is
below 2^-122, e.g. the default pts of a tensor whose amax is below about 2^-111): torchao computes
0 * inf = NaN there and turns it into an unspecified code, this reference keeps the signed zero.
Non-zero elements become +-inf, clamped to +-6, in both. The optional test in
``test_reference_blocks.py`` compares this reference with torchao 0.18.0 (torch 2.13.0, CPU): codes,
scale bytes, per-tensor scale and dequantised values agree bit for bit.

Scale policies (``docs/blocks.md`` "Scale policies")
====================================================

- ``policy=("four_over_six", metric)`` (NVFP4 only), metric "mae" or "mse": candidate scales
  map-to-6 (the default rule) and map-to-4 (the same rule with ``amax / 4`` for ``amax / 6``, then
  the same ``/ pts``, clamp and e4m3fn rounding). Each candidate quantises the whole block (same
  draws); the dequantised values give the block error; map-to-4 is kept only if its error is
  strictly smaller (a tie keeps map-to-6).
- ``scale_search="mse"``: NVFP4: the candidates are the e4m3fn codes c0-2 .. c0+2 around the
  computed code c0; a candidate outside the finite positive codes 0x01..0x7e is skipped (it is not
  a scale: 0x00 is zero, 0x7f NaN). MX: the computed exponent e and e + 1; e + 1 = 128 is skipped
  (byte 0xff is NaN). The candidates are tried in the order c0 (resp. e) first, then increasing
  codes, and one replaces the best so far only when its block sum of squared errors is strictly
  smaller: a tie keeps the computed scale, and among the others the smaller code. Special blocks
  (all-zero, NaN/inf) are not searched.
- ``policy`` and ``scale_search`` cannot be combined (ValueError): the spec does not say how.
- Block errors: float64, ``d = float64(dq_i) - float64(x_i)`` then ``|d|`` (mae) or ``d * d``
  (mse), accumulated left to right from 0.0 in the tile's C order, each step rounded to float64.
  An inf dequantised value gives an infinite error; a candidate with an infinite error never wins.

Neuron's ``nki.isa.quantize_mx``
================================

From the Neuron documentation (aws-neuron-sdk, commit 81ce03ae261e12925e53437a0f690478e6366155:
the instruction's docstring in ``nki/api/nki/isa/__init__.py``, the deep dive
``nki/deep-dives/mxfp-matmul.rst`` and its ``nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py``):

- Input float16/bfloat16 [P, F] in SBUF, P a multiple of 32 up to 128, F a multiple of 4; output
  float8_e4m3fn_x4 or float8_e5m2_x4 [P, F/4] (four consecutive free-axis elements per 32-bit
  container) and one e8m0 scale per group, logical shape [P/8, F/4]. No FP4 output.
- A group is 8 partitions x 4 consecutive free-axis elements: rows 8a..8a+7, columns 4b..4b+3 for
  scale [a, b]. Here: ``quantize_2d_ref(x, fmt, (8, 4), scale_mode="neuron")``.
- Scale: X = 2^(floor(log2 amax) - (emax - 1)) with emax 8 (e4m3fn) or 15 (e5m2): twice the OCP
  scale, so the block maximum never saturates. All-zero group: X = 2^-127 (byte 0). This is the
  "neuron" mode of docs/blocks.md. (The deep dive's CPU golden ``quantize_mx_golden`` uses the OCP
  exponent instead, max exponent field - emax, and compares with the device through a tolerance;
  the instruction's own documentation states the one-binade-higher rule, which is what is used
  here.)
- Elements: divided by X, clipped to +-max, cast to the FP8 type (the golden: clip, then a round to
  nearest even cast); NaN/inf groups are not documented: the special-block rule of docs/blocks.md
  is used.
- Containers: element 4j + i of a row is byte i (bits 8i..8i+7) of container j, element 0 the least
  significant (the golden views the FP8 bytes as little-endian uint32).
- Scale placement in SBUF (``mx_cpu_utils.get_p_contiguous_scale`` and the deep dive): the
  partition axis is four quadrants of 32 partitions, and a group's scale must stay in its quadrant.
  For P > 32 the scale tile is [P, F/4] and logical row a sits on partition 32 * (a // 4) + a % 4
  (+ an offset of 0, 4, 8 or 12, which lets up to four tensors share one scale tile); the other
  partitions are unused. For P <= 32 the [P/8, F/4] logical tile may be used as is.
  ``neuron_scale_tile_ref`` builds the [P, F/4] form.

Random Hadamard rotation
========================

``y = (x * signs) @ H16 / 4`` on every group of 16 consecutive elements along ``axis`` (the length
must be a multiple of 16), H16 the Sylvester Hadamard matrix (H[i, j] = (-1)^popcount(i & j)),
default signs ``RHT_DEFAULT_SIGNS``. The inverse is ``(y @ H16 / 4) * signs``. The spec's
``rht=True`` is the composition ``quantize(rht_ref(x, signs, axis=block axis))`` (the rotated
float32 values are what gets quantised), and ``dequantize(..., unrotate=True)`` is
``rht_inverse_ref(dequantize(...), signs, axis=block axis)``.

Evaluation (the package must do the same operations to match bit for bit): each element is widened
to float64 and multiplied by its sign (exact); then the in-place fast Walsh-Hadamard butterfly runs
in float64 in four stages h = 1, 2, 4, 8: for every index j with ``j & h == 0``, in increasing j,
``(v[j], v[j + h]) <- (v[j] + v[j + h], v[j] - v[j + h])``; then each v is multiplied by 0.25
(exact) and rounded once to float32 (nearest even; overflow to inf). The inverse runs the same
butterfly on float64(y), multiplies by 0.25 and by the signs, and rounds once to float32.

The sums are *not* always exact in float64: 16 float32 terms whose exponents lie far apart need
more than 53 bits (1 + 2^-24 + 2^-80 is not a float64). Every butterfly step is exact when the
ulps (float32 quanta) of the group's non-zero elements lie within a factor 2^25 of each other
(every partial sum is then an integer multiple of the smallest ulp, and less than 2^53 times it, in
magnitude); then the output is
the correctly rounded float32 of the exact value. Otherwise a step may round, and the output is the
result of exactly the operations above (it can differ from the correctly rounded value by double
rounding; the tests show such a case). Non-finite inputs follow IEEE float64 in that order.

Rules decided here where the specs leave room (each is repeated where it is used)
===================================================================================

- NVFP4 rounding modes are MX's: "nearest_even" (torchao), "nearest_away", "toward_zero",
  "stochastic".
- A zero element always keeps its signed-zero code, even where the float32 multiply would give
  NaN (0 * inf, see above).
- NVFP4 dequantisation applies the formula to any scale byte (0x7f and 0xff give NaN; a negative
  scale code gives negative values).
- MX 2-D blocks use ``reference_mx.shared_exponent_ref`` on the tile's values, so every scale mode,
  clamp and special block is that of docs/blocks.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .reference_casts import FORMATS_REF, decode_ref, encode_float64_ref, encode_ref
from .reference_mx import (
    E8M0_BIAS,
    E8M0_NAN,
    INT8_MAX_CODE,
    INT8_SCALE_BITS,
    MX_FORMATS_REF,
    MX_ROUNDING_MODES,
    SCALE_MODES,
    block_amax_ref,
    round_int8_magnitude,
    shared_exponent_ref,
)

# ---- constants --------------------------------------------------------------------------------

NVFP4 = "nvfp4"
NVFP4_BLOCK_SIZE = 16
NVFP4_TILE = (16, 16)

#: float8_e4m3fn: 0x7f is NaN, 0x7e (448) the largest finite code, 0x08 (2^-6) the smallest normal.
E4M3_NAN_BYTE = 0x7F
E4M3_MAX_CODE = 0x7E
E4M3_MIN_POSITIVE_CODE = 0x01
E4M3_MIN_NORMAL = np.float32(2.0**-6)
E4M3_MAX = np.float32(448.0)
E2M1_MAX = np.float32(6.0)

ROUNDING_MODES = MX_ROUNDING_MODES
POLICIES = ("four_over_six",)
ERROR_METRICS = ("mae", "mse")
SCALE_SEARCHES = ("mse",)
PER_TENSOR_DEFAULT = "default"

#: The sign vector of the rotation when none is given (docs/blocks.md).
RHT_DEFAULT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
RHT_GROUP = 16

#: Neuron quantize_mx: 8 partitions x 4 free-axis elements per group; FP8 outputs only.
NEURON_MX_BLOCK = (8, 4)
NEURON_MX_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2")

_ONE = np.float32(1.0)
_FOUR = np.float32(4.0)
_SIX = np.float32(6.0)


class BlockQuantRef(NamedTuple):
    """What the quantisers return.

    codes:
        uint8, the input's shape, one unpacked code per element.
    scales:
        uint8 scale bytes, one per block (float8_e4m3fn codes for NVFP4, e8m0 bytes for MX).
    pts:
        The per-tensor scale used (np.float32), or None (single level, and always for MX).
    """

    codes: np.ndarray
    scales: np.ndarray
    pts: np.float32 | None


# ---- float32 arithmetic, one operation at a time ----------------------------------------------


def f32_mul(a, b) -> np.float32:
    """One IEEE float32 multiply of two float32 values (nearest even, subnormals kept, overflow to
    inf, 0 * inf = NaN)."""
    with np.errstate(all="ignore"):
        return np.float32(np.float32(a) * np.float32(b))


def f32_div(a, b) -> np.float32:
    """One IEEE float32 division of two float32 values (nearest even, subnormals kept)."""
    with np.errstate(all="ignore"):
        return np.float32(np.float32(a) / np.float32(b))


def _as_float32_2d(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = np.asarray(x, dtype=np.float32)
    if x32.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {x32.shape}")
    return x32


def _check_rand(rand, shape, rounding) -> np.ndarray | None:
    if rounding != "stochastic":
        return None
    if rand is None:
        raise ValueError("rounding='stochastic' needs rand (one uint32 per element)")
    rand = np.asarray(rand)
    if rand.shape != tuple(shape) or rand.dtype.kind not in "ui":
        raise ValueError(f"rand must be integers of shape {tuple(shape)}")
    if rand.size and (rand.min() < 0 or rand.max() > 0xFFFFFFFF):
        raise ValueError("rand must hold integers in [0, 2^32)")
    return rand.astype(np.uint32)


def _check_block_shape(block_shape) -> tuple[int, int]:
    try:
        r, c = block_shape
    except (TypeError, ValueError):
        raise ValueError(f"block_shape must be a pair (r, c), got {block_shape!r}") from None
    for n in (r, c):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"block_shape must hold positive ints, got {block_shape!r}")
    return int(r), int(c)


def _tiles(shape: tuple[int, int], block_shape: tuple[int, int]):
    """Yield (I, J, [(i, j), ...]) for every tile, the positions in C order within the tile."""
    n_rows, n_cols = shape
    r, c = block_shape
    for bi in range(-(-n_rows // r)):
        rows = range(bi * r, min(n_rows, (bi + 1) * r))
        for bj in range(-(-n_cols // c)):
            cols = range(bj * c, min(n_cols, (bj + 1) * c))
            yield bi, bj, [(i, j) for i in rows for j in cols]


# ---- block errors -----------------------------------------------------------------------------


def block_error_ref(x, dq, metric: str = "mse") -> float:
    """The error of one block: sum |dq - x| ("mae") or sum (dq - x)^2 ("mse") in float64.

    ``x`` and ``dq`` are the block's values in the order to sum (a tile in C order). Each
    difference is float64(dq_i) - float64(x_i), rounded to float64; the terms are added left to
    right starting from 0.0, each addition rounded to float64. Non-finite values give inf or NaN.
    """
    if metric not in ERROR_METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {ERROR_METRICS}")
    with np.errstate(invalid="ignore"):
        xs = np.asarray(x, dtype=np.float32).reshape(-1).astype(np.float64).tolist()
        ds = np.asarray(dq, dtype=np.float32).reshape(-1).astype(np.float64).tolist()
    if len(xs) != len(ds):
        raise ValueError("x and dq must have the same number of values")
    total = 0.0
    for a, b in zip(xs, ds):
        d = b - a
        total += abs(d) if metric == "mae" else d * d
    return total


def block_errors_ref(x, dq, block_shape, metric: str = "mse") -> np.ndarray:
    """``block_error_ref`` of every tile of two 2-D arrays: float64 of shape (ceil(R/r), ceil(C/c))."""
    x32, d32 = _as_float32_2d(x), _as_float32_2d(dq)
    if x32.shape != d32.shape:
        raise ValueError("x and dq must have the same shape")
    bs = _check_block_shape(block_shape)
    out = np.zeros((-(-x32.shape[0] // bs[0]), -(-x32.shape[1] // bs[1])), dtype=np.float64)
    for bi, bj, pos in _tiles(x32.shape, bs):
        out[bi, bj] = block_error_ref([x32[p] for p in pos], [d32[p] for p in pos], metric)
    return out


# ---- NVFP4: scale, elements, dequantisation ---------------------------------------------------


def nvfp4_per_tensor_scale_ref(x, pts_bound=448) -> np.float32:
    """The default per-tensor scale: f32(amax_t / f32(pts_bound * 6)), amax_t the largest |x| over
    the finite elements of ``x`` (0 if there are none); a result that is 0 or not finite is 1.0."""
    with np.errstate(over="ignore", invalid="ignore"):
        vals = np.asarray(x, dtype=np.float32).reshape(-1)
    finite = [abs(float(v)) for v in vals.tolist() if math.isfinite(v)]
    amax = np.float32(max(finite, default=0.0))  # exact: a float32 magnitude
    bound = _check_pts_bound(pts_bound)
    pts = f32_div(amax, f32_mul(bound, _SIX))
    if pts == 0 or not math.isfinite(pts):
        return _ONE
    return pts


def _check_pts_bound(pts_bound) -> np.float32:
    bound = np.float32(pts_bound)
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"pts_bound must be a positive finite number, got {pts_bound!r}")
    return bound


def _resolve_pts(x32: np.ndarray, per_tensor_scale, pts_bound) -> np.float32 | None:
    if per_tensor_scale is None:
        return None
    if isinstance(per_tensor_scale, str):
        if per_tensor_scale in ("amax", PER_TENSOR_DEFAULT):
            return nvfp4_per_tensor_scale_ref(x32, pts_bound)
        raise ValueError(f"per_tensor_scale must be 'amax', a positive float or None, got {per_tensor_scale!r}")
    with np.errstate(over="ignore"):
        pts = np.float32(per_tensor_scale)
    if not (math.isfinite(pts) and pts > 0):
        raise ValueError(f"per_tensor_scale must be positive and finite in float32, got {per_tensor_scale!r}")
    return pts


def nvfp4_scale_byte_ref(amax, pts=None, divisor=6) -> int:
    """The float8_e4m3fn scale byte for a block with largest magnitude ``amax`` (finite, >= 0).

    t = f32(amax / divisor); two level: t = f32(t / pts); t = clamp(t, 2^-6, 448); the byte is
    t rounded to nearest even in float8_e4m3fn. ``divisor`` is 6 (the default rule, "map to 6")
    or 4 ("map to 4" of four over six).
    """
    a = np.float32(amax)
    if not (math.isfinite(a) and a >= 0):
        raise ValueError("amax must be finite and non-negative (NaN/inf blocks have byte 0x7f)")
    t = f32_div(a, np.float32(divisor))
    if pts is not None:
        t = f32_div(t, pts)
    if t < E4M3_MIN_NORMAL:
        t = E4M3_MIN_NORMAL
    if t > E4M3_MAX:
        t = E4M3_MAX
    return int(encode_ref(np.array([t], dtype=np.float32), "float8_e4m3fn")[0])


def _e4m3_value(byte: int) -> np.float32:
    with np.errstate(invalid="ignore"):
        return decode_ref(np.array([byte], dtype=np.uint8), "float8_e4m3fn")[0]


def _nvfp4_codes(vals: list, draws: list | None, byte: int, pts, rounding: str) -> list[int]:
    """E2M1 codes of a block's float32 values quantised with scale byte ``byte``."""
    s = _e4m3_value(byte)
    r = f32_div(_ONE, s) if pts is None else f32_div(f32_div(_ONE, pts), s)
    scaled = []
    for x in vals:
        if x == 0:
            v = x  # a zero keeps its sign, even where r is inf (0 * inf would be NaN)
        else:
            v = f32_mul(x, r)
            if v > E2M1_MAX:
                v = E2M1_MAX
            elif v < -E2M1_MAX:
                v = -E2M1_MAX
        scaled.append(v)
    rand = None if draws is None else np.array(draws, dtype=np.uint32)
    codes = encode_ref(np.array(scaled, dtype=np.float32), "float4_e2m1fn", rounding, saturate=True, rand=rand)
    return [int(c) for c in codes.tolist()]


def _nvfp4_multiplier(byte: int, pts) -> np.float32:
    """f32(s) single level, f32(pts * f32(s)) two level."""
    s = _e4m3_value(byte)
    return s if pts is None else f32_mul(pts, s)


def _nvfp4_dequant(codes: list[int], byte: int, pts) -> list[np.float32]:
    m = _nvfp4_multiplier(byte, pts)
    p = decode_ref(np.array(codes, dtype=np.uint8), "float4_e2m1fn").tolist()
    return [f32_mul(v, m) for v in p]


def _nvfp4_tile(vals, draws, pts, rounding, policy, scale_search) -> tuple[int, list[int]]:
    """(scale byte, codes) of one NVFP4 block or tile."""
    amax = block_amax_ref(np.array(vals, dtype=np.float32))
    if not math.isfinite(amax):
        return E4M3_NAN_BYTE, [0] * len(vals)
    byte = nvfp4_scale_byte_ref(amax, pts, 6)
    codes = _nvfp4_codes(vals, draws, byte, pts, rounding)
    if policy is not None:
        metric = policy[1]
        err = block_error_ref(vals, _nvfp4_dequant(codes, byte, pts), metric)
        byte4 = nvfp4_scale_byte_ref(amax, pts, 4)
        codes4 = _nvfp4_codes(vals, draws, byte4, pts, rounding)
        if block_error_ref(vals, _nvfp4_dequant(codes4, byte4, pts), metric) < err:
            return byte4, codes4
    elif scale_search == "mse" and amax > 0:
        best = (block_error_ref(vals, _nvfp4_dequant(codes, byte, pts), "mse"), byte, codes)
        for cand in (byte - 2, byte - 1, byte + 1, byte + 2):
            if not E4M3_MIN_POSITIVE_CODE <= cand <= E4M3_MAX_CODE:
                continue  # not a finite positive scale: skipped
            cand_codes = _nvfp4_codes(vals, draws, cand, pts, rounding)
            err = block_error_ref(vals, _nvfp4_dequant(cand_codes, cand, pts), "mse")
            if err < best[0]:
                best = (err, cand, cand_codes)
        return best[1], best[2]
    return byte, codes


# ---- MX tiles ---------------------------------------------------------------------------------


def _mx_codes(vals: list, e: int, fmt: str, rounding: str, draws: list | None) -> list[int]:
    """Element codes of a block's float32 values for MX format ``fmt`` and shared exponent e:
    x * 2^-e (exact in float64) rounded once, saturating; mxint8: round(x * 2^(6 - e)) clamped to
    [-127, 127] as two's complement, no signed zero."""
    elem = MX_FORMATS_REF[fmt][0]
    if elem == "int8":
        out = []
        for k, x in enumerate(vals):
            v = math.ldexp(float(x), INT8_SCALE_BITS - e)
            c = min(round_int8_magnitude(abs(v), rounding, draws[k] if draws else 0), INT8_MAX_CODE)
            out.append((-c if v < 0 else c) & 0xFF)
        return out
    scaled = np.array([math.ldexp(float(x), -e) for x in vals], dtype=np.float64)  # exact; -0.0 stays
    rand = None if draws is None else np.array(draws, dtype=np.uint32)
    codes = encode_float64_ref(scaled, elem, rounding, saturate=True, rand=rand)
    return [int(c) for c in codes.tolist()]


def _mx_element_values(codes: list[int], fmt: str) -> list[float]:
    elem = MX_FORMATS_REF[fmt][0]
    if elem == "int8":
        return [math.ldexp(c - 256 if c >= 128 else c, -INT8_SCALE_BITS) for c in codes]
    with np.errstate(invalid="ignore"):
        return decode_ref(np.array(codes, dtype=np.uint8), elem).astype(np.float64).tolist()


def _mx_dequant(codes: list[int], byte: int, fmt: str) -> list[np.float32]:
    """X * P formed exactly in float64 and rounded to float32; byte 0xff gives NaN."""
    with np.errstate(over="ignore"):
        if byte == E8M0_NAN:
            return [np.float32(math.nan)] * len(codes)
        return [np.float32(math.ldexp(p, byte - E8M0_BIAS)) for p in _mx_element_values(codes, fmt)]


def _mx_nan_code(fmt: str) -> int:
    elem = MX_FORMATS_REF[fmt][0]
    if elem == "int8" or FORMATS_REF[elem].nan == "none":
        return 0
    return int(FORMATS_REF[elem].nan_codes[0])


def _mx_tile(vals, draws, fmt, scale_mode, rounding, scale_search) -> tuple[int, list[int]]:
    """(e8m0 byte, codes) of one MX block or tile."""
    e = shared_exponent_ref(np.array(vals, dtype=np.float32), fmt, scale_mode)
    if e == "nan":
        return E8M0_NAN, [_mx_nan_code(fmt)] * len(vals)
    if e == "zero":
        return 0, _mx_codes(vals, -127, fmt, rounding, draws)  # signed zeros
    codes = _mx_codes(vals, e, fmt, rounding, draws)
    if scale_search == "mse" and e + 1 <= 127:  # e + 1 = 128 would be byte 0xff (NaN): skipped
        err = block_error_ref(vals, _mx_dequant(codes, e + E8M0_BIAS, fmt), "mse")
        codes1 = _mx_codes(vals, e + 1, fmt, rounding, draws)
        if block_error_ref(vals, _mx_dequant(codes1, e + 1 + E8M0_BIAS, fmt), "mse") < err:
            return e + 1 + E8M0_BIAS, codes1
    return e + E8M0_BIAS, codes


# ---- the quantisers ---------------------------------------------------------------------------


def _check_kind(kind: str) -> None:
    if kind != NVFP4 and kind not in MX_FORMATS_REF:
        raise ValueError(f"unknown kind {kind!r}; expected {NVFP4!r} or one of {tuple(MX_FORMATS_REF)}")


def quantize_2d_ref(
    x,
    kind: str,
    block_shape,
    *,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    rand=None,
    per_tensor_scale=PER_TENSOR_DEFAULT,
    pts_bound=448,
    policy=None,
    scale_search=None,
) -> BlockQuantRef:
    """Quantise a 2-D array with one scale per ``block_shape = (r, c)`` tile.

    Parameters
    ----------
    x:
        2-D values (converted to float32 first).
    kind:
        "nvfp4" (E2M1 elements, float8_e4m3fn scales, optional per-tensor scale) or an MX format
        name of ``reference_mx.MX_FORMATS_REF`` (e8m0 scales).
    block_shape:
        (r, c): rows x columns of a tile; (1, c) is 1-D blocks along the last axis. Edge tiles
        may be partial.
    scale_mode:
        MX only: one of ``reference_mx.SCALE_MODES`` (amax over the tile). NVFP4 needs "floor"
        (the default; NVFP4 has a single rule).
    rounding:
        One of ``ROUNDING_MODES`` for the elements.
    rand:
        uint32 of x's shape, for "stochastic" only; element (i, j) uses rand[i, j].
    per_tensor_scale:
        NVFP4: "default" or "amax" (computed, see ``nvfp4_per_tensor_scale_ref``), a positive
        float (used as is), or None (single level). MX: "default" or None (MX has none).
    pts_bound:
        NVFP4 with a computed pts: 448 (default) or 256 (room for four over six).
    policy:
        NVFP4 only: None or ("four_over_six", "mae" | "mse").
    scale_search:
        None or "mse" (NVFP4: codes c0-2..c0+2; MX: e and e+1).

    Returns
    -------
    BlockQuantRef
        codes (uint8, x's shape), scales (uint8, (ceil(R/r), ceil(C/c))), pts.
    """
    _check_kind(kind)
    x32 = _as_float32_2d(x)
    bs = _check_block_shape(block_shape)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDING_MODES}")
    if scale_search is not None and scale_search not in SCALE_SEARCHES:
        raise ValueError(f"unknown scale_search {scale_search!r}; expected None or one of {SCALE_SEARCHES}")
    if policy is not None:
        if kind != NVFP4:
            raise ValueError("policy applies to nvfp4 only")
        if not (isinstance(policy, tuple) and len(policy) == 2 and policy[0] in POLICIES):
            raise ValueError(f"policy must be None or ('four_over_six', metric), got {policy!r}")
        if policy[1] not in ERROR_METRICS:
            raise ValueError(f"unknown policy metric {policy[1]!r}; expected one of {ERROR_METRICS}")
        if scale_search is not None:
            raise ValueError("policy and scale_search cannot be combined")
    if kind == NVFP4:
        if scale_mode != "floor":
            raise ValueError("scale_mode applies to MX formats only")
        _check_pts_bound(pts_bound)
        pts = _resolve_pts(x32, per_tensor_scale, pts_bound)
    else:
        if scale_mode not in SCALE_MODES:
            raise ValueError(f"unknown scale_mode {scale_mode!r}; expected one of {SCALE_MODES}")
        if per_tensor_scale not in (None, PER_TENSOR_DEFAULT):
            raise ValueError("MX formats have no per-tensor scale")
        pts = None
    draws_all = _check_rand(rand, x32.shape, rounding)

    codes = np.zeros(x32.shape, dtype=np.uint8)
    scales = np.zeros((-(-x32.shape[0] // bs[0]), -(-x32.shape[1] // bs[1])), dtype=np.uint8)
    for bi, bj, pos in _tiles(x32.shape, bs):
        vals = [x32[p] for p in pos]  # np.float32 scalars, C order within the tile
        draws = None if draws_all is None else [int(draws_all[p]) for p in pos]
        if kind == NVFP4:
            byte, tile_codes = _nvfp4_tile(vals, draws, pts, rounding, policy, scale_search)
        else:
            byte, tile_codes = _mx_tile(vals, draws, kind, scale_mode, rounding, scale_search)
        scales[bi, bj] = byte
        for p, c in zip(pos, tile_codes):
            codes[p] = c
    return BlockQuantRef(codes, scales, pts)


def dequantize_2d_ref(codes, scales, kind: str, block_shape, pts=None) -> np.ndarray:
    """Dequantise the codes of ``quantize_2d_ref`` (float32, the codes' shape).

    NVFP4: decode(code) * f32(s) single level (``pts=None``); two level ``m = f32(pts * f32(s))``
    first, then decode(code) * m, rounded to float32. Scale byte 0x7f (NaN) makes its block NaN.
    MX: X * P formed exactly and rounded to float32 (as ``reference_mx.dequantize_mx_ref``);
    byte 0xff makes its block NaN.
    """
    _check_kind(kind)
    codes = np.asarray(codes)
    scales = np.asarray(scales)
    if codes.ndim != 2 or codes.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError("codes must be 2-D uint8 and scales uint8")
    bs = _check_block_shape(block_shape)
    want = (-(-codes.shape[0] // bs[0]), -(-codes.shape[1] // bs[1]))
    if scales.shape != want:
        raise ValueError(f"expected scales of shape {want}, got {scales.shape}")
    if kind != NVFP4 and pts is not None:
        raise ValueError("MX formats have no per-tensor scale")
    if pts is not None:
        pts = np.float32(pts)
    out = np.zeros(codes.shape, dtype=np.float32)
    for bi, bj, pos in _tiles(codes.shape, bs):
        tile_codes = [int(codes[p]) for p in pos]
        byte = int(scales[bi, bj])
        if kind == NVFP4:
            values = _nvfp4_dequant(tile_codes, byte, pts)
        else:
            values = _mx_dequant(tile_codes, byte, kind)
        for p, v in zip(pos, values):
            out[p] = v
    return out


def nvfp4_quantize_ref(
    x,
    block_size: int = NVFP4_BLOCK_SIZE,
    per_tensor_scale="amax",
    rounding: str = "nearest_even",
    rand=None,
    policy=None,
    pts_bound=448,
    scale_search=None,
) -> BlockQuantRef:
    """NVFP4 with 1-D blocks of ``block_size`` along the last axis of a 2-D array (a partial last
    block allowed): ``quantize_2d_ref(x, "nvfp4", (1, block_size), ...)``.

    Returns codes (uint8, x's shape, E2M1 codes with bit 3 the sign), scales (uint8 float8_e4m3fn
    codes, shape (R, ceil(C / block_size))) and the pts used (np.float32, or None when
    ``per_tensor_scale=None``). See the module docstring for every step.
    """
    if not isinstance(block_size, (int, np.integer)) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return quantize_2d_ref(
        x,
        NVFP4,
        (1, int(block_size)),
        rounding=rounding,
        rand=rand,
        per_tensor_scale=per_tensor_scale,
        pts_bound=pts_bound,
        policy=policy,
        scale_search=scale_search,
    )


def nvfp4_dequantize_ref(codes, scales, pts, block_size: int = NVFP4_BLOCK_SIZE) -> np.ndarray:
    """Dequantise ``nvfp4_quantize_ref``'s codes: decode(code) * f32(s), or with ``pts`` (two
    level) decode(code) * f32(pts * f32(s)), that product formed first. float32, the codes' shape."""
    return dequantize_2d_ref(codes, scales, NVFP4, (1, block_size), pts)


# ---- Neuron quantize_mx -----------------------------------------------------------------------


def pack_x4_ref(codes) -> np.ndarray:
    """Pack 8-bit codes four per uint32 along the last axis: element 4j + i is byte i (bits
    8i..8i+7) of container j, element 0 the least significant. The last axis must be a multiple
    of 4 (float8_e4m3fn_x4 / float8_e5m2_x4)."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8 or codes.ndim < 1 or codes.shape[-1] % 4:
        raise ValueError("codes must be uint8 with a last axis that is a multiple of 4")
    out = np.zeros(codes.shape[:-1] + (codes.shape[-1] // 4,), dtype=np.uint32)
    for idx in np.ndindex(*out.shape):
        word = 0
        for i in range(4):
            word |= int(codes[idx[:-1] + (4 * idx[-1] + i,)]) << (8 * i)
        out[idx] = word
    return out


def unpack_x4_ref(packed) -> np.ndarray:
    """Inverse of ``pack_x4_ref``: uint8 codes, the last axis four times longer."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint32 or packed.ndim < 1:
        raise ValueError("packed must be uint32")
    out = np.zeros(packed.shape[:-1] + (packed.shape[-1] * 4,), dtype=np.uint8)
    for idx in np.ndindex(*packed.shape):
        word = int(packed[idx])
        for i in range(4):
            out[idx[:-1] + (4 * idx[-1] + i,)] = (word >> (8 * i)) & 0xFF
    return out


def neuron_quantize_mx_ref(x, fmt: str = "mxfp8_e4m3") -> tuple[np.ndarray, np.ndarray]:
    """Emulate ``nki.isa.quantize_mx`` on a [P, F] tile (see the module docstring).

    Groups of 8 partitions x 4 free-axis elements, the "neuron" scale mode, elements rounded to
    nearest even and saturated, the special blocks of docs/blocks.md. ``x`` holds the tile's values (the
    instruction reads float16/bfloat16; pass such values). P must be a multiple of 8 (the
    hardware wants a multiple of 32 up to 128) and F a multiple of 4.

    Returns
    -------
    (packed, scales)
        packed: uint32 [P, F/4], ``pack_x4_ref`` of the codes; scales: uint8 e8m0 bytes
        [P/8, F/4] (the logical layout; ``neuron_scale_tile_ref`` gives the SBUF one).
    """
    if fmt not in NEURON_MX_FORMATS:
        raise ValueError(f"quantize_mx outputs {NEURON_MX_FORMATS} only, got {fmt!r}")
    x32 = _as_float32_2d(x)
    if x32.shape[0] % 8 or x32.shape[1] % 4:
        raise ValueError(f"the tile must be [P, F] with P a multiple of 8 and F of 4, got {x32.shape}")
    q = quantize_2d_ref(x32, fmt, NEURON_MX_BLOCK, scale_mode="neuron")
    return pack_x4_ref(q.codes), q.scales


def neuron_scale_tile_ref(scales, partitions: int, offset: int = 0) -> np.ndarray:
    """Place logical scales [P/8, F/4] on a [P, F/4] tile the way the instruction writes them:
    row a on partition 32 * (a // 4) + a % 4 + offset (the first four partitions of its 32-partition
    quadrant, moved by ``offset`` in {0, 4, 8, 12}); the other partitions are 0."""
    scales = np.asarray(scales)
    if scales.dtype != np.uint8 or scales.ndim != 2:
        raise ValueError("scales must be 2-D uint8")
    if offset not in (0, 4, 8, 12):
        raise ValueError(f"offset must be 0, 4, 8 or 12, got {offset!r}")
    if partitions % 8 or scales.shape[0] != partitions // 8:
        raise ValueError(f"expected {partitions // 8} scale rows for {partitions} partitions, got {scales.shape[0]}")
    out = np.zeros((partitions, scales.shape[1]), dtype=np.uint8)
    for a in range(scales.shape[0]):
        p = 32 * (a // 4) + a % 4 + offset
        if p >= partitions:
            raise ValueError(f"scale row {a} would land on partition {p} of {partitions}")
        out[p] = scales[a]
    return out


# ---- random Hadamard rotation -----------------------------------------------------------------


def hadamard16_ref() -> np.ndarray:
    """The 16 x 16 Sylvester Hadamard matrix (int8): H[i, j] = (-1)^popcount(i & j), i.e.
    H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]."""
    h = np.zeros((16, 16), dtype=np.int8)
    for i in range(16):
        for j in range(16):
            h[i, j] = -1 if bin(i & j).count("1") % 2 else 1
    return h


def _check_signs(signs) -> list[float]:
    if signs is None:
        signs = RHT_DEFAULT_SIGNS
    s = np.asarray(signs)
    if s.shape != (RHT_GROUP,) or not np.all((s == 1) | (s == -1)):
        raise ValueError("signs must be 16 values, each +1 or -1")
    return [float(v) for v in s.tolist()]


def _butterfly(v: list[float]) -> list[float]:
    """The in-place fast Walsh-Hadamard transform in float64 (Python floats), stages h = 1, 2, 4, 8,
    pairs (j, j + h) with j & h == 0 in increasing j. Equals v @ H16 when every step is exact."""
    v = list(v)
    h = 1
    while h < RHT_GROUP:
        for j in range(RHT_GROUP):
            if j & h == 0:
                a, b = v[j], v[j + h]
                v[j], v[j + h] = a + b, a - b
        h *= 2
    return v


def _rotate(x, signs, axis: int, inverse: bool) -> np.ndarray:
    s = _check_signs(signs)
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = np.asarray(x, dtype=np.float32)
    if x32.ndim == 0:
        raise ValueError("x must have at least one axis")
    moved = np.moveaxis(x32, axis, -1)
    n = moved.shape[-1]
    if n % RHT_GROUP:
        raise ValueError(f"the rotated axis must be a multiple of {RHT_GROUP}, got {n}")
    out = np.zeros(moved.shape, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for idx in np.ndindex(*moved.shape[:-1]):
            row = moved[idx].astype(np.float64).tolist()
            for g in range(0, n, RHT_GROUP):
                group = row[g : g + RHT_GROUP]
                if inverse:
                    v = [t * 0.25 * s[i] for i, t in enumerate(_butterfly(group))]
                else:
                    v = [t * 0.25 for t in _butterfly([group[i] * s[i] for i in range(RHT_GROUP)])]
                out[idx + (slice(g, g + RHT_GROUP),)] = np.array(v, dtype=np.float64).astype(np.float32)
    return np.moveaxis(out, -1, axis)


def rht_ref(x, signs=None, axis: int = -1) -> np.ndarray:
    """The random Hadamard rotation y = (x * signs) @ H16 / 4 of every 16-element group along
    ``axis`` (float32 out, x's shape). float64 butterfly, one rounding to float32: see the module
    docstring for the exact order of operations."""
    return _rotate(x, signs, axis, inverse=False)


def rht_inverse_ref(y, signs=None, axis: int = -1) -> np.ndarray:
    """The inverse rotation x = (y @ H16 / 4) * signs, evaluated like ``rht_ref``."""
    return _rotate(y, signs, axis, inverse=True)
