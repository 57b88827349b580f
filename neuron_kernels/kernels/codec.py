"""The generic encoder and decoder: float32 bit patterns <-> the codes of every float format.

One encoder and one decoder, written once over the parameters of the format table and
specialised per (source, target, rounding, saturate) by :func:`make_cast_kernel`, which closes over
plain ints only (so every specialisation is cached on disk on its own).

Encoding (float32 pattern ``u`` -> code), for a target with ``M`` mantissa bits and bias ``B``::

    m = significand with the implicit bit (F | 2^23 for normal inputs, F for subnormal ones)
    s = 23 - M + max(0, emin - e)         shift that puts the target's ulp at bit 0
    q = m >> s, r = m mod 2^s             kept significand (with the implicit bit), discarded bits
    up = rounding decision from (q, r, s, sign, random bits)
    code = (max(e + B - 1, 0) << M) + q + up

A rounding carry out of the mantissa moves into the exponent by itself, so the result is
correct at binade edges, at the subnormal/normal boundary and at the overflow threshold.
Everything is 32-bit integer arithmetic without branches, which vectorises.

Special values and signs: an input NaN gives the format's quiet NaN (float16 keeps the payload's
top bits, as numpy does); fnuz formats have no -0 and one NaN (0x80); float6/float4 have no NaN and
XOR the sign into their -0 code, so +NaN gives the -0 code and -NaN +0, as ml_dtypes does;
overflow gives the infinity, the NaN (fn) or the largest value (float6/float4, or under
``saturate`` and the directed modes that round toward zero). ``float8_e8m0fnu`` has its own
encoder (:func:`encode_e8m0`: ties to the even code).
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from .._jit import (
    f16_to_f32_bits,
    f32_bits,
    f32_from_bits,
    i32_positive,
    jit,
    u32_add,
    u32_and,
    u32_mul,
    u32_or,
    u32_shl,
    u32_shr,
    u32_sub,
    u32_xor,
)
from ..errors import InvalidValueError
from ..formats import SPECIALS, Format
from ..modes import ROUNDING_MODES

__all__ = [
    "Codec",
    "NO_CODEC",
    "codec_of",
    "mode_id",
    "encode",
    "encode_e8m0",
    "decode",
    "round_significand",
    "random_bits",
    "load",
    "loader",
    "storer",
    "Store",
    "make_cast_kernel",
    "copy_items",
    "pack_nibbles",
    "unpack_nibbles",
    "look_up_items",
]

# Specials kinds (Format.specials), as ints for the kernels, in the order of formats.SPECIALS.
IEEE, FN, FNUZ, NONE, E8M0, FIXED = (SPECIALS.index(k) for k in ("ieee", "fn", "fnuz", "none", "e8m0", "fixed"))

# Rounding modes, as ints for the kernels: their position in ROUNDING_MODES.
MODE_IDS = {name: i for i, name in enumerate(ROUNDING_MODES)}
NEAREST_EVEN, NEAREST_AWAY, TOWARD_ZERO = MODE_IDS["nearest_even"], MODE_IDS["nearest_away"], MODE_IDS["toward_zero"]
TOWARD_POSITIVE, TOWARD_NEGATIVE = MODE_IDS["toward_positive"], MODE_IDS["toward_negative"]
STOCHASTIC = MODE_IDS["stochastic"]


def source_of_codes(fmt: Format) -> int:
    """The source kind of arrays of codes of ``fmt``: the fast paths of bfloat16 (a shift) and
    float16 (the hardware conversion), else the generic decoder."""
    return {"bfloat16": SOURCE_BF16, "float16": SOURCE_F16}.get(fmt.name, SOURCE_CODES)


def mode_id(rounding: str) -> int:
    """The kernels' id of a rounding mode of ``ROUNDING_MODES``."""
    return MODE_IDS[rounding]


