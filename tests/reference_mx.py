"""Slow, obviously-correct reference for MX block-scale quantisation (``docs/blocks.md``).

Nothing here shares code with the package. The elementwise rounding is delegated to the
independent cast reference ``reference_casts`` (``encode_float64_ref`` rounds an exact float64
value once); everything else is done one element at a time in Python integers, ``fractions``
and exact float64 arithmetic.

An MX block of ``block_size`` consecutive elements stores one shared power-of-two scale
X = 2^e (an e8m0 byte, e + 127) and one element code P_i per value; the value is X * P_i.

Exactness:

- Exponents are read from the float32 bit pattern (a subnormal's exact floor(log2) comes from
  the bit length of its mantissa); no floating-point log2 is ever taken.
- x_i / X = x_i * 2^-e is done with ``math.ldexp`` in float64: a float32 has at most 24
  significant bits and exponents in [-149, 127], e is in [-127, 127], so the quotient has
  exponent in [-276, 254], well inside float64's normal range: exact.
- The rceil quantities float32(1/max_elem) and float32(amax * r) are computed as exact
  fractions and rounded to float32 once (round to nearest even, subnormals kept), which is
  what one IEEE float32 multiply does.
- Dequantisation computes X * P in float64 (exact: both factors are powers of two times at most
  24 significant bits) and rounds to float32, which is exact whenever the product is a float32.

Public names:

- ``MX_FORMATS_REF``: MX format name -> (element format, emax_elem, max element)
- ``SCALE_MODES``, ``MX_ROUNDING_MODES``: the vocabularies
- ``element_mantissa_bits_ref(fmt)``: the element's explicit mantissa width (for "even")
- ``shared_exponent_ref(block, fmt, scale_mode)``: int in [-127, 127], "zero" or "nan"
- ``scale_byte_ref(block, fmt, scale_mode)``: the e8m0 byte of a block
- ``quantize_mx_ref(x, fmt, block_size, scale_mode, rounding, rand)``: (codes, scale_bytes)
- ``dequantize_mx_ref(codes, scale_bytes, fmt, block_size)``: float32 values
- ``pack_fp4_ref(codes)``, ``unpack_fp4_ref(packed, n)``: two FP4 codes per byte and back

Rules decided here where ``docs/blocks.md`` leaves room (each is repeated where it is used):

- mxint8's element mantissa width (for ``scale_mode="even"``) is 6: c/64 with |c| <= 127 is a
  sign plus a 7-bit magnitude, i.e. 1.xxxxxx * 2^0 at the top binade (microxcaling describes
  int8 as ``mbits = 8`` *including* the sign and the implicit bit: 8 - 2 = 6).
- floor(log2(amax)) and ceil(log2(amax)) are the exact values also for a subnormal amax (torchao
  reads the exponent field, which is 0 for every subnormal, i.e. it treats them as 2^-127). After
  the clamp to [-127, 127] this only differs for mxint8 (emax_elem = 0) in "ceil" and "neuron".
- "even" on a subnormal amax rounds the *normalised* significand (the same bit trick applied
  after shifting the leading one up to bit 23); for a normal amax this is exactly torchao's
  "add half an element-ulp to the bit pattern and mask". The two differ only for a subnormal
  amax, and after the clamp only for mxint8.
- float32(1/max_elem) is the correctly rounded float32 of the exact quotient. (torchao computes
  ``1.0 / max_pos`` in float64 and the multiply rounds it to float32; for the six formats the
  two agree, which the tests check.)
- Rounding modes: the spec's four, "nearest_even", "nearest_away", "toward_zero" and
  "stochastic" (microxcaling calls the first three "even", "nearest" and "floor"). Stochastic
  rounding uses one uint32 draw per element with the rule of ``reference_casts.encode_ref``:
  |v| between neighbours lo < hi goes up iff rand < floor(2^32 (|v| - lo) / (hi - lo)).
- An element that rounds past the max (in any mode, stochastic included) saturates to +-max.
- mxint8 never has a signed zero: -0.0 and negative values rounding to 0 give code 0.
- Dequantisation: X * P rounded to float32. It is exact whenever the product is a float32, but
  with "ceil", "even", "neuron" and "rceil" a block whose amax is within an element rounding of
  2^128 (e.g. float32 max in mxfp8_e4m3, mxfp6_*, mxfp4) quantises to X * P = 2^128, which
  dequantises to +-inf. The spec's "every X * P is exact in float32" does not hold there.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np

from .reference_casts import FORMATS_REF, decode_ref, encode_float64_ref

# ---- the table --------------------------------------------------------------------------------

#: name -> (element format (a key of reference_casts.FORMATS_REF, or "int8"), emax_elem, max element).
#: Written out from the spec's table; emax_elem is floor(log2(max element)).
MX_FORMATS_REF: dict[str, tuple[str, int, float]] = {
    "mxfp8_e4m3": ("float8_e4m3fn", 8, 448.0),
    "mxfp8_e5m2": ("float8_e5m2", 15, 57344.0),
    "mxfp6_e2m3": ("float6_e2m3fn", 2, 7.5),
    "mxfp6_e3m2": ("float6_e3m2fn", 4, 28.0),
    "mxfp4_e2m1": ("float4_e2m1fn", 2, 6.0),
    "mxint8": ("int8", 0, 127 / 64),
}

SCALE_MODES = ("floor", "ceil", "even", "rceil", "neuron")
MX_ROUNDING_MODES = ("nearest_even", "nearest_away", "toward_zero", "stochastic")

#: mxint8: the element value is c / 64 (c an int8 code clamped to [-127, 127]).
INT8_SCALE_BITS = 6
INT8_MAX_CODE = 127

E8M0_NAN = 0xFF
E8M0_BIAS = 127


def _check_fmt(fmt: str) -> tuple[str, int, float]:
    if fmt not in MX_FORMATS_REF:
        raise ValueError(f"unknown MX format {fmt!r}; expected one of {tuple(MX_FORMATS_REF)}")
    return MX_FORMATS_REF[fmt]


def element_mantissa_bits_ref(fmt: str) -> int:
    """The explicit mantissa width of the element format of MX format ``fmt``.

    For the float elements this is the format's ``mbits``. For mxint8 it is 6: the element is
    c / 64 with |c| <= 127, so at the top binade [1, 2) it is 1.xxxxxx (six fraction bits);
    microxcaling describes int8 with ``mbits = 8`` counting the sign and the implicit one.
    """
    elem, _, _ = _check_fmt(fmt)
    if elem == "int8":
        return INT8_SCALE_BITS
    return FORMATS_REF[elem].mbits


# ---- float32 helpers --------------------------------------------------------------------------


def _bits(v: float) -> int:
    """The float32 bit pattern of a value that is exactly a float32 (or +-inf / NaN)."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _value(bits: int) -> float:
    """The float32 with bit pattern ``bits``, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _floor_log2(bits: int) -> int:
    """floor(log2(a)) of a positive finite float32 ``a`` given by its bit pattern (exact).

    Normal: the unbiased exponent field. Subnormal: a = m * 2^-149, so floor(log2 a) is
    bit_length(m) - 1 - 149.
    """
    exp_field, mant = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exp_field == 0:
        return mant.bit_length() - 150
    return exp_field - 127


def _significand24(bits: int) -> int:
    """The 24-bit normalised significand of a positive finite float32: an integer in
    [2^23, 2^24) with a = significand * 2^(floor(log2 a) - 23). For a subnormal the mantissa is
    shifted so that its leading one is at bit 23."""
    exp_field, mant = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exp_field == 0:
        return mant << (24 - mant.bit_length())
    return (1 << 23) | mant


def _round_to_float32(q: Fraction) -> float:
    """The float32 nearest to the exact non-negative rational ``q`` (ties to even), as a Python
    float. Subnormals are kept (quantum 2^-149); a value past float32's range becomes +inf."""
    if q < 0:
        raise ValueError("only non-negative values are needed here")
    if q == 0:
        return 0.0
    e = q.numerator.bit_length() - q.denominator.bit_length()  # 2^e <= q < 2^(e+2) roughly
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    # now 2^e <= q < 2^(e+1); the float32 quantum at this binade:
    quantum = Fraction(2) ** (max(e, -126) - 23)
    n = q / quantum
    k = math.floor(n)
    rest = n - k
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and k % 2 == 1):
        k += 1
    value = Fraction(k) * quantum
    if value > Fraction(2) ** 127 * (2 - Fraction(2) ** -23):
        return math.inf
    return float(value)  # k <= 2^24: exact in float64


