"""The kernels of the integer block formats (``int2_group`` ... ``int8_channel``): quantise and
dequantise rows of groups, with compressed-tensors' arithmetic.

A value's code is ``q = round(x / s)`` (symmetric) or ``round(x / s + z)`` (with a zero point),
clamped to ``[-2^(b-1), 2^(b-1) - 1]``; its value is ``(q - z) * s``. The producers compute each
step in the weight's dtype (torch rounds every bfloat16 or float16 operation's float32 result to
the dtype): the kernels do the same, every operation in float32 followed by the rounding of
:func:`rounded` to the scale's dtype (``dt``: :data:`AS_FLOAT32`, :data:`AS_BFLOAT16`,
:data:`AS_FLOAT16`, a constant compiled in). The scale of a group: ``amax / ((qmax - qmin) / 2)``
symmetric, ``(max - min) / (qmax - qmin)`` with the zero point ``round(clamp(qmin - min / s))``
otherwise (min and max taken with 0; computed before a zero scale becomes the dtype's epsilon, as
compressed-tensors does: 0 for an all-zero group, whose ``qmin - 0 / 0`` torch casts to 0). A group holding a
NaN or an infinity gets a NaN scale, codes and zero point 0, and dequantises to NaN.

Codes are ``b``-bit two's-complement patterns, one per byte; zero points int8; scales float32
values (rounded to the scale's dtype).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..._jit import f32_bits, f32_from_bits, jit, u32_add, u32_and, u32_shl, u32_shr
from ..loaders import SOURCE_BF16
from .elements import load_value
from .spec import source_of

#: The dtype every step of the arithmetic is rounded to, as the kernels number them.
AS_FLOAT32, AS_BFLOAT16, AS_FLOAT16 = 0, 1, 2

#: The kernels' number of each scale dtype.
ROUNDING_OF = {"float32": AS_FLOAT32, "bfloat16": AS_BFLOAT16, "float16": AS_FLOAT16}

#: The smallest positive normal value of each, and the epsilon (the scale of an all-zero group).
_EPS = {AS_FLOAT32: 2.0**-23, AS_BFLOAT16: 2.0**-7, AS_FLOAT16: 2.0**-10}


@jit(inline="always")
def rounded(v, dt):  # pragma: no cover - compiled
    """The float32 ``v`` rounded to nearest even in the dtype ``dt`` (its value, in float32)."""
    if dt == AS_FLOAT32 or v != v:
        return v
    u = f32_bits(v)
    if dt == AS_BFLOAT16:
        return f32_from_bits(u32_and(u32_add(u, 0x7FFF + u32_and(u32_shr(u, 16), 1)), 0xFFFF0000))
    a = abs(v)
    if a >= np.float32(65520.0):
        return np.float32(np.inf) if v > 0 else np.float32(-np.inf)
    if a < np.float32(2.0**-14):  # float16's subnormals: multiples of 2^-24, by the adder
        r = (a + np.float32(0.5)) - np.float32(0.5)
    else:
        ab = f32_bits(a)
        r = f32_from_bits(u32_and(u32_add(ab, 0xFFF + u32_and(u32_shr(ab, 13), 1)), 0xFFFFE000))
    return r if v >= 0 else -r


#: The elements the codes' loop takes at a time: a constant trip count, which LLVM vectorises with
#: no remainder loop and no run-time checks (a loop over a whole group of 128 cost about 50 cycles
#: more per group).
CHUNK = 32


@jit(inline="always")
def _extremes(p, n, u):  # pragma: no cover - compiled
    """The largest positive (``p``) and negative (``n``) float32 patterns with ``u``'s."""
    negative = u >= np.uint32(0x80000000)
    return max(p, np.uint32(0) if negative else u), max(n, u32_and(u, 0x7FFFFFFF) if negative else np.uint32(0))


@jit(inline="always")
def _rounded_number(v, dt):  # pragma: no cover - compiled
    """:func:`rounded` of a ``v`` that is no NaN (an infinity rounds to itself)."""
    if dt == AS_BFLOAT16:
        u = f32_bits(v)
        return f32_from_bits(u32_and(u32_add(u, 0x7FFF + u32_and(u32_shr(u, 16), 1)), 0xFFFF0000))
    return rounded(v, dt)