# Where a kernel's float32 patterns come from / go to.
SOURCE_F32 = 0  # a float32 (or tfloat32/float32r) array
SOURCE_F64_NEAREST = 1  # float64, rounded to float32 to nearest even first (the block formats' reading)
SOURCE_F64_ODD = 2  # float64, rounded to float32 "to odd": one correct rounding follows
SOURCE_CODES = 3  # codes of a small format, decoded exactly
SOURCE_INT = 4  # integers, converted to float32 (round to nearest even): for float32 targets
SOURCE_F64_SPLIT = 5  # float64 truncated to float32, the rest kept as 32 more bits (stochastic rounding)
SOURCE_BF16 = 6  # bfloat16 codes: the top half of a float32 pattern
SOURCE_F16 = 7  # float16 codes: the hardware conversion, NaN payloads kept
SOURCE_INT_ODD = 8  # integers, rounded to float32 "to odd" (exactly, see _int_to_f32_odd): one correct rounding follows
TARGET_F32 = 0
TARGET_F64 = 1
TARGET_CODES = 2
ELEMENTWISE, PACK_NIBBLES, UNPACK_NIBBLES = 0, 1, 2


class Codec(NamedTuple):
    """The ints a kernel needs about one float (or fixed-point) format, derived from its table row;
    kernels take it as a compile-time constant.

    The exponent bias B also enters as ``kc = max(128 - B, 0)`` (the float32 biased exponent of
    the format's smallest normal, clamped) and ``off = (B - 128) mod 2^32``: the forms in which
    :func:`encode` uses it. ``shift`` places the code in its container: 13 for tfloat32 (a
    float32 pattern with the low 13 bits zero), 0 otherwise.
    """

    bits: int
    mbits: int
    bias: int
    specials: int
    sign_bit: int
    max_code: int
    nan_code: int
    inf_code: int
    payload_encode: bool
    payload_decode: bool
    shift: int
    kc: int
    off: int


#: The codec argument of kernels whose source or target has none (float32, float64, integers).
NO_CODEC = Codec(0, 0, 0, 0, 0, 0, 0, 0, False, False, 0, 0, 0)


def codec_of(fmt: Format) -> Codec:
    """The :class:`Codec` of a float or fixed-point format of the table."""
    if fmt.kind not in ("float", "fixed"):
        raise InvalidValueError(f"{fmt.name} is not a float or fixed-point format")
    return Codec(
        bits=fmt.bits,
        mbits=fmt.mbits,
        bias=fmt.bias,
        specials=SPECIALS.index(fmt.specials),
        sign_bit=fmt.sign_code,
        max_code=fmt.max_code,
        nan_code=fmt.nan_code if fmt.nan_code is not None else 0,
        inf_code=fmt.inf_code if fmt.inf_code is not None else 0,
        payload_encode=fmt.nan_payload_encode,
        payload_decode=fmt.nan_payload_decode,
        shift=8 * fmt.itemsize - fmt.bits if fmt.container == "float32" else 0,
        kc=max(128 - fmt.bias, 0),
        off=(fmt.bias - 128) & 0xFFFFFFFF,
    )


@jit
def round_significand(m, s, neg, rnd, ext, mode):  # pragma: no cover - compiled
    """``m`` shifted right by ``s`` bits and rounded by ``mode`` (a carry may add a bit).

    ``m`` < 2^24, so adding a rounding increment below 2^31 never overflows 32 bits. ``s`` may
    exceed 31 (the value is far below the smallest subnormal): the result is then 0 or 1.
    Stochastic mode only: ``rnd`` is 32 uniformly random bits and ``ext`` the value's bits below
    ``m``'s last one as a 32-bit fraction of it (non-zero only for float64 sources); the magnitude
    rounds up when ``rnd < floor(2^32 * f)``, ``f`` the discarded fraction of the target's ulp.
    """
    sc = s if s < 31 else u32_or(u32_and(s, 0), 31)
    if mode == NEAREST_EVEN:
        lsb = u32_and(u32_shr(m, sc), 1)
        return u32_shr(u32_add(u32_add(m, u32_sub(u32_shl(1, u32_sub(sc, 1)), 1)), lsb), sc)
    if mode == NEAREST_AWAY:
        return u32_shr(u32_add(m, u32_shl(1, u32_sub(sc, 1))), sc)
    if mode == TOWARD_ZERO:
        return u32_shr(m, sc)
    if mode == TOWARD_POSITIVE or mode == TOWARD_NEGATIVE:
        away = (neg == 0) if mode == TOWARD_POSITIVE else (neg == 1)
        bump = u32_sub(u32_shl(1, sc), 1) if away else u32_and(sc, 0)
        return u32_shr(u32_add(m, bump), sc)
    # stochastic: up with probability (discarded bits) / 2^s, the fraction as 32-bit fixed point
    q = u32_shr(m, sc)
    r = u32_sub(m, u32_shl(q, sc))
    if s <= 31:
        frac = u32_add(u32_shl(r, u32_sub(32, s)), u32_shr(ext, s))
    elif s < 64:
        frac = u32_shr(r, u32_sub(s, 32))
    else:
        frac = u32_and(r, 0)
    return u32_add(q, rnd < frac)


