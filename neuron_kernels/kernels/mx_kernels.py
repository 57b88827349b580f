"""Numba kernels of MX quantisation, dequantisation and fake quantisation.

The array is seen as (A, L, B) with blocks of ``block_size`` along L; ``B == 1`` (the block axis is
the last) has its own, faster kernels on (A, L) arrays. A *task* is one (row, block) pair, and a
kernel runs the tasks ``[t0, t1)``, so that threads can share an array without sharing a block.

Scales come from the block's amax read as a float32 bit pattern (integer max over |x| patterns;
NaN patterns are the largest), never from a floating-point log2; a float32 block of 16, 32 or 64
is reduced as one vector. An element is x * (1 / X), a product by a power of two (exact where it
matters, see :func:`_element`), encoded with saturation: under ``nearest_even`` by float
arithmetic of its own (:func:`_nearest_even`, swept exhaustively in tests/test_mx_exhaustive.py),
in the other modes by the cast codec's generic encoder.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .._jit import f32_bits, f32_from_bits, jit, u32_add, u32_amax_abs, u32_and, u32_or, u32_shl, u32_shr, u32_sub
from ..formats import FORMATS
from ..mx import MX_FORMATS
from . import codec as C

__all__ = ["quantize_kernel", "dequantize_kernel", "fake_quantize_kernel", "error_sums", "unpack_fp4_axis"]

FLOOR, CEIL, EVEN, RCEIL, NEURON = range(5)
_SCALE_IDS = {"floor": FLOOR, "ceil": CEIL, "even": EVEN, "rceil": RCEIL, "neuron": NEURON}
_INT8 = 99  # the "specials" id of mxint8 elements


@jit
def _bit_length(v):  # pragma: no cover - compiled
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


@jit
def _scale_byte(amax, mode, emax, mbits, rcp):  # pragma: no cover - compiled
    """The e8m0 byte of a block from its amax bit pattern (see spec/mx.md, "The shared scale")."""
    if amax == 0:
        return 0
    if amax >= 0x7F800000:
        return 0xFF
    e_bits = np.int64(amax >> 23)
    frac = np.int64(amax & 0x7FFFFF)
    if e_bits > 0:
        fl = e_bits - 127
        sig = frac | 0x800000
    else:
        nbits = _bit_length(frac)
        fl = nbits - 150
        sig = frac << (24 - nbits)
    if mode == FLOOR:
        e = fl - emax
    elif mode == CEIL:
        e = fl + (1 if sig != 0x800000 else 0) - emax
    elif mode == EVEN:
        e = fl + ((sig + (1 << (22 - mbits))) >> 24) - emax
    elif mode == NEURON:
        e = fl - (emax - 1)
    else:
        d = f32_bits(f32_from_bits(np.uint32(amax)) * rcp)
        d_exp = np.int64(d >> 23)
        d_mant = np.int64(d & 0x7FFFFF)
        if d_exp == 0:
            u = 0 if d_mant <= 0x400000 else 1
        else:
            u = d_exp + (1 if d_mant != 0 else 0)
        e = min(u, 0xFE) - 127
    e = max(-127, min(127, e))
    return e + 127


@jit
def _column_block(x, t, nb, size, amax, dst, inp, sc):  # pragma: no cover - compiled
    """Task ``t`` of an (A, L, B) array: its row ``a_``, block ``j`` and range ``[l0, l1)`` of L;
    ``dst[b]`` gets the scale byte of column b's block (``amax`` is scratch of length B)."""
    a_ = t // nb
    j = t - a_ * nb
    l0 = j * size
    l1 = min(l0 + size, x.shape[1])
    amax[:] = 0
    for ll in range(l0, l1):
        for b in range(amax.size):
            v = u32_and(C._load(x[a_, ll, b], inp), 0x7FFFFFFF)
            amax[b] = v if v > amax[b] else amax[b]
    for b in range(amax.size):
        dst[b] = _scale_byte(amax[b], sc[0], sc[1], sc[2], sc[3])
    return a_, j, l0, l1


@jit(inline="always")
def _row_amax(xr, l0, l1, inp, v16, v32, v64):  # pragma: no cover - compiled
    """The largest |x| pattern of ``xr[l0:l1]``; one vector reduction for a block of 16, 32 or
    64 float32 values (``v16, v32, v64`` are these lengths for float32 rows, else 0)."""
    n = l1 - l0
    if v32 != 0 and n == v32:
        return u32_amax_abs(xr, l0, v32)
    if v16 != 0 and n == v16:
        return u32_amax_abs(xr, l0, v16)
    if v64 != 0 and n == v64:
        return u32_amax_abs(xr, l0, v64)
    amax = np.uint32(0)
    for i in range(l0, l1):
        a = u32_and(C._load(xr[i], inp), 0x7FFFFFFF)
        amax = a if a > amax else amax
    return amax