@jit(inline="always")
def _code(u, s, z, qmin, qmax, mask, dt, symmetric):  # pragma: no cover - compiled
    """The ``b``-bit code (``mask`` its bits) of the value of float32 pattern ``u`` in a group of
    scale ``s`` and zero point ``z``: ``round(clamp(x / s (+ z)))``, each step rounded to ``dt``.
    The group holds no NaN and no infinity, so no step makes a NaN."""
    v = _rounded_number(f32_from_bits(u) / s, dt)
    if not symmetric:
        v = _rounded_number(v + z, dt)
    return np.uint8(np.int32(np.rint(min(max(v, qmin), qmax))) & mask)


@jit(inline="always")
def _torch_code(u, inv, qmin, qmax, mask):  # pragma: no cover - compiled
    """torch's ``quantize_per_channel`` code of the float32 pattern ``u`` (zero point 0): ``x *
    inv`` (``inv`` the float32 reciprocal of the scale) rounded to nearest even, clamped."""
    return np.uint8(np.int32(min(max(np.rint(f32_from_bits(u) * inv), qmin), qmax)) & mask)


@cache
def quantize_kernel(source: str, dt: int, symmetric: bool, packed: bool = False, torch_rule: bool = False) -> Any:
    """Kernel ``(x, codes, scales, zeros, group, bits, t0, t1)`` over rows ``[t0, t1)`` of (A, L)
    arrays: ``x`` the input as :func:`~.spec.input_view` gives it, ``codes`` uint8 (A, L), or
    (A, ceil(L / 2)) with ``packed`` 4-bit codes (element 2i in the low nibble), ``scales`` float32
    (A, groups), ``zeros`` int8 (A, groups) (unused when ``symmetric``), ``group`` the group
    length, ``bits`` the element width. Each group is read twice (its range, then its codes),
    from the cache; its loops are over slices, which LLVM vectorises. With ``torch_rule`` (symmetric,
    float32: the recipes' ``torch_int``), torch.ao's arithmetic instead: the scale ``max(amax / qmax,
    float32 epsilon)``, the codes by :func:`_torch_code`."""
    src = source_of(source)
    kind, codec = src.kind, src.codec
    eps = np.float32(_EPS[dt])

    @jit
    def kernel(x, codes, scales, zeros, group, bits, t0, t1):  # pragma: no cover - compiled
        qmin = np.float32(-(1 << (bits - 1)))
        qmax = np.float32((1 << (bits - 1)) - 1)
        span = qmax - qmin
        half = rounded(span / np.float32(2.0), dt)
        mask = (1 << bits) - 1
        length = x.shape[1]
        groups = scales.shape[1]
        row_codes = np.empty(length if packed else 0, np.uint8)
        pos = np.empty(groups, np.uint32)
        neg = np.empty(groups, np.uint32)
        step = np.empty(groups, np.float32)  # each group's scale (0: a NaN or an infinity in it)
        shift = np.empty(groups, np.float32)  # and zero point
        for r in range(t0, t1):
            row = x[r]
            # the ranges: the largest positive and negative magnitudes as float32 patterns, integer
            # maxima, which vectorise (float min/max reductions do not), and show a NaN or an infinity
            for g in range(groups):
                c0 = g * group
                c1 = min(c0 + group, length)
                p = np.uint32(0)
                n = np.uint32(0)
                seg = row[c0:c1]  # one loop: a reduction in chunks would wait on each chunk's sum
                if kind == SOURCE_BF16:  # on the 16-bit codes, twice the lanes
                    p16 = np.uint16(0)
                    n16 = np.uint16(0)
                    for i in range(seg.size):
                        h = seg[i]
                        negative = h >= np.uint16(0x8000)
                        p16 = max(p16, np.uint16(0) if negative else h)
                        n16 = max(n16, np.uint16(h & np.uint16(0x7FFF)) if negative else np.uint16(0))
                    p = u32_shl(np.uint32(p16), 16)
                    n = u32_shl(np.uint32(n16), 16)
                else:
                    for i in range(seg.size):
                        p, n = _extremes(p, n, load_value(seg[i], kind, codec))
                pos[g] = p
                neg[g] = n
            # the scales and zero points: a scalar loop whose groups are independent, so that their
            # divisions overlap
            for g in range(groups):
                hi = f32_from_bits(pos[g])  # max(group, 0)
                lo = -f32_from_bits(neg[g])  # min(group, 0)
                z = np.float32(0.0)
                if max(pos[g], neg[g]) >= np.uint32(0x7F800000):  # a NaN or an infinity
                    scales[r, g] = np.float32(np.nan)
                    if not symmetric:
                        zeros[r, g] = 0
                    step[g] = 0
                    shift[g] = 0
                    continue
                if torch_rule:  # floored rather than replaced where zero
                    sc = max(max(-lo, hi) / qmax, np.float32(2.0**-23))
                elif symmetric:
                    sc = rounded(max(-lo, hi) / half, dt)
                else:
                    sc = rounded(rounded(hi - lo, dt) / span, dt)
                    if sc != 0:
                        z = rounded(qmin - rounded(lo / sc, dt), dt)
                        z = np.float32(np.rint(min(max(z, qmin), qmax)))
                    elif lo < 0:  # a range whose scale underflowed: qmin - lo / 0 is +inf, clamped
                        z = qmax
                    # else qmin - 0 / 0 is NaN, which torch's cast to int8 makes 0
                    zeros[r, g] = np.int8(z)
                sc = sc if sc != 0 else eps
                scales[r, g] = sc
                step[g] = sc
                shift[g] = z
            # the codes, in chunks of a constant length (which LLVM vectorises without a remainder
            # loop); 4-bit codes packed two a byte after
            out = row_codes if packed else codes[r]
            for g in range(groups):
                c0 = g * group
                c1 = min(c0 + group, length)
                sc = step[g]
                z = shift[g]
                if sc == 0:  # a NaN or an infinity: codes 0
                    out[c0:c1] = 0
                    continue
                k = c0
                if torch_rule:
                    inv = np.float32(1.0) / sc
                    while k + CHUNK <= c1:
                        seg = row[k : k + CHUNK]
                        dst = out[k : k + CHUNK]
                        for i in range(CHUNK):
                            dst[i] = _torch_code(load_value(seg[i], kind, codec), inv, qmin, qmax, mask)
                        k += CHUNK
                    seg = row[k:c1]
                    dst = out[k:c1]
                    for i in range(seg.size):
                        dst[i] = _torch_code(load_value(seg[i], kind, codec), inv, qmin, qmax, mask)
                    continue
                while k + CHUNK <= c1:
                    seg = row[k : k + CHUNK]
                    dst = out[k : k + CHUNK]
                    for i in range(CHUNK):
                        dst[i] = _code(load_value(seg[i], kind, codec), sc, z, qmin, qmax, mask, dt, symmetric)
                    k += CHUNK
                seg = row[k:c1]
                dst = out[k:c1]
                for i in range(seg.size):
                    dst[i] = _code(load_value(seg[i], kind, codec), sc, z, qmin, qmax, mask, dt, symmetric)
            if not packed:
                continue
            pairs = length // 2
            dst = codes[r]
            for j in range(pairs):
                dst[j] = row_codes[2 * j] | (row_codes[2 * j + 1] << 4)
            if length % 2:
                dst[pairs] = row_codes[length - 1]

    return kernel