@jit
def encode(u, rnd, ext, c, mode, saturate):  # pragma: no cover - compiled
    """Code of the float32 pattern ``u`` in the format of :class:`Codec` ``c`` (every format with
    a mantissa: all but e8m0), rounded by ``mode``; ``rnd`` and ``ext`` as in
    :func:`round_significand`. Fixed-point formats (``FIXED``) saturate, encode NaN as 0 and
    store the sign as two's complement of the magnitude code. Unsigned formats (no sign bit)
    give NaN for every negative input but -0 (ml_dtypes' rule), whatever the rounding."""
    mbits, kc, off, bits, specials = c.mbits, c.kc, c.off, c.bits, c.specials
    max_code, nan_code, inf_code, payload = c.max_code, c.nan_code, c.inf_code, c.payload_encode
    a = u32_and(u, 0x7FFFFFFF)
    neg = u32_shr(u, 31)
    e_bits = u32_shr(a, 23)
    frac = u32_and(a, 0x7FFFFF)
    e1 = e_bits if e_bits > 0 else u32_or(e_bits, 1)
    m = u32_or(frac, 0x800000) if e_bits > 0 else frac
    extra = u32_sub(kc, e1) if e1 < kc else u32_and(e1, 0)  # extra shift below the smallest normal
    s = u32_add(23 - mbits, extra)
    q = round_significand(m, s, neg, rnd, ext, mode)
    t = u32_add(e1, off)  # e + B - 1, the code's exponent field before rounding, if positive
    expo = t if i32_positive(t) else u32_and(t, 0)
    mag = u32_add(u32_shl(expo, mbits), q)

    # Overflow: saturate, or IEEE's rule for directed modes, or the format's overflow code.
    toward_zero = (
        (mode == TOWARD_ZERO) | ((mode == TOWARD_POSITIVE) & (neg == 1)) | ((mode == TOWARD_NEGATIVE) & (neg == 0))
    )
    sign_bit = 1 << (bits - 1)
    if specials == IEEE:
        inf_out = inf_code
    elif specials == FN:
        inf_out = nan_code
    elif specials == FNUZ:
        inf_out = sign_bit
    else:
        inf_out = max_code
    over = max_code if (saturate or toward_zero) else inf_out
    mag = over if mag > max_code else mag

    # Infinity and NaN inputs.
    if specials == IEEE and payload:
        pay = u32_shr(frac, 23 - mbits)
        nan_out = u32_or(inf_code, pay if pay != 0 else u32_or(pay, 1))
    elif specials == NONE or specials == FNUZ:
        nan_out = sign_bit  # fnuz: the one NaN; float6/float4 (ml_dtypes): the -0 code, flipped by the sign
    elif specials == FIXED:
        nan_out = u32_and(sign_bit, 0)
    else:
        nan_out = nan_code
    mag = (max_code if saturate else inf_out) if a == 0x7F800000 else mag
    mag = nan_out if a > 0x7F800000 else mag

    # The sign: XOR (ml_dtypes' rule for float6/float4; the same as OR elsewhere), except that
    # fnuz formats have no negative zero and a single NaN, fixed-point codes negate, and an
    # unsigned format has no negative values (a float64 below float32's range has ext != 0).
    if c.sign_bit == 0:
        return u32_or(u32_and(mag, 0), nan_code) if (neg == 1) & ((a != 0) | (ext != 0)) else mag
    if specials == FIXED:
        return u32_and(u32_sub(0, mag), (1 << bits) - 1) if neg == 1 else mag
    signed = (mag != 0) & (mag < sign_bit) if specials == FNUZ else mag == mag
    return u32_xor(mag, u32_shl(neg, bits - 1)) if signed else mag


