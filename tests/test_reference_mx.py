"""The MX reference (tests/reference_mx.py) against results derived by hand from docs/blocks.md.

The reference is what the fast MX kernels are judged by, so it is checked here on its own. Every
expected value below is worked out in the comment next to it from the spec's rules, never by
calling the reference a second way. Notation: e4m3 is mxfp8_e4m3 (emax_elem 8, max 448, 3
mantissa bits); "r" is float32(1/max_elem) used by rceil; codes are written in hex.

float32(1/448) (used throughout the rceil cases): 1/448 = 2^-9 * 8/7 = 2^-9 * 1.142857...;
0.142857... * 2^23 = 1198372.57 -> mantissa 1198373 = 0x124925, so r = 0x3B124925
= (2^23 + 0x124925) * 2^-32 = 9586981 * 2^-32. Hence 448 * r = 4294967488 * 2^-32 = 1 + 192 * 2^-32,
which rounds to exactly 1.0 in float32 (192 * 2^-32 is 0.375 of the float32 ulp at 1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .reference_casts import magnitudes_ref
from .reference_mx import (
    MX_FORMATS_REF,
    MX_ROUNDING_MODES,
    SCALE_MODES,
    dequantize_mx_ref,
    element_mantissa_bits_ref,
    pack_fp4_ref,
    quantize_mx_ref,
    rceil_reciprocal_ref,
    scale_byte_ref,
    shared_exponent_ref,
    unpack_fp4_ref,
)

FP_FORMATS = [f for f in MX_FORMATS_REF if f != "mxint8"]
DETERMINISTIC = [m for m in MX_ROUNDING_MODES if m != "stochastic"]


def f32(bits) -> np.ndarray:
    """float32 values from bit patterns."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def one(bits: int) -> np.float32:
    return f32([bits])[0]


def u32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def pow2(k: int) -> np.float32:
    """2^k as a float32 (k in [-149, 127]), built from its bits."""
    if k >= -126:
        return one((k + 127) << 23)
    return one(1 << (k + 149))


def se(values, fmt="mxfp8_e4m3", mode="floor"):
    return shared_exponent_ref(np.asarray(values, dtype=np.float32), fmt, mode)


def q(x, fmt="mxfp8_e4m3", **kw):
    return quantize_mx_ref(np.asarray(x, dtype=np.float32), fmt, **kw)


# ---- the table ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(MX_FORMATS_REF))
def test_table_is_consistent(fmt):
    elem, emax, max_elem = MX_FORMATS_REF[fmt]
    mant, exp = math.frexp(max_elem)  # max = mant * 2^exp, mant in [0.5, 1)
    assert emax == exp - 1  # emax_elem = floor(log2(max element))
    if elem == "int8":
        assert max_elem == 127 / 64
    else:
        assert magnitudes_ref(elem)[-1] == max_elem


def test_table_values():
    assert MX_FORMATS_REF == {
        "mxfp8_e4m3": ("float8_e4m3fn", 8, 448.0),
        "mxfp8_e5m2": ("float8_e5m2", 15, 57344.0),
        "mxfp6_e2m3": ("float6_e2m3fn", 2, 7.5),
        "mxfp6_e3m2": ("float6_e3m2fn", 4, 28.0),
        "mxfp4_e2m1": ("float4_e2m1fn", 2, 6.0),
        "mxint8": ("int8", 0, 1.984375),
    }


def test_element_mantissa_bits():
    # mxint8: c/64, |c| <= 127 = 0b1111111 -> 1.xxxxxx at the top binade: 6 bits (decided here).
    got = {f: element_mantissa_bits_ref(f) for f in MX_FORMATS_REF}
    assert got == {"mxfp8_e4m3": 3, "mxfp8_e5m2": 2, "mxfp6_e2m3": 3, "mxfp6_e3m2": 2, "mxfp4_e2m1": 1, "mxint8": 6}


@pytest.mark.parametrize(
    "fmt, bits",
    [
        ("mxfp8_e4m3", 0x3B124925),  # 1/448 = 2^-9 * 1.142857 (derived in the module docstring)
        ("mxfp8_e5m2", 0x37924925),  # 1/57344 = 1/(448 * 128): same mantissa, exponent -16 (field 111)
        ("mxfp6_e2m3", 0x3E088889),  # 1/7.5 = 2^-3 * 1.0666...; 0.0666.. * 2^23 = 559240.53 -> 0x088889
        ("mxfp6_e3m2", 0x3D124925),  # 1/28 = 1/(448 / 16): mantissa 0x124925, exponent -5 (field 122)
        ("mxfp4_e2m1", 0x3E2AAAAB),  # 1/6 = 2^-3 * 1.333...; 0.333.. * 2^23 = 2796202.67 -> 0x2AAAAB
        ("mxint8", 0x3F010204),  # 64/127 = 2^-1 * 1.007874; 0.007874 * 2^23 = 66052.03 -> 0x010204
    ],
)
def test_rceil_reciprocal(fmt, bits):
    r = rceil_reciprocal_ref(fmt)
    assert int(u32([r])[0]) == bits
    # torchao computes 1.0 / max_pos in float64 and the float32 multiply rounds it again; the
    # double rounding gives the same float32 for every MX format (so the choice does not matter).
    assert np.float32(1.0 / MX_FORMATS_REF[fmt][2]) == np.float32(r)


# ---- the shared scale ---------------------------------------------------------------------------