@cache
def dequantize_kernel(dt: int, symmetric: bool, permuted: bool, packed: bool = False) -> Any:
    """Kernel ``(codes, scales, zeros, gidx, out, group, bits, t0, t1)`` over rows ``[t0, t1)``:
    ``out[r, c] = (q - z) * s`` of column ``c``'s group (``gidx[c]`` where ``permuted``, else
    ``c // group``), each step rounded to ``dt`` as the producers compute it; ``codes`` as
    :func:`quantize_kernel` writes them (``packed``: two per byte)."""

    @jit
    def kernel(codes, scales, zeros, gidx, out, group, bits, t0, t1):  # pragma: no cover - compiled
        half = np.int32(1 << (bits - 1))
        length = out.shape[1]
        row_codes = np.empty(length + 1 if packed else 0, np.uint8)
        for r in range(t0, t1):
            crow = codes[r]
            if packed:
                for j in range(crow.size):
                    b = crow[j]
                    row_codes[2 * j] = b & 0xF
                    row_codes[2 * j + 1] = b >> 4
                crow = row_codes
            orow = out[r]
            if permuted:
                for c in range(length):
                    g = gidx[c]
                    q = np.float32((np.int32(crow[c]) ^ half) - half)
                    if not symmetric:
                        q = q - np.float32(zeros[r, g])
                    orow[c] = rounded(q * scales[r, g], dt)
                continue
            for g in range(scales.shape[1]):
                c0 = g * group
                c1 = min(c0 + group, length)
                s = scales[r, g]
                z = np.float32(0.0) if symmetric else np.float32(zeros[r, g])
                src = crow[c0:c1]
                dst = orow[c0:c1]
                for i in range(src.size):
                    q = np.float32((np.int32(src[i]) ^ half) - half)
                    if not symmetric:
                        q = q - z
                    dst[i] = rounded(q * s, dt)

    return kernel
