"""Numba kernels of the block-scaled formats (MX, NVFP4): quantise, dequantise, fake-quantise.

Geometry. *Row* kernels take (A, L) arrays with blocks of ``size`` consecutive elements along L,
the last axis (the fast path). *Tile* kernels take (A, R, C) arrays with tiles of ``rows x cols``
over (R, C): a 1-D block along an axis that is not the last is a tile ``(size, 1)`` of the array
seen as (outer, L, inner); a 2-D block is a tile over the last two axes. A *task* is one (row,
block) pair of a row kernel, or one row of tiles of a tile kernel; a kernel runs the tasks
``[t0, t1)``, so that threads share an array without sharing a block.

Scales come from the block's amax read as a float32 bit pattern (the integer max of |x|
patterns; NaN patterns are the largest), never from a floating-point log2; a float32 block of 16,
32 or 64 is reduced as one vector. The scale rule (``modes.SCALE_MODES``) and the scale policy
(plain, four-over-six, MSE search) are run-time arguments; the element format, the source, the
rounding mode and the layout are compiled in.

Flags. A helper that branches on the format (e8m0 or e4m3fn scales, the rounding mode,
fixed-point elements, the source kind) takes the decision as an argument of its own
(:func:`_flags`). A kernel passes constants of its closure, so numba drops the branches not
taken before typing them and compiles only the kernel's own path (it cannot see through a field
of a tuple constant); the shared scale loops pass the run-time fields and serve every format.

Elements. MX (e8m0 scales): an element is ``x * (1 / X)``, a product by a power of two, exact
where it matters (see :func:`_nearest_even`). NVFP4 (e4m3fn scales ``s``): ``x * (1 / s)``
single-level, ``x * ((1 / pts) / s)`` two-level, each operation rounded to float32, as torchao's
``nvfp4_quantize`` computes it (torchao 0.18 and later; earlier releases divided). The result is
encoded with saturation, under ``nearest_even`` by float arithmetic of its own, in the other
modes by the cast codec's generic encoder. Dequantised values are ``P * X`` (exact) and ``P * s``
or ``P * float32(pts * s)``.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from .._jit import f32_bits, f32_from_bits, jit, u32_add, u32_amax_abs, u32_and, u32_or, u32_shl, u32_shr, u32_sub
from ..formats import FORMATS, BlockFormat
from ..modes import FOUR_OVER_SIX, SCALE_MODES, SCALE_SEARCHES
from . import codec as C
from .codec import NEAREST_EVEN, SOURCE_BF16, SOURCE_F32  # bare names: numba prunes branches on them

__all__ = [
    "Source",
    "source_of",
    "scale_mode_id",
    "policy_id",
    "quantize_kernel",
    "fake_quantize_kernel",
    "dequantize_kernel",
    "finite_amax_kernel",
    "error_sums",
]

#: Scale-mode ids, bound by name: an id is the mode's index in ``modes.SCALE_MODES``.
FLOOR, CEIL, EVEN, RCEIL, NEURON, NEAREST = (
    SCALE_MODES.index(m) for m in ("floor", "ceil", "even", "rceil", "neuron", "nearest")
)

#: Scale policies, as the kernels number them: the plain rule, four-over-six by each error
#: measure of ``modes.FOUR_OVER_SIX``, then each search of ``modes.SCALE_SEARCHES``.
POLICIES: tuple[tuple[str, str] | None, ...] = (
    None,
    *(("four_over_six", m) for m in FOUR_OVER_SIX),
    *(("scale_search", m) for m in SCALE_SEARCHES),
)
PLAIN, FOUR_SIX_MAE, FOUR_SIX_MSE, SEARCH_MSE = (
    POLICIES.index(p) for p in (None, ("four_over_six", "mae"), ("four_over_six", "mse"), ("scale_search", "mse"))
)

#: Where a tile kernel stores two 4-bit codes per byte: not at all, along R or along C.
PACK_NONE, PACK_ROWS, PACK_COLS = 0, 1, 2


def scale_mode_id(scale_mode: str) -> int:
    return SCALE_MODES.index(scale_mode)


def policy_id(four_over_six: str | None, scale_search: str | None) -> int:
    """The kernels' id of a scale policy (at most one of the two is set)."""
    if four_over_six is not None:
        return POLICIES.index(("four_over_six", four_over_six))
    if scale_search is not None:
        return POLICIES.index(("scale_search", scale_search))
    return PLAIN


class Source(NamedTuple):
    """How a kernel reads its input: the codec's source kind and codec, and whether blocks of 16,
    32 or 64 are reduced as one vector (float32 patterns, and float16/bfloat16 codes, whose
    magnitudes order as their values do: the largest code is decoded once)."""

    kind: int
    codec: C.Codec
    vector: bool


def source_of(dtype_name: str) -> Source:
    """The :class:`Source` of an input dtype (float32, float64, or 16-bit float codes)."""
    if dtype_name == "float32":
        return Source(C.SOURCE_F32, C.NO_CODEC, True)
    if dtype_name == "float64":
        return Source(C.SOURCE_F64_NEAREST, C.NO_CODEC, False)
    fmt = FORMATS[dtype_name]
    return Source(C.source_of_codes(fmt), C.codec_of(fmt), fmt.itemsize == 2)


def input_view(x: np.ndarray) -> np.ndarray:
    """The array as the kernels read it: float32 patterns, 16-bit float codes, or float64."""
    if x.dtype == np.float64:
        return x
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


class Element(NamedTuple):
    """The element format, as the kernels need it.

    ``top``: the largest element; ``min_normal`` the smallest normal, ``magic`` a float whose ulp is
    the smallest subnormal, ``rebias`` ``(127 - B) << M`` (mod 2^32): the constants of
    :func:`_nearest_even`. ``nan_code``: the code of every element of a NaN block.
    """

    codec: C.Codec
    mode: int
    top: np.float32
    min_normal: np.float32
    magic: np.float32
    rebias: int
    nan_code: int


class Scale(NamedTuple):
    """The scale format, as the kernels need it.

    ``e8m0``: power-of-two scales (MX) rather than float8_e4m3fn ones (NVFP4). ``emax``, ``mbits``
    and ``rcp`` (float32(1 / max element)) serve the e8m0 rules; ``max_element`` and ``four``
    (2^emax: the map-to-4 divisor of four-over-six) the e4m3fn ones, with the scale's codec, its
    smallest normal (the lower clamp) and largest value, and ``nan_byte``, the scale of a block
    holding a NaN or an infinity. ``policies``: whether the kernel evaluates scale policies at all
    (their code, even untaken, costs the plain kernels a quarter more instructions per element).
    """

    e8m0: bool
    emax: int
    mbits: int
    rcp: np.float32
    max_element: np.float32
    four: np.float32
    codec: C.Codec
    lowest: np.float32
    highest: np.float32
    nan_byte: int
    policies: bool