# (format, amax as float32 bits, {mode: expected shared exponent}).
SCALE_CASES = [
    # amax = 1.0, a power of two. floor: 0 - 8; ceil: log2 is exact, 0 - 8; even: 1.000 needs no
    # rounding, -8; neuron: 0 - (8 - 1) = -7; rceil: d = 1.0 * r = r = 0x3B124925, exp field 118,
    # mantissa != 0 -> u = 119 -> e = -8.
    ("mxfp8_e4m3", 0x3F800000, dict(floor=-8, ceil=-8, even=-8, neuron=-7, rceil=-8)),
    # amax = 2 - 2^-23 (0x3FFFFFFF), one ulp below a power of two: floor: 0 - 8; ceil: 1 - 8;
    # even: 23 one bits + 2^-4 carries into the next binade: 1 - 8; neuron: 0 - 7;
    # rceil: d = (2 - 2^-23) * 1.142857 * 2^-9 = 1.142857 * 2^-8 (exp field 119, mantissa != 0)
    # -> u = 120 -> -7. (A float32 log2 rounds log2(amax) up to 1.0: the spec's warning.)
    ("mxfp8_e4m3", 0x3FFFFFFF, dict(floor=-8, ceil=-7, even=-7, neuron=-7, rceil=-7)),
    # amax = 2^-2 - one ulp = 0x3E7FFFFF: as above, two binades down.
    ("mxfp8_e4m3", 0x3E7FFFFF, dict(floor=-11, ceil=-10, even=-10, neuron=-10, rceil=-10)),
    # amax = 448 = 1.75 * 2^8 (0x43E00000): floor 8 - 8 = 0; ceil 9 - 8 = 1; even: 1.110b fits in
    # 3 mantissa bits -> 0; neuron 8 - 7 = 1; rceil: d = 448 * r = 1 + 192 * 2^-32 -> 1.0 exactly
    # (mantissa 0, exp field 127) -> u = 127 -> 0.
    ("mxfp8_e4m3", 0x43E00000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=0)),
    # amax = 448 * 2^10 = 458752 (0x48E00000): everything shifts by 10; rceil d = 2^10 exactly.
    ("mxfp8_e4m3", 0x48E00000, dict(floor=10, ceil=11, even=10, neuron=11, rceil=10)),
    # amax = 448 * 2^-20 (0x39E00000): shifted by -20; rceil d = 2^-20 exactly (normal).
    ("mxfp8_e4m3", 0x39E00000, dict(floor=-20, ceil=-19, even=-20, neuron=-19, rceil=-20)),
    # amax = 449 (0x43E08000): just above 448. rceil: d = 449 * r > 1 (449/448 - 1 = 2^-8.8 is far
    # more than a float32 ulp) -> exp 127, mantissa != 0 -> u = 128 -> 1.
    ("mxfp8_e4m3", 0x43E08000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=1)),
    # even, e4m3 (M = 3): a tie in the significand rounding goes away from zero.
    # amax = 1.9375 = 1.1111b (0x3FF80000): + 2^-4 = 2.0 -> next binade: even = 1 - 8 = -7.
    ("mxfp8_e4m3", 0x3FF80000, dict(floor=-8, ceil=-7, even=-7, neuron=-7)),
    # one ulp below the tie (0x3FF7FFFF): 1.11101111..1b + 2^-4 < 2 -> stays: -8.
    ("mxfp8_e4m3", 0x3FF7FFFF, dict(floor=-8, ceil=-7, even=-8, neuron=-7)),
    # amax = 1.875 = 1.111b (0x3FF00000), representable with 3 bits: -8.
    ("mxfp8_e4m3", 0x3FF00000, dict(floor=-8, ceil=-7, even=-8)),
    # even, fp4 (M = 1, emax 2): 1.75 = 1.11b + 0.01b = 10.0b -> next binade: 1 - 2 = -1.
    ("mxfp4_e2m1", 0x3FE00000, dict(floor=-2, ceil=-1, even=-1, neuron=-1)),
    # 1.5 = 1.1b: exact in one bit: -2; rceil: d = 1.5 * float32(1/6): r = 0x3E2AAAAB =
    # 11184811 * 2^-26, 1.5 * r = 0.25 * (1 + 2^-25) -> 0.25 (mantissa 0) -> u = 125 -> -2.
    ("mxfp4_e2m1", 0x3FC00000, dict(floor=-2, ceil=-1, even=-2, neuron=-1, rceil=-2)),
    # 1.75 - one ulp (0x3FDFFFFF): no carry: -2.
    ("mxfp4_e2m1", 0x3FDFFFFF, dict(even=-2)),
    # fp4, amax = 6 (0x40C00000): floor 2 - 2 = 0; rceil: 6 * r = 67108866 * 2^-26 = 1 + 2^-25
    # -> 1.0 -> 0.
    ("mxfp4_e2m1", 0x40C00000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=0)),
    # e5m2 (emax 15, M = 2): amax = 57344 = 1.75 * 2^15 (0x47600000): floor 0; even: 1.11b exact: 0;
    # rceil: r = 0x37924925 (the e4m3 mantissa) so d = 1 + 192 * 2^-32 -> 1.0 -> 0.
    ("mxfp8_e5m2", 0x47600000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=0)),
    # e5m2 even: amax = 1.875 = 1.111b (0x3FF00000) is a tie at 2 bits -> away -> 1 - 15 = -14.
    ("mxfp8_e5m2", 0x3FF00000, dict(floor=-15, ceil=-14, even=-14, neuron=-14)),
    # e2m3 (emax 2, M = 3): amax = 7.5 = 1.875 * 4 (0x40F00000): floor 0, even 0; rceil:
    # r = 0x3E088889 = 8947849 * 2^-26; 7.5 * r = 67108867.5 * 2^-26 = 1 + 3.5 * 2^-26 -> 1.0 -> 0.
    ("mxfp6_e2m3", 0x40F00000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=0)),
    # e3m2 (emax 4, M = 2): amax = 28 = 1.75 * 16 (0x41E00000): r = 0x3D124925, d = 1 + 192 * 2^-32
    # -> 1.0 -> 0.
    ("mxfp6_e3m2", 0x41E00000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=0)),
    # mxint8 (emax 0, M = 6): amax = 127/64 = 1.984375 = 1.111111b (0x3FFE0000): floor 0; ceil 1;
    # even: exact in 6 bits -> 0; neuron 0 - (0 - 1) = 1; rceil: r = 0x3F010204 = 8454660 * 2^-24;
    # 127/64 * r = 127 * 8454660 * 2^-30 = (2^30 - 4) * 2^-30 = 1 - 2^-28 -> rounds to 1.0 -> 0.
    ("mxint8", 0x3FFE0000, dict(floor=0, ceil=1, even=0, neuron=1, rceil=0)),
    # mxint8 even: amax = 2 - 2^-7 = 1.1111111b (0x3FFF0000), a tie at 6 bits -> away -> 1.
    ("mxint8", 0x3FFF0000, dict(floor=0, ceil=1, even=1, neuron=1)),
    # mxint8 even: 2 - 2^-7 - 2^-23 (0x3FFEFFFF) -> stays: 0.
    ("mxint8", 0x3FFEFFFF, dict(even=0)),
]