# ---- the shared scale -------------------------------------------------------------------------


def block_amax_ref(block) -> float:
    """The largest |x| of a block of float32 values, as a float (exact). NaN if any element is
    NaN (NaN propagates), +inf if any is infinite and none is NaN, 0.0 for an empty block."""
    with np.errstate(invalid="ignore"):  # a signalling NaN may raise "invalid" when widened
        vals = np.asarray(block, dtype=np.float32).reshape(-1).astype(np.float64).tolist()
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max((abs(v) for v in vals), default=0.0)


def rceil_reciprocal_ref(fmt: str) -> float:
    """float32(1 / max_elem): the exact reciprocal rounded once to float32."""
    _, _, max_elem = _check_fmt(fmt)
    return _round_to_float32(1 / Fraction(max_elem))


def shared_exponent_ref(block, fmt: str, scale_mode: str = "floor"):
    """The shared exponent e (X = 2^e) of one block, per the spec's scale modes.

    Parameters
    ----------
    block:
        The block's float32 values (a partial block is just a shorter one).
    fmt:
        A key of ``MX_FORMATS_REF``.
    scale_mode:
        With amax = max |x| and emax = emax_elem of the format:

        - "floor": floor(log2 amax) - emax (OCP MX v1.0).
        - "ceil": ceil(log2 amax) - emax.
        - "even": amax's significand is rounded to the element's mantissa width M, ties away
          (add 2^(23 - M - 1) to the 24-bit significand; a carry out means the next binade),
          then floor(log2(.)) - emax.
        - "rceil": d = float32(amax * float32(1 / max_elem)); the e8m0 byte is d rounded up to
          a power of two on d's bits: u = exp(d) + (mantissa(d) != 0) for a normal d, and for
          a subnormal d (exp 0) u = 0 if mantissa <= 0x400000 (d <= 2^-127) else 1; u
          saturates at 0xfe; e = u - 127.
        - "neuron": floor(log2 amax) - (emax - 1).

        The result is clamped to [-127, 127] in every mode.

    Returns
    -------
    int | str
        The exponent in [-127, 127]; "zero" for amax == 0 (scale byte 0x00, elements are signed
        zeros); "nan" when amax is not finite (a NaN or an infinity in the block; byte 0xff).
    """
    _, emax, _ = _check_fmt(fmt)
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown scale_mode {scale_mode!r}; expected one of {SCALE_MODES}")
    amax = block_amax_ref(block)
    if not math.isfinite(amax):
        return "nan"
    if amax == 0.0:
        return "zero"
    bits = _bits(amax)  # amax is a float32, so this is its bit pattern
    fl = _floor_log2(bits)
    if scale_mode == "floor":
        e = fl - emax
    elif scale_mode == "ceil":
        is_power_of_two = _significand24(bits) == 1 << 23
        e = fl + (0 if is_power_of_two else 1) - emax
    elif scale_mode == "even":
        m = element_mantissa_bits_ref(fmt)
        rounded = _significand24(bits) + (1 << (23 - m - 1))  # + half an element ulp; ties carry
        e = fl + (rounded >> 24) - emax  # a carry past bit 23 is the next binade (the mask drops the rest)
    elif scale_mode == "neuron":
        e = fl - (emax - 1)
    else:  # rceil
        d = _round_to_float32(Fraction(amax) * Fraction(rceil_reciprocal_ref(fmt)))
        dbits = _bits(d)
        d_exp, d_mant = (dbits >> 23) & 0xFF, dbits & 0x7FFFFF
        if d_exp == 0:
            u = 0 if d_mant <= 0x400000 else 1
        else:
            u = d_exp + (1 if d_mant != 0 else 0)
        u = min(u, 0xFE)  # reached only by mxint8 (d > 2^127); the clamp below agrees
        e = u - E8M0_BIAS
    return max(-127, min(127, e))