@jit
def encode_e8m0(u, rnd, ext, mode, saturate):  # pragma: no cover - compiled
    """Code of the float32 pattern ``u`` in float8_e8m0fnu: the nearest power of two, ties to even.

    Consecutive codes are a binade apart, so the decision is about the significand's position
    in its own binade (midpoint 1.5 * 2^e); float32 subnormals above 2^-127 are placed in the
    binade [2^-127, 2^-126) the same way. 0, negatives, NaN -> 0xff; overflow -> 0xff, or 0xfe
    under ``saturate``. Below 2^-127 there is no smaller value: every mode gives 0x00 (2^-127),
    except the two that round such a positive value down (toward zero, toward negative), which
    give 0xff as for zero itself, since a directed rounding never moves past its direction.
    ``rnd`` and ``ext`` are those of :func:`round_significand`.
    """
    e_bits = u32_shr(u, 23)  # the sign is bit 8 of this: negatives are >= 256
    frac = u32_and(u, 0x7FFFFF)
    # float32 subnormals: (2^-127, 2^-126) maps onto code 0 with a significand twice the excess
    sub_frac = u32_shl(u32_sub(frac, 0x400000), 1) if frac > 0x400000 else u32_and(frac, 0)
    f = frac if e_bits > 0 else sub_frac
    below = (e_bits == 0) & (frac < 0x400000)  # 0 < x < 2^-127 (x = 0 is refused below)
    if mode == NEAREST_EVEN:
        up = (f > 0x400000) | ((f == 0x400000) & (u32_and(e_bits, 1) == 1))
    elif mode == NEAREST_AWAY:
        up = f >= 0x400000
    elif mode == TOWARD_POSITIVE:
        up = f != 0
    elif mode == STOCHASTIC:
        # the fraction of the binade as 32 bits: f has 23 (normal) or 22 (subnormal) of them
        sub_ext = u32_shr(ext, 22) if frac >= 0x400000 else u32_and(ext, 0)
        up = rnd < u32_add(u32_shl(f, 9), u32_shr(ext, 23) if e_bits > 0 else sub_ext)
    else:
        up = f != f
    code = u32_add(e_bits, up)
    top = 0xFE if saturate else 0xFF
    code = top if code > 0xFE else code
    code = top if u == 0x7F800000 else code
    if mode == TOWARD_ZERO or mode == TOWARD_NEGATIVE:
        code = 0xFF if below else code
    zero = (u32_and(u, 0x7FFFFFFF) == 0) & (ext == 0)  # ext != 0: a float64 below float32's range
    invalid = (e_bits > 0xFF) | zero | (u32_and(u, 0x7FFFFFFF) > 0x7F800000)
    return 0xFF if invalid else code


@jit
def decode(c, f):  # pragma: no cover - compiled
    """The float32 pattern of code ``c`` of the format of :class:`Codec` ``f`` (exact; NaN codes
    give a quiet NaN, or keep the payload)."""
    mbits, bias, bits, specials, payload = f.mbits, f.bias, f.bits, f.specials, f.payload_decode
    if specials == E8M0:
        v = u32_shl(c, 23) if c != 0 else u32_or(c, 0x400000)
        return 0x7FC00000 if c == 0xFF else v
    if specials == FIXED:  # the two's-complement integer of ``bits`` bits, times 2^-mbits (exact)
        signed = np.int32(u32_shl(c, 32 - bits)) >> (32 - bits)
        return f32_bits(np.float32(signed) * np.float32(2.0**-mbits))
    sign_bit = 1 << (bits - 1)
    neg = c >= sign_bit if specials == NONE else u32_and(c, f.sign_bit) != 0
    mag = u32_and(c, sign_bit - 1 if f.sign_bit != 0 else 0xFFFFFFFF)
    ex = u32_shr(mag, mbits)
    mant = u32_and(mag, (1 << mbits) - 1)
    normal = u32_add(u32_shl(mag, 23 - mbits), (127 - bias) << 23)
    # subnormal: 2^(1-B) * (1 + mant/2^M) - 2^(1-B), exact in float32 (no int-to-float conversion)
    one_plus = f32_from_bits(u32_or((128 - bias) << 23, u32_shl(mant, 23 - mbits)))
    sub = f32_bits(one_plus - np.float32(2.0 ** (1 - bias)))
    v = normal if ex != 0 else sub
    top = (1 << (bits - 1 - mbits)) - 1
    if specials == IEEE:
        quiet = u32_or(u32_and(mant, 0), 0x7FC00000)
        nan = u32_or(u32_shl(mant, 23 - mbits), 0x7F800000) if payload else quiet
        v = (0x7F800000 if mant == 0 else nan) if ex == top else v
    elif specials == FN:
        v = 0x7FC00000 if mag == f.nan_code else v
    v = u32_or(v, u32_shl(neg, 31))
    if specials == FNUZ:
        v = 0xFFC00000 if c == sign_bit else v
    return v