def _element_of(bf: BlockFormat, rounding: str) -> Element:
    c = C.codec_of(bf.element_format)
    return Element(
        codec=c,
        mode=C.mode_id(rounding),
        top=np.float32(bf.max_element),
        min_normal=np.float32(2.0 ** (1 - c.bias)),
        magic=np.float32(2.0 ** (1 - c.bias - c.mbits + 23)),
        rebias=((127 - c.bias) << c.mbits) & 0xFFFFFFFF,
        nan_code=bf.nan_element_code,
    )


def _scale_of(bf: BlockFormat, policies: bool = False) -> Scale:
    sf = bf.scale_format
    return Scale(
        e8m0=bf.is_mx,
        emax=bf.emax_elem,
        mbits=bf.mbits,
        rcp=np.float32(1.0 / bf.max_element),
        max_element=np.float32(bf.max_element),
        four=np.float32(2.0**bf.emax_elem),
        codec=C.codec_of(sf),
        lowest=np.float32(sf.smallest_normal),
        highest=np.float32(sf.max),
        nan_byte=sf.nan_code or 0,
        policies=policies,
    )


# ---- scales ----------------------------------------------------------------------------------


@jit
def _bit_length(v):  # pragma: no cover - compiled
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


@jit
def _e8m0_byte(amax, mode, sc):  # pragma: no cover - compiled
    """The e8m0 byte of a block from its finite, non-zero amax bit pattern, by ``mode`` (the
    formulas of ``modes.SCALE_MODES``), the exponent clamped to [-127, 127]."""
    e_bits = np.int64(amax >> 23)
    frac = np.int64(amax & 0x7FFFFF)
    if e_bits > 0:
        fl = e_bits - 127
        sig = frac | 0x800000
    else:
        nbits = _bit_length(frac)
        fl = nbits - 150
        sig = frac << (24 - nbits)
    if mode == CEIL:
        e = fl + (1 if sig != 0x800000 else 0) - sc.emax
    elif mode == EVEN:
        e = fl + ((sig + (1 << (22 - sc.mbits))) >> 24) - sc.emax
    elif mode == NEURON:
        e = fl - (sc.emax - 1)
    elif mode == RCEIL:
        d = f32_bits(f32_from_bits(np.uint32(amax)) * sc.rcp)
        d_exp = np.int64(d >> 23)
        d_mant = np.int64(d & 0x7FFFFF)
        if d_exp == 0:
            u = 0 if d_mant <= 0x400000 else 1
        else:
            u = d_exp + (1 if d_mant != 0 else 0)
        e = min(u, 0xFE) - 127
    else:  # FLOOR
        e = fl - sc.emax
    return max(-127, min(127, e)) + 127


@jit(inline="always")
def _e4m3_byte(amax, divisor, pts, sc):  # pragma: no cover - compiled
    """The float8_e4m3fn scale of a block: ``amax / divisor`` (then ``/ pts`` when ``pts != 0``),
    in float32, clamped to [2^-6, 448] and rounded to the nearest e4m3fn code. The clamp keeps it
    in the scale format's normal range, so rounding the float32 mantissa to the scale's width
    (ties to even, a carry moving into the exponent) and rebiasing is the encoding."""
    t = f32_from_bits(np.uint32(amax)) / divisor
    if pts != 0:
        t = t / pts
    b = f32_bits(min(max(t, sc.lowest), sc.highest))
    m = sc.codec.mbits
    rounded = u32_add(u32_add(b, (1 << (22 - m)) - 1), u32_and(u32_shr(b, 23 - m), 1))
    return u32_sub(u32_shr(rounded, 23 - m), ((127 - sc.codec.bias) << m) & 0xFFFFFFFF)


@jit(inline="always")
def _scale_byte(amax, mode, pts, sc, e8m0):  # pragma: no cover - compiled
    """The scale byte of a block by the plain rule (NaN byte for a NaN/inf block; e8m0: 0 for
    an all-zero block, e4m3fn: the lower clamp 2^-6). ``e8m0``: ``sc.e8m0`` (see the module's flags)."""
    if amax >= 0x7F800000:
        return np.uint32(sc.nan_byte)
    if e8m0:
        return np.uint32(0) if amax == 0 else np.uint32(_e8m0_byte(amax, mode, sc))
    return np.uint32(_e4m3_byte(amax, sc.max_element, pts, sc))


@jit(inline="always")
def _multiplier(byte, pts, sc, e8m0):  # pragma: no cover - compiled
    """(What an element is multiplied by before encoding, the scale of the dequantised values),
    in float32: MX, (1 / X, X) = (2^(127 - byte), 2^(byte - 127)); NVFP4, (1 / s, s) single-level
    and ((1 / pts) / s, pts * s) two-level, torchao's order of operations. NaN for a NaN block."""
    if e8m0:
        inv = f32_from_bits(u32_shl(u32_sub(254, byte), 23) if byte < np.uint32(254) else np.uint32(0x400000))
        x = f32_from_bits(u32_shl(byte, 23) if byte != 0 else u32_or(byte, 0x400000))
        x = np.float32(np.nan) if byte == np.uint32(0xFF) else x
        return inv, x
    s = f32_from_bits(C.decode(byte, sc.codec))
    one = np.float32(1.0)
    if pts != 0:
        return (one / pts) / s, pts * s
    return one / s, s


@jit(inline="always")
def _scaled(u, mul, e8m0):  # pragma: no cover - compiled
    """The element value before encoding, ``x * mul``. NVFP4's multiplier overflows to inf for a
    tensor of tiny amax: a zero element stays a signed zero (not 0 * inf = NaN)."""
    x = f32_from_bits(u)
    v = x * mul
    if e8m0:
        return v
    return v if x != 0 else x


@jit(inline="always")
def _nearest_even(v, el, fixed):  # pragma: no cover - compiled
    """The saturating round-to-nearest-even code of the finite float32 ``v``, in float arithmetic.

    |v| is clamped to the largest element first (the same as saturating after rounding, as the
    largest element is a representable value). Below the smallest normal, adding a float whose
    ulp is the element's smallest subnormal rounds |v| to a multiple of it (the hardware adder
    rounds to nearest even), and the pattern difference is the code; above it, the float32
    pattern's mantissa is rounded to ``mbits`` bits in integer arithmetic and rebiased. The sign
    is a sign bit, or two's complement for fixed-point elements. For MX, ``v = x * 2^k`` is exact
    whenever it is a normal float32, and otherwise below 2^-126, so far below half the element's
    smallest subnormal (at least 2^-16 of X) that every mode gives the signed zero from it too.
    """
    c = el.codec
    a = min(abs(v), el.top)
    ab = f32_bits(a)
    sub = u32_sub(f32_bits(a + el.magic), f32_bits(el.magic))
    negative = f32_bits(v) >= np.uint32(0x80000000)
    if fixed:  # one quantum over the whole range: the adder trick is the code
        return u32_and(u32_sub(0, sub), (1 << c.bits) - 1) if negative else sub
    rounded = u32_add(u32_add(ab, (1 << (22 - c.mbits)) - 1), u32_and(u32_shr(ab, 23 - c.mbits), 1))
    normal = u32_sub(u32_shr(rounded, 23 - c.mbits), el.rebias)
    code = sub if a < el.min_normal else normal
    return u32_or(code, u32_and(u32_shr(f32_bits(v), 32 - c.bits), 1 << (c.bits - 1)))