@pytest.mark.parametrize("fmt, bits, expected", SCALE_CASES)
def test_scale_modes_hand_derived(fmt, bits, expected):
    for mode, e in expected.items():
        assert se([one(bits)], fmt, mode) == e, (mode, hex(bits))
        assert se([-one(bits), 0.0], fmt, mode) == e, (mode, "sign and smaller elements ignored")


# Exponents outside [-127, 127] clamp. (format, amax bits, {mode: e}).
CLAMP_CASES = [
    # 2^-120 (0x03800000): floor -128 -> -127; ceil -128 -> -127; even -128 -> -127;
    # neuron -120 - 7 = -127 exactly; rceil: d = 1.142857 * 2^-129, subnormal with mantissa
    # 0x124925 <= 0x400000 -> u = 0 -> -127.
    ("mxfp8_e4m3", 0x03800000, dict(floor=-127, ceil=-127, even=-127, neuron=-127, rceil=-127)),
    # smallest subnormal 2^-149: every mode far below -127 -> -127; rceil: d = 2^-149 * r rounds
    # to 0 -> exp 0, mantissa 0 -> u = 0 -> -127.
    ("mxfp8_e4m3", 0x00000001, dict(floor=-127, ceil=-127, even=-127, neuron=-127, rceil=-127)),
    # float32 max (2 - 2^-23) * 2^127 in e4m3: floor 127 - 8 = 119; ceil 128 - 8 = 120; even
    # rounds to 2^128: 120; neuron 127 - 7 = 120; rceil: d = 1.142857 * (2 - 2^-23) * 2^118
    # = 1.1428 * 2^119 -> u = 127 + 119 + 1 = 247 -> 120. No clamp.
    ("mxfp8_e4m3", 0x7F7FFFFF, dict(floor=119, ceil=120, even=120, neuron=120, rceil=120)),
    # e5m2 float32 max: floor 127 - 15 = 112.
    ("mxfp8_e5m2", 0x7F7FFFFF, dict(floor=112, ceil=113, even=113, neuron=113)),
    # mxint8, float32 max: floor 127 - 0 = 127 (no clamp); ceil, even (rounds up to 2^128) and
    # neuron (127 + 1) give 128 -> 127; rceil: d = (2 - 2^-23) * 2^127 * 1.007874 * 2^-1 > 2^127:
    # exp field 254, mantissa != 0 -> u = 255 -> saturates at 0xfe -> 127.
    ("mxint8", 0x7F7FFFFF, dict(floor=127, ceil=127, even=127, neuron=127, rceil=127)),
    # mxint8, amax = 2^127 (0x7F000000): floor 127; ceil 127; neuron 128 -> 127; rceil:
    # d = 2^127 * 8454660 * 2^-24 = 1.007874 * 2^126: exp field 253, mantissa != 0 -> u = 254 -> 127.
    ("mxint8", 0x7F000000, dict(floor=127, ceil=127, even=127, neuron=127, rceil=127)),
    # mxint8, amax = 1.5 * 2^127 (0x7F400000): ceil 128 -> 127; floor 127.
    ("mxint8", 0x7F400000, dict(floor=127, ceil=127)),
    # Subnormal amax, where the exact floor/ceil of log2 matter (the spec: compute from the bit
    # pattern; torchao instead reads the exponent field, 0, as -127: a rule decided here).
    # mxint8 neuron, amax = 2^-127 (0x00400000): floor(log2) = -127 -> -127 + 1 = -126.
    ("mxint8", 0x00400000, dict(floor=-127, ceil=-127, neuron=-126, even=-127)),
    # mxint8 neuron, amax = 2^-130 (0x00080000): -130 + 1 = -129 -> -127 (the exponent-field
    # reading would give -127 + 1 = -126).
    ("mxint8", 0x00080000, dict(floor=-127, ceil=-127, neuron=-127, even=-127)),
    # mxint8 ceil, amax = 3 * 2^-131 (0x000C0000): ceil(log2) = -129 -> -127 (field reading: -126).
    ("mxint8", 0x000C0000, dict(ceil=-127)),
    # mxint8 ceil, amax = 1.5 * 2^-127 (0x00600000): ceil(log2) = -126, not clamped.
    ("mxint8", 0x00600000, dict(floor=-127, ceil=-126, neuron=-126)),
    # mxint8 even on a subnormal: amax = 0x007F8000 = (2 - 2^-7) * 2^-127: the normalised
    # significand 1.1111111b is a tie at 6 bits -> away -> -126 (decided here: the significand is
    # normalised first; torchao's bit trick on the raw pattern would carry from 0x7F0000 upward).
    ("mxint8", 0x007F8000, dict(even=-126)),
    ("mxint8", 0x007F4000, dict(even=-127)),  # (2 - 1.5 * 2^-7) * 2^-127: below the tie -> -127
]


@pytest.mark.parametrize("fmt, bits, expected", CLAMP_CASES)
def test_scale_clamp_and_subnormal_amax(fmt, bits, expected):
    for mode, e in expected.items():
        assert se([one(bits)], fmt, mode) == e, (mode, hex(bits))