@jit(inline="always")
def _inverse_scale(byte):  # pragma: no cover - compiled
    """1 / X = 2^(127 - byte) as a float32 (2^-127 is the subnormal pattern 2^22)."""
    return f32_from_bits(u32_shl(u32_sub(254, byte), 23) if byte < np.uint32(254) else np.uint32(0x400000))


@jit(inline="always")
def _nearest_even(v, ne, specials):  # pragma: no cover - compiled
    """The saturating round-to-nearest-even code of the finite float32 ``v``, in float arithmetic.

    |v| is clamped to the largest element first (the same as saturating after rounding, as the
    largest element is a representable value). Below the smallest normal, adding a float whose
    ulp is the element's smallest subnormal rounds |v| to a multiple of it (the hardware adder
    rounds to nearest even), and the pattern difference is the code; above it, the float32
    pattern's mantissa is rounded to ``mbits`` bits in integer arithmetic and rebiased. mxint8:
    round(|v| * 64) by the same adder trick with 2^23.
    """
    mbits, top, min_normal, magic, rebias, sign_shift, sign_bit = ne
    if specials == _INT8:
        w = min(abs(v * np.float32(64.0)), np.float32(127.0))
        c = u32_sub(f32_bits(w + np.float32(8388608.0)), 0x4B000000)
        return u32_and(u32_sub(0, c), 0xFF) if f32_bits(v) >= np.uint32(0x80000000) else c
    a = min(abs(v), top)
    ab = f32_bits(a)
    sub = u32_sub(f32_bits(a + magic), f32_bits(magic))
    rounded = u32_add(u32_add(ab, (1 << (22 - mbits)) - 1), u32_and(u32_shr(ab, 23 - mbits), 1))
    normal = u32_sub(u32_shr(rounded, 23 - mbits), rebias)
    code = sub if a < min_normal else normal
    return u32_or(code, u32_and(u32_shr(f32_bits(v), sign_shift), sign_bit))


@jit(inline="always")
def _element(u, inv, rnd, el):  # pragma: no cover - compiled
    """The code of x / X (``u`` the float32 pattern of finite x, ``inv`` = 1 / X).

    x * (1 / X) is exact whenever it is a normal float32, and otherwise below 2^-126, so far
    below half the element's smallest subnormal (at least 2^-16 of X) that every rounding mode
    gives the signed zero from the rounded product too.
    """
    mbits, kc, off, bits, specials, max_code, nan_code, inf_code, mode, ne = el
    v = f32_bits(f32_from_bits(u) * inv)
    if mode == C.NEAREST_EVEN:
        return _nearest_even(f32_from_bits(v), ne, specials)
    if specials == _INT8:
        # c = round(v * 64), clamped to [-127, 127], int8 two's complement
        a = u32_and(v, 0x7FFFFFFF)
        e_bits = u32_shr(a, 23)
        e1 = e_bits if e_bits > np.uint32(0) else u32_or(e_bits, 1)
        m = u32_or(u32_and(a, 0x7FFFFF), 0x800000) if e_bits > np.uint32(0) else u32_and(a, 0x7FFFFF)
        neg = u32_shr(v, 31)
        big = e1 >= np.uint32(144)  # |v| * 64 >= 2^23: saturates
        s = u32_sub(144, e1 if e1 < np.uint32(143) else np.uint32(143))  # leaves the integer part of |v| * 64
        q = C._round_significand(m, s, neg, rnd, np.uint32(0), mode)
        c = np.uint32(127) if big or q > np.uint32(127) else q
        return u32_and(u32_sub(0, c), 0xFF) if neg == np.uint32(1) else c
    return C._encode(
        v, rnd, np.uint32(0), mbits, kc, off, bits, specials, max_code, nan_code, inf_code, False, mode, True
    )


@jit(inline="always")
def _value(code, byte, vl):  # pragma: no cover - compiled
    """X * P as a float32 (NaN for a NaN block)."""
    mbits, bias, bits, specials = vl
    if specials == _INT8:
        p = np.float32(np.int8(code)) * np.float32(1.0 / 64.0)
    else:
        p = f32_from_bits(C._decode(code, mbits, bias, bits, specials, False))
    x = f32_from_bits(u32_shl(byte, 23) if byte != 0 else np.uint32(0x400000))
    return np.float32(np.nan) if byte == 0xFF else p * x