@jit(inline="always")
def _code(v, rnd, el, rmode, fixed):  # pragma: no cover - compiled
    """The saturating code of the finite float32 ``v`` under the element's rounding mode ``rmode``."""
    if rmode == NEAREST_EVEN:
        return _nearest_even(v, el, fixed)
    return C.encode(f32_bits(v), rnd, np.uint32(0), el.codec, el.mode, True)


@jit(inline="always")
def _value(code, scale, el):  # pragma: no cover - compiled
    """The dequantised value P * scale; the positive quiet NaN for a NaN block (``scale`` is NaN),
    whatever the code."""
    v = f32_from_bits(C.decode(code, el.codec)) * scale
    return v if scale == scale else np.float32(np.nan)


@jit(inline="always")
def _nearest_value(v, el, fixed):  # pragma: no cover - compiled
    """The float32 value of the code :func:`_nearest_even` gives ``v``, without the code: the same
    roundings, left in float32 (the adder trick's sum below the smallest normal, the rounded
    pattern's kept bits above it), with the sign of ``v`` (negated for fixed-point elements,
    whose zero is unsigned). Fake quantisation and error sums need no code."""
    c = el.codec
    a = min(abs(v), el.top)
    sub = (a + el.magic) - el.magic
    if fixed:
        return np.float32(0.0) - sub if v < 0 else sub  # not -0.0: the code of zero is 0
    ab = f32_bits(a)
    rounded = u32_add(u32_add(ab, (1 << (22 - c.mbits)) - 1), u32_and(u32_shr(ab, 23 - c.mbits), 1))
    normal = f32_from_bits(u32_and(rounded, u32_sub(0, 1 << (23 - c.mbits))))
    mag = sub if a < el.min_normal else normal
    return f32_from_bits(u32_or(f32_bits(mag), u32_and(f32_bits(v), 0x80000000)))


@jit(inline="always")
def _dequantized(v, rnd, scale, el, rmode, fixed):  # pragma: no cover - compiled
    """``_value(_code(v, rnd, el, rmode, fixed), scale, el)``: the value the finite scaled element
    ``v`` comes back as (NaN for a NaN block)."""
    if rmode == NEAREST_EVEN:
        d = _nearest_value(v, el, fixed) * scale
        return d if scale == scale else np.float32(np.nan)
    return _value(_code(v, rnd, el, rmode, fixed), scale, el)


@jit(inline="always")
def _stream(key):  # pragma: no cover - compiled
    return np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)


@jit(inline="always")
def _load(x, kind, codec):  # pragma: no cover - compiled
    """:func:`~.codec.load`, with float32 patterns and bfloat16 codes read in place: a kernel of
    either source compiles no loader."""
    if kind == SOURCE_F32:
        return x
    if kind == SOURCE_BF16:
        return u32_shl(x, 16)
    return C.load(x, kind, codec)


@jit(inline="always")
def _fixed(el):  # pragma: no cover - compiled
    return el.codec.specials == C.FIXED


def _flags(source: Source, el: Element, sc: Scale) -> tuple[int, int, bool, bool]:
    """The decisions the helpers branch on, as the separate constants a kernel passes them:
    the source kind, the rounding mode, fixed-point elements, e8m0 scales (see the module's
    flags)."""
    return source.kind, el.mode, el.codec.specials == C.FIXED, sc.e8m0


# ---- scale policies -----------------------------------------------------------------------------


@jit
def _row_errors(xr, l0, l1, base, cands, count, pts, squared, key, src, el, sc, errs):  # pragma: no cover
    """The error sums of the block ``xr[l0:l1]`` with the scales ``cands[:count]`` into
    ``errs[:count]``: for each, |dq - x| (or its square) in float64, accumulated left to right
    from 0.0. One element loop serves every candidate (compiled once, the block in cache)."""
    key_lo, key_hi = _stream(key)
    rnd = np.uint32(0)
    for k in range(count):
        mul, scale = _multiplier(cands[k], pts, sc, sc.e8m0)
        err = 0.0
        for i in range(l0, l1):
            u = C.load(xr[i], src.kind, src.codec)
            if el.mode == C.STOCHASTIC:
                rnd = C.random_bits(key_lo, key_hi, base + np.int64(i))
            v = _scaled(u, mul, sc.e8m0)
            d = np.float64(_dequantized(v, rnd, scale, el, el.mode, _fixed(el))) - np.float64(f32_from_bits(u))
            err += d * d if squared else abs(d)
        errs[k] = err


@jit
def _tile_error(x, a, r0, r1, c0, c1, byte, pts, squared, key, idx0, src, el, sc):  # pragma: no cover - compiled
    """The sum of |dq - x| (or its square) over the tile ``x[a, r0:r1, c0:c1]`` in C order, in float64,
    with the scale ``byte``."""
    key_lo, key_hi = _stream(key)
    mul, scale = _multiplier(byte, pts, sc, sc.e8m0)
    rows, cols = x.shape[1], x.shape[2]
    err = 0.0
    rnd = np.uint32(0)
    for rr in range(r0, r1):
        for cc in range(c0, c1):
            u = C.load(x[a, rr, cc], src.kind, src.codec)
            if el.mode == C.STOCHASTIC:
                rnd = C.random_bits(key_lo, key_hi, idx0 + (a * rows + rr) * cols + cc)
            v = _scaled(u, mul, sc.e8m0)
            d = np.float64(_dequantized(v, rnd, scale, el, el.mode, _fixed(el))) - np.float64(f32_from_bits(u))
            err += d * d if squared else abs(d)
    return err


@jit
def _candidate(k, byte, policy, amax, pts, sc):  # pragma: no cover - compiled
    """(valid, byte) of the ``k``-th (0..3) alternative scale a policy tries besides the plain
    one, in the order they are tried (the first of equal errors wins, and the plain scale wins
    every tie): four-over-six, the map-to-4 scale; MSE search, e8m0: the exponent above; e4m3fn:
    the codes two and one below, one and two above (positive finite codes only)."""
    if policy == FOUR_SIX_MAE or policy == FOUR_SIX_MSE:
        return k == 0, np.uint32(_e4m3_byte(amax, sc.four, pts, sc))
    if sc.e8m0:
        return (k == 0) & (byte < np.uint32(254)), u32_add(byte, 1)
    b = np.int64(byte) + (k - 2 if k < 2 else k - 1)
    return (b >= 1) & (b <= 0x7E), np.uint32(b)


