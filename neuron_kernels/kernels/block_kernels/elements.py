"""The elements of a block: the scaled value (:func:`_scaled`), its code under the rounding mode
(:func:`_code`; :func:`_nearest_even` in float arithmetic), the value a code or a scaled element
comes back as (:func:`_value`, :func:`_dequantized`) and the source loader (:func:`_load`). 4-bit
codes two per byte are :mod:`..nibble_kernels`'s."""

from __future__ import annotations

import numpy as np

from ..._jit import f32_bits, f32_from_bits, jit, u32_add, u32_and, u32_or, u32_shl, u32_shr, u32_sub
from .. import codec as C
from .. import loaders as S
from ..codec import NEAREST_EVEN
from ..loaders import SOURCE_BF16, SOURCE_F32  # bare names: numba prunes branches on them
from .spec import BY_DIVISION, BY_E8M0, BY_POW2


@jit(inline="always")
def scaled(u, mul, scaling):  # pragma: no cover - compiled
    """The element value before encoding, ``x * mul`` (``x / mul`` for float scales that divide;
    ``scaling``: ``BY_*`` of :mod:`.spec`). A multiplier of NVFP4 (or of the reciprocal rule)
    overflows to inf for a tensor of tiny amax: a zero element stays a signed zero (not 0 * inf =
    NaN)."""
    x = f32_from_bits(u)
    if scaling == BY_DIVISION or scaling == BY_POW2:
        return x / mul
    v = x * mul
    if scaling == BY_E8M0:
        return v
    return v if x != 0 else x


@jit(inline="always")
def nearest_even(v, el, fixed):  # pragma: no cover - compiled
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
def element_code(v, rnd, el, rmode, fixed):  # pragma: no cover - compiled
    """The saturating code of the finite float32 ``v`` under the element's rounding mode ``rmode``."""
    if rmode == NEAREST_EVEN:
        return nearest_even(v, el, fixed)
    return C.encode(f32_bits(v), rnd, np.uint32(0), el.codec, el.mode, True)


@jit(inline="always")
def element_value(code, scale, el):  # pragma: no cover - compiled
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
def dequantized(v, rnd, scale, el, rmode, fixed):  # pragma: no cover - compiled
    """``_value(_code(v, rnd, el, rmode, fixed), scale, el)``: the value the finite scaled element
    ``v`` comes back as (NaN for a NaN block)."""
    if rmode == NEAREST_EVEN:
        d = _nearest_value(v, el, fixed) * scale
        return d if scale == scale else np.float32(np.nan)
    return element_value(element_code(v, rnd, el, rmode, fixed), scale, el)


@jit(inline="always")
def stream(key):  # pragma: no cover - compiled
    return np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)


@jit(inline="always")
def load_value(x, kind, codec):  # pragma: no cover - compiled
    """:func:`~..loaders.load`, with float32 patterns and bfloat16 codes read in place: a kernel of
    either source compiles no loader."""
    if kind == SOURCE_F32:
        return x
    if kind == SOURCE_BF16:
        return u32_shl(x, 16)
    return S.load(x, kind, codec)


@jit(inline="always")
def is_fixed_point(el):  # pragma: no cover - compiled
    return el.codec.specials == C.FIXED