def _element_args(fmt: str, rounding: str) -> tuple[Any, ...]:
    """The constants of :func:`_element`."""
    mxf = MX_FORMATS[fmt]
    mode = C.MODE_IDS[rounding]
    if mxf.is_int:
        return (0, 0, 0, 8, _INT8, 127, 0, 0, mode, (0, np.float32(0), np.float32(0), np.float32(0), 0, 0, 0))
    c = C.codec_of(FORMATS[mxf.element])
    ne = (
        c.mbits,
        np.float32(mxf.max_element),
        np.float32(2.0 ** (1 - c.bias)),
        np.float32(2.0 ** (1 - c.bias - c.mbits + 23)),
        ((127 - c.bias) << c.mbits) & 0xFFFFFFFF,
        32 - c.bits,
        1 << (c.bits - 1),
    )
    return (c.mbits, *C.bias_args(c.bias), c.bits, c.specials, c.max_code, c.nan_code, c.inf_code, mode, ne)


def _value_args(fmt: str) -> tuple[Any, ...]:
    """The constants of :func:`_value`."""
    mxf = MX_FORMATS[fmt]
    if mxf.is_int:
        return (0, 0, 8, _INT8)
    c = C.codec_of(FORMATS[mxf.element])
    return (c.mbits, c.bias, c.bits, c.specials)


def _nan_block_code(fmt: str) -> int:
    """The code of every element of a NaN block: the positive NaN code, or 0 where there is none."""
    mxf = MX_FORMATS[fmt]
    if mxf.is_int or mxf.element_format.nan_code is None:  # type: ignore[union-attr]
        return 0
    return mxf.element_format.nan_code  # type: ignore[union-attr,return-value]


def _input_args(source: str) -> tuple[Any, ...]:
    if source == "float32":
        return (C.SOURCE_F32, 0, 0, 0, 0, False)
    if source == "float64":
        return (C.SOURCE_F64_NEAREST, 0, 0, 0, 0, False)
    c = C.codec_of(FORMATS[source])
    return (C.SOURCE_CODES, c.mbits, c.bias, c.bits, c.specials, c.payload_decode)


def input_view(x: np.ndarray) -> np.ndarray:
    """The array as the kernels read it: float32 patterns, float16/bfloat16 codes, or float64."""
    if x.dtype == np.float64:
        return x
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


