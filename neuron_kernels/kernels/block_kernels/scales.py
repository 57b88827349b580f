"""The scale of a block: the rules (``modes.SCALE_MODES``) from its amax, e8m0 (:func:`_e8m0_byte`)
or e4m3fn (:func:`_e4m3_byte`); what an element is multiplied by (:func:`_multiplier`); and the
scale policies, four-over-six and the MSE search, which compare the error sums of a block under
candidate scales (:func:`_row_errors`, :func:`_tile_error`, :func:`_candidate`)."""

from __future__ import annotations

import numpy as np

from ..._jit import f32_bits, f32_from_bits, jit, u32_add, u32_amax_abs, u32_and, u32_or, u32_shl, u32_shr, u32_sub
from .. import codec as C
from .. import loaders as S
from ..hashing import random_bits
from .elements import dequantized, is_fixed_point, load_value, scaled, stream
from .spec import (
    BY_DIVISION,
    BY_E8M0,
    BY_POW2,
    BY_RECIPROCAL,
    CEIL,
    EVEN,
    FOUR_SIX_MAE,
    FOUR_SIX_MSE,
    NEURON,
    PLAIN,
    RCEIL,
)


@jit
def _bit_length(v):  # pragma: no cover - compiled
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


@jit(inline="always")
def row_amax(xr, l0, l1, kind, codec, v16, v32, v64):  # pragma: no cover - compiled
    """The largest |x| pattern of ``xr[l0:l1]``; one vector reduction for a float32 block of 16,
    32 or 64 (``v16, v32, v64``: these lengths, compile-time constants, for float32 rows; else 0)."""
    n = l1 - l0
    if v32 != 0 and n == v32:
        return load_value(u32_amax_abs(xr, l0, v32), kind, codec)
    if v16 != 0 and n == v16:
        return load_value(u32_amax_abs(xr, l0, v16), kind, codec)
    if v64 != 0 and n == v64:
        return load_value(u32_amax_abs(xr, l0, v64), kind, codec)
    amax = np.uint32(0)
    for i in range(l0, l1):
        a = u32_and(load_value(xr[i], kind, codec), 0x7FFFFFFF)
        amax = a if a > amax else amax
    return amax


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
def _float_scale(amax, sc, scaling):  # pragma: no cover - compiled
    """The float32 pattern of a float scale from a block's finite amax pattern. ``divide``:
    ``s = amax / max`` in float32, rounded to the scale's dtype (``sc.codec``; float32: as is), and
    a scale that is zero there (an all-zero block) becomes the dtype's epsilon. ``reciprocal``:
    the multiplier ``m = max / amax`` (1 for an all-zero block), stored as ``1 / m`` in the end.
    ``pow2``: the smallest power of two ``s`` with ``amax <= max * s``, at least 2^-126: the power
    of two of ``t = amax / max`` (its mantissa cleared), doubled where ``max * s`` (exact) is
    still below amax; ``t`` is within an ulp of the quotient, so that is the smallest."""
    a = f32_from_bits(np.uint32(amax))
    if scaling == BY_RECIPROCAL:
        return f32_bits(sc.max_element / a) if amax != 0 else f32_bits(np.float32(1.0))
    if scaling == BY_POW2:
        if amax == 0:
            return f32_bits(sc.eps)
        p = u32_and(f32_bits(a / sc.max_element), 0x7F800000)
        p = p if p != 0 else np.uint32(0x00800000)  # below 2^-126: 2^-126
        return p if a <= sc.max_element * f32_from_bits(p) else u32_add(p, 0x00800000)
    t = f32_bits(a / sc.max_element)
    if sc.codec.bits != 32:
        t = C.decode(C.encode(t, np.uint32(0), np.uint32(0), sc.codec, C.NEAREST_EVEN, True), sc.codec)
    return t if t != 0 else f32_bits(sc.eps)


@jit(inline="always")
def scale_byte(amax, mode, pts, sc, scaling):  # pragma: no cover - compiled
    """The scale byte of a block by the plain rule (NaN byte for a NaN/inf block; e8m0: 0 for
    an all-zero block, e4m3fn: the lower clamp 2^-6); of float scales, the float32 pattern of
    :func:`_float_scale`. ``scaling``: ``sc.scaling`` (``BY_*`` of :mod:`.spec`)."""
    if amax >= 0x7F800000:
        return np.uint32(sc.nan_byte)
    if scaling >= BY_DIVISION:
        return np.uint32(_float_scale(amax, sc, scaling))
    if scaling == BY_E8M0:
        return np.uint32(0) if amax == 0 else np.uint32(_e8m0_byte(amax, mode, sc))
    return np.uint32(_e4m3_byte(amax, sc.max_element, pts, sc))