@jit
def _mix32(x):  # pragma: no cover - compiled
    """A 32-bit integer hash with good avalanche (xorshift-multiply, as in 'lowbias32')."""
    x = u32_xor(x, u32_shr(x, 16))
    x = u32_mul(x, 0x7FEB352D)
    x = u32_xor(x, u32_shr(x, 15))
    x = u32_mul(x, 0x846CA68B)
    return u32_xor(x, u32_shr(x, 16))


@jit
def _f64_to_f32_odd(x):  # pragma: no cover - compiled
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
def _int_to_f32_odd(x):  # pragma: no cover - compiled
    """Integer -> float32 pattern rounded to odd, with no rounding on the way: a magnitude below
    2^53 is a float64 as it is; from 2^53 on, float32's ulp is at least 2^30, so the bits below
    2^21 only decide the odd bit, and the rest (at most 43 significant bits) is a float64."""
    neg = x < 0
    m = np.uint64(0) - np.uint64(x) if neg else np.uint64(x)
    low = m & np.uint64(0x1FFFFF)
    if m < np.uint64(1 << 53):
        b = _f64_to_f32_odd(np.float64(m))
    else:
        b = u32_or(_f64_to_f32_odd(np.float64(m - low)), low != np.uint64(0))
    return u32_or(b, 0x80000000) if neg else b


@jit
def _f64_to_f32_truncated(x):  # pragma: no cover - compiled
    """float64 -> float32 pattern rounded toward zero; +-inf from 2^128 on (past every target's
    largest value, as float32's own infinity is); NaN as numpy converts it."""
    y = np.float32(x)
    b = f32_bits(y)
    b = u32_sub(b, 1) if abs(np.float64(y)) > abs(x) else b
    return u32_or(u32_and(b, 0x80000000), 0x7F800000) if abs(x) >= 2.0**128 else b