@jit
def _policy_scale(byte, amax, policy, pts, sc):  # pragma: no cover - compiled
    """Whether a policy looks past the plain scale of this block (not for zero or NaN blocks)."""
    if not sc.policies:
        return False
    return (policy != PLAIN) & (amax != 0) & (amax < np.uint32(0x7F800000))


# ---- row kernels (blocks along the last axis) ---------------------------------------------------


@jit(inline="always")
def _decoded_amax(m, src):  # pragma: no cover - compiled
    """The float32 |pattern| of the largest magnitude code ``m`` of a vector reduction (the codes
    of 16-bit sources are decoded once, after the reduction), the source known at run time. A
    kernel's own reduction (:func:`_row_amax`) decodes with :func:`_load`."""
    return m if src.kind == SOURCE_F32 else C.load(m, src.kind, src.codec)


@jit(inline="always")
def _row_amax(xr, l0, l1, kind, codec, v16, v32, v64):  # pragma: no cover - compiled
    """The largest |x| pattern of ``xr[l0:l1]``; one vector reduction for a float32 block of 16,
    32 or 64 (``v16, v32, v64``: these lengths, compile-time constants, for float32 rows; else 0)."""
    n = l1 - l0
    if v32 != 0 and n == v32:
        return _load(u32_amax_abs(xr, l0, v32), kind, codec)
    if v16 != 0 and n == v16:
        return _load(u32_amax_abs(xr, l0, v16), kind, codec)
    if v64 != 0 and n == v64:
        return _load(u32_amax_abs(xr, l0, v64), kind, codec)
    amax = np.uint32(0)
    for i in range(l0, l1):
        a = u32_and(_load(xr[i], kind, codec), 0x7FFFFFFF)
        amax = a if a > amax else amax
    return amax


@jit(inline="always")
def _row_scale(xr, l0, l1, base, amax, mode, policy, pts, key, src, el, sc, cands, errs):  # pragma: no cover
    """The scale byte of the block ``xr[l0:l1]``: the plain rule, or the policy's best candidate
    (``cands``, ``errs``: scratch of 5 entries)."""
    byte = _scale_byte(amax, mode, pts, sc, sc.e8m0)
    if not _policy_scale(byte, amax, policy, pts, sc):
        return byte
    # the plain scale first; invalid candidates are evaluated with it (never strictly better)
    count = 5 if (policy == SEARCH_MSE) & (not sc.e8m0) else 2
    cands[0] = byte
    for k in range(count - 1):
        valid, cand = _candidate(k, byte, policy, amax, pts, sc)
        cands[k + 1] = cand if valid else byte
    _row_errors(xr, l0, l1, base, cands, count, pts, policy != FOUR_SIX_MAE, key, src, el, sc, errs)
    best, chosen = errs[0], byte
    for k in range(1, count):
        if errs[k] < best:
            best, chosen = errs[k], np.uint32(cands[k])
    return chosen


def _vector_length(source: str, fmt: BlockFormat) -> int:
    """The block length the plain scale loop of a kernel reduces as one vector (a compile-time
    constant): the format's own, for the sources that have the vector reduction; 0 for none.
    Other lengths take the scalar loop: one vector length per kernel compiles faster than all
    three, and the format's own block size is what nearly every call uses."""
    return fmt.block_size if source_of(source).vector else 0


def _vector_lengths(source: Source) -> tuple[int, int, int]:
    return (16, 32, 64) if source.vector else (0, 0, 0)


@jit(inline="always")
def _block_amax(xr, l0, l1, src):  # pragma: no cover - compiled
    """:func:`_row_amax` with the source known at run time only (one vector reduction for the
    blocks of 16, 32 or 64 of the sources that have them)."""
    n = l1 - l0
    if src.vector:
        if n == 32:
            return _decoded_amax(u32_amax_abs(xr, l0, 32), src)
        if n == 16:
            return _decoded_amax(u32_amax_abs(xr, l0, 16), src)
        if n == 64:
            return _decoded_amax(u32_amax_abs(xr, l0, 64), src)
    amax = np.uint32(0)
    for i in range(l0, l1):
        a = u32_and(C.load(xr[i], src.kind, src.codec), 0x7FFFFFFF)
        amax = a if a > amax else amax
    return amax


@jit
def _row_scales(xr, j0, j1, size, base, out, mode, policy, pts, key, src, el, sc):  # pragma: no cover
    """The scale bytes of blocks ``[j0, j1)`` of the row ``xr`` into ``out[j]``. A loop of its own,
    before the elements', and a function of its own: the per-block decisions (the format's
    constants, scale mode and policy, all run-time values here) cost the element loop nothing,
    and one compiled copy serves every format and kernel with scale policies of a source's row
    type (compiling the policies' evaluation into each kernel cost most of their compile time)."""
    length = xr.shape[0]
    cands = np.empty(5, np.uint32)
    errs = np.empty(5, np.float64)
    for j in range(j0, j1):
        l0 = np.uint64(j * size)
        l1 = np.uint64(min(j * size + size, length))
        amax = _block_amax(xr, l0, l1, src)
        out[j] = _row_scale(xr, l0, l1, base, amax, mode, policy, pts, key, src, el, sc, cands, errs)


@jit(inline="always")
def _row_plain_scales(xr, j0, j1, size, out, mode, pts, kind, codec, sc, e8m0, vlen):  # pragma: no cover - compiled
    """The scale bytes of blocks ``[j0, j1)`` of the row ``xr`` by the plain rule (kernels without
    scale policies), inlined into the kernel with the format's constants and ``vlen`` (see
    :func:`_vector_length`) compiled in: the shared :func:`_row_scales`, with run-time constants,
    cost the quantisers up to a fifth of their speed."""
    length = xr.shape[0]
    for j in range(j0, j1):
        l0 = np.uint64(j * size)
        l1 = np.uint64(min(j * size + size, length))
        out[j] = _scale_byte(_row_amax(xr, l0, l1, kind, codec, 0, vlen, 0), mode, pts, sc, e8m0)