@jit(inline="always")
def multiplier(byte, pts, sc, scaling):  # pragma: no cover - compiled
    """(What an element is multiplied by before encoding, the scale of the dequantised values),
    in float32: MX, (1 / X, X) = (2^(127 - byte), 2^(byte - 127)); NVFP4, (1 / s, s) single-level
    and ((1 / pts) / s, pts * s) two-level, torchao's order of operations; float scales, (s, s)
    (elements divided by s, :func:`~.elements.scaled`), or (m, 1 / m) of the reciprocal rule's
    multiplier. NaN for a NaN block."""
    if scaling == BY_DIVISION or scaling == BY_POW2:
        s = f32_from_bits(byte)
        return s, s
    if scaling == BY_RECIPROCAL:
        m = f32_from_bits(byte)
        return m, np.float32(1.0) / m
    if scaling == BY_E8M0:
        inv = f32_from_bits(u32_shl(u32_sub(254, byte), 23) if byte < np.uint32(254) else np.uint32(0x400000))
        x = f32_from_bits(u32_shl(byte, 23) if byte != 0 else u32_or(byte, 0x400000))
        x = np.float32(np.nan) if byte == np.uint32(0xFF) else x
        return inv, x
    s = f32_from_bits(C.decode(byte, sc.codec))
    one = np.float32(1.0)
    if pts != 0:
        return (one / pts) / s, pts * s
    return one / s, s


@jit
def row_errors(xr, l0, l1, base, cands, count, pts, squared, key, src, el, sc, errs):  # pragma: no cover
    """The error sums of the block ``xr[l0:l1]`` with the scales ``cands[:count]`` into
    ``errs[:count]``: for each, |dq - x| (or its square) in float64, accumulated left to right
    from 0.0. One element loop serves every candidate (compiled once, the block in cache)."""
    key_lo, key_hi = stream(key)
    rnd = np.uint32(0)
    for k in range(count):
        mul, scale = multiplier(cands[k], pts, sc, sc.scaling)
        err = 0.0
        for i in range(l0, l1):
            u = S.load(xr[i], src.kind, src.codec)
            if el.mode == C.STOCHASTIC:
                rnd = random_bits(key_lo, key_hi, base + np.int64(i))
            v = scaled(u, mul, sc.scaling)
            d = np.float64(dequantized(v, rnd, scale, el, el.mode, is_fixed_point(el))) - np.float64(f32_from_bits(u))
            err += d * d if squared else abs(d)
        errs[k] = err


@jit
def tile_error(x, a, r0, r1, c0, c1, byte, pts, squared, key, idx0, src, el, sc):  # pragma: no cover - compiled
    """The sum of |dq - x| (or its square) over the tile ``x[a, r0:r1, c0:c1]`` in C order, in float64,
    with the scale ``byte``."""
    key_lo, key_hi = stream(key)
    mul, scale = multiplier(byte, pts, sc, sc.scaling)
    rows, cols = x.shape[1], x.shape[2]
    err = 0.0
    rnd = np.uint32(0)
    for rr in range(r0, r1):
        for cc in range(c0, c1):
            u = S.load(x[a, rr, cc], src.kind, src.codec)
            if el.mode == C.STOCHASTIC:
                rnd = random_bits(key_lo, key_hi, idx0 + (a * rows + rr) * cols + cc)
            v = scaled(u, mul, sc.scaling)
            d = np.float64(dequantized(v, rnd, scale, el, el.mode, is_fixed_point(el))) - np.float64(f32_from_bits(u))
            err += d * d if squared else abs(d)
    return err


@jit
def candidate(k, byte, policy, amax, pts, sc):  # pragma: no cover - compiled
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
def policy_scale(byte, amax, policy, pts, sc):  # pragma: no cover - compiled
    """Whether a policy looks past the plain scale of this block (not for zero or NaN blocks)."""
    if not sc.policies:
        return False
    return (policy != PLAIN) & (amax != 0) & (amax < np.uint32(0x7F800000))