@jit
def _f64_rest(x, u):  # pragma: no cover - compiled
    """The part of ``|x|`` below its truncation ``u`` (:func:`_f64_to_f32_truncated`), as a 32-bit
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


@jit
def random_bits(key_lo, key_hi, idx):  # pragma: no cover - compiled
    """32 random bits for element ``idx`` of an array: a hash of (key, idx), nothing else.

    With the key (:func:`neuron_kernels._random.stream_key` of the seed) split into 32-bit halves
    ``key_lo``/``key_hi`` and ``idx`` into ``idx_lo``/``idx_hi``:
    ``mix32(((mix32(idx_lo ^ key_lo) + idx_hi) mod 2^32) ^ key_hi)``.
    Stochastic rounding rounds a magnitude up when these bits, read as an unsigned integer, are
    below ``floor(2^32 * f)``, ``f`` being the discarded fraction of an ulp.
    """
    h = _mix32(u32_xor(np.uint32(idx & 0xFFFFFFFF), key_lo))
    return _mix32(u32_xor(u32_add(h, np.uint32((idx >> 32) & 0xFFFFFFFF)), key_hi))


@jit
def load(x, source, c):  # pragma: no cover - compiled
    """The float32 pattern of one source item of kind ``source`` (``SOURCE_*``; codes are decoded
    with the source's :class:`Codec` ``c``), the kind a run-time value: the block kernels' shared
    helpers read every source of a row type with it. A cast kernel calls its :func:`loader`."""
    if source == SOURCE_F32:
        return x
    if source == SOURCE_F64_NEAREST or source == SOURCE_INT:
        return f32_bits(np.float32(x))
    if source == SOURCE_F64_ODD:
        return _f64_to_f32_odd(x)
    if source == SOURCE_INT_ODD:
        return _int_to_f32_odd(x)
    if source == SOURCE_F64_SPLIT:
        return _f64_to_f32_truncated(x)
    if source == SOURCE_BF16:
        return u32_shl(x, 16)
    if source == SOURCE_F16:
        return _f16_to_f32(x)
    return decode(x, c)


@jit
def _f16_to_f32(x):  # pragma: no cover - compiled
    """float16 code -> float32 pattern, exact: the hardware conversion, except that a NaN keeps
    its payload bits as they are (the conversion would make a signalling NaN quiet)."""
    h = u32_and(x, 0xFFFF)
    nan = u32_or(u32_or(u32_shl(u32_and(h, 0x8000), 16), 0x7F800000), u32_shl(u32_and(h, 0x3FF), 13))
    return nan if u32_and(h, 0x7FFF) > np.uint32(0x7C00) else f16_to_f32_bits(h)


class Store(NamedTuple):
    """What a kernel makes of a float32 pattern: the source and target kinds, the target's
    :class:`Codec`, the rounding mode id and saturation."""

    source: int
    target: int
    codec: Codec
    mode: int
    saturate: bool


# The loaders and storers of the cast kernels: one small function per source kind and per kind of
# target, which :func:`loader` and :func:`storer` pick where a kernel is made. A kernel then
# compiles the path it takes and no other: a call's first cast compiles in half the time of one
# that types every source kind and every target (the decoder, the float64 paths, both encoders).


@jit
def _load_pattern(x, c):  # pragma: no cover - compiled
    return x


@jit
def _load_rounded(x, c):  # pragma: no cover - compiled
    return f32_bits(np.float32(x))


@jit
def _load_f64_odd(x, c):  # pragma: no cover - compiled
    return _f64_to_f32_odd(x)


@jit
def _load_int_odd(x, c):  # pragma: no cover - compiled
    return _int_to_f32_odd(x)


@jit
def _load_f64_truncated(x, c):  # pragma: no cover - compiled
    return _f64_to_f32_truncated(x)


@jit
def _load_bf16(x, c):  # pragma: no cover - compiled
    return u32_shl(x, 16)


@jit
def _load_f16(x, c):  # pragma: no cover - compiled
    return _f16_to_f32(x)


_LOADERS = {
    SOURCE_F32: _load_pattern,
    SOURCE_F64_NEAREST: _load_rounded,
    SOURCE_INT: _load_rounded,
    SOURCE_F64_ODD: _load_f64_odd,
    SOURCE_INT_ODD: _load_int_odd,
    SOURCE_F64_SPLIT: _load_f64_truncated,
    SOURCE_BF16: _load_bf16,
    SOURCE_F16: _load_f16,
    SOURCE_CODES: decode,
}


def loader(source: int) -> Any:
    """The compiled ``(x, codec) -> float32 pattern`` of one source item of kind ``source``
    (``SOURCE_*``; codes are decoded with the source's :class:`Codec`)."""
    return _LOADERS[source]


@jit
def _store_pattern(x, u, rnd, how):  # pragma: no cover - compiled
    return u


@jit
def _store_f64(x, u, rnd, how):  # pragma: no cover - compiled
    return np.float64(f32_from_bits(u))


@jit
def _store_f64_of_int(x, u, rnd, how):  # pragma: no cover - compiled
    return np.float64(x)


@jit
def _store_code(x, u, rnd, how):  # pragma: no cover - compiled
    return u32_shl(encode(u, rnd, np.uint32(0), how.codec, how.mode, how.saturate), how.codec.shift)


@jit
def _store_code_split(x, u, rnd, how):  # pragma: no cover - compiled
    return u32_shl(encode(u, rnd, _f64_rest(x, u), how.codec, how.mode, how.saturate), how.codec.shift)


@jit
def _store_e8m0(x, u, rnd, how):  # pragma: no cover - compiled
    return encode_e8m0(u, rnd, np.uint32(0), how.mode, how.saturate)


@jit
def _store_e8m0_split(x, u, rnd, how):  # pragma: no cover - compiled
    return encode_e8m0(u, rnd, _f64_rest(x, u), how.mode, how.saturate)


def storer(how: Store) -> Any:
    """The compiled ``(x, u, rnd, how) -> target item`` of the float32 pattern ``u`` (``x`` is the
    source item it came from, ``rnd`` the random bits of stochastic rounding), as :class:`Store`
    ``how`` says: the pattern itself, a float64, or a code (float64 sources split for stochastic
    rounding also pass on the bits below the float32 truncation)."""
    if how.target == TARGET_F32:
        return _store_pattern
    if how.target == TARGET_F64:
        return _store_f64_of_int if how.source == SOURCE_INT else _store_f64
    split = how.source == SOURCE_F64_SPLIT
    if how.codec.specials == E8M0:
        return _store_e8m0_split if split else _store_e8m0
    return _store_code_split if split else _store_code


@cache
def make_cast_kernel(
    source: int,
    src_codec: Codec,
    target: int,
    dst_codec: Codec,
    mode: int,
    saturate: bool,
    layout: int = ELEMENTWISE,
) -> Any:
    """Kernel ``(src, dst, key, start)`` casting 1-D arrays.

    ``source`` is one of ``SOURCE_*`` (codes need ``src_codec``), ``target`` one of ``TARGET_*``
    (codes need ``dst_codec``; :data:`NO_CODEC` where there is none). Codes and float32 patterns
    are passed as unsigned-int views, float64 and integers as they are. ``layout``:
    ``ELEMENTWISE``; ``PACK_NIBBLES`` (two 4-bit codes per output byte, element 2k in the low
    nibble); ``UNPACK_NIBBLES`` (the reverse). ``key`` seeds the stochastic rounding: element
    ``start + i`` uses the hash of (key, start + i), so results do not depend on how the array
    was split.
    """
    stochastic = mode == STOCHASTIC
    how = Store(source, target, dst_codec, mode, bool(saturate))
    load_item, store_item = loader(source), storer(how)

    # One loop per kernel, chosen here rather than inside the kernel: with a single call site
    # LLVM inlines the helpers into the loop and vectorises it (inlining them in numba's IR
    # instead triples the compile time for the same machine code).
    if layout == ELEMENTWISE:

        @jit
        def kernel(src, dst, key, start):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            rnd = np.uint32(0)
            for i in range(src.size):
                if stochastic:
                    rnd = random_bits(key_lo, key_hi, start + i)
                u = load_item(src[i], src_codec)
                dst[i] = store_item(src[i], u, rnd, how)

    elif layout == PACK_NIBBLES:

        @jit
        def kernel(src, dst, key, start):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            rnd_lo = np.uint32(0)
            rnd_hi = np.uint32(0)
            for k in range(dst.size):
                if stochastic:
                    rnd_lo = random_bits(key_lo, key_hi, start + 2 * k)
                    rnd_hi = random_bits(key_lo, key_hi, start + 2 * k + 1)
                a = src[2 * k]
                b = src[2 * k + 1]
                lo = store_item(a, load_item(a, src_codec), rnd_lo, how)
                hi = store_item(b, load_item(b, src_codec), rnd_hi, how)
                dst[k] = u32_or(u32_and(lo, 0xF), u32_shl(u32_and(hi, 0xF), 4))

    else:

        @jit
        def kernel(src, dst, key, start):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            rnd_lo = np.uint32(0)
            rnd_hi = np.uint32(0)
            for k in range(src.size):
                if stochastic:
                    rnd_lo = random_bits(key_lo, key_hi, start + 2 * k)
                    rnd_hi = random_bits(key_lo, key_hi, start + 2 * k + 1)
                a = u32_and(src[k], 0xF)
                b = u32_shr(u32_and(src[k], 0xFF), 4)
                dst[2 * k] = store_item(a, load_item(a, src_codec), rnd_lo, how)
                dst[2 * k + 1] = store_item(b, load_item(b, src_codec), rnd_hi, how)

    return kernel


@jit
def copy_items(src, dst, key, start):  # pragma: no cover - compiled
    """Item by item with C conversion semantics (integer to integer: wrap, as numpy does)."""
    for i in range(src.size):
        dst[i] = src[i]


@jit
def pack_nibbles(src, dst, key, start):  # pragma: no cover - compiled
    """4-bit codes (one per byte) to bytes of two, element 2k in the low nibble; bits kept as they are."""
    for k in range(dst.size):
        dst[k] = u32_or(u32_and(src[2 * k], 0xF), u32_shl(u32_and(src[2 * k + 1], 0xF), 4))


@jit
def unpack_nibbles(src, dst, key, start):  # pragma: no cover - compiled
    """The inverse of :func:`pack_nibbles`."""
    for k in range(src.size):
        dst[2 * k] = u32_and(src[k], 0xF)
        dst[2 * k + 1] = u32_shr(u32_and(src[k], 0xFF), 4)


@jit
def look_up_items(src, table, dst):  # pragma: no cover - compiled
    """``dst[i] = table[src[i]]``: a cast of codes through the table of its results for every
    code (see :func:`neuron_kernels.kernels.compiled._by_table`)."""
    for i in range(src.size):
        dst[i] = table[src[i]]