def _row_quantize(source: Source, el: Element, sc: Scale, pack: bool, vlen: int) -> Any:
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    policies = sc.policies  # a constant of the closure: numba compiles only the branch taken
    nan_code = el.nan_code

    @jit
    def kernel(x, codes, scales, size, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = scales.shape[1]
        rnd = np.uint32(0)
        rnd_hi = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, cr, sr = x[r], codes[r], scales[r]  # one view per row, unsigned indices below
            base = idx0 + r * length
            j0, j1 = t - r * nb, min(t1 - r * nb, nb)
            if policies:
                _row_scales(xr, j0, j1, size, base, sr, mode, policy, pts, key, source, el, sc)
            else:
                _row_plain_scales(xr, j0, j1, size, sr, mode, pts, kind, source.codec, sc, e8m0, vlen)
            for j in range(j0, j1):
                l0 = np.uint64(j * size)
                l1 = np.uint64(min(j * size + size, length))
                byte = np.uint32(sr[j])
                mul, _ = _multiplier(byte, pts, sc, e8m0)
                nan_block = byte == np.uint32(sc.nan_byte)
                if not pack:
                    for i in range(l0, l1):
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + np.int64(i))
                        code = _code(_scaled(_load(xr[i], kind, source.codec), mul, e8m0), rnd, el, rmode, fixed)
                        cr[i] = nan_code if nan_block else code
                elif (l0 & 1) == 0 and ((l1 - l0) & 1) == 0:
                    for k in range(l0 >> np.uint64(1), l1 >> np.uint64(1)):
                        lo_i = k + k
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + np.int64(lo_i))
                            rnd_hi = C.random_bits(key_lo, key_hi, base + np.int64(lo_i) + 1)
                        lo = _code(_scaled(_load(xr[lo_i], kind, source.codec), mul, e8m0), rnd, el, rmode, fixed)
                        hi_u = _load(xr[lo_i + np.uint64(1)], kind, source.codec)
                        hi = _code(_scaled(hi_u, mul, e8m0), rnd_hi, el, rmode, fixed)
                        pair = u32_or(u32_and(lo, 0xF), u32_shl(u32_and(hi, 0xF), 4))
                        cr[k] = nan_code if nan_block else pair
                else:
                    for i in range(l0, l1):
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + np.int64(i))
                        code = _code(_scaled(_load(xr[i], kind, source.codec), mul, e8m0), rnd, el, rmode, fixed)
                        code = u32_and(nan_code if nan_block else code, 0xF)
                        pos = i >> np.uint64(1)
                        if i & 1:
                            cr[pos] = u32_or(cr[pos], u32_shl(code, 4))
                        else:
                            cr[pos] = code
            t = (r + 1) * nb

    return kernel