# rceil on the bits of d. (amax bits, expected e) for e4m3, r = 9586981 * 2^-32.
RCEIL_CASES = [
    # amax = 448 * 2^-127 = 1.75 * 2^-119 (0x04600000): d = 2^-127 (1 + 192 * 2^-32); in units of
    # 2^-149 that is 2^22 + 0.1875 -> rounds to 2^22: subnormal d, mantissa 0x400000 -> u = 0
    # -> -127 (d is exactly 2^-127, which byte 0 represents). Here ceil would give -126.
    (0x04600000, -127),
    # amax = 0x04600008 = 448 * 2^-127 + 8 * 2^-142: d = 2^22 + 0.1875 + 8 * 1.142857 / 4
    # = 2^22 + 2.47 units -> mantissa 0x400002 > 0x400000 -> u = 1 -> -126.
    (0x04600008, -126),
    # amax = 2^-118 (0x04800000): d = 9586981 * 2^-150 = 4793490.5 units of 2^-149, a tie -> even
    # 4793490 = 0x492492 > 0x400000 -> u = 1 -> -126.
    (0x04800000, -126),
    # amax = 2^-149: d rounds to 0 (exp 0, mantissa 0) -> u = 0 -> -127.
    (0x00000001, -127),
    # amax = 448 * 2^-126 (0x04E00000): d = 2^-126 (1 + 192 * 2^-32) -> 2^-126 exactly, the
    # smallest normal (exp 1, mantissa 0) -> u = 1 -> -126.
    (0x04E00000, -126),
    # amax = 448 * 2^-125 (0x05600000): d = 2^-125 exactly: exp 2, mantissa 0 -> u = 2 -> -125.
    (0x05600000, -125),
    # amax = 1.0: d = r, normal, mantissa 0x124925 != 0 -> u = 118 + 1 -> -8.
    (0x3F800000, -8),
    # amax = 448: d = 1.0, mantissa 0 -> u = 127 -> 0.
    (0x43E00000, 0),
]


@pytest.mark.parametrize("bits, expected", RCEIL_CASES)
def test_rceil_on_the_bits_of_d(bits, expected):
    assert se([one(bits)], "mxfp8_e4m3", "rceil") == expected
    assert scale_byte_ref(f32([bits]), "mxfp8_e4m3", "rceil") == expected + 127


@pytest.mark.parametrize("fmt", list(MX_FORMATS_REF))
def test_scale_mode_relations_on_random_amax(fmt):
    # Invariants (not constants): for a normal amax = s * 2^E (s in [1, 2)), away from the clamp,
    # ceil - floor = [s > 1]; even is floor or floor + 1; neuron = floor + 1; rceil is
    # floor when s <= the max element's significand and floor + 1 above it (up to d's rounding,
    # which only matters within a few ulps of that significand: those amax are skipped).
    _, emax, max_elem = MX_FORMATS_REF[fmt]
    max_sig = math.frexp(max_elem)[0] * 2
    rng = np.random.default_rng(3)
    bits = rng.integers(0x1A000000, 0x66000000, 2000, dtype=np.int64).astype(np.uint32)
    for b in bits.tolist():
        a = float(one(b))
        s = math.frexp(a)[0] * 2
        fl, ce = se([a], fmt, "floor"), se([a], fmt, "ceil")
        assert ce - fl == (1 if s > 1 else 0)
        assert se([a], fmt, "even") in (fl, fl + 1)
        assert se([a], fmt, "neuron") == fl + 1
        if abs(s - max_sig) > 1e-6:
            assert se([a], fmt, "rceil") == fl + (1 if s > max_sig else 0)


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", list(MX_FORMATS_REF))
def test_special_blocks(fmt, mode):
    assert se([0.0, -0.0, 0.0], fmt, mode) == "zero"
    assert se([-0.0], fmt, mode) == "zero"
    assert scale_byte_ref(np.zeros(4, np.float32), fmt, mode) == 0x00
    for block in ([1.0, np.nan, 2.0], [np.inf], [-np.inf, 1.0], [np.nan, np.inf, 0.0], [f32([0xFFC00000])[0]]):
        assert se(block, fmt, mode) == "nan"
        assert scale_byte_ref(np.asarray(block, np.float32), fmt, mode) == 0xFF


def test_scale_validation():
    with pytest.raises(ValueError):
        se([1.0], "mxfp8", "floor")
    with pytest.raises(ValueError):
        se([1.0], "mxfp8_e4m3", "round")


# ---- the elements -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 40, -100, -118])
def test_e4m3_round_trip_hand_codes(k):
    # 448 in the block makes amax = 448 * 2^k, so floor gives X = 2^k and x / X is the listed value.
    vals = [448.0, -1.5, 0.125, 2.0**-9, -0.0, 3.0, 240.0, -(2.0**-6)]
    # 448 = 1.75 * 2^8 -> exp field 15, mantissa 6: 0x7E; 1.5 -> field 7, mantissa 4: 0x3C, signed 0xBC;
    # 2^-3 -> field 4: 0x20; 2^-9 is the smallest subnormal: 0x01; -0.0: 0x80; 3 = 1.5 * 2 -> 0x44;
    # 240 = 1.875 * 2^7 -> field 14, mantissa 7: 0x77; -2^-6 is the smallest normal: 0x88.
    want = [0x7E, 0xBC, 0x20, 0x01, 0x80, 0x44, 0x77, 0x88]
    x = np.array([math.ldexp(v, k) for v in vals], dtype=np.float32)
    codes, scales = q(x, block_size=8)
    assert codes.tolist() == want
    assert scales.tolist() == [127 + k]
    dq = dequantize_mx_ref(codes, scales, "mxfp8_e4m3", 8)
    assert np.array_equal(u32(dq), u32(x))  # bit for bit, -0.0 included