@cache
def quantize_kernel(source: str, fmt: str, scale_mode: str, rounding: str, pack: bool, last: bool) -> Any:
    """Kernel ``(x, codes, scales, block_size, key, idx0, t0, t1)``; 2-D arrays if ``last`` else 3-D.

    ``idx0`` is the C-order index of x's first element in the whole array (the stochastic bits
    depend on it), so that an array quantised in pieces gets the bits of the whole."""
    mxf = MX_FORMATS[fmt]
    inp = _input_args(source)
    v16, v32, v64 = (16, 32, 64) if source == "float32" else (0, 0, 0)
    el = _element_args(fmt, rounding)
    sc = (_SCALE_IDS[scale_mode], mxf.emax_elem, mxf.mbits, np.float32(1.0 / mxf.max_element))
    nan_code = _nan_block_code(fmt)
    stochastic = rounding == "stochastic"

    if last:

        @jit
        def kernel(x, codes, scales, size, key, idx0, t0, t1):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            length = x.shape[1]
            nb = scales.shape[1]
            rnd = np.uint32(0)
            rnd_hi = np.uint32(0)
            t = t0
            while t < t1:
                r = t // nb
                xr, cr, sr = x[r], codes[r], scales[r]  # one view per row, unsigned indices below
                for j in range(t - r * nb, min(t1 - r * nb, nb)):
                    l0 = np.uint64(j * size)
                    l1 = np.uint64(min(j * size + size, length))
                    amax = _row_amax(xr, l0, l1, inp, v16, v32, v64)
                    byte = _scale_byte(amax, sc[0], sc[1], sc[2], sc[3])
                    sr[j] = byte
                    inv = _inverse_scale(np.uint32(byte))
                    base = idx0 + r * length
                    if not pack:
                        for i in range(l0, l1):
                            if stochastic:
                                rnd = C._random_bits(key_lo, key_hi, base + np.int64(i))
                            code = _element(C._load(xr[i], inp), inv, rnd, el)
                            cr[i] = nan_code if byte == 0xFF else code
                    elif (l0 & 1) == 0 and ((l1 - l0) & 1) == 0:
                        for k in range(l0 >> np.uint64(1), l1 >> np.uint64(1)):
                            lo_i = k + k
                            if stochastic:
                                rnd = C._random_bits(key_lo, key_hi, base + np.int64(lo_i))
                                rnd_hi = C._random_bits(key_lo, key_hi, base + np.int64(lo_i) + 1)
                            lo = _element(C._load(xr[lo_i], inp), inv, rnd, el)
                            hi = _element(C._load(xr[lo_i + np.uint64(1)], inp), inv, rnd_hi, el)
                            pair = u32_or(u32_and(lo, 0xF), u32_shl(u32_and(hi, 0xF), 4))
                            cr[k] = nan_code if byte == 0xFF else pair
                    else:
                        for i in range(l0, l1):
                            if stochastic:
                                rnd = C._random_bits(key_lo, key_hi, base + np.int64(i))
                            code = _element(C._load(xr[i], inp), inv, rnd, el)
                            code = u32_and(nan_code if byte == 0xFF else code, 0xF)
                            pos = i >> np.uint64(1)
                            if i & 1:
                                cr[pos] = u32_or(cr[pos], u32_shl(code, 4))
                            else:
                                cr[pos] = code
                t = (r + 1) * nb

        return kernel

    @jit
    def kernel3(x, codes, scales, size, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
        length = x.shape[1]
        inner = x.shape[2]
        nb = scales.shape[1]
        amax = np.empty(inner, np.uint32)
        rnd = np.uint32(0)
        for t in range(t0, t1):
            a_, j, l0, l1 = _column_block(x, t, nb, size, amax, scales[t // nb, t % nb], inp, sc)
            for ll in range(l0, l1):
                cl = ll >> 1 if pack else ll
                for b in range(inner):
                    byte = scales[a_, j, b]
                    if stochastic:
                        rnd = C._random_bits(key_lo, key_hi, idx0 + (a_ * length + ll) * inner + b)
                    code = _element(C._load(x[a_, ll, b], inp), _inverse_scale(np.uint32(byte)), rnd, el)
                    code = nan_code if byte == 0xFF else code
                    if not pack:
                        codes[a_, cl, b] = code
                    elif ll & 1:
                        codes[a_, cl, b] = u32_or(codes[a_, cl, b], u32_shl(u32_and(code, 0xF), 4))
                    else:
                        codes[a_, cl, b] = u32_and(code, 0xF)

    return kernel3


@cache
def fake_quantize_kernel(source: str, fmt: str, scale_mode: str, rounding: str, last: bool) -> Any:
    """Kernel ``(x, out, block_size, key, idx0, t0, t1)``: X * P of every element, in one pass."""
    mxf = MX_FORMATS[fmt]
    inp = _input_args(source)
    v16, v32, v64 = (16, 32, 64) if source == "float32" else (0, 0, 0)
    el = _element_args(fmt, rounding)
    vl = _value_args(fmt)
    sc = (_SCALE_IDS[scale_mode], mxf.emax_elem, mxf.mbits, np.float32(1.0 / mxf.max_element))
    stochastic = rounding == "stochastic"

    @jit
    def kernel(x, out, size, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
        length = x.shape[1]
        inner = x.shape[2]
        nb = (length + size - 1) // size
        amax = np.empty(inner, np.uint32)
        bytes_ = np.empty(inner, np.uint32)
        rnd = np.uint32(0)
        for t in range(t0, t1):
            a_, _, l0, l1 = _column_block(x, t, nb, size, amax, bytes_, inp, sc)
            for ll in range(l0, l1):
                for b in range(inner):
                    byte = bytes_[b]
                    if stochastic:
                        rnd = C._random_bits(key_lo, key_hi, idx0 + (a_ * length + ll) * inner + b)
                    code = _element(C._load(x[a_, ll, b], inp), _inverse_scale(np.uint32(byte)), rnd, el)
                    out[a_, ll, b] = _value(code, byte, vl)

    if not last:
        return kernel

    @jit
    def kernel2(x, out, size, key, idx0, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
        length = x.shape[1]
        nb = (length + size - 1) // size
        rnd = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, orow = x[r], out[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = np.uint64(j * size)
                l1 = np.uint64(min(j * size + size, length))
                amax = _row_amax(xr, l0, l1, inp, v16, v32, v64)
                byte = np.uint32(_scale_byte(amax, sc[0], sc[1], sc[2], sc[3]))
                inv = _inverse_scale(np.uint32(byte))
                for i in range(l0, l1):
                    if stochastic:
                        rnd = C._random_bits(key_lo, key_hi, idx0 + r * length + np.int64(i))
                    code = _element(C._load(xr[i], inp), inv, rnd, el)
                    orow[i] = _value(code, byte, vl)
            t = (r + 1) * nb

    return kernel2


@cache
def dequantize_kernel(fmt: str, packed: bool, last: bool) -> Any:
    """Kernel ``(codes, scales, out, block_size, t0, t1)``: X * P into float32 or float64 ``out``."""
    vl = _value_args(fmt)

    @jit
    def kernel(codes, scales, out, size, t0, t1):  # pragma: no cover - compiled
        length = out.shape[1]
        inner = out.shape[2]
        nb = scales.shape[1]
        for t in range(t0, t1):
            a_ = t // nb
            j = t - a_ * nb
            l0 = j * size
            l1 = min(l0 + size, length)
            for ll in range(l0, l1):
                cl = ll >> 1 if packed else ll
                shift = 4 * (ll & 1) if packed else 0
                for b in range(inner):
                    code = u32_and(u32_shr(codes[a_, cl, b], shift), 0xF if packed else 0xFF)
                    out[a_, ll, b] = _value(code, np.uint32(scales[a_, j, b]), vl)

    if not last:
        return kernel

    @jit
    def kernel2(codes, scales, out, size, t0, t1):  # pragma: no cover - compiled
        length = out.shape[1]
        nb = scales.shape[1]
        t = t0
        while t < t1:
            r = t // nb
            cr, sr, orow = codes[r], scales[r], out[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = np.uint64(j * size)
                l1 = np.uint64(min(j * size + size, length))
                byte = np.uint32(sr[j])
                if packed and (l0 & 1) == 0 and ((l1 - l0) & 1) == 0:
                    for k in range(l0 >> np.uint64(1), l1 >> np.uint64(1)):
                        pair = np.uint32(cr[k])
                        orow[k + k] = _value(u32_and(pair, 0xF), byte, vl)
                        orow[k + k + np.uint64(1)] = _value(u32_shr(pair, 4), byte, vl)
                elif packed:
                    for pos in range(l0, l1):
                        code = u32_and(u32_shr(cr[pos >> np.uint64(1)], 4 * (pos & 1)), 0xF)
                        orow[pos] = _value(code, byte, vl)
                else:
                    for pos in range(l0, l1):
                        orow[pos] = _value(np.uint32(cr[pos]), byte, vl)
            t = (r + 1) * nb

    return kernel2


@jit
def error_sums(xv, dq, scales, size, max_element):  # pragma: no cover - compiled
    """The sums behind :class:`~neuron_kernels.mx.QuantizationError`, over (A, L, B) arrays: x as
    float64, its dequantised values, and the scale bytes (A, blocks, B). Elements of blocks with
    scale 0xff and non-finite x are left out. Returns (count, sum x^2, sum err^2, max |err|,
    max |err|/|x| over x != 0, saturated count, flushed count)."""
    count = 0
    signal = 0.0
    noise = 0.0
    max_abs = 0.0
    max_rel = 0.0
    saturated = 0
    flushed = 0
    for a in range(xv.shape[0]):
        for ll in range(xv.shape[1]):
            j = ll // size
            for b in range(xv.shape[2]):
                byte = scales[a, j, b]
                x = xv[a, ll, b]
                if byte == 0xFF or not np.isfinite(x):
                    continue
                d = np.float64(dq[a, ll, b])
                err = abs(x - d)
                count += 1
                signal += x * x
                noise += err * err
                max_abs = max(max_abs, err)
                if x != 0:
                    max_rel = max(max_rel, err / abs(x))
                    flushed += d == 0
                saturated += abs(x) > max_element * np.ldexp(1.0, np.int64(byte) - 127)
    return count, signal, noise, max_abs, max_rel, saturated, flushed


def unpack_fp4_axis(codes: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """FP4 codes stored two per byte along ``axis`` -> one code per byte, ``shape``."""
    moved = np.moveaxis(codes, axis, -1)
    out = np.empty(moved.shape[:-1] + (2 * moved.shape[-1],), np.uint8)
    out[..., 0::2] = moved & 0xF
    out[..., 1::2] = moved >> 4
    return np.ascontiguousarray(np.moveaxis(out[..., : shape[axis]], -1, axis))
