"""Slow, obviously-correct reference for the elementwise casts of ``docs/casts.md``.

Nothing here shares code with the package, and nothing copies the spec's bit-level pseudocode.
Every format is described by a small table written out from the spec (``FORMATS_REF``); from it
we enumerate the sorted list of all finite non-negative values of the format, where the value at
index ``i`` is the value of magnitude code ``i``. Encoding an input then means: take its exact
value, find the two neighbouring representable magnitudes, pick one according to the rounding
mode, and apply the format's rules for signs, NaN, infinity and overflow.

Exactness: every float32 is exact in float64; every representable value of these formats is a
float32 (hence a float64); two neighbouring values have at most 24 significant bits each and lie
within a factor of two of each other, so their sum and half-sum are exact in float64 as well.
The comparisons below are therefore exact. The stochastic threshold uses ``fractions.Fraction``.

Public names:

- ``FORMATS_REF``: name -> ``FormatRef`` (the table)
- ``ROUNDING_MODES``: the rounding-mode vocabulary
- ``magnitudes_ref(name)``: the sorted finite non-negative values, index = magnitude code
- ``encode_ref(x, name, rounding, saturate, rand)``: float32 values -> codes
- ``decode_ref(codes, name)``: codes -> float32 values
- ``float64_to_target_ref(x64, name)``: float64 rounded to float32 first, then encoded (how the
  block formats read float64; ml_dtypes 0.6.0's casts)
- ``encode_float64_ref(x64, name, rounding, saturate, rand)``: float64 values -> codes, rounding
  the exact float64 value once (no intermediate float32)
- ``int_to_target_ref(x, name, rounding, saturate)``: integers -> codes, one rounding of the integer
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

ROUNDING_MODES = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
)


@dataclass(frozen=True)
class FormatRef:
    """One target format, as written in the spec's table.

    A code is ``sign | (magnitude_code << code_shift)`` where the magnitude code is
    ``(biased_exponent << mbits) | mantissa`` and the sign bit sits just above the magnitude.

    Attributes
    ----------
    ebits, mbits, bias:
        Exponent bits, explicit mantissa bits, exponent bias.
    container:
        The unsigned integer dtype that holds one code.
    max_code:
        Magnitude code of the largest finite value (the table's "max (code)").
    max_finite, min_normal, min_subnormal:
        The table's values (used by the tests to check the enumeration of the format).
    inf:
        True when exponent all-ones with a zero mantissa means +-inf.
    nan:
        Which codes are NaN: ``"ieee"`` (exponent all ones, mantissa non-zero), ``"fn"`` (only the
        all-ones magnitude), ``"fnuz"`` (only the negative-zero code 0x80), ``"e8m0"`` (0xff),
        ``"none"`` (float6 / float4: every code is a number).
    nan_codes:
        The codes that encoding gives for (+NaN, -NaN). For float6/float4 these are ml_dtypes'
        quirk: +NaN -> the -0 code, -NaN -> the +0 code.
    nan_payload_encode:
        float16 only: a NaN keeps the top mantissa bits of the float32 payload (numpy's rule:
        ``sign | 0x7c00 | (F >> 13)``, made 1 if that mantissa is 0).
    nan_payload_decode:
        NaN codes decode by widening the payload (bfloat16, float16, tfloat32); otherwise a NaN
        code decodes to the quiet NaN of the code's sign (0x7fc00000 / 0xffc00000).
    signed_zero:
        False for fnuz and e8m0: there is no -0, so results that round to zero are +0.
    overflow:
        What a finite overflow gives by default: ``"inf"``, ``"nan"`` (the NaN code of the sign)
        or ``"max"`` (float6 / float4 saturate). +-inf inputs give the same code.
    signed:
        False for e8m0 and e5m3fnu (no sign bit): negatives are NaN, -0 is 0 (e8m0: 0 is NaN too).
    subnormals:
        False only for e8m0 (code 0 is 2^-127, not zero).
    code_shift:
        13 for tfloat32 (the code is a float32 bit pattern with the low 13 bits zero), else 0.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    container: type
    max_code: int
    max_finite: float
    min_normal: float
    min_subnormal: float
    inf: bool
    nan: str
    nan_codes: tuple[int, int]
    nan_payload_encode: bool
    nan_payload_decode: bool
    signed_zero: bool
    overflow: str
    signed: bool = True
    subnormals: bool = True
    code_shift: int = 0

    @property
    def sign_bit(self) -> int:
        """The sign bit of a code (0 for the unsigned e8m0)."""
        return (1 << (self.ebits + self.mbits + self.code_shift)) if self.signed else 0

    @property
    def inf_code(self) -> int:
        """Magnitude code of +inf (exponent all ones, mantissa 0), or -1 if there is none."""
        return ((1 << self.ebits) - 1) << self.mbits if self.inf else -1

    def value_of_magnitude_code(self, c: int) -> float:
        """Exact value of magnitude code ``c`` read as a finite number (also past ``max_code``).

        Normal: (2^M + f) * 2^(e - bias - M); subnormal (e == 0): f * 2^(1 - bias - M).
        """
        e, f = c >> self.mbits, c & ((1 << self.mbits) - 1)
        if e == 0 and self.subnormals:
            return math.ldexp(f, 1 - self.bias - self.mbits)
        return math.ldexp((1 << self.mbits) + f, e - self.bias - self.mbits)


def _ieee(
    name,
    ebits,
    mbits,
    bias,
    container,
    max_code,
    max_finite,
    min_normal,
    min_subnormal,
    nan_codes,
    nan_payload_encode=False,
    nan_payload_decode=False,
    code_shift=0,
):
    """An IEEE-like format: +-inf, NaN with exponent all ones, -0, overflow to +-inf."""
    return FormatRef(
        name,
        ebits,
        mbits,
        bias,
        container,
        max_code,
        max_finite,
        min_normal,
        min_subnormal,
        inf=True,
        nan="ieee",
        nan_codes=nan_codes,
        nan_payload_encode=nan_payload_encode,
        nan_payload_decode=nan_payload_decode,
        signed_zero=True,
        overflow="inf",
        code_shift=code_shift,
    )


def _fnuz(name, ebits, mbits, bias, max_finite, min_normal, min_subnormal):
    """A finite, unsigned-zero 8-bit format: NaN is 0x80 only, no -0, overflow to NaN."""
    return FormatRef(
        name,
        ebits,
        mbits,
        bias,
        np.uint8,
        0x7F,
        max_finite,
        min_normal,
        min_subnormal,
        inf=False,
        nan="fnuz",
        nan_codes=(0x80, 0x80),
        nan_payload_encode=False,
        nan_payload_decode=False,
        signed_zero=False,
        overflow="nan",
    )


def _small_fn(name, ebits, mbits, bias, max_code, max_finite, min_normal, min_subnormal):
    """A float6 / float4 format: no inf, no NaN, -0 exists, overflow saturates.

    NaN inputs follow ml_dtypes: +NaN -> the -0 code, -NaN -> the +0 code.
    """
    sign_bit = 1 << (ebits + mbits)
    return FormatRef(
        name,
        ebits,
        mbits,
        bias,
        np.uint8,
        max_code,
        max_finite,
        min_normal,
        min_subnormal,
        inf=False,
        nan="none",
        nan_codes=(sign_bit, 0x00),
        nan_payload_encode=False,
        nan_payload_decode=False,
        signed_zero=True,
        overflow="max",
    )


FORMATS_REF: dict[str, FormatRef] = {
    f.name: f
    for f in (
        _ieee(
            "bfloat16",
            8,
            7,
            127,
            np.uint16,
            0x7F7F,
            (2 - 2.0**-7) * 2.0**127,
            2.0**-126,
            2.0**-133,
            nan_codes=(0x7FC0, 0xFFC0),
            nan_payload_decode=True,
        ),
        _ieee(
            "float16",
            5,
            10,
            15,
            np.uint16,
            0x7BFF,
            65504.0,
            2.0**-14,
            2.0**-24,
            nan_codes=(0x7E00, 0xFE00),
            nan_payload_encode=True,
            nan_payload_decode=True,
        ),
        _ieee("float8_e4m3", 4, 3, 7, np.uint8, 0x77, 240.0, 2.0**-6, 2.0**-9, nan_codes=(0x7C, 0xFC)),
        FormatRef(
            "float8_e4m3fn",
            4,
            3,
            7,
            np.uint8,
            0x7E,
            448.0,
            2.0**-6,
            2.0**-9,
            inf=False,
            nan="fn",
            nan_codes=(0x7F, 0xFF),
            nan_payload_encode=False,
            nan_payload_decode=False,
            signed_zero=True,
            overflow="nan",
        ),
        _fnuz("float8_e4m3fnuz", 4, 3, 8, 240.0, 2.0**-7, 2.0**-10),
        _fnuz("float8_e4m3b11fnuz", 4, 3, 11, 30.0, 2.0**-10, 2.0**-13),
        _ieee("float8_e5m2", 5, 2, 15, np.uint8, 0x7B, 57344.0, 2.0**-14, 2.0**-16, nan_codes=(0x7E, 0xFE)),
        _fnuz("float8_e5m2fnuz", 5, 2, 16, 57344.0, 2.0**-15, 2.0**-17),
        _ieee("float8_e3m4", 3, 4, 3, np.uint8, 0x6F, 15.5, 2.0**-2, 2.0**-6, nan_codes=(0x78, 0xF8)),
        # ml_dtypes 0.7.0's unsigned FP8: no sign bit, subnormals, 0xff the only NaN, no infinity
        FormatRef(
            "float8_e5m3fnu",
            5,
            3,
            15,
            np.uint8,
            0xFE,
            114688.0,
            2.0**-14,
            2.0**-17,
            inf=False,
            nan="fn",
            nan_codes=(0xFF, 0xFF),
            nan_payload_encode=False,
            nan_payload_decode=False,
            signed_zero=False,
            overflow="nan",
            signed=False,
        ),
        _small_fn("float6_e2m3fn", 2, 3, 1, 0x1F, 7.5, 1.0, 0.125),
        _small_fn("float6_e3m2fn", 3, 2, 3, 0x1F, 28.0, 0.25, 0.0625),
        _small_fn("float4_e2m1fn", 2, 1, 1, 0x07, 6.0, 1.0, 0.5),
        FormatRef(
            "float8_e8m0fnu",
            8,
            0,
            127,
            np.uint8,
            0xFE,
            2.0**127,
            2.0**-127,
            2.0**-127,
            inf=False,
            nan="e8m0",
            nan_codes=(0xFF, 0xFF),
            nan_payload_encode=False,
            nan_payload_decode=False,
            signed_zero=False,
            overflow="nan",
            signed=False,
            subnormals=False,
        ),
        _ieee(
            "tfloat32",
            8,
            10,
            127,
            np.uint32,
            (254 << 10) | 0x3FF,
            (2 - 2.0**-10) * 2.0**127,
            2.0**-126,
            2.0**-136,
            nan_codes=(0x7FC00000, 0xFFC00000),
            nan_payload_decode=True,
            code_shift=13,
        ),
    )
}


@functools.cache
def _magnitude_table(name: str) -> tuple[list[float], float]:
    """(values, beyond): values[c] is the value of magnitude code c for c = 0..max_code (sorted,
    all finite); ``beyond`` is the value the next code would have if the exponent range went on
    (max + one ulp; 2^128 for e8m0). Rounding up to ``beyond`` means overflow."""
    fmt = FORMATS_REF[name]
    values = [fmt.value_of_magnitude_code(c) for c in range(fmt.max_code + 1)]
    assert all(a < b for a, b in zip(values, values[1:])), name
    return values, fmt.value_of_magnitude_code(fmt.max_code + 1)


def magnitudes_ref(name: str) -> np.ndarray:
    """All finite non-negative values of format ``name`` in increasing order (float64, exact);
    the value at index ``c`` is the value of magnitude code ``c``."""
    return np.array(_magnitude_table(name)[0], dtype=np.float64)


def _float32_bits(v: float) -> int:
    """The float32 bit pattern of a float64 value that is exactly a float32."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


# ---- encode -----------------------------------------------------------------------------------


def _magnitude_direction(rounding: str, negative: bool) -> str:
    """The rounding mode restated for the magnitude |x|: directed modes become "down" / "up"."""
    if rounding == "toward_zero":
        return "down"
    if rounding == "toward_positive":
        return "down" if negative else "up"
    if rounding == "toward_negative":
        return "up" if negative else "down"
    return rounding  # nearest_even, nearest_away and stochastic do not depend on the sign


def _round_magnitude(a: float, values: list[float], beyond: float, mode: str, r: int) -> int:
    """Round the exact magnitude ``a >= 0`` to a magnitude code.

    Returns an index into ``values``, or ``len(values)`` meaning "overflow" (rounded past the
    largest finite value), or -1 when rounding down finds no value (e8m0 below its smallest).
    ``mode`` is "down", "up", "nearest_even", "nearest_away" or
    "stochastic" (with ``r`` the uint32 random draw).
    """
    n = len(values)
    if a < values[0]:  # only e8m0 has a smallest value above zero: nothing smaller exists
        return -1 if mode == "down" else 0  # rounding down finds no value (-1), the others the smallest
    i = bisect.bisect_right(values, a) - 1  # values[i] <= a < values[i + 1]
    lo = values[i]
    if a == lo:
        return i  # exact: every mode keeps it
    hi = values[i + 1] if i + 1 < n else beyond
    if a >= hi:  # at or past the virtual value after the max: overflow unless rounding down
        return n - 1 if mode == "down" else n
    if mode == "down":
        return i
    if mode == "up":
        return i + 1
    if mode == "stochastic":
        threshold = math.floor(Fraction(2**32) * (Fraction(a) - Fraction(lo)) / (Fraction(hi) - Fraction(lo)))
        return i + 1 if r < threshold else i
    mid = (lo + hi) / 2
    if a < mid:
        return i
    if a > mid:
        return i + 1
    if mode == "nearest_away":
        return i + 1
    return i if i % 2 == 0 else i + 1  # nearest_even: the even code (= even mantissa)


def _nan_code(fmt: FormatRef, bits: int) -> int:
    """The code for a float32 NaN with bit pattern ``bits``."""
    negative = bits >> 31
    if fmt.nan_payload_encode:  # float16: keep the top of the payload, never give the inf code
        mantissa = (bits & 0x7FFFFF) >> (23 - fmt.mbits)
        if mantissa == 0:
            mantissa = 1
        return (fmt.sign_bit if negative else 0) | (fmt.inf_code << fmt.code_shift) | (mantissa << fmt.code_shift)
    return fmt.nan_codes[negative]


def _overflow_code(fmt: FormatRef, negative: bool, saturate: bool) -> int:
    """The code of a value beyond the largest finite one (including +-inf inputs)."""
    sign = fmt.sign_bit if negative else 0
    if saturate or fmt.overflow == "max":
        return sign | (fmt.max_code << fmt.code_shift)
    if fmt.overflow == "inf":
        return sign | (fmt.inf_code << fmt.code_shift)
    return fmt.nan_codes[int(negative)]


def _encode_one(fmt: FormatRef, bits: int, x: float, mode: str, saturate: bool, r: int) -> int:
    """Encode one float32 (bit pattern ``bits``, exact value ``x``) to a code of ``fmt``."""
    negative = bool(bits >> 31)
    if math.isnan(x):
        return _nan_code(fmt, bits)
    if not fmt.signed and (negative or x == 0.0) and not (x == 0.0 and fmt.subnormals):
        return fmt.nan_codes[0]  # unsigned: negatives and -inf are NaN; e8m0 (no zero): 0 and -0 too
    if math.isinf(x):
        return _overflow_code(fmt, negative, saturate)
    values, beyond = _magnitude_table(fmt.name)
    c = _round_magnitude(abs(x), values, beyond, _magnitude_direction(mode, negative), r)
    if c < 0:
        return fmt.nan_codes[0]  # e8m0 has no zero: a value rounded down below 2^-127 is NaN, as 0 is
    if c > fmt.max_code:
        return _overflow_code(fmt, negative, saturate)
    sign = fmt.sign_bit if negative and (c != 0 or fmt.signed_zero) else 0
    return sign | (c << fmt.code_shift)


def encode_ref(x, name: str, rounding: str = "nearest_even", saturate: bool = False, rand=None) -> np.ndarray:
    """Encode float32 values into format ``name``; returns the codes (same shape as ``x``).

    Parameters
    ----------
    x:
        float32 values, any bit patterns (NaN payloads, signalling NaNs, subnormals). Anything
        that is not float32 is first converted to float32 by numpy (round to nearest even).
    name:
        A key of ``FORMATS_REF``.
    rounding:
        One of ``ROUNDING_MODES``. ``nearest_even`` / ``nearest_away``: the nearest representable
        value, ties to the even code / away from zero. ``toward_zero`` / ``toward_positive`` /
        ``toward_negative``: the neighbour in that direction. ``stochastic``: with lo <= |x| < hi
        the neighbouring magnitudes, |x| goes up to hi iff ``rand < floor(2^32 (|x|-lo)/(hi-lo))``.
        A finite value rounded toward zero never overflows (gives +-max); one rounded away from
        zero past the max gives the overflow code. Above the max, ``hi`` is the value the next
        code would have if the exponent range continued (max + ulp; 2^128 for e8m0). e8m0 has no
        value below 2^-127: a positive value below it rounded down (toward zero or negative)
        gives 0xff, as zero does; every other mode gives 0x00.
    saturate:
        Every finite overflow and +-inf becomes +-max finite. NaN stays NaN (float6/float4 keep
        ml_dtypes' NaN encoding); e8m0 still maps 0, negatives and NaN to 0xff.
    rand:
        uint32 draws broadcastable to ``x``'s shape; required for ``stochastic``.

    Returns
    -------
    numpy.ndarray
        uint8 codes (8/6/4-bit formats), uint16 (bfloat16, float16) or uint32 float32 bit
        patterns with the low 13 bits zero (tfloat32).
    """
    fmt = FORMATS_REF[name]
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDING_MODES}")
    with np.errstate(over="ignore", invalid="ignore"):  # signalling NaNs may raise "invalid"
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        shape = x32.shape
        bits = x32.reshape(-1).view(np.uint32).tolist()
        vals = x32.reshape(-1).astype(np.float64).tolist()
    if rounding == "stochastic":
        if rand is None:
            raise ValueError("rounding='stochastic' needs rand (uint32 per element)")
        rand = np.asarray(rand)
        if rand.dtype.kind not in "ui" or (rand.size and (rand.min() < 0 or rand.max() > 0xFFFFFFFF)):
            raise ValueError("rand must hold integers in [0, 2^32)")
        draws = np.broadcast_to(rand, shape).reshape(-1).tolist()
    else:
        draws = [0] * len(bits)
    codes = [_encode_one(fmt, b, v, rounding, saturate, r) for b, v, r in zip(bits, vals, draws)]
    return np.array(codes, dtype=fmt.container).reshape(shape)


def float64_to_target_ref(x64, name: str) -> np.ndarray:
    """float64 rounded to float32 (nearest even), then encoded: two roundings (ml_dtypes 0.6.0's casts)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return encode_ref(np.asarray(x64, dtype=np.float64).astype(np.float32), name)


def int_to_target_ref(x, name: str, rounding: str = "nearest_even", saturate: bool = False) -> np.ndarray:
    """Encode integers into format ``name`` with one rounding of the exact integer (ml_dtypes 0.7.0;
    no float32 or float64 on the way). Python compares an int with a float exactly, so the rules of
    ``encode_ref`` apply to the integer as it is. ``stochastic`` is not offered here."""
    fmt = FORMATS_REF[name]
    if rounding not in ROUNDING_MODES or rounding == "stochastic":
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDING_MODES[:-1]}")
    x = np.asarray(x)
    codes = [_encode_one(fmt, 0x80000000 if v < 0 else 0, v, rounding, saturate, 0) for v in x.reshape(-1).tolist()]
    return np.array(codes, dtype=fmt.container).reshape(x.shape)


def encode_float64_ref(x64, name: str, rounding: str = "nearest_even", saturate: bool = False, rand=None) -> np.ndarray:
    """Encode float64 values into format ``name`` with one rounding of the exact float64 value.

    The rules are those of ``encode_ref`` (same rounding modes, overflow, saturation, signs),
    applied to the float64 value itself instead of its float32 rounding, so there is no double
    rounding. A value beyond float32's range is simply a value far past the format's max; a
    value below float32's smallest subnormal still has its sign.

    Exactness: every representable value and every midpoint of two neighbours is exact in
    float64 (at most 25 significant bits), so comparing a float64 input with them is exact; the
    stochastic threshold uses ``fractions.Fraction`` of the exact input.

    NaN inputs give the code of the float32 NaN that numpy's float64 -> float32 conversion
    makes of them (sign kept, the top of the payload kept).
    """
    fmt = FORMATS_REF[name]
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDING_MODES}")
    x = np.ascontiguousarray(x64, dtype=np.float64)
    shape = x.shape
    vals = x.reshape(-1).tolist()
    if rounding == "stochastic":
        if rand is None:
            raise ValueError("rounding='stochastic' needs rand (uint32 per element)")
        draws = np.broadcast_to(np.asarray(rand), shape).reshape(-1).tolist()
    else:
        draws = [0] * len(vals)
    codes = []
    for v, r in zip(vals, draws):
        if math.isnan(v):
            with np.errstate(invalid="ignore"):
                bits = int(np.array([v], dtype=np.float64).astype(np.float32).view(np.uint32)[0])
        else:
            bits = 0x80000000 if math.copysign(1.0, v) < 0 else 0  # only the sign is read
        codes.append(_encode_one(fmt, bits, v, rounding, saturate, r))
    return np.array(codes, dtype=fmt.container).reshape(shape)


# ---- decode -----------------------------------------------------------------------------------


def _decode_one(fmt: FormatRef, code: int) -> int:
    """The float32 bit pattern of one code of ``fmt``."""
    negative = fmt.signed and code >= fmt.sign_bit  # float6/float4: any bit at or above the sign bit
    if fmt.signed:
        magnitude_bits = code & (fmt.sign_bit - 1)
    else:
        magnitude_bits = code
    if magnitude_bits & ((1 << fmt.code_shift) - 1):
        raise ValueError(f"{fmt.name}: code 0x{code:x} has non-zero bits below bit {fmt.code_shift}")
    c = magnitude_bits >> fmt.code_shift
    sign32 = 0x80000000 if negative else 0
    is_nan = (c > fmt.max_code and c != fmt.inf_code) or (fmt.nan == "fnuz" and negative and c == 0)
    if is_nan:
        if fmt.nan_payload_decode:  # widen the payload: sign | exponent all ones | mantissa << (23 - M)
            return sign32 | 0x7F800000 | ((c & ((1 << fmt.mbits) - 1)) << (23 - fmt.mbits))
        return sign32 | 0x7FC00000
    if c == fmt.inf_code:
        return sign32 | 0x7F800000
    return sign32 | _float32_bits(fmt.value_of_magnitude_code(c))


def decode_ref(codes, name: str) -> np.ndarray:
    """Decode codes of format ``name`` to float32 (every value of these formats is a float32).

    NaN codes: bfloat16 / float16 / tfloat32 keep the payload (``code << 16`` for bfloat16, numpy's
    widening for float16); other IEEE-like types give the quiet NaN of the code's sign; fnuz 0x80
    gives 0xffc00000; e8m0 0xff gives 0x7fc00000 and 0x00 gives 2^-127 (a float32 subnormal).
    float6/float4 have no NaN: any set bit at or above the sign bit makes the value negative and
    the magnitude comes from the low bits.
    """
    fmt = FORMATS_REF[name]
    codes = np.asarray(codes)
    if codes.dtype.kind not in "ui":
        raise TypeError(f"codes must be integers, got {codes.dtype}")
    limit = np.iinfo(fmt.container).max
    if codes.size and (codes.min() < 0 or codes.max() > limit):
        raise ValueError(f"{name}: codes must lie in [0, {limit}]")
    out = [_decode_one(fmt, int(c)) for c in codes.reshape(-1).tolist()]
    return np.array(out, dtype=np.uint32).reshape(codes.shape).view(np.float32)