@pytest.mark.parametrize("k", [0, 17, -60, -125])
@pytest.mark.parametrize("fmt", list(MX_FORMATS_REF))
def test_round_trip_every_element_value(fmt, k):
    # The block holds every value of the element format (both signs) times 2^k. amax = max * 2^k, so
    # floor gives e = floor(log2(max)) + k - emax = k, every x / X is representable and the codes
    # decode back exactly. (k = -125 with e4m3 puts values down to 2^-134, float32 subnormals.)
    elem, _, _ = MX_FORMATS_REF[fmt]
    if elem == "int8":
        mags = np.arange(128) / 64.0
    else:
        mags = magnitudes_ref(elem)
    vals = np.concatenate([mags, -mags])
    x = np.ldexp(vals, k).astype(np.float32)
    assert np.array_equal(x.astype(np.float64), np.ldexp(vals, k))  # the inputs are exact
    for mode in DETERMINISTIC:
        codes, scales = q(x, fmt, block_size=len(x), rounding=mode)
        assert scales.tolist() == [127 + k]
        dq = dequantize_mx_ref(codes, scales, fmt, len(x))
        if elem == "int8":  # no signed zero: -0.0 comes back as +0.0
            assert np.array_equal(dq, x)
        else:
            assert np.array_equal(u32(dq), u32(x))
    # the magnitude codes are the indices into the sorted values
    codes, _ = q(x[: len(mags)], fmt, block_size=len(mags))
    assert codes.tolist() == list(range(len(mags)))


# e4m3 ties, X = 1 (448 is in every block). (x, {rounding: code}).
E4M3_TIES = [
    # 1.0625 is halfway between 1.0 (0x38, even mantissa) and 1.125 (0x39).
    (1.0625, dict(nearest_even=0x38, nearest_away=0x39, toward_zero=0x38)),
    # 1.1875 is halfway between 1.125 (0x39) and 1.25 (0x3A, even).
    (1.1875, dict(nearest_even=0x3A, nearest_away=0x3A, toward_zero=0x39)),
    (-1.0625, dict(nearest_even=0xB8, nearest_away=0xB9, toward_zero=0xB8)),
    # 2^-10 is halfway between 0 and 2^-9 (0x01): even -> 0, away -> 0x01.
    (2.0**-10, dict(nearest_even=0x00, nearest_away=0x01, toward_zero=0x00)),
    # -2^-10: the zero keeps the sign (0x80).
    (-(2.0**-10), dict(nearest_even=0x80, nearest_away=0x81, toward_zero=0x80)),
    # 3 * 2^-10 is halfway between 2^-9 (0x01) and 2^-8 (0x02, even).
    (3 * 2.0**-10, dict(nearest_even=0x02, nearest_away=0x02, toward_zero=0x01)),
    # 464 is halfway between 448 and 480 (past the max): always saturates to 448 (0x7E), never NaN.
    (464.0, dict(nearest_even=0x7E, nearest_away=0x7E, toward_zero=0x7E)),
    (-464.0, dict(nearest_even=0xFE, nearest_away=0xFE, toward_zero=0xFE)),
]


@pytest.mark.parametrize("x, expected", E4M3_TIES)
def test_e4m3_element_ties(x, expected):
    for mode, code in expected.items():
        codes, scales = q([448.0, x], block_size=2, rounding=mode)
        assert scales.tolist() == [127]
        assert codes.tolist() == [0x7E, code], mode


# fp4 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 = codes 0..7) ties, X = 1 (6 in the block).
FP4_TIES = [
    (2.5, dict(nearest_even=0x4, nearest_away=0x5, toward_zero=0x4)),  # 2 (code 4) | 3 (code 5)
    (5.0, dict(nearest_even=0x6, nearest_away=0x7, toward_zero=0x6)),  # 4 (code 6) | 6 (code 7)
    (0.25, dict(nearest_even=0x0, nearest_away=0x1, toward_zero=0x0)),  # 0 | 0.5
    (-0.25, dict(nearest_even=0x8, nearest_away=0x9, toward_zero=0x8)),  # -0 keeps the sign bit 0x8
    (-1.25, dict(nearest_even=0xA, nearest_away=0xB, toward_zero=0xA)),  # -1 (0xA) | -1.5 (0xB)
]


@pytest.mark.parametrize("x, expected", FP4_TIES)
def test_fp4_element_ties(x, expected):
    for mode, code in expected.items():
        codes, scales = q([6.0, x], "mxfp4_e2m1", block_size=2, rounding=mode)
        assert scales.tolist() == [127]
        assert codes.tolist() == [0x7, code], mode


def test_saturation_with_a_scale_below_amax():
    # floor on amax = 500: floor(log2 500) = 8 -> e = 0; 500 > 448 saturates to 0x7E in every mode.
    for mode in DETERMINISTIC:
        codes, scales = q([500.0, -500.0], rounding=mode)
        assert scales.tolist() == [127]
        assert codes.tolist() == [0x7E, 0xFE]
    # fp4 floor on amax = 7.9: e = 2 - 2 = 0; 7.9 > 6 saturates to 0x7; e5m2 on 65000: e = 15 - 15 = 0,
    # 65000 lies between 57344 and the virtual 65536 -> nearest would overflow: 57344 (0x7B).
    assert q([7.9], "mxfp4_e2m1")[0].tolist() == [0x7]
    assert q([65000.0], "mxfp8_e5m2")[0].tolist() == [0x7B]


def test_signed_zeros():
    # -0.0 next to the max element (X = 1): e4m3 0x80, e5m2 0x80, fp6 0x20, fp4 0x8, int8 0.
    tops = {
        "mxfp8_e4m3": 448.0,
        "mxfp8_e5m2": 57344.0,
        "mxfp6_e2m3": 7.5,
        "mxfp6_e3m2": 28.0,
        "mxfp4_e2m1": 6.0,
        "mxint8": 1.5,
    }
    want = {
        "mxfp8_e4m3": 0x80,
        "mxfp8_e5m2": 0x80,
        "mxfp6_e2m3": 0x20,
        "mxfp6_e3m2": 0x20,
        "mxfp4_e2m1": 0x8,
        "mxint8": 0x00,
    }
    for fmt, top in tops.items():
        codes, scales = q([top, -0.0, 0.0], fmt, block_size=3)
        assert scales.tolist() == [127], fmt
        assert codes.tolist()[1:] == [want[fmt], 0x00], fmt