def scale_byte_ref(block, fmt: str, scale_mode: str = "floor") -> int:
    """The e8m0 scale byte of one block: e + 127, 0x00 for an all-zero block, 0xff for a block
    with a NaN or an infinity."""
    e = shared_exponent_ref(block, fmt, scale_mode)
    if e == "nan":
        return E8M0_NAN
    if e == "zero":
        return 0
    return e + E8M0_BIAS


# ---- the elements -----------------------------------------------------------------------------


def round_int8_magnitude(a: float, rounding: str, r: int) -> int:
    """Round the exact magnitude ``a >= 0`` (a float64) to a non-negative integer."""
    lo = math.floor(a)
    frac = Fraction(a) - lo
    if frac == 0:
        return lo
    if rounding == "toward_zero":
        return lo
    if rounding == "stochastic":
        threshold = math.floor(Fraction(2**32) * frac)
        return lo + 1 if r < threshold else lo
    if frac > Fraction(1, 2):
        return lo + 1
    if frac < Fraction(1, 2):
        return lo
    if rounding == "nearest_away":
        return lo + 1
    return lo if lo % 2 == 0 else lo + 1  # nearest_even


def _int8_code(v: float, rounding: str, r: int) -> int:
    """mxint8 code of the exact scaled value v = x / X * 64: rounded, clamped to [-127, 127],
    stored as int8 two's complement in a uint8. No signed zero."""
    c = round_int8_magnitude(abs(v), rounding, r)
    c = min(c, INT8_MAX_CODE)
    if v < 0:
        c = -c
    return c & 0xFF


