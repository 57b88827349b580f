"""The generic encoder and decoder: float32 bit patterns <-> the codes of every float format.

One encoder and one decoder, written once over the parameters of the format table and
specialised per (source, target, rounding, saturate) by :func:`~.cast_loops.make_cast_kernel`, which
closes over plain ints only (so every specialisation is cached on disk on its own). Where the
float32 patterns come from is :mod:`.loaders`; the random bits of stochastic rounding are
:mod:`.hashing`'s.

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

from typing import NamedTuple

import numpy as np

from .._jit import (
    f32_bits,
    f32_from_bits,
    i32_positive,
    jit,
    u32_add,
    u32_and,
    u32_or,
    u32_shl,
    u32_shr,
    u32_sub,
    u32_xor,
)
from ..errors import InvalidValueError
from ..formats import SPECIALS, Format
from ..modes import ROUNDING_MODES

__all__ = ["Codec", "NO_CODEC", "codec_of", "mode_id", "encode", "encode_e8m0", "decode", "round_significand"]

IEEE, FN, FNUZ, NONE, E8M0, FIXED = (SPECIALS.index(k) for k in ("ieee", "fn", "fnuz", "none", "e8m0", "fixed"))

# Rounding modes, as ints for the kernels: their position in ROUNDING_MODES.
MODE_IDS = {name: i for i, name in enumerate(ROUNDING_MODES)}
NEAREST_EVEN, NEAREST_AWAY, TOWARD_ZERO = MODE_IDS["nearest_even"], MODE_IDS["nearest_away"], MODE_IDS["toward_zero"]
TOWARD_POSITIVE, TOWARD_NEGATIVE = MODE_IDS["toward_positive"], MODE_IDS["toward_negative"]
STOCHASTIC = MODE_IDS["stochastic"]


def mode_id(rounding: str) -> int:
    """The kernels' id of a rounding mode of ``ROUNDING_MODES``."""
    return MODE_IDS[rounding]


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