@pytest.mark.parametrize("mode", SCALE_MODES)
def test_all_zero_block(mode):
    # amax == 0: scale byte 0x00; the codes are signed zeros; they dequantise to signed zeros.
    x = np.array([0.0, -0.0, -0.0, 0.0, 0.0], dtype=np.float32)
    for fmt, neg in [("mxfp8_e4m3", 0x80), ("mxfp4_e2m1", 0x8), ("mxfp6_e3m2", 0x20), ("mxint8", 0x00)]:
        codes, scales = q(x, fmt, block_size=4, scale_mode=mode)
        assert scales.tolist() == [0x00, 0x00]
        assert codes.tolist() == [0, neg, neg, 0, 0]
        dq = dequantize_mx_ref(codes, scales, fmt, 4)
        assert np.all(dq == 0)
        if fmt != "mxint8":
            assert np.signbit(dq).tolist() == [False, True, True, False, False]


def test_float32_subnormal_inputs_are_not_flushed():
    # e4m3 block [2^-135, -3 * 2^-136, 2^-149]: amax 2^-135, floor -135 - 8 -> clamped to -127,
    # X = 2^-127. 2^-8 is e4m3 subnormal 2 * 2^-9 -> 0x02; -3 * 2^-9 -> 0x83; 2^-22 is below half
    # of 2^-9 -> 0x00. Dequantised: the inputs back, except 2^-149, which had no element value.
    x = np.array([pow2(-135), -3 * pow2(-136), pow2(-149)], dtype=np.float32)
    codes, scales = q(x, block_size=3)
    assert scales.tolist() == [0]
    assert codes.tolist() == [0x02, 0x83, 0x00]
    dq = dequantize_mx_ref(codes, scales, "mxfp8_e4m3", 3)
    assert np.array_equal(u32(dq), u32([pow2(-135), -3 * pow2(-136), 0.0]))
    # fp4 block [2^-128, -2^-127, 3 * 2^-128]: amax 1.5 * 2^-127, floor(log2) = -127, -2 -> -127.
    # x / X = 0.5 (0x1), -1 (0xA), 1.5 (0x3); round trip exact.
    x = np.array([pow2(-128), -pow2(-127), 3 * pow2(-128)], dtype=np.float32)
    codes, scales = q(x, "mxfp4_e2m1", block_size=3)
    assert scales.tolist() == [0] and codes.tolist() == [0x1, 0xA, 0x3]
    assert np.array_equal(u32(dequantize_mx_ref(codes, scales, "mxfp4_e2m1", 3)), u32(x))
    # mxint8 block [2^-127, 2^-133, 2^-134]: floor(log2 2^-127) - 0 = -127. c = x * 2^127 * 64:
    # 64, 1, 0.5 -> 0 (even) / 1 (away).
    x = np.array([pow2(-127), pow2(-133), pow2(-134)], dtype=np.float32)
    assert q(x, "mxint8", block_size=3)[0].tolist() == [64, 1, 0]
    assert q(x, "mxint8", block_size=3, rounding="nearest_away")[0].tolist() == [64, 1, 1]


NAN_CODE = {"mxfp8_e4m3": 0x7F, "mxfp8_e5m2": 0x7E, "mxfp6_e2m3": 0, "mxfp6_e3m2": 0, "mxfp4_e2m1": 0, "mxint8": 0}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, f32([0xFFC00000])[0], f32([0x7F800001])[0]])
@pytest.mark.parametrize("fmt", list(MX_FORMATS_REF))
def test_nan_and_inf_blocks(fmt, bad):
    # Block 0 = [1, bad, -0.0]: scale 0xff, every code the positive NaN code (or 0); it dequantises
    # to NaN throughout. Block 1 = [1.5, -1] (partial) is unaffected: floor e = 0 - emax.
    _, emax, _ = MX_FORMATS_REF[fmt]
    x = np.array([1.0, bad, -0.0, 1.5, -1.0], dtype=np.float32)
    for mode in SCALE_MODES:
        codes, scales = q(x, fmt, block_size=3, scale_mode=mode)
        assert scales[0] == 0xFF
        assert codes[:3].tolist() == [NAN_CODE[fmt]] * 3
        dq = dequantize_mx_ref(codes, scales, fmt, 3)
        assert np.all(np.isnan(dq[:3]))
        if mode == "floor":
            assert scales[1] == 127 - emax
            assert dq[3:].tolist() == [1.5, -1.0]


def test_clamped_scales_and_elements():
    # e4m3 [2^-140]: floor e = -148 -> -127, X = 2^-127: 2^-13 is below half of 2^-9 -> 0x00.
    codes, scales = q([pow2(-140)], block_size=1)
    assert scales.tolist() == [0] and codes.tolist() == [0x00]
    # mxint8 [float32 max], floor: e = 127 (not clamped): c = (2 - 2^-23) * 64 = 128 - 2^-17 -> 128
    # -> clamped to 127 (0x7F); dequantises to 127/64 * 2^127.
    fmax = one(0x7F7FFFFF)
    codes, scales = q([fmax, -fmax], "mxint8", block_size=2)
    assert scales.tolist() == [254] and codes.tolist() == [0x7F, 0x81]
    dq = dequantize_mx_ref(codes, scales, "mxint8", 2)
    assert dq.tolist() == [127 / 64 * 2.0**127, -127 / 64 * 2.0**127]
    # mxint8 neuron [2^127]: e = 128 clamped to 127, so c = 1 * 64 = 64 (0x40).
    codes, scales = q([pow2(127)], "mxint8", block_size=1, scale_mode="neuron")
    assert scales.tolist() == [254] and codes.tolist() == [0x40]