def _row_fake_quantize(source: Source, el: Element, sc: Scale, vlen: int) -> Any:
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    policies = sc.policies  # a constant of the closure: numba compiles only the branch taken

    @jit
    def kernel(x, out, size, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = (length + size - 1) // size
        bytes_ = np.empty(nb, np.uint32)
        rnd = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, orow = x[r], out[r]
            base = idx0 + r * length
            j0, j1 = t - r * nb, min(t1 - r * nb, nb)
            if policies:
                _row_scales(xr, j0, j1, size, base, bytes_, mode, policy, pts, key, source, el, sc)
            else:
                _row_plain_scales(xr, j0, j1, size, bytes_, mode, pts, kind, source.codec, sc, e8m0, vlen)
            for j in range(j0, j1):
                l0 = np.uint64(j * size)
                l1 = np.uint64(min(j * size + size, length))
                mul, scale = _multiplier(bytes_[j], pts, sc, e8m0)
                for i in range(l0, l1):
                    if stochastic:
                        rnd = C.random_bits(key_lo, key_hi, base + np.int64(i))
                    orow[i] = _dequantized(
                        _scaled(_load(xr[i], kind, source.codec), mul, e8m0), rnd, scale, el, rmode, fixed
                    )
            t = (r + 1) * nb

    return kernel


def _row_dequantize(el: Element, sc: Scale, packed: bool) -> Any:
    e8m0 = sc.e8m0

    @jit
    def kernel(codes, scales, out, size, pts, t0, t1):  # pragma: no cover - compiled
        length = out.shape[1]
        nb = scales.shape[1]
        t = t0
        while t < t1:
            r = t // nb
            cr, sr, orow = codes[r], scales[r], out[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = np.uint64(j * size)
                l1 = np.uint64(min(j * size + size, length))
                _, scale = _multiplier(np.uint32(sr[j]), pts, sc, e8m0)
                if packed and (l0 & 1) == 0 and ((l1 - l0) & 1) == 0:
                    for k in range(l0 >> np.uint64(1), l1 >> np.uint64(1)):
                        pair = np.uint32(cr[k])
                        orow[k + k] = _value(u32_and(pair, 0xF), scale, el)
                        orow[k + k + np.uint64(1)] = _value(u32_shr(pair, 4), scale, el)
                elif packed:
                    for pos in range(l0, l1):
                        code = u32_and(u32_shr(cr[pos >> np.uint64(1)], 4 * (pos & 1)), 0xF)
                        orow[pos] = _value(code, scale, el)
                else:
                    for pos in range(l0, l1):
                        orow[pos] = _value(np.uint32(cr[pos]), scale, el)
            t = (r + 1) * nb

    return kernel


# ---- tile kernels (1-D blocks along another axis, 2-D blocks) ----------------------------------


@jit
def _tile_amax(x, a, r0, r1, cols, amax, src):  # pragma: no cover - compiled
    """The largest |x| pattern of each tile of the row of tiles ``x[a, r0:r1, :]`` (tiles ``cols``
    wide) into ``amax``."""
    width = x.shape[2]
    amax[:] = 0
    if cols == 1:
        for rr in range(r0, r1):
            for cc in range(width):
                v = u32_and(C.load(x[a, rr, cc], src.kind, src.codec), 0x7FFFFFFF)
                amax[cc] = v if v > amax[cc] else amax[cc]
    else:
        for rr in range(r0, r1):
            for j in range(amax.size):
                m = amax[j]
                for cc in range(j * cols, min(j * cols + cols, width)):
                    v = u32_and(C.load(x[a, rr, cc], src.kind, src.codec), 0x7FFFFFFF)
                    m = v if v > m else m
                amax[j] = m


@jit
def _tile_plain_scales(x, a, r0, r1, cols, amax, bytes_, mode, policy, pts, key, idx0, src, el, sc):  # pragma: no cover
    """:func:`_tile_scales` of the kernels without scale policies (``policy`` ignored)."""
    _tile_amax(x, a, r0, r1, cols, amax, src)
    for j in range(amax.size):
        bytes_[j] = _scale_byte(amax[j], mode, pts, sc, sc.e8m0)


@jit
def _tile_scales(x, a, r0, r1, cols, amax, bytes_, mode, policy, pts, key, idx0, src, el, sc):  # pragma: no cover
    """Scale bytes of the row of tiles ``x[a, r0:r1, :]`` (tiles ``cols`` wide) into ``bytes_``;
    ``amax`` is scratch of one entry per tile."""
    width = x.shape[2]
    _tile_amax(x, a, r0, r1, cols, amax, src)
    for j in range(amax.size):
        m = amax[j]
        byte = _scale_byte(m, mode, pts, sc, sc.e8m0)
        if _policy_scale(byte, m, policy, pts, sc):
            c0, c1 = j * cols, min(j * cols + cols, width)
            squared = policy != FOUR_SIX_MAE
            best = _tile_error(x, a, r0, r1, c0, c1, byte, pts, squared, key, idx0, src, el, sc)
            plain = byte
            for k in range(4):
                valid, cand = _candidate(k, plain, policy, m, pts, sc)
                if valid:
                    err = _tile_error(x, a, r0, r1, c0, c1, cand, pts, squared, key, idx0, src, el, sc)
                    if err < best:
                        best, byte = err, cand
        bytes_[j] = byte


def _tile_quantize(source: Source, el: Element, sc: Scale, pack: int) -> Any:
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    policies = sc.policies  # a constant of the closure: numba compiles only the branch taken
    nan_code = el.nan_code

    @jit
    def kernel(x, codes, scales, rows, cols, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        height, width = x.shape[1], x.shape[2]
        nrt, nct = scales.shape[1], scales.shape[2]
        amax = np.empty(nct, np.uint32)
        bytes_ = np.empty(nct, np.uint32)
        col_mul = np.empty(width, np.float32)
        col_nan = np.empty(width, np.bool_)
        rnd = np.uint32(0)
        for t in range(t0, t1):
            a = t // nrt
            i = t - a * nrt
            r0 = i * rows
            r1 = min(r0 + rows, height)
            if policies:
                _tile_scales(x, a, r0, r1, cols, amax, bytes_, mode, policy, pts, key, idx0, source, el, sc)
            else:
                _tile_plain_scales(x, a, r0, r1, cols, amax, bytes_, mode, policy, pts, key, idx0, source, el, sc)
            for j in range(nct):
                scales[a, i, j] = bytes_[j]
                mul, _ = _multiplier(bytes_[j], pts, sc, e8m0)
                nan_block = amax[j] >= np.uint32(0x7F800000)
                for cc in range(j * cols, min(j * cols + cols, width)):
                    col_mul[cc] = mul
                    col_nan[cc] = nan_block
            for rr in range(r0, r1):
                for cc in range(width):
                    if stochastic:
                        rnd = C.random_bits(key_lo, key_hi, idx0 + (a * height + rr) * width + cc)
                    code = _code(
                        _scaled(_load(x[a, rr, cc], kind, source.codec), col_mul[cc], e8m0), rnd, el, rmode, fixed
                    )
                    code = nan_code if col_nan[cc] else code
                    if pack == PACK_NONE:
                        codes[a, rr, cc] = code
                    elif pack == PACK_COLS:
                        if cc & 1:
                            codes[a, rr, cc >> 1] = u32_or(codes[a, rr, cc >> 1], u32_shl(u32_and(code, 0xF), 4))
                        else:
                            codes[a, rr, cc >> 1] = u32_and(code, 0xF)
                    elif rr & 1:
                        codes[a, rr >> 1, cc] = u32_or(codes[a, rr >> 1, cc], u32_shl(u32_and(code, 0xF), 4))
                    else:
                        codes[a, rr >> 1, cc] = u32_and(code, 0xF)

    return kernel


def _tile_fake_quantize(source: Source, el: Element, sc: Scale) -> Any:
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    policies = sc.policies  # a constant of the closure: numba compiles only the branch taken

    @jit
    def kernel(x, out, rows, cols, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        height, width = x.shape[1], x.shape[2]
        nrt = (height + rows - 1) // rows
        nct = (width + cols - 1) // cols
        amax = np.empty(nct, np.uint32)
        bytes_ = np.empty(nct, np.uint32)
        col_mul = np.empty(width, np.float32)
        col_scale = np.empty(width, np.float32)
        rnd = np.uint32(0)
        for t in range(t0, t1):
            a = t // nrt
            i = t - a * nrt
            r0 = i * rows
            r1 = min(r0 + rows, height)
            if policies:
                _tile_scales(x, a, r0, r1, cols, amax, bytes_, mode, policy, pts, key, idx0, source, el, sc)
            else:
                _tile_plain_scales(x, a, r0, r1, cols, amax, bytes_, mode, policy, pts, key, idx0, source, el, sc)
            for j in range(nct):
                mul, scale = _multiplier(bytes_[j], pts, sc, e8m0)
                for cc in range(j * cols, min(j * cols + cols, width)):
                    col_mul[cc] = mul
                    col_scale[cc] = scale
            for rr in range(r0, r1):
                for cc in range(width):
                    if stochastic:
                        rnd = C.random_bits(key_lo, key_hi, idx0 + (a * height + rr) * width + cc)
                    v = _scaled(_load(x[a, rr, cc], kind, source.codec), col_mul[cc], e8m0)
                    out[a, rr, cc] = _dequantized(v, rnd, col_scale[cc], el, rmode, fixed)

    return kernel


def _tile_dequantize(el: Element, sc: Scale, pack: int) -> Any:
    e8m0 = sc.e8m0

    @jit
    def kernel(codes, scales, out, rows, cols, pts, t0, t1):  # pragma: no cover - compiled
        height, width = out.shape[1], out.shape[2]
        nrt, nct = scales.shape[1], scales.shape[2]
        col_scale = np.empty(width, np.float32)
        for t in range(t0, t1):
            a = t // nrt
            i = t - a * nrt
            r0 = i * rows
            r1 = min(r0 + rows, height)
            for j in range(nct):
                _, scale = _multiplier(np.uint32(scales[a, i, j]), pts, sc, e8m0)
                for cc in range(j * cols, min(j * cols + cols, width)):
                    col_scale[cc] = scale
            for rr in range(r0, r1):
                for cc in range(width):
                    if pack == PACK_NONE:
                        code = np.uint32(codes[a, rr, cc])
                    elif pack == PACK_COLS:
                        code = u32_and(u32_shr(codes[a, rr, cc >> 1], 4 * (cc & 1)), 0xF)
                    else:
                        code = u32_and(u32_shr(codes[a, rr >> 1, cc], 4 * (rr & 1)), 0xF)
                    out[a, rr, cc] = _value(code, col_scale[cc], el)

    return kernel


# ---- the random Hadamard rotation ---------------------------------------------------------------


@jit(inline="always")
def _rotate_group(src_row, start, dst, off, signs, t, kind, codec, inverse):  # pragma: no cover - compiled
    """Rotate the 16 values ``src_row[start:start + 16]`` into the float32 patterns
    ``dst[off:off + 16]``: forward ``(x * signs) @ H16 / 4``, inverse ``(y @ H16 / 4) * signs``.

    In float64 (``t`` is scratch of 16): the signs multiply first (forward) and exactly; the fast
    Walsh-Hadamard butterfly runs in stages h = 1, 2, 4, 8, each pair (j, j + h) with
    ``j & h == 0`` in increasing j becoming (a + b, a - b); then each value is multiplied by 0.25
    (and by its sign, inverse) and rounded once to float32."""
    for k in range(16):
        v = np.float64(f32_from_bits(_load(src_row[start + k], kind, codec)))
        t[k] = v if inverse else v * signs[k]
    for stage in range(4):  # constant trip counts and no branches: straight-line code
        h = 1 << stage
        for pair in range(8):  # the pairs (j, j + h) with j & h == 0, in increasing j
            j = (pair >> stage << (stage + 1)) | (pair & (h - 1))
            a = t[j]
            b = t[j + h]
            t[j] = a + b
            t[j + h] = a - b
    for k in range(16):
        v = t[k] * 0.25
        dst[off + k] = f32_bits(np.float32(v * signs[k] if inverse else v))


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
            _rotate_group(x[r], g, out[r], g, signs, t, kind, src.codec, inverse)

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
                _rotate_group(x[r], (group - r * ng) * 16, buf, 0, signs, t, kind, src.codec, False)
                for k in range(16):
                    v = u32_and(buf[k], 0x7FFFFFFF)
                    m = v if (v > m) & (v < np.uint32(0x7F800000)) else m
            out[task] = m

    return kernel


def _row_quantize_rotated(source: Source, el: Element, sc: Scale, pack: bool) -> Any:
    """:func:`_row_quantize` of the rotated input (blocks and rows of a multiple of 16): each block
    is rotated into a scratch row first."""
    f32 = source_of("float32")
    stochastic = el.mode == C.STOCHASTIC
    V16, V32, V64 = _vector_lengths(f32)  # noqa: N806 - compile-time constants
    nan_code = el.nan_code
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)

    @jit
    def kernel(x, codes, scales, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = scales.shape[1]
        buf = np.empty(size, np.uint32)
        t64 = np.empty(16, np.float64)
        cands = np.empty(5, np.uint32)
        errs = np.empty(5, np.float64)
        rnd = np.uint32(0)
        rnd_hi = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, cr, sr = x[r], codes[r], scales[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = j * size
                n = min(size, length - l0)
                base = idx0 + r * length + l0
                for g in range(0, n, 16):
                    _rotate_group(xr, l0 + g, buf, g, signs, t64, kind, source.codec, False)
                amax = _row_amax(buf, np.uint64(0), np.uint64(n), SOURCE_F32, f32.codec, V16, V32, V64)
                byte = _row_scale(
                    buf, np.uint64(0), np.uint64(n), base, amax, mode, policy, pts, key, f32, el, sc, cands, errs
                )
                sr[j] = byte
                mul, _ = _multiplier(byte, pts, sc, e8m0)
                nan_block = amax >= np.uint32(0x7F800000)
                if pack:
                    for k in range(n // 2):
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + 2 * k)
                            rnd_hi = C.random_bits(key_lo, key_hi, base + 2 * k + 1)
                        lo = _code(_scaled(buf[2 * k], mul, e8m0), rnd, el, rmode, fixed)
                        hi = _code(_scaled(buf[2 * k + 1], mul, e8m0), rnd_hi, el, rmode, fixed)
                        pair = u32_or(u32_and(lo, 0xF), u32_shl(u32_and(hi, 0xF), 4))
                        cr[l0 // 2 + k] = nan_code if nan_block else pair
                else:
                    for i in range(n):
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + i)
                        code = _code(_scaled(buf[i], mul, e8m0), rnd, el, rmode, fixed)
                        cr[l0 + i] = nan_code if nan_block else code
            t = (r + 1) * nb

    return kernel


def _row_fake_quantize_rotated(source: Source, el: Element, sc: Scale) -> Any:
    """:func:`_row_fake_quantize` of the rotated input (values stay rotated)."""
    f32 = source_of("float32")
    stochastic = el.mode == C.STOCHASTIC
    V16, V32, V64 = _vector_lengths(f32)  # noqa: N806 - compile-time constants
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)

    @jit
    def kernel(x, out, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = (length + size - 1) // size
        buf = np.empty(size, np.uint32)
        t64 = np.empty(16, np.float64)
        cands = np.empty(5, np.uint32)
        errs = np.empty(5, np.float64)
        rnd = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, orow = x[r], out[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = j * size
                n = min(size, length - l0)
                base = idx0 + r * length + l0
                for g in range(0, n, 16):
                    _rotate_group(xr, l0 + g, buf, g, signs, t64, kind, source.codec, False)
                amax = _row_amax(buf, np.uint64(0), np.uint64(n), SOURCE_F32, f32.codec, V16, V32, V64)
                byte = _row_scale(
                    buf, np.uint64(0), np.uint64(n), base, amax, mode, policy, pts, key, f32, el, sc, cands, errs
                )
                mul, scale = _multiplier(byte, pts, sc, e8m0)
                for i in range(n):
                    if stochastic:
                        rnd = C.random_bits(key_lo, key_hi, base + i)
                    orow[l0 + i] = _dequantized(_scaled(buf[i], mul, e8m0), rnd, scale, el, rmode, fixed)
            t = (r + 1) * nb

    return kernel


# ---- the kernels, by specialisation -------------------------------------------------------------


@cache
def quantize_kernel(
    source: str, fmt: BlockFormat, rounding: str, pack: int, row: bool, rotate: bool = False, policies: bool = False
) -> Any:
    """Row kernel ``(x, codes, scales, size, mode, policy, pts, key, idx0, t0, t1)`` on (A, L)
    arrays (``pack``: FP4 codes two per byte along L), or tile kernel ``(x, codes, scales, rows,
    cols, mode, policy, pts, key, idx0, t0, t1)`` on (A, R, C) arrays (``pack``: ``PACK_*``).

    ``mode``, ``policy``: :func:`scale_mode_id`, :func:`policy_id`; ``pts``: the per-tensor scale
    (float32; 0 for none); ``idx0``: the C-order index of x's first element in the whole array
    (the stochastic bits depend on it), so that an array quantised in pieces gets the bits of the
    whole. ``rotate``: row kernels of the rotated input, taking the 16 signs (float64) after
    ``idx0``. ``policies``: kernels that evaluate the scale policies (else ``policy`` is ignored)."""
    el, sc = _element_of(fmt, rounding), _scale_of(fmt, policies)
    if rotate:
        return _row_quantize_rotated(source_of(source), el, sc, bool(pack))
    if row:
        return _row_quantize(source_of(source), el, sc, bool(pack), _vector_length(source, fmt))
    return _tile_quantize(source_of(source), el, sc, pack)


@cache
def fake_quantize_kernel(
    source: str, fmt: BlockFormat, rounding: str, row: bool, rotate: bool = False, policies: bool = False
) -> Any:
    """As :func:`quantize_kernel`, writing the dequantised values into float32 ``out`` (in place of
    codes and scales)."""
    el, sc = _element_of(fmt, rounding), _scale_of(fmt, policies)
    if rotate:
        return _row_fake_quantize_rotated(source_of(source), el, sc)
    if row:
        return _row_fake_quantize(source_of(source), el, sc, _vector_length(source, fmt))
    return _tile_fake_quantize(source_of(source), el, sc)


@cache
def dequantize_kernel(fmt: BlockFormat, pack: int, row: bool) -> Any:
    """Row kernel ``(codes, scales, out, size, pts, t0, t1)`` or tile kernel ``(codes, scales,
    out, rows, cols, pts, t0, t1)``: the values into float32 ``out``."""
    el, sc = _element_of(fmt, "nearest_even"), _scale_of(fmt)
    if row:
        return _row_dequantize(el, sc, bool(pack))
    return _tile_dequantize(el, sc, pack)


@cache
def finite_amax_kernel(source: str) -> Any:
    """Kernel ``(x, out, chunk, t0, t1)``: ``out[t]`` = the largest finite |x| pattern of
    ``x[t * chunk : (t + 1) * chunk]`` (x 1-D), 0 where there is none."""
    src = source_of(source)
    kind = src.kind

    @jit
    def kernel(x, out, chunk, t0, t1):  # pragma: no cover - compiled
        for t in range(t0, t1):
            seg = x[t * chunk : min(t * chunk + chunk, x.size)]  # a slice: LLVM vectorises its loop
            m = np.uint32(0)
            for i in range(seg.size):
                v = u32_and(_load(seg[i], kind, src.codec), 0x7FFFFFFF)
                v = v if v < np.uint32(0x7F800000) else u32_and(v, 0)
                m = max(m, v)
            out[t] = m

    return kernel


#: The sums of the error statistics, in the order kernels store them.
N_SUMS = 7  # count, sum x^2, sum err^2, max |err|, max |err| / |x|, saturated, flushed


@cache
def row_error_kernel(source: str, fmt: BlockFormat, packed: bool) -> Any:
    """Kernel ``(x, codes, scales, size, pts, out, t0, t1)``: the error statistics of the rows
    ``[t0, t1)`` of (A, L) ``x`` quantised as ``codes``/``scales`` (1-D blocks along L), row ``r``'s
    into ``out[r]`` (see :func:`error_sums`), dequantising on the way: no array of values is
    made, and rows are independent tasks whose sums are combined in row order (so the result
    does not depend on the thread count)."""
    src = source_of(source)
    el, sc = _element_of(fmt, "nearest_even"), _scale_of(fmt)
    top = fmt.element_format.max_code
    kind, _, _, e8m0 = _flags(src, el, sc)

    @jit
    def kernel(x, codes, scales, size, pts, out, t0, t1):  # pragma: no cover - compiled
        length = x.shape[1]
        for r in range(t0, t1):
            xr, cr, sr = x[r], codes[r], scales[r]
            count = 0
            signal = 0.0
            noise = 0.0
            max_abs = 0.0
            max_rel = 0.0
            saturated = 0
            flushed = 0
            for j in range(sr.size):
                _, scale = _multiplier(np.uint32(sr[j]), pts, sc, e8m0)
                lim = abs(np.float64(_value(np.uint32(top), scale, el)))
                for i in range(j * size, min(j * size + size, length)):
                    code = u32_and(u32_shr(cr[i >> 1], 4 * (i & 1)), 0xF) if packed else np.uint32(cr[i])
                    d = np.float64(_value(code, scale, el))
                    xi = np.float64(f32_from_bits(_load(xr[i], kind, src.codec)))
                    if not np.isfinite(xi) or np.isnan(d):
                        continue
                    err = abs(xi - d)
                    count += 1
                    signal += xi * xi
                    noise += err * err
                    max_abs = max(max_abs, err)
                    if xi != 0:
                        max_rel = max(max_rel, err / abs(xi))
                        flushed += d == 0
                    saturated += abs(xi) > lim
            out[r, 0] = count
            out[r, 1] = signal
            out[r, 2] = noise
            out[r, 3] = max_abs
            out[r, 4] = max_rel
            out[r, 5] = saturated
            out[r, 6] = flushed

    return kernel


@cache
def quantize_error_kernel(source: str, fmt: BlockFormat) -> Any:
    """Kernel ``(x, size, mode, policy, pts, key, out, t0, t1)``: the error statistics of the rows
    ``[t0, t1)`` of (A, L) ``x`` quantised to ``fmt`` (1-D blocks along L, rounding to nearest
    even, any scale mode and policy at run time) into ``out[r]``, as :func:`row_error_kernel`
    computes them from the codes, bit for bit, without writing codes: one kernel per source and
    format serves every scale mode and policy of a format (what the error table compares)."""
    src = source_of(source)
    el, sc = _element_of(fmt, "nearest_even"), _scale_of(fmt, True)
    top = fmt.element_format.max_code
    kind, rmode, fixed, e8m0 = _flags(src, el, sc)

    @jit
    def kernel(x, size, mode, policy, pts, key, out, t0, t1):  # pragma: no cover - compiled
        length = x.shape[1]
        nb = (length + size - 1) // size
        bytes_ = np.empty(nb, np.uint32)
        for r in range(t0, t1):
            xr = x[r]
            _row_scales(xr, 0, nb, size, r * length, bytes_, mode, policy, pts, key, src, el, sc)
            count = 0
            signal = 0.0
            noise = 0.0
            max_abs = 0.0
            max_rel = 0.0
            saturated = 0
            flushed = 0
            for j in range(nb):
                mul, scale = _multiplier(bytes_[j], pts, sc, e8m0)
                lim = abs(np.float64(_value(np.uint32(top), scale, el)))
                for i in range(j * size, min(j * size + size, length)):
                    u = _load(xr[i], kind, src.codec)
                    d = np.float64(_dequantized(_scaled(u, mul, e8m0), np.uint32(0), scale, el, rmode, fixed))
                    xi = np.float64(f32_from_bits(u))
                    if not np.isfinite(xi) or np.isnan(d):
                        continue
                    err = abs(xi - d)
                    count += 1
                    signal += xi * xi
                    noise += err * err
                    max_abs = max(max_abs, err)
                    if xi != 0:
                        max_rel = max(max_rel, err / abs(xi))
                        flushed += d == 0
                    saturated += abs(xi) > lim
            out[r, 0] = count
            out[r, 1] = signal
            out[r, 2] = noise
            out[r, 3] = max_abs
            out[r, 4] = max_rel
            out[r, 5] = saturated
            out[r, 6] = flushed

    return kernel


@jit
def error_sums(xv, dq, xs, lim):  # pragma: no cover - compiled
    """The sums behind the error statistics over flat arrays: x as float64, its dequantised
    values, the values as quantised (x, or x rotated) and the largest value each one's block can
    hold (max element times the block's scale). Elements with a non-finite x or a NaN dequantised
    value (blocks holding a NaN or an infinity) are left out. Returns (count, sum x^2, sum err^2,
    max |err|, max |err|/|x| over x != 0, saturated count, flushed count)."""
    count = 0
    signal = 0.0
    noise = 0.0
    max_abs = 0.0
    max_rel = 0.0
    saturated = 0
    flushed = 0
    for i in range(xv.size):
        x = xv[i]
        d = np.float64(dq[i])
        if not np.isfinite(x) or np.isnan(d):
            continue
        err = abs(x - d)
        count += 1
        signal += x * x
        noise += err * err
        max_abs = max(max_abs, err)
        if x != 0:
            max_rel = max(max_rel, err / abs(x))
            flushed += d == 0
        saturated += abs(np.float64(xs[i])) > np.float64(lim[i])
    return count, signal, noise, max_abs, max_rel, saturated, flushed