def _nan_block_code(elem: str) -> int:
    """The code every element of a NaN/inf block gets: the element format's positive NaN code
    where it has one (0x7f for e4m3fn, 0x7e for e5m2), else 0 (float6, float4, int8)."""
    if elem == "int8" or FORMATS_REF[elem].nan == "none":
        return 0
    return int(FORMATS_REF[elem].nan_codes[0])


def quantize_mx_ref(
    x, fmt: str, block_size: int = 32, scale_mode: str = "floor", rounding: str = "nearest_even", rand=None
) -> tuple[np.ndarray, np.ndarray]:
    """Quantise a 1-D float32 array to MX along its only axis.

    Blocks are ``x[k*block_size:(k+1)*block_size]``; the last one may be partial (its amax is
    over its real elements only). For each block, X = 2^e with e = ``shared_exponent_ref``, and
    element i gets the code P_i of x_i / X, the division done exactly (x_i * 2^-e in float64).

    - Float elements: x_i / X rounded once by ``rounding`` with the cast reference, always
      saturating to +-max element (never inf/NaN from a finite input); -0.0 and negative values
      that round to zero keep their sign (e4m3fn 0x80, fp4 0x8).
    - mxint8: c = round(x_i / X * 64) by ``rounding``, clamped to [-127, 127], stored as int8
      two's complement in a uint8.
    - All-zero block (either sign): scale byte 0x00 (2^-127); the elements are signed zeros.
    - A block with a NaN or an infinity: scale byte 0xff and every code is the element format's
      positive NaN code (0x7f e4m3fn, 0x7e e5m2), or 0 where it has none.

    Parameters
    ----------
    x:
        1-D float32 values (other dtypes are converted to float32 first).
    fmt:
        A key of ``MX_FORMATS_REF``.
    block_size:
        Elements per block (a positive int).
    scale_mode:
        One of ``SCALE_MODES`` (see ``shared_exponent_ref``).
    rounding:
        One of ``MX_ROUNDING_MODES``. "stochastic" needs ``rand``: one uint32 per element; the
        magnitude goes up to the next representable value iff rand < floor(2^32 * fraction).
    rand:
        uint32 draws of ``x``'s shape, for "stochastic" only.

    Returns
    -------
    (codes, scale_bytes)
        ``codes``: uint8 of x's length, one (unpacked) code per element. ``scale_bytes``: uint8
        of length ceil(len(x) / block_size), the e8m0 bytes.
    """
    elem, _, _ = _check_fmt(fmt)
    if rounding not in MX_ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {MX_ROUNDING_MODES}")
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown scale_mode {scale_mode!r}; expected one of {SCALE_MODES}")
    if not isinstance(block_size, (int, np.integer)) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = np.asarray(x, dtype=np.float32)
    if x32.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {x32.shape}")
    n = x32.shape[0]
    if rounding == "stochastic":
        if rand is None:
            raise ValueError("rounding='stochastic' needs rand (one uint32 per element)")
        rand = np.asarray(rand)
        if rand.shape != x32.shape or rand.dtype.kind not in "ui":
            raise ValueError("rand must be integers of x's shape")
        if rand.size and (rand.min() < 0 or rand.max() > 0xFFFFFFFF):
            raise ValueError("rand must hold integers in [0, 2^32)")
        draws = [int(r) for r in rand.tolist()]
    else:
        draws = [0] * n

    codes = np.zeros(n, dtype=np.uint8)
    n_blocks = -(-n // block_size)
    scale_bytes = np.zeros(n_blocks, dtype=np.uint8)
    for k in range(n_blocks):
        lo, hi = k * block_size, min(n, (k + 1) * block_size)
        block = x32[lo:hi]
        e = shared_exponent_ref(block, fmt, scale_mode)
        if e == "nan":
            scale_bytes[k] = E8M0_NAN
            codes[lo:hi] = _nan_block_code(elem)
            continue
        if e == "zero":
            e = -127  # scale byte 0x00; x / X keeps each zero's sign
        scale_bytes[k] = e + E8M0_BIAS
        for i in range(lo, hi):
            xi = float(block[i - lo])
            if elem == "int8":
                codes[i] = _int8_code(math.ldexp(xi, INT8_SCALE_BITS - e), rounding, draws[i])
            else:
                scaled = np.array([math.ldexp(xi, -e)], dtype=np.float64)  # exact; -0.0 stays -0.0
                code = encode_float64_ref(
                    scaled, elem, rounding, saturate=True, rand=np.array([draws[i]], dtype=np.uint32)
                )
                codes[i] = int(code[0])
    return codes, scale_bytes


def dequantize_mx_ref(codes, scale_bytes, fmt: str, block_size: int = 32) -> np.ndarray:
    """Dequantise unpacked MX codes: value_i = X * P_i with X = 2^(byte - 127).

    Scale byte 0x00 is 2^-127 (a float32 subnormal, never flushed); 0xff makes the whole block
    NaN. P_i is the element's value (the cast reference's decoding; c / 64 for mxint8). The
    product is formed exactly in float64 and rounded to float32: exact whenever it is a float32;
    a product of 2^128 or more becomes +-inf.

    Parameters
    ----------
    codes:
        uint8, one code per element (1-D).
    scale_bytes:
        uint8, ceil(len(codes) / block_size) e8m0 bytes.
    fmt, block_size:
        As for ``quantize_mx_ref``.
    """
    elem, _, _ = _check_fmt(fmt)
    codes = np.asarray(codes)
    scale_bytes = np.asarray(scale_bytes)
    if codes.ndim != 1 or codes.dtype != np.uint8 or scale_bytes.dtype != np.uint8:
        raise ValueError("codes and scale_bytes must be 1-D uint8")
    n = codes.shape[0]
    if scale_bytes.shape != (-(-n // block_size),):
        raise ValueError(f"expected {-(-n // block_size)} scale bytes, got {scale_bytes.shape}")
    if elem == "int8":
        p = [c - 256 if c >= 128 else c for c in codes.tolist()]
        p = [math.ldexp(c, -INT8_SCALE_BITS) for c in p]
    else:
        with np.errstate(invalid="ignore"):
            p = decode_ref(codes, elem).astype(np.float64).tolist()
    out = np.zeros(n, dtype=np.float64)
    for i in range(n):
        b = int(scale_bytes[i // block_size])
        out[i] = math.nan if b == E8M0_NAN else math.ldexp(p[i], b - E8M0_BIAS)
    with np.errstate(over="ignore"):
        return out.astype(np.float32)


# ---- FP4 packing ------------------------------------------------------------------------------


def pack_fp4_ref(codes) -> np.ndarray:
    """Pack 4-bit codes two per byte along the last axis: byte j holds element 2j in its low
    nibble and element 2j+1 in its high nibble; an odd tail is padded with a zero nibble."""
    codes = np.asarray(codes)
    if codes.dtype.kind not in "ui" or (codes.size and (codes.min() < 0 or codes.max() > 0xF)):
        raise ValueError("codes must be integers in [0, 15]")
    n = codes.shape[-1]
    out = np.zeros(codes.shape[:-1] + ((n + 1) // 2,), dtype=np.uint8)
    for idx in np.ndindex(*codes.shape[:-1]):
        row = [int(c) for c in codes[idx].tolist()]
        for j in range(0, n, 2):
            lo = row[j]
            hi = row[j + 1] if j + 1 < n else 0
            out[idx + (j // 2,)] = lo | (hi << 4)
    return out


def unpack_fp4_ref(packed, n: int) -> np.ndarray:
    """Inverse of ``pack_fp4_ref``: the first ``n`` 4-bit codes along the last axis, as uint8.
    ``n`` is the unpacked length (the padding nibble of an odd ``n`` is dropped)."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.shape[-1] != (n + 1) // 2:
        raise ValueError(f"packed must be uint8 with {(n + 1) // 2} bytes along the last axis")
    out = np.zeros(packed.shape[:-1] + (n,), dtype=np.uint8)
    for idx in np.ndindex(*packed.shape[:-1]):
        row = [int(b) for b in packed[idx].tolist()]
        for j in range(n):
            byte = row[j // 2]
            out[idx + (j,)] = (byte >> 4) if j % 2 else (byte & 0xF)
    return out