# mxint8 with X = 1 (amax = 1.999 in [1, 2)): c = round(64 x), clamped to [-127, 127].
INT8_CASES = [
    # 1.999 * 64 = 127.94 -> 128 -> 127 (0x7F) in the nearest modes; toward zero: 127.
    (1.999, dict(nearest_even=0x7F, nearest_away=0x7F, toward_zero=0x7F)),
    (-1.999, dict(nearest_even=0x81, nearest_away=0x81, toward_zero=0x81)),  # -127 = 0x81
    (1.984375, dict(nearest_even=0x7F, nearest_away=0x7F, toward_zero=0x7F)),  # exactly 127/64
    (2.0**-7, dict(nearest_even=0x00, nearest_away=0x01, toward_zero=0x00)),  # c = 0.5
    (1.5 / 64, dict(nearest_even=0x02, nearest_away=0x02, toward_zero=0x01)),  # c = 1.5
    (-1.5 / 64, dict(nearest_even=0xFE, nearest_away=0xFE, toward_zero=0xFF)),  # -2 / -2 / -1
    (2.5 / 64, dict(nearest_even=0x02, nearest_away=0x03, toward_zero=0x02)),  # c = 2.5
    (-(2.0**-7), dict(nearest_even=0x00, nearest_away=0xFF, toward_zero=0x00)),  # -0.5: no -0 code
]


@pytest.mark.parametrize("x, expected", INT8_CASES)
def test_mxint8_rounding_and_clamp(x, expected):
    for mode, code in expected.items():
        codes, scales = q([1.999, x], "mxint8", block_size=2, rounding=mode)
        assert scales.tolist() == [127]
        assert codes.tolist()[1] == code, mode


def test_mxint8_clamp_from_the_scale_mode():
    # rceil on amax = 1.999: d = 1.999 * 64/127 = 1.0074 > 1 -> u = 128 -> e = 1, X = 2:
    # c = 1.999 / 2 * 64 = 63.97 -> 64. floor: e = 0, c = 127.94 -> 128 -> clamped to 127.
    codes, scales = q([1.999], "mxint8", block_size=1, scale_mode="rceil")
    assert codes.tolist() == [64] and scales.tolist() == [128]
    codes, scales = q([1.999], "mxint8", block_size=1, scale_mode="floor")
    assert codes.tolist() == [127] and scales.tolist() == [127]


def test_partial_last_block():
    # 35 elements, block 32: block 0 has amax 448 (e = 0); block 1 = [0.5, -0.25, 0.125] has amax
    # 0.5 -> floor -1 - 8 = -9 (over its own 3 elements only), X = 2^-9: 256 = 2^8 -> 0x78;
    # -128 -> 0xF0; 64 -> 0x68.
    x = np.concatenate([np.full(32, 448.0), [0.5, -0.25, 0.125]]).astype(np.float32)
    codes, scales = q(x)
    assert scales.tolist() == [127, 118]
    assert codes.tolist() == [0x7E] * 32 + [0x78, 0xF0, 0x68]
    assert np.array_equal(dequantize_mx_ref(codes, scales, "mxfp8_e4m3", 32), x)
    # a block size larger than the array: one partial block
    codes, scales = q([0.5, -0.25, 0.125])
    assert scales.tolist() == [118] and codes.tolist() == [0x78, 0xF0, 0x68]
    # empty input: no blocks
    codes, scales = q(np.zeros(0, np.float32))
    assert codes.shape == (0,) and scales.shape == (0,)


def test_stochastic_threshold_is_exact():
    # e4m3, X = 1: 1.03125 = 1 + 1/32 lies a quarter of the way from 1.0 (0x38) to 1.125 (0x39):
    # up iff rand < floor(2^32 / 4) = 2^30.
    def code(x, r):
        return q([448.0, x], block_size=2, rounding="stochastic", rand=np.array([0, r], dtype=np.uint32))[0].tolist()[1]

    assert [code(1.03125, r) for r in (0, 2**30 - 1, 2**30, 2**32 - 1)] == [0x39, 0x39, 0x38, 0x38]
    assert [code(-1.03125, r) for r in (0, 2**30 - 1, 2**30)] == [0xB9, 0xB9, 0xB8]  # on the magnitude
    assert [code(1.125, r) for r in (0, 2**32 - 1)] == [0x39, 0x39]  # representable: never moves
    # 470 lies between 448 and the virtual 480: going up overflows and saturates: always 0x7E.
    assert [code(470.0, r) for r in (0, 2**31, 2**32 - 1)] == [0x7E, 0x7E, 0x7E]
    # mxint8, X = 1: c = 64 * 10.25 / 64 = 10.25 -> 11 iff rand < 2^30.
    got = [
        q([1.5, 10.25 / 64], "mxint8", block_size=2, rounding="stochastic", rand=np.array([0, r], dtype=np.uint32))[
            0
        ].tolist()[1]
        for r in (2**30 - 1, 2**30)
    ]
    assert got == [11, 10]


def test_stochastic_mean_with_evenly_spaced_draws():
    # With the 4096 draws k * 2^20, exactly those with k < 1024 round 1.03125 up: the mean of the
    # dequantised values is (3072 * 1.0 + 1024 * 1.125) / 4096 = 1.03125 exactly.
    n = 4096
    x = np.tile(np.array([448.0, 1.03125], dtype=np.float32), n)
    rand = np.zeros(2 * n, dtype=np.uint32)
    rand[1::2] = np.arange(n, dtype=np.uint32) << 20
    codes, scales = q(x, block_size=2, rounding="stochastic", rand=rand)
    dq = dequantize_mx_ref(codes, scales, "mxfp8_e4m3", 2)
    assert dq[1::2].mean(dtype=np.float64) == 1.03125


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8"])
def test_stochastic_mean_approaches_x(fmt):
    # A block of random values, none saturating (amax is the max element times X). Over many
    # draws, each element takes only its two neighbours X * lo, X * hi and the mean tends to x
    # (within 5 standard errors).
    rng = np.random.default_rng(11)
    _, emax, max_elem = MX_FORMATS_REF[fmt]
    top = np.float32(max_elem * 2.0**-3)
    x = np.clip(rng.standard_normal(16) * 0.3, -top, top).astype(np.float32)
    x[0] = top  # amax = max element * 2^-3: floor e = -3, every |x| / X <= max element
    n = 3000
    xs = np.tile(x, n)
    rand = rng.integers(0, 2**32, xs.size, dtype=np.uint64).astype(np.uint32)
    codes, scales = q(xs, fmt, block_size=16, rounding="stochastic", rand=rand)
    assert set(scales.tolist()) == {127 - 3}
    dq = dequantize_mx_ref(codes, scales, fmt, 16).reshape(n, 16).astype(np.float64)
    lo, hi = dq.min(axis=0), dq.max(axis=0)
    assert np.all((lo <= x) & (x <= hi))
    for j in range(16):
        assert len(set(dq[:, j].tolist())) <= 2
    stderr = (hi - lo) / 2 / math.sqrt(n)
    assert np.all(np.abs(dq.mean(axis=0) - x) <= 5 * stderr + 1e-12)


def test_stochastic_needs_rand_and_validation():
    with pytest.raises(ValueError):
        q([1.0], rounding="stochastic")
    with pytest.raises(ValueError):
        q([1.0], rounding="toward_positive")
    with pytest.raises(ValueError):
        q([1.0], block_size=0)
    with pytest.raises(ValueError):
        q([[1.0]])


# ---- dequantisation -----------------------------------------------------------------------------


def test_dequantize_scale_extremes():
    # byte 0 is 2^-127, never flushed: e4m3 code 0x01 (2^-9) -> 2^-136 = float32 bits 0x00002000.
    dq = dequantize_mx_ref(np.array([0x01, 0x38], np.uint8), np.array([0], np.uint8), "mxfp8_e4m3", 2)
    assert u32(dq).tolist() == [0x00002000, 0x00400000]  # and 1.0 * 2^-127 = 0x00400000
    # byte 254 is 2^127: 1.0 (0x38) -> 0x7F000000.
    dq = dequantize_mx_ref(np.array([0x38], np.uint8), np.array([254], np.uint8), "mxfp8_e4m3", 1)
    assert u32(dq).tolist() == [0x7F000000]
    # byte 0xff: the whole block is NaN, zero codes included; the next block is not.
    dq = dequantize_mx_ref(np.array([0x00, 0x38, 0x38], np.uint8), np.array([0xFF, 127], np.uint8), "mxfp8_e4m3", 2)
    assert np.isnan(dq[:2]).all() and dq[2] == 1.0
    # mxint8 code 0x81 = -127 -> -127/64 * X; fp4 code 0xF = -6.
    dq = dequantize_mx_ref(np.array([0x81, 0x40], np.uint8), np.array([127 + 3], np.uint8), "mxint8", 2)
    assert dq.tolist() == [-127 / 64 * 8, 8.0]
    dq = dequantize_mx_ref(np.array([0xF], np.uint8), np.array([127], np.uint8), "mxfp4_e2m1", 1)
    assert dq.tolist() == [-6.0]


def test_dequantize_overflow_at_2_to_the_128():
    # Where the spec's "every X * P is exact in float32" fails: e4m3 rceil on float32 max gives
    # e = 120 (see CLAMP_CASES) and amax / X = (2 - 2^-23) * 2^7 = 256 - 2^-16, which rounds to the
    # e4m3 value 256 (0x78); X * P = 2^128 is not a float32 and dequantises to inf.
    fmax = one(0x7F7FFFFF)
    for mode in ("ceil", "even", "neuron", "rceil"):
        codes, scales = q([fmax], block_size=1, scale_mode=mode)
        assert scales.tolist() == [247] and codes.tolist() == [0x78]
        assert dequantize_mx_ref(codes, scales, "mxfp8_e4m3", 1).tolist() == [math.inf]
    # floor: e = 119, amax / X = 512 - 2^-15 saturates to 448: finite.
    codes, scales = q([fmax], block_size=1)
    assert scales.tolist() == [246] and codes.tolist() == [0x7E]
    assert dequantize_mx_ref(codes, scales, "mxfp8_e4m3", 1).tolist() == [448 * 2.0**119]


def test_dequantize_validation():
    with pytest.raises(ValueError):
        dequantize_mx_ref(np.zeros(3, np.uint8), np.zeros(2, np.uint8), "mxfp8_e4m3", 32)


# ---- FP4 packing --------------------------------------------------------------------------------


def test_pack_fp4_hand():
    # element 2j in the low nibble, 2j + 1 in the high nibble, odd tail padded with 0.
    assert pack_fp4_ref(np.array([1, 2, 3], np.uint8)).tolist() == [0x21, 0x03]
    assert pack_fp4_ref(np.array([0xF, 0x0, 0x8, 0x7], np.uint8)).tolist() == [0x0F, 0x78]
    assert pack_fp4_ref(np.zeros(0, np.uint8)).tolist() == []
    assert pack_fp4_ref(np.array([[1, 2, 3], [4, 5, 6]], np.uint8)).tolist() == [[0x21, 0x03], [0x54, 0x06]]
    assert unpack_fp4_ref(np.array([0x21, 0x03], np.uint8), 3).tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        pack_fp4_ref(np.array([16], np.uint8))


@pytest.mark.parametrize("n", [0, 1, 2, 31, 32, 33])
def test_pack_fp4_round_trip(n):
    codes = np.random.default_rng(n).integers(0, 16, n).astype(np.uint8)
    packed = pack_fp4_ref(codes)
    assert packed.shape == ((n + 1) // 2,)
    assert np.array_equal(unpack_fp4_ref(packed, n), codes)
    if n % 2:
        assert packed[-1] >> 4 == 0


def test_fp4_quantize_then_pack():
    # fp4, X = 1 (6 in the block): [6, -0.5, 1.5] -> codes [0x7, 0x9, 0x3] -> bytes [0x97, 0x03].
    codes, scales = q([6.0, -0.5, 1.5], "mxfp4_e2m1")
    assert codes.tolist() == [0x7, 0x9, 0x3] and scales.tolist() == [127]
    assert pack_fp4_ref(codes).tolist() == [0x97, 0x03]
