"""The block-format reference (tests/reference_blocks.py) against results derived by hand from
docs/blocks.md.

The reference is what the fast NVFP4, 2-D block, scale-policy and rotation kernels will be judged
by, so it is checked here on its own. Every expected value below is worked out in the comment next
to it from the spec's rules, never by calling the reference a second way. Notation: "s" is the
decoded float8_e4m3fn block scale, "r" the float32 multiplier the elements are scaled by
(1 / s, or (1 / pts) / s), "v" the scaled element, codes in hex. E2M1 values by magnitude code:
0, 0.5, 1, 1.5, 2, 3, 4, 6 = codes 0..7, bit 3 the sign. e4m3fn code 0x38 is 1.0, one exponent
step is 0x08 and the low three bits are the mantissa in eighths (0x3C = 1.5, 0x40 = 2.0).

An optional test compares the reference with torchao's ``nvfp4_quantize`` bit for bit; it is
skipped, with the reason, when torch or torchao is not installed.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from .helpers import import_runtime
from .reference_blocks import (
    BlockQuantRef,
    block_error_ref,
    block_errors_ref,
    dequantize_2d_ref,
    f32_div,
    f32_mul,
    hadamard16_ref,
    neuron_quantize_mx_ref,
    neuron_scale_tile_ref,
    nvfp4_dequantize_ref,
    nvfp4_per_tensor_scale_ref,
    nvfp4_quantize_ref,
    nvfp4_scale_byte_ref,
    pack_x4_ref,
    quantize_2d_ref,
    rht_inverse_ref,
    rht_ref,
    unpack_x4_ref,
)
from .reference_casts import decode_ref
from .reference_mx import MX_FORMATS_REF, MX_ROUNDING_MODES, SCALE_MODES, quantize_mx_ref, unpack_fp4_ref

DETERMINISTIC = [m for m in MX_ROUNDING_MODES if m != "stochastic"]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def f32(bits) -> np.ndarray:
    """float32 values from bit patterns."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def one(bits: int) -> np.float32:
    return f32([bits])[0]


def u32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def row(*values) -> np.ndarray:
    return np.array([values], dtype=np.float32)


def nv(x, **kw) -> BlockQuantRef:
    """Single-level NVFP4 unless the test says otherwise."""
    kw.setdefault("per_tensor_scale", None)
    return nvfp4_quantize_ref(np.asarray(x, dtype=np.float32), **kw)


def e2m1(codes) -> list[float]:
    return decode_ref(np.asarray(codes, dtype=np.uint8), "float4_e2m1fn").tolist()


# ---- float32 steps ------------------------------------------------------------------------------


def test_f32_steps_are_one_ieee_operation():
    # A float32 * float32 product is exact in float64 (48 significant bits), so rounding that
    # float64 to float32 is the one correct rounding. For the quotient, float64 then float32 is a
    # double rounding that is innocuous for division because 53 >= 2 * 24 + 2 (Figueroa).
    rng = np.random.default_rng(5)
    a = f32(rng.integers(0, 0x7F800000, 4000, dtype=np.int64).astype(np.uint32))
    b = f32(rng.integers(0x00000001, 0x7F800000, 4000, dtype=np.int64).astype(np.uint32))
    with np.errstate(all="ignore"):
        want_mul = (a.astype(np.float64) * b.astype(np.float64)).astype(np.float32)
        want_div = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)
    got_mul = np.array([f32_mul(p, q) for p, q in zip(a, b)], dtype=np.float32)
    got_div = np.array([f32_div(p, q) for p, q in zip(a, b)], dtype=np.float32)
    assert np.array_equal(u32(got_mul), u32(want_mul))
    assert np.array_equal(u32(got_div), u32(want_div))
    # subnormal results are kept; overflow is inf
    assert u32([f32_mul(one(0x00800000), np.float32(0.5))]).tolist() == [0x00400000]
    assert f32_mul(np.float32(3e38), np.float32(2)) == math.inf


# ---- NVFP4: the scale ---------------------------------------------------------------------------

# (amax, pts, divisor, expected e4m3fn byte)
SCALE_BYTE_CASES = [
    (6.0, None, 6, 0x38),  # 6 / 6 = 1.0
    (6.375, None, 6, 0x38),  # 1.0625: a tie between 1.0 (0x38) and 1.125 (0x39): even mantissa -> 0x38
    (6.75, None, 6, 0x39),  # 1.125 exactly
    (7.125, None, 6, 0x3A),  # 1.1875: tie between 1.125 (0x39) and 1.25 (0x3A, even) -> 0x3A
    (12.0, None, 6, 0x40),  # 2.0
    (2688.0, None, 6, 0x7E),  # 448: the largest finite code
    (1e6, None, 6, 0x7E),  # 166666.7 clamps to 448
    (0.0, None, 6, 0x08),  # 0 clamps up to 2^-6: the all-zero block's byte
    (2.0**-10, None, 6, 0x08),  # 2^-10 / 6 < 2^-6 clamps to 2^-6
    (0.1, None, 6, 0x09),  # 0.01667 is above the midpoint 0.0166016 of 2^-6 and 1.125 * 2^-6 -> 0x09
    (6.0, None, 4, 0x3C),  # map to 4: 6 / 4 = 1.5
    (4.0, None, 4, 0x38),  # 4 / 4 = 1.0
    (11.25, 1.875, 6, 0x38),  # (11.25 / 6) / 1.875 = 1.875 / 1.875 = 1.0
    (9.0, 0.75, 6, 0x40),  # (9 / 6) / 0.75 = 1.5 / 0.75 = 2.0
    (2688.0, 0.5, 6, 0x7E),  # 448 / 0.5 = 896 clamps to 448
]


@pytest.mark.parametrize("amax, pts, divisor, byte", SCALE_BYTE_CASES)
def test_nvfp4_scale_byte_hand(amax, pts, divisor, byte):
    p = None if pts is None else np.float32(pts)
    assert nvfp4_scale_byte_ref(amax, p, divisor) == byte


def test_nvfp4_scale_byte_rejects_non_finite_amax():
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError):
            nvfp4_scale_byte_ref(bad)


# ---- NVFP4: single level ------------------------------------------------------------------------


def test_nvfp4_single_level_elements_hand():
    # amax = 6 -> t = 1.0 -> s = 1.0 (0x38), r = 1: v = x, rounded to E2M1 to nearest even.
    x = row(6.0, -0.0, 2.5, 1.25, 0.3, -5.0, 0.25, 0.75, 1.75, 3.5, -2.0, 4.0, 5.5, 0.1, -0.2, 1.0)
    want = [
        0x7,  # 6
        0x8,  # -0.0 keeps its sign
        0x4,  # 2.5: tie 2 (code 4) | 3 (code 5) -> 4
        0x2,  # 1.25: tie 1 (2) | 1.5 (3) -> 2
        0x1,  # 0.3 > 0.25 -> 0.5
        0xE,  # -5: tie 4 (6) | 6 (7) -> 6, negative
        0x0,  # 0.25: tie 0 | 0.5 -> 0
        0x2,  # 0.75: tie 0.5 (1) | 1 (2) -> 2
        0x4,  # 1.75: tie 1.5 (3) | 2 (4) -> 4
        0x6,  # 3.5: tie 3 (5) | 4 (6) -> 6
        0xC,  # -2
        0x6,  # 4
        0x7,  # 5.5 > 5 -> 6
        0x0,  # 0.1 < 0.25 -> 0
        0x8,  # -0.2 -> -0
        0x2,  # 1
    ]
    q = nv(x)
    assert q.codes.tolist() == [want] and q.scales.tolist() == [[0x38]] and q.pts is None
    dq = nvfp4_dequantize_ref(q.codes, q.scales, None)
    assert dq[0].tolist() == [6, -0.0, 2, 1, 0.5, -4, 0, 1, 2, 4, -2, 4, 6, 0, -0.0, 1]
    assert np.signbit(dq[0, 1]) and np.signbit(dq[0, 14])


def test_nvfp4_multiplies_by_the_reciprocal():
    # The spec (and torchao >= 0.18): v = x * f32(1 / s), not x / s. Block [11.25, 2.34375]:
    # t = 11.25 / 6 = 1.875 -> s = 1.875 (0x3F). r = f32(8/15): 8/15 * 2^24 = 8947848.53 -> 8947849,
    # r = 8947849 * 2^-24 (0.875 of a float32 ulp too large, relatively). 2.34375 = 75/32:
    # x * r = 20971521.09375 * 2^-24; float32 quantum in [1, 2) is 2 units -> 10485760.55 rounds up
    # to 20971522 * 2^-24 = 1.25 + 2^-23, just above the E2M1 tie 1.25 -> 1.5 (code 3). A true
    # division gives exactly 1.25, the tie, -> 1.0 (code 2).
    # 11.25 * r = 6 + a little -> clamped to 6 (code 7).
    q = nv(row(11.25, 2.34375))
    assert q.scales.tolist() == [[0x3F]]
    assert q.codes.tolist() == [[0x7, 0x3]]
    # dequantised: 6 * 1.875 = 11.25, 1.5 * 1.875 = 2.8125 (exact products)
    assert nvfp4_dequantize_ref(q.codes, q.scales, None).tolist() == [[11.25, 2.8125]]


def test_nvfp4_saturation_and_scale_clamps():
    # amax 6.375: s = 1.0 (the e4m3 tie above), v = 6.375 clamps to 6 (code 7): dequantises to 6.
    q = nv(row(6.375, -6.375))
    assert q.scales.tolist() == [[0x38]] and q.codes.tolist() == [[0x7, 0xF]]
    assert nvfp4_dequantize_ref(q.codes, q.scales, None).tolist() == [[6.0, -6.0]]
    # amax 1e6: t clamps to 448 (0x7E); v = 1e6 * f32(1/448) ~ 2232 -> 6 (code 7) -> 6 * 448 = 2688.
    q = nv(row(1e6))
    assert q.scales.tolist() == [[0x7E]] and q.codes.tolist() == [[0x7]]
    assert nvfp4_dequantize_ref(q.codes, q.scales, None).tolist() == [[2688.0]]
    # amax 0.05: t = 0.00833 clamps up to 2^-6 (0x08); r = 64: v = 3.2 -> 3 (code 5); 3 * 2^-6.
    q = nv(row(0.05, -0.001))
    assert q.scales.tolist() == [[0x08]] and q.codes.tolist() == [[0x5, 0x8]]  # -0.064 -> -0
    assert nvfp4_dequantize_ref(q.codes, q.scales, None).tolist() == [[0.046875, -0.0]]


def test_nvfp4_special_blocks():
    # Block 0 all zeros (either sign): t = 0 clamps to 2^-6 -> 0x08, codes are signed zeros.
    # Block 1 holds a NaN: 0x7f, codes 0, all NaN. Block 2 holds -inf: the same. Block 3 is the
    # partial last block [1.5, 3]: amax 3 -> t = 0.5 -> s = 0.5 (0x30), v = 3, 6 -> codes 5, 7.
    x = np.zeros((1, 16 * 3 + 2), dtype=np.float32)
    x[0, 1] = x[0, 7] = -0.0
    x[0, 16:32] = 1.0
    x[0, 20] = np.nan
    x[0, 32:48] = 2.0
    x[0, 40] = -np.inf
    x[0, 48:] = [1.5, 3.0]
    for pts in (None, "amax", 0.25):
        q = nvfp4_quantize_ref(x, per_tensor_scale=pts)
        if pts is None:
            assert q.scales.tolist() == [[0x08, 0x7F, 0x7F, 0x30]]
            assert q.codes[0, 48:].tolist() == [0x5, 0x7]
        assert q.scales[0, :3].tolist() == [0x08, 0x7F, 0x7F]
        assert q.codes[0, :16].tolist() == [0, 0x8] + [0] * 5 + [0x8] + [0] * 8
        assert q.codes[0, 16:48].tolist() == [0] * 32
        dq = nvfp4_dequantize_ref(q.codes, q.scales, q.pts)
        assert np.all(dq[0, :16] == 0) and np.signbit(dq[0, 1]) and not np.signbit(dq[0, 0])
        assert np.all(np.isnan(dq[0, 16:48]))
        assert np.all(np.isfinite(dq[0, 48:]))


def test_nvfp4_float32_subnormal_inputs():
    # Single level: the scale clamps to 2^-6, r = 64, and subnormals scale to ~2^-130: signed zeros.
    q = nv(row(one(0x00000001), -one(0x00400000), one(0x007FFFFF)))
    assert q.scales.tolist() == [[0x08]] and q.codes.tolist() == [[0x0, 0x8, 0x0]]
    # Two level with pts = 2^-127 (a float32 subnormal, given by the caller): block
    # [1.5 * 2^-125, 2^-127, 3 * 2^-128]: t = (1.5 * 2^-125 / 6) / 2^-127 = 2^-127 / 2^-127 = 1
    # (0x38); r = (1 / 2^-127) / 1 = 2^127: v = 6, 1, 1.5 -> codes 7, 2, 3. Dequantised:
    # m = 2^-127 * 1 and 6m, 1m, 1.5m are the inputs again, two of them subnormal.
    x = row(1.5 * 2.0**-125, 2.0**-127, 3 * 2.0**-128)
    q = nv(x, per_tensor_scale=2.0**-127)
    assert q.pts == np.float32(2.0**-127)
    assert q.scales.tolist() == [[0x38]] and q.codes.tolist() == [[0x7, 0x2, 0x3]]
    assert np.array_equal(u32(nvfp4_dequantize_ref(q.codes, q.scales, q.pts)), u32(x))


def test_nvfp4_partial_last_block_and_block_size():
    # 18 elements, block 16: block 1 = [3, -1.5] (amax over its two elements only): t = 0.5 ->
    # 0x30, v = 6, -3 -> codes 7, 0xD. block_size 4 on [6, 1, 12, 3, 0.75]: [6, 1, 12, 3] has
    # amax 12 -> s = 2 (0x40), v = 3, 0.5, 6, 1.5 -> codes 5, 1, 7, 3; [0.75]: t = 0.125 -> 0x20,
    # v = 6 -> 7. block_size 5 on [6, 1, 12, 3, 0.75, 0]: 0x40 and the zero block 0x08.
    x = np.concatenate([np.full(16, 6.0), [3.0, -1.5]]).astype(np.float32)[None, :]
    q = nv(x)
    assert q.scales.tolist() == [[0x38, 0x30]]
    assert q.codes[0, 16:].tolist() == [0x7, 0xD]
    q = nv(row(6, 1, 12, 3, 0.75), block_size=4)
    assert q.scales.tolist() == [[0x40, 0x20]] and q.codes.tolist() == [[5, 1, 7, 3, 7]]
    q = nv(row(6, 1, 12, 3, 0.75, 0.0), block_size=5)
    assert q.scales.tolist() == [[0x40, 0x08]]
    q = nv(np.zeros((2, 0), np.float32))
    assert q.codes.shape == (2, 0) and q.scales.shape == (2, 0)


def test_nvfp4_rows_are_independent():
    x = np.array([[6.0] * 16, [12.0] * 16, [0.75] * 16], dtype=np.float32)
    q = nv(x)
    assert q.scales.tolist() == [[0x38], [0x40], [0x20]]
    assert np.all(q.codes == 7)


# ---- NVFP4: two level ---------------------------------------------------------------------------


def test_default_per_tensor_scale_hand():
    # pts = amax / 2688 over the finite elements; 0 or non-finite -> 1.0.
    assert nvfp4_per_tensor_scale_ref(row(2688.0, -1.0)) == 1.0
    assert nvfp4_per_tensor_scale_ref(row(-5376.0, np.inf, np.nan)) == 2.0  # the inf and NaN are ignored
    # 448 / 2688 = 1/6 -> f32(1/6) = 0x3E2AAAAB
    assert u32([nvfp4_per_tensor_scale_ref(row(448.0))]).tolist() == [0x3E2AAAAB]
    assert nvfp4_per_tensor_scale_ref(np.zeros((2, 3))) == 1.0  # 0 -> 1.0
    assert nvfp4_per_tensor_scale_ref(row(np.nan, -np.inf)) == 1.0  # no finite element -> 1.0
    assert nvfp4_per_tensor_scale_ref(row(one(0x00000001))) == 1.0  # 2^-149 / 2688 rounds to 0 -> 1.0
    # the four-over-six bound: 1536 / (256 * 6) = 1
    assert nvfp4_per_tensor_scale_ref(row(1536.0), pts_bound=256) == 1.0
    assert nvfp4_per_tensor_scale_ref(row(1536.0), pts_bound=448) == np.float32(1536 / 2688)


def test_nvfp4_two_level_hand():
    # amax 448 -> pts = f32(1/6) = 11184811 * 2^-26 (0x3E2AAAAB).
    # t = f32(448 / 6) = 9786709 * 2^-17 (74.6666641); t / pts = 448 - 2.86e-5, which rounds to
    # the float32 448 - 2^-15 -> e4m3 448 (0x7E). r = f32(1 / pts) / 448: 2^26 / 11184811 =
    # 6 - 1.79e-7 rounds to 6.0; 6 / 448 = 3/224 -> f32 = 14380471 * 2^-30. v = 448 * r =
    # 6442451008 * 2^-30 -> 6.0 exactly after rounding -> code 7. The 1.0 element: v = r = 0.0134
    # -> 0. Dequantised: m = f32(pts * 448) = f32(5010795328 * 2^-26) = 9786710 * 2^-17, then
    # 6 * m = 58720260 * 2^-17 = 448 + 2^-15: the two-level round trip is not exact.
    q = nvfp4_quantize_ref(row(448.0, 1.0))
    assert u32([q.pts]).tolist() == [0x3E2AAAAB]
    assert q.scales.tolist() == [[0x7E]] and q.codes.tolist() == [[0x7, 0x0]]
    dq = nvfp4_dequantize_ref(q.codes, q.scales, q.pts)
    assert dq.tolist() == [[448.0 + 2.0**-15, 0.0]]


def test_nvfp4_two_level_reciprocal_order():
    # pts = 1.875 (given), block [11.25, 2.34375]: t = 1.875 / 1.875 = 1.0 (0x38); r = f32(1 / 1.875)
    # / 1 = 8947849 * 2^-24 as in test_nvfp4_multiplies_by_the_reciprocal: codes 7, 3. Dividing by
    # pts * s = 1.875 would give the tie 1.25 -> code 2. Dequantised: m = 1.875, 6m = 11.25, 1.5m.
    q = nv(row(11.25, 2.34375), per_tensor_scale=1.875)
    assert q.scales.tolist() == [[0x38]] and q.codes.tolist() == [[0x7, 0x3]]
    assert nvfp4_dequantize_ref(q.codes, q.scales, q.pts).tolist() == [[11.25, 2.8125]]
    # pts = 0.75, block [9, 1.875]: t = 1.5 / 0.75 = 2 (0x40); 1 / 0.75 = 11184811 * 2^-23, / 2 ->
    # r = 11184811 * 2^-24. 9r = 6 + 2e-7 -> 6 (code 7); 1.875 r = 20971520.625 * 2^-24, quantum 2
    # units -> 10485760.31 -> 1.25 exactly, the tie -> 1 (code 2). m = 0.75 * 2 = 1.5.
    q = nv(row(9.0, 1.875), per_tensor_scale=0.75)
    assert q.scales.tolist() == [[0x40]] and q.codes.tolist() == [[0x7, 0x2]]
    assert nvfp4_dequantize_ref(q.codes, q.scales, q.pts).tolist() == [[9.0, 1.5]]


def test_nvfp4_dequantize_forms_pts_times_s_first():
    # pts = f32(1/3) = 11184811 * 2^-25, s = 1.75 (0x3E), code 5 (3.0).
    # pts * s = 19573419.25 * 2^-25; float32 quantum in [0.5, 1) is 2 units -> 9786709.625 -> m =
    # 9786710 * 2^-24; 3 * m = 29360130 * 2^-24, quantum 2 units -> exact: 1.75 + 2^-23 (0x3FE00001).
    # The other order, (3 * pts) * s: 3 * pts = 33554433 * 2^-25 rounds to 1.0, times 1.75 = 1.75.
    pts = one(0x3EAAAAAB)
    dq = nvfp4_dequantize_ref(np.array([[0x5]], np.uint8), np.array([[0x3E]], np.uint8), pts)
    assert u32(dq).tolist() == [[0x3FE00001]]
    # single level: 3 * 1.75 = 5.25 exactly
    assert nvfp4_dequantize_ref(np.array([[0x5]], np.uint8), np.array([[0x3E]], np.uint8), None).tolist() == [[5.25]]


def test_nvfp4_zero_elements_when_the_reciprocal_overflows():
    # Decided here: a tensor whose computed pts is so small that (1 / pts) / s overflows to inf.
    # amax = 2^-120 -> pts = 2^-120 / 2688 ~ 2^-131.4 (subnormal), 1 / pts = inf. Non-zero
    # elements: x * inf = inf -> clamped to 6 (code 7); zeros keep their signed-zero codes (the
    # float32 product would be 0 * inf = NaN).
    q = nvfp4_quantize_ref(row(2.0**-120, 0.0, -0.0, -(2.0**-121)))
    assert 0 < q.pts < 2.0**-126
    assert q.codes.tolist() == [[0x7, 0x0, 0x8, 0xF]]


def test_per_tensor_scale_validation():
    for bad in (0.0, -1.0, math.inf, math.nan, 1e39, "max"):
        with pytest.raises(ValueError):
            nv(row(1.0), per_tensor_scale=bad)
    with pytest.raises(ValueError):
        nv(row(1.0), per_tensor_scale="amax", pts_bound=0)


# ---- NVFP4: stochastic rounding -----------------------------------------------------------------


def test_nvfp4_stochastic_threshold_and_indexing():
    # s = 1 (6 in the block): 1.25 lies half-way from 1.0 (code 2) to 1.5 (code 3): up iff
    # rand < 2^31. 2.25 lies a quarter of the way from 2 (code 4) to 3 (code 5): up iff rand < 2^30.
    # rand is indexed by the element's C-order position (here row 1, column 3 and column 5).
    x = np.zeros((2, 16), dtype=np.float32)
    x[:, 0] = 6.0
    x[1, 3] = 1.25
    x[1, 5] = -2.25

    def codes(r13, r15):
        rand = np.zeros(x.shape, dtype=np.uint32)
        rand[1, 3], rand[1, 5] = r13, r15
        c = nv(x, rounding="stochastic", rand=rand).codes
        return int(c[1, 3]), int(c[1, 5])

    assert codes(2**31 - 1, 2**30 - 1) == (0x3, 0xD)
    assert codes(2**31, 2**30) == (0x2, 0xC)
    assert codes(0, 2**32 - 1) == (0x3, 0xC)
    # 6 is representable: never moves; saturation stays at 6 whatever the draw
    rand = np.full(x.shape, 0, dtype=np.uint32)
    assert int(nv(x, rounding="stochastic", rand=rand).codes[0, 0]) == 0x7
    with pytest.raises(ValueError):
        nv(x, rounding="stochastic")
    with pytest.raises(ValueError):
        nv(x, rounding="stochastic", rand=np.zeros((16, 2), np.uint32))


def test_nvfp4_stochastic_mean_with_evenly_spaced_draws():
    # 1.25 in a block with 6 (s = 1): the draws k * 2^22, k < 1024, go up exactly for k < 512:
    # the mean is (512 * 1.0 + 512 * 1.5) / 1024 = 1.25.
    n = 1024
    x = np.zeros((n, 2), dtype=np.float32)
    x[:, 0], x[:, 1] = 6.0, 1.25
    rand = np.zeros(x.shape, dtype=np.uint32)
    rand[:, 1] = np.arange(n, dtype=np.uint32) << 22
    q = nv(x, rounding="stochastic", rand=rand)
    dq = nvfp4_dequantize_ref(q.codes, q.scales, None)
    assert dq[:, 1].mean(dtype=np.float64) == 1.25


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_nvfp4_other_rounding_modes(mode):
    # s = 1: 2.5 is a tie between 2 (code 4) and 3 (5); 2.75 lies above it; -0.75 is a tie
    # between -0.5 (0x9) and -1 (0xA).
    want = {
        "nearest_even": [0x4, 0x5, 0xA],
        "nearest_away": [0x5, 0x5, 0xA],
        "toward_zero": [0x4, 0x4, 0x9],
    }[mode]
    assert nv(row(6.0, 2.5, 2.75, -0.75), rounding=mode).codes.tolist()[0][1:] == want


# ---- NVFP4: invariants on random data -----------------------------------------------------------


def random_blocks(seed: int, rows: int = 24, cols: int = 48) -> np.ndarray:
    """Rows over many binades, with zeros, negative zeros and subnormals."""
    rng = np.random.default_rng(seed)
    mant = rng.uniform(-2, 2, (rows, cols))
    exps = rng.integers(-40, 40, (rows, 1)) + rng.integers(-6, 6, (rows, cols))
    x = (mant * np.exp2(exps)).astype(np.float32)
    x[rng.random((rows, cols)) < 0.05] = 0.0
    x[rng.random((rows, cols)) < 0.03] = -0.0
    x[0, :5] = f32([0x00000001, 0x80000010, 0x00400000, 0x007FFFFF, 0x00800000])
    return x


def half_gap(p: float) -> float:
    """Half the distance from E2M1 magnitude p to its neighbours (the largest rounding error)."""
    return 0.25 if p < 2 else (0.5 if p < 4 else 1.0)


@pytest.mark.parametrize("pts", [None, "amax"])
def test_nvfp4_round_trip_within_half_an_element_step(pts):
    # For every element with |x / (pts s)| <= 6 (not saturated), |dq - x| <= half an E2M1 step
    # times pts * s, up to the float32 roundings of r, of pts * s and of the product (each a
    # relative 2^-24 of at most 6 pts s: below pts * s * 2^-18 together).
    x = random_blocks(1)
    q = nvfp4_quantize_ref(x, per_tensor_scale=pts)
    assert q.codes.max() <= 0xF
    dq = nvfp4_dequantize_ref(q.codes, q.scales, q.pts)
    for i, j in np.ndindex(*x.shape):
        s = float(decode_ref(q.scales[i, j // 16 : j // 16 + 1], "float8_e4m3fn")[0])
        m = s * (1.0 if q.pts is None else float(q.pts))
        v = float(x[i, j]) / m
        p = abs(e2m1([q.codes[i, j]])[0])
        assert abs(float(dq[i, j])) <= 6 * m * (1 + 2.0**-20)
        if abs(v) <= 6:
            assert abs(float(dq[i, j]) - float(x[i, j])) <= half_gap(p) * m + m * 2.0**-18


def test_nvfp4_exact_round_trip_on_the_grid():
    # Blocks whose elements are E2M1 values times s, with 6 s in the block and s an e4m3 value
    # (amax / 6 = s exactly): single level gives them back exactly.
    rng = np.random.default_rng(2)
    for s in (2.0**-6, 0.09375, 1.0, 1.375, 13.0, 448.0):
        vals = rng.choice(E2M1, 16) * rng.choice([-1, 1], 16)
        vals[3] = 6.0
        x = (vals * s).astype(np.float32)[None, :]
        q = nv(x)
        assert np.array_equal(u32(nvfp4_dequantize_ref(q.codes, q.scales, None)), u32(x))


# ---- scale policies -----------------------------------------------------------------------------


def test_four_over_six_picks_map_to_4():
    # Block [4, 3, 2, 1]. Map to 6: t = 4/6 = 0.667 -> e4m3 1.375 * 2^-1 = 0.6875 (0x33; 1.333 is
    # nearer 1.375 than 1.25); v = x / 0.6875 = 5.82, 4.36, 2.91, 1.45 -> 6, 4, 3, 1.5 -> dq 4.125,
    # 2.75, 2.0625, 1.03125: mse = 0.125^2 + 0.25^2 + 0.0625^2 + 0.03125^2 = 0.0830078125.
    # Map to 4: t = 1 (0x38), v = x: 4, 3, 2, 1 exactly: error 0 -> map to 4 wins.
    x = row(4.0, 3.0, 2.0, 1.0)
    q = nv(x)
    assert q.scales.tolist() == [[0x33]] and q.codes.tolist() == [[7, 6, 5, 3]]
    err = block_error_ref(x, nvfp4_dequantize_ref(q.codes, q.scales, None), "mse")
    assert err == 0.0830078125
    for metric in ("mae", "mse"):
        q = nv(x, policy=("four_over_six", metric))
        assert q.scales.tolist() == [[0x38]] and q.codes.tolist() == [[6, 5, 4, 2]]


def test_four_over_six_keeps_map_to_6_on_a_tie_and_metrics_differ():
    # Block [0.5, 2.5, 6]. Map to 6: s = 1 (0x38): 0.5 and 6 exact, 2.5 (tie) -> 2: errors 0, 0.5, 0
    # -> mae 0.5, mse 0.25. Map to 4: t = 1.5 (0x3C), r = f32(2/3) = 0.666666686: 0.333 -> 0.5 (dq
    # 0.75), 1.667 -> 1.5 (dq 2.25), 6r rounds to 4.0 (dq 6): errors 0.25, 0.25, 0 -> mae 0.5,
    # mse 0.125. mae ties -> map to 6; mse is smaller with map to 4.
    x = row(0.5, 2.5, 6.0)
    q = nv(x, policy=("four_over_six", "mae"))
    assert q.scales.tolist() == [[0x38]] and q.codes.tolist() == [[1, 4, 7]]
    q = nv(x, policy=("four_over_six", "mse"))
    assert q.scales.tolist() == [[0x3C]] and q.codes.tolist() == [[1, 3, 6]]
    # [6] alone: map to 4 gives s = 1.5 and v = 4: dq 6 exactly, a tie at 0 -> map to 6.
    assert nv(row(6.0), policy=("four_over_six", "mse")).scales.tolist() == [[0x38]]
    # all-zero block: both candidates are 2^-6: 0x08
    assert nv(np.zeros((1, 16)), policy=("four_over_six", "mse")).scales.tolist() == [[0x08]]


def test_four_over_six_with_the_256_bound():
    # amax_t = 1536: pts = 1536 / (256 * 6) = 1. Block [1536, 1024]: map to 6: t = 256 (0x78, 2^8),
    # v = 6, 4 -> exact; map to 4: t = 384 (0x7C), v = 4, 2.67 -> 3: worse. Map to 6 kept. The
    # point of the bound: map to 4 of the largest block, 384, still fits below 448.
    q = nvfp4_quantize_ref(row(1536.0, 1024.0), pts_bound=256, policy=("four_over_six", "mse"))
    assert q.pts == 1.0 and q.scales.tolist() == [[0x78]] and q.codes.tolist() == [[7, 6]]
    # [1536, 1280]: map to 6 (s = 256): v = 6, 5 (a tie) -> 4: dq 1024, error 256^2; map to 4
    # (s = 384): v = 4, 3.33 -> 3: dq 1536, 1152, error 128^2: map to 4 wins.
    q = nvfp4_quantize_ref(row(1536.0, 1280.0), pts_bound=256, policy=("four_over_six", "mse"))
    assert q.scales.tolist() == [[0x7C]] and q.codes.tolist() == [[6, 5]]


def test_nvfp4_mse_scale_search_hand():
    # Block [6, 5], s = 1 (0x38): 5 is a tie -> 4: mse 1. Candidates 0x36..0x3A:
    #   0x36 = 0.875: v = 6.86, 5.71 -> 6, 6 -> dq 5.25, 5.25: 0.5625 + 0.0625 = 0.625
    #   0x37 = 0.9375: v = 6.4, 5.33 -> 6, 6 -> dq 5.625, 5.625: 0.140625 + 0.390625 = 0.53125
    #   0x39 = 1.125: v = 5.33, 4.44 -> 6, 4 -> dq 6.75, 4.5: 0.5625 + 0.25 = 0.8125
    #   0x3A = 1.25: v = 4.8, 4 -> 4, 4 -> dq 5, 5: 1 + 0 = 1
    # -> 0x37, codes 7, 7.
    q = nv(row(6.0, 5.0), scale_search="mse")
    assert q.scales.tolist() == [[0x37]] and q.codes.tolist() == [[7, 7]]
    # exact on the grid: nothing beats error 0, so the computed scale stays
    assert nv(row(6.0, 3.0, -1.5), scale_search="mse").scales.tolist() == [[0x38]]
    # codes outside 0x01..0x7e are skipped: amax 2688 -> 0x7E; 0x7F (NaN) and 0x80 are not tried.
    # s = 448: 2600 / 448 = 5.8 -> 6 (error 88^2); 0x7D = 416: 2688 / 416 = 6.46 -> 6, dq 2496
    # (error 192^2 already); 0x7C = 384: dq at most 2304: 0x7E stays.
    assert nv(row(2688.0, 2600.0), scale_search="mse").scales.tolist() == [[0x7E]]
    # [0.0703125] (9/128): t = 0.0117 clamps to 2^-6 (0x08): v = 4.5, a tie -> 4 -> dq 0.0625.
    # The e4m3 subnormal scales below the clamp are candidates too: 0x06 = 6 * 2^-9 = 0.01171875
    # gives v = 6 -> dq 0.0703125 exactly (error 0); 0x09 = 1.125 * 2^-6 gives v = 4 -> exact as
    # well, a tie that the smaller code (tried first) keeps.
    q = nv(row(0.0703125), scale_search="mse")
    assert q.scales.tolist() == [[0x06]] and q.codes.tolist() == [[7]]


def test_mx_mse_scale_search_hand():
    # mxfp4 floor, [7.5]: e = 2 - 2 = 0: 7.5 saturates to 6 (err 2.25); e + 1 = 1: 3.75 -> 4 (code
    # 6) -> dq 8 (err 0.25) -> byte 128.
    x = row(7.5)
    assert quantize_2d_ref(x, "mxfp4_e2m1", (1, 32)).scales.tolist() == [[127]]
    q = quantize_2d_ref(x, "mxfp4_e2m1", (1, 32), scale_search="mse")
    assert q.scales.tolist() == [[128]] and q.codes.tolist() == [[6]]
    # mxfp4 [7, 7]: X = 1 -> 6, 6 (err 1 + 1); X = 2 -> 3.5 -> tie -> 4 -> 8, 8 (err 1 + 1): tie
    # keeps e -> 127.
    assert quantize_2d_ref(row(7.0, 7.0), "mxfp4_e2m1", (1, 32), scale_search="mse").scales.tolist() == [[127]]
    # e4m3 [480]: floor e = 0 saturates to 448 (err 1024); e + 1: 240 exactly (0x77) -> 128.
    q = quantize_2d_ref(row(480.0), "mxfp8_e4m3", (1, 32), scale_search="mse")
    assert q.scales.tolist() == [[128]] and q.codes.tolist() == [[0x77]]
    # e = 127 (mxint8, amax 1.5 * 2^127): e + 1 = 128 is not a scale: skipped -> byte 254
    q = quantize_2d_ref(row(1.5 * 2.0**127), "mxint8", (1, 32), scale_search="mse")
    assert q.scales.tolist() == [[254]] and q.codes.tolist() == [[96]]
    # special blocks are not searched
    q = quantize_2d_ref(np.array([[0.0, np.nan]], np.float32), "mxfp8_e4m3", (1, 1), scale_search="mse")
    assert q.scales.tolist() == [[0, 0xFF]]


@pytest.mark.parametrize("seed", [3, 4])
def test_policies_never_increase_the_block_error(seed):
    x = random_blocks(seed, rows=12, cols=32)
    for pts in (None, "amax"):
        base = nvfp4_quantize_ref(x, per_tensor_scale=pts)
        dq0 = nvfp4_dequantize_ref(base.codes, base.scales, base.pts)
        for metric in ("mae", "mse"):
            q = nvfp4_quantize_ref(x, per_tensor_scale=pts, policy=("four_over_six", metric))
            dq = nvfp4_dequantize_ref(q.codes, q.scales, q.pts)
            assert np.all(block_errors_ref(x, dq, (1, 16), metric) <= block_errors_ref(x, dq0, (1, 16), metric))
        q = nvfp4_quantize_ref(x, per_tensor_scale=pts, scale_search="mse")
        dq = nvfp4_dequantize_ref(q.codes, q.scales, q.pts)
        assert np.all(block_errors_ref(x, dq, (1, 16), "mse") <= block_errors_ref(x, dq0, (1, 16), "mse"))
        assert np.all(np.abs(q.scales.astype(int) - base.scales.astype(int)) <= 2)
    for fmt in ("mxfp4_e2m1", "mxfp8_e4m3", "mxint8"):
        base = quantize_2d_ref(x, fmt, (4, 8))
        q = quantize_2d_ref(x, fmt, (4, 8), scale_search="mse")
        e0 = block_errors_ref(x, dequantize_2d_ref(base.codes, base.scales, fmt, (4, 8)), (4, 8))
        e1 = block_errors_ref(x, dequantize_2d_ref(q.codes, q.scales, fmt, (4, 8)), (4, 8))
        assert np.all(e1 <= e0)
        assert np.all((q.scales == base.scales) | (q.scales == base.scales + 1))


def test_policy_validation():
    x = row(1.0)
    for bad in ("four_over_six", ("four_over_six", "max"), ("six", "mse")):
        with pytest.raises(ValueError):
            nv(x, policy=bad)
    with pytest.raises(ValueError):
        nv(x, policy=("four_over_six", "mse"), scale_search="mse")
    with pytest.raises(ValueError):
        nv(x, scale_search="mae")
    with pytest.raises(ValueError):
        quantize_2d_ref(x, "mxfp8_e4m3", (1, 32), policy=("four_over_six", "mse"))


def test_block_error_hand():
    # |0.5 - 0| + |-1 - (-0.75)| = 0.75; squares 0.25 + 0.0625; a tile sum in C order.
    assert block_error_ref([0.0, -0.75], [0.5, -1.0], "mae") == 0.75
    assert block_error_ref([0.0, -0.75], [0.5, -1.0], "mse") == 0.3125
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    dq = x + np.array([[1, 0, 2], [0, 0, 3]], np.float32)
    assert block_errors_ref(x, dq, (2, 2), "mae").tolist() == [[1.0, 5.0]]
    assert block_errors_ref(x, dq, (1, 3), "mse").tolist() == [[5.0], [9.0]]
    assert math.isinf(block_error_ref([1.0], [np.inf]))


# ---- 2-D blocks ---------------------------------------------------------------------------------


def test_mx_2d_tiles_hand():
    # e4m3 floor, tiles 2 x 2 over a 3 x 3 array (partial tiles on the bottom and right):
    # (0,0) {1, 2, 4, 8}: amax 8 -> 3 - 8 = -5 (byte 122), x * 32 = 32, 64, 128, 256 -> 0x60, 0x68,
    # 0x70, 0x78. (0,1) {448, 0.5}: e = 0 (127): 0x7E, 0x30. (1,0) {0, -0}: zero block, byte 0,
    # signed zeros. (1,1) {3}: floor(log2 3) = 1 -> -7 (120), 3 * 128 = 384 = 1.5 * 2^8 -> 0x7C.
    x = np.array([[1, 2, 448], [4, 8, 0.5], [0, -0.0, 3]], np.float32)
    q = quantize_2d_ref(x, "mxfp8_e4m3", (2, 2))
    assert q.pts is None
    assert q.scales.tolist() == [[122, 127], [0, 120]]
    assert q.codes.tolist() == [[0x60, 0x68, 0x7E], [0x70, 0x78, 0x30], [0x00, 0x80, 0x7C]]
    dq = dequantize_2d_ref(q.codes, q.scales, "mxfp8_e4m3", (2, 2))
    assert np.array_equal(u32(dq), u32(x))


def test_nvfp4_16x16_tiles_hand():
    # A 17 x 18 array, tiles 16 x 16: (0,0) holds 6 -> s = 1 (0x38); (0,1) = columns 16, 17 of rows
    # 0..15 holds 0.75 -> t = 0.125 (0x20), v = 6; (1,0) = row 16, columns 0..15: zeros -> 0x08;
    # (1,1) = x[16, 16:18] holds 12 -> t = 2 (0x40), v = 6. Single level.
    x = np.zeros((17, 18), dtype=np.float32)
    x[0, 0], x[5, 9] = 6.0, -3.0
    x[3, 17] = 0.75
    x[16, 17] = 12.0
    q = quantize_2d_ref(x, "nvfp4", (16, 16), per_tensor_scale=None)
    assert q.scales.tolist() == [[0x38, 0x20], [0x08, 0x40]]
    want = np.zeros(x.shape, np.uint8)
    want[0, 0], want[5, 9], want[3, 17], want[16, 17] = 0x7, 0xD, 0x7, 0x7
    assert np.array_equal(q.codes, want)
    dq = dequantize_2d_ref(q.codes, q.scales, "nvfp4", (16, 16))
    assert np.array_equal(dq, x)
    # with the default pts: amax 12 -> pts = 12 / 2688 = 1/224; tile (1,1): t = 2 / pts = 448
    assert quantize_2d_ref(x, "nvfp4", (16, 16)).scales[1, 1] == 0x7E


@pytest.mark.parametrize("fmt", list(MX_FORMATS_REF))
def test_mx_tile_1_by_c_equals_1d_blocks(fmt):
    # The 2-D tiles (1, c) are the 1-D MX blocks of reference_mx along the last axis, and (c, 1)
    # along the first axis, for every scale mode and rounding mode (partial last blocks included).
    rng = np.random.default_rng(7)
    x = random_blocks(8, rows=3, cols=21)
    x[1, 16:] = [np.nan, 1.0, 2.0, 0.0, -1.0]
    rand = rng.integers(0, 2**32, x.shape, dtype=np.uint64).astype(np.uint32)
    for mode in SCALE_MODES:
        for rounding in MX_ROUNDING_MODES:
            rr = rand if rounding == "stochastic" else None
            q = quantize_2d_ref(x, fmt, (1, 8), scale_mode=mode, rounding=rounding, rand=rr)
            for i in range(x.shape[0]):
                codes, scales = quantize_mx_ref(
                    x[i], fmt, 8, mode, rounding, None if rr is None else rr[i].astype(np.uint32)
                )
                assert q.codes[i].tolist() == codes.tolist(), (mode, rounding, i)
                assert q.scales[i].tolist() == scales.tolist(), (mode, rounding, i)
    q = quantize_2d_ref(x.T, fmt, (8, 1))
    for i in range(x.shape[0]):
        codes, scales = quantize_mx_ref(x[i], fmt, 8)
        assert q.codes[:, i].tolist() == codes.tolist() and q.scales[:, i].tolist() == scales.tolist()


def test_nvfp4_tile_1_by_16_is_the_1d_quantiser():
    x = random_blocks(9, rows=4, cols=40)
    a = nvfp4_quantize_ref(x)
    b = quantize_2d_ref(x, "nvfp4", (1, 16))
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales) and a.pts == b.pts


def test_2d_tile_amax_spans_rows():
    # mxfp4 floor, tile (2, 2): the tile's amax (6 in row 1) sets X = 1 for row 0 too, so row 0's
    # 0.25 rounds (tie) to 0 where a 1 x 2 block [0.25, 0.5] would have X = 2^-3 and keep it.
    x = np.array([[0.25, 0.5], [6.0, 1.0]], np.float32)
    assert quantize_2d_ref(x, "mxfp4_e2m1", (2, 2)).codes.tolist() == [[0x0, 0x1], [0x7, 0x2]]
    assert quantize_2d_ref(x, "mxfp4_e2m1", (1, 2)).codes.tolist() == [[0x4, 0x6], [0x7, 0x2]]


def test_2d_validation():
    x = np.ones((4, 4), np.float32)
    for bad in ((0, 4), (4,), (1.5, 2), None, (True, 2)):
        with pytest.raises(ValueError):
            quantize_2d_ref(x, "nvfp4", bad)
    with pytest.raises(ValueError):
        quantize_2d_ref(x, "nvfp8", (1, 4))
    with pytest.raises(ValueError):
        quantize_2d_ref(x, "nvfp4", (1, 4), scale_mode="rceil")
    with pytest.raises(ValueError):
        quantize_2d_ref(x, "mxfp8_e4m3", (1, 4), per_tensor_scale=1.0)
    with pytest.raises(ValueError):
        quantize_2d_ref(x, "mxfp8_e4m3", (1, 4), scale_mode="round")
    with pytest.raises(ValueError):
        quantize_2d_ref(np.ones(4), "nvfp4", (1, 4))
    with pytest.raises(ValueError):
        dequantize_2d_ref(np.zeros((2, 4), np.uint8), np.zeros((2, 2), np.uint8), "nvfp4", (1, 4))
    with pytest.raises(ValueError):
        dequantize_2d_ref(np.zeros((2, 4), np.uint8), np.zeros((2, 1), np.uint8), "mxfp8_e4m3", (1, 4), pts=1.0)


# ---- Neuron quantize_mx -------------------------------------------------------------------------


def test_pack_x4_hand():
    # element 4j + i in byte i of container j, element 0 least significant
    codes = np.array([[0x01, 0x02, 0x03, 0x04, 0xAA, 0xBB, 0xCC, 0xDD]], np.uint8)
    assert pack_x4_ref(codes).tolist() == [[0x04030201, 0xDDCCBBAA]]
    assert np.array_equal(unpack_x4_ref(pack_x4_ref(codes)), codes)
    with pytest.raises(ValueError):
        pack_x4_ref(np.zeros((1, 6), np.uint8))


@pytest.mark.parametrize("fmt, one_code, emax", [("mxfp8_e4m3", 0x70, 8), ("mxfp8_e5m2", 0x74, 15)])
def test_neuron_quantize_mx_groups_and_scale(fmt, one_code, emax):
    # A [16, 8] tile of ones, four groups of 8 partitions x 4 elements; group (a, b) gets one
    # element 2^k: (0,0) at [7, 3] with k = 0 (all ones), (0,1) at [0, 4] with k = 3, (1,0) at
    # [8, 3] with k = -2, (1,1) at [15, 7] with k = 5 (and one zero group element).
    # "neuron" scale: floor(log2 amax) - (emax - 1): amax 1 -> 1 - emax; amax 8 -> 4 - emax;
    # amax 1 (the 2^-2 is not the max) -> 1 - emax; amax 32 -> 6 - emax. Byte = that + 127.
    # Elements: x / X. The block maximum 2^k / 2^(k - emax + 1) = 2^(emax - 1): e4m3 2^7 (field 14,
    # 0x70), e5m2 2^14 (field 29, 0x74). The ones in a block with amax 2^k are 2^(emax - 1 - k).
    x = np.ones((16, 8), np.float32)
    x[0, 4], x[8, 3], x[15, 7], x[14, 6] = 8.0, 0.25, 32.0, 0.0
    packed, scales = neuron_quantize_mx_ref(x, fmt)
    assert scales.tolist() == [[128 - emax, 131 - emax], [128 - emax, 133 - emax]]
    assert packed.shape == (16, 2) and packed.dtype == np.uint32
    codes = unpack_x4_ref(packed)
    # group (0,0) and (1,0): ones are the maximum: one_code; group (0,1): ones are 2^(emax-1-3)
    assert codes[7, 3] == one_code and codes[0, 4] == one_code and codes[15, 7] == one_code
    assert codes[3, 5] == one_code - 3 * (8 if fmt == "mxfp8_e4m3" else 4)  # three binades lower
    assert codes[9, 6] == one_code - 5 * (8 if fmt == "mxfp8_e4m3" else 4)
    assert codes[14, 6] == 0x00
    assert codes[8, 3] == one_code - 2 * (8 if fmt == "mxfp8_e4m3" else 4)  # 0.25 in a block of amax 1
    # packed word: row 0, container 0 holds elements 0..3, all ones at the block maximum
    assert packed[0, 0] == one_code * 0x01010101
    assert np.array_equal(dequantize_2d_ref(codes, scales, fmt, (8, 4)), x)


def test_neuron_quantize_mx_zero_and_special_groups():
    # all-zero group: X = 2^-127 (byte 0), codes 0; a NaN group (docs/blocks.md): 0xff and 0x7f codes.
    x = np.zeros((8, 8), np.float32)
    x[2, 5] = np.nan
    packed, scales = neuron_quantize_mx_ref(x)
    assert scales.tolist() == [[0, 0xFF]]
    codes = unpack_x4_ref(packed)
    assert np.all(codes[:, :4] == 0) and np.all(codes[:, 4:] == 0x7F)
    # the block maximum never saturates: 1020: floor(log2) = 9 -> X = 2^(9 - 7) = 4, 1020 / 4 = 255
    # -> 256 (0x78; the OCP floor scale 2 would give 510, saturated to 448)
    x = np.full((8, 4), 1020.0, np.float32)
    packed, scales = neuron_quantize_mx_ref(x)
    assert scales.tolist() == [[127 + 2]] and unpack_x4_ref(packed)[0, 0] == 0x78


def test_neuron_quantize_mx_validation():
    with pytest.raises(ValueError):
        neuron_quantize_mx_ref(np.ones((8, 4)), "mxfp4_e2m1")  # no FP4 output
    with pytest.raises(ValueError):
        neuron_quantize_mx_ref(np.ones((12, 4)))
    with pytest.raises(ValueError):
        neuron_quantize_mx_ref(np.ones((8, 6)))


def test_neuron_scale_tile_hand():
    # P = 128: logical rows a = 0..15 go to partitions 32 * (a // 4) + a % 4 (+ offset).
    scales = np.arange(16, dtype=np.uint8).reshape(16, 1) + 100
    tile = neuron_scale_tile_ref(scales, 128)
    assert tile.shape == (128, 1)
    where = {int(p): int(tile[p, 0]) for p in np.nonzero(tile[:, 0])[0]}
    assert where == {
        0: 100,
        1: 101,
        2: 102,
        3: 103,
        32: 104,
        33: 105,
        34: 106,
        35: 107,
        64: 108,
        65: 109,
        66: 110,
        67: 111,
        96: 112,
        97: 113,
        98: 114,
        99: 115,
    }
    tile = neuron_scale_tile_ref(scales, 128, offset=12)
    assert tile[12, 0] == 100 and tile[111, 0] == 115 and tile[0, 0] == 0
    # P = 32: four rows on partitions 0..3
    assert neuron_scale_tile_ref(scales[:4], 32)[:4, 0].tolist() == [100, 101, 102, 103]
    with pytest.raises(ValueError):
        neuron_scale_tile_ref(scales, 128, offset=2)
    with pytest.raises(ValueError):
        neuron_scale_tile_ref(scales[:1], 8, offset=12)  # partition 12 of 8


# ---- random Hadamard rotation -------------------------------------------------------------------


def test_hadamard16_is_sylvester():
    h2 = np.array([[1, 1], [1, -1]])
    want = np.array([[1]])
    for _ in range(4):
        want = np.kron(h2, want)  # H_2n = [[H_n, H_n], [H_n, -H_n]]
    h = hadamard16_ref()
    assert np.array_equal(h, want)
    assert np.array_equal(h.astype(int) @ h.T.astype(int), 16 * np.eye(16, dtype=int))


def test_rht_hand():
    s = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]
    h = hadamard16_ref().astype(float)
    # one-hot at index 0: y = s_0 * H[0] / 4 = 0.25 everywhere
    e0 = np.zeros((1, 16), np.float32)
    e0[0, 0] = 1
    assert rht_ref(e0).tolist() == [[0.25] * 16]
    # one-hot at 3: s_3 = -1, y = -H[3] / 4; H[3, j] = (-1)^popcount(3 & j): +, -, -, +, ...
    e3 = np.zeros((1, 16), np.float32)
    e3[0, 3] = 1
    assert rht_ref(e3)[0, :4].tolist() == [-0.25, 0.25, 0.25, -0.25]
    assert rht_ref(e3).tolist() == [(-h[3] / 4).tolist()]
    # all ones: y_0 = sum(s) / 4 = (6 - 10) / 4 = -1
    assert rht_ref(np.ones((1, 16), np.float32))[0, 0] == -1.0
    # custom signs: all +1 on all ones: y = [4, 0, 0, ...] (every other column of H sums to 0)
    assert rht_ref(np.ones((1, 16), np.float32), signs=[1] * 16).tolist() == [[4.0] + [0.0] * 15]
    # the default is the spec's vector
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    assert np.array_equal(rht_ref(x), rht_ref(x, signs=s))


def exact_rotation(group, signs) -> list[Fraction]:
    h = hadamard16_ref().astype(int).tolist()
    return [sum(Fraction(float(group[i])) * signs[i] * h[i][j] for i in range(16)) / 4 for j in range(16)]


def test_rht_is_correctly_rounded_when_exponents_are_close():
    # Magnitudes in [2^-11, 2^10): the ulps span 2^21 <= 2^25, so every float64 step is exact and
    # each output is the exact (x * s) @ H / 4 rounded once to float32 (the exact value needs at
    # most 24 + 21 + 4 bits, so float(Fraction) is exact and float64 -> float32 the one rounding).
    s = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]
    rng = np.random.default_rng(4)
    mags = rng.uniform(0.5, 1, (20, 16)) * np.exp2(rng.integers(-10, 10, (20, 16)))
    x = (mags * rng.choice([-1, 1], (20, 16))).astype(np.float32)
    y = rht_ref(x)
    for i in range(x.shape[0]):
        want = [np.float32(float(v)) for v in exact_rotation(x[i], s)]
        assert u32(y[i]).tolist() == u32(want).tolist()


def test_rht_float64_sum_is_not_always_exact():
    # x = [1, 2^-24, 2^-80, 0, ...] (signs +1 there): the exact y_0 = (1 + 2^-24 + 2^-80) / 4 lies
    # just above the float32 midpoint 2^-2 (1 + 2^-24), so its correct rounding is 2^-2 + 2^-25
    # (0x3E800001). The butterfly's second stage adds 2^-80 to 1 + 2^-24 in float64, which loses
    # it; the final rounding then sees the exact midpoint and goes to even: 2^-2 (0x3E800000).
    # This is the documented evaluation, not the correctly rounded value.
    x = np.zeros((1, 16), np.float32)
    x[0, :3] = [1.0, 2.0**-24, 2.0**-80]
    exact = exact_rotation(x[0], [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1])[0]
    assert exact == (1 + Fraction(1, 2**24) + Fraction(1, 2**80)) / 4
    assert u32(rht_ref(x)[0, :1]).tolist() == [0x3E800000]


def test_rht_inverse_round_trip():
    # Orthogonal: inverse(rht(x)) = x up to the two float32 roundings: each output error is at
    # most 2^-24 |y_j|, the inverse moves a vector of such errors by at most its 2-norm (<= 2^-24
    # ||x||_2 <= 2^-22 max|x|), and the last rounding adds 2^-24 |x_i|: below 2^-21 max|x| per group.
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((8, 64)) * np.exp2(rng.integers(-20, 20, (8, 1)))).astype(np.float32)
    back = rht_inverse_ref(rht_ref(x))
    for i in range(8):
        for g in range(0, 64, 16):
            grp = x[i, g : g + 16].astype(np.float64)
            assert np.max(np.abs(back[i, g : g + 16] - grp)) <= 2.0**-21 * np.max(np.abs(grp))
    # exact for small integers times a power of two: every y is a multiple of 2^k / 4 below 2^14
    # 2^k (exact in float32) and the inverse sums are exact integers again.
    xi = (rng.integers(-1000, 1000, (4, 32)) * 2.0**-30).astype(np.float32)
    assert np.array_equal(rht_inverse_ref(rht_ref(xi)), xi)
    assert np.array_equal(rht_ref(rht_inverse_ref(xi)), xi)
    # custom signs
    sg = rng.choice([-1, 1], 16)
    assert np.array_equal(rht_inverse_ref(rht_ref(xi, sg), sg), xi)


def test_rht_axis_and_matmul():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((3, 32)).astype(np.float32)
    b = rng.standard_normal((5, 32)).astype(np.float32)
    assert np.array_equal(rht_ref(a.T, axis=0), rht_ref(a).T)
    assert np.array_equal(rht_inverse_ref(a.T, axis=0), rht_inverse_ref(a).T)
    # both operands rotated along K: the product is unchanged (up to float32 rounding)
    ra, rb = rht_ref(a).astype(np.float64), rht_ref(b).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.allclose(ra @ rb.T, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_rht_validation():
    with pytest.raises(ValueError):
        rht_ref(np.ones((2, 24), np.float32))
    with pytest.raises(ValueError):
        rht_ref(np.ones((2, 16), np.float32), signs=[1] * 15)
    with pytest.raises(ValueError):
        rht_ref(np.ones((2, 16), np.float32), signs=[2] * 16)
    # infinities follow float64: a lone +inf makes every output of its group +-inf
    x = np.zeros((1, 16), np.float32)
    x[0, 0] = np.inf
    assert np.all(np.isinf(rht_ref(x)))


# ---- torchao (optional) -------------------------------------------------------------------------


def _torchao():
    """torch and torchao's nvfp4 module, or a skip with the reason."""
    return import_runtime("torch"), import_runtime("torchao.prototype.mx_formats.nvfp4_tensor")


def torchao_inputs() -> list[np.ndarray]:
    """[R, C] float32 arrays, C a multiple of 16: many binades, ties, zeros, subnormals."""
    rng = np.random.default_rng(21)
    out = []
    x = random_blocks(22, rows=48, cols=128)
    x[1, :16] = 0.0
    x[2, :16] = -0.0
    out.append(x)
    # ties: blocks with amax 6 (s = 1) whose elements sit on E2M1 midpoints, and the e4m3 ties
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.25, -5.0, 2.34375, 0.1, 6.0, -6.0, 4.5, 3.0])
    t = np.tile(ties, (8, 2)).astype(np.float32)
    t[1] *= 2.0**-20
    t[2] *= 2.0**30
    t[3, :16] = [6.375] + [1.0] * 15
    t[4, :16] = [7.125, 1.0625, 2.125] + [0.5] * 13
    t[5, :16] = [11.25, 2.34375] + [0.0] * 14
    out.append(t)
    # extremes of float32: huge and tiny rows
    e = (rng.uniform(-1, 1, (4, 32)) * np.array([[1e37], [1e-35], [1e-20], [3e38]])).astype(np.float32)
    out.append(e)
    return out


def test_against_torchao_nvfp4_quantize():
    torch, nvt = _torchao()
    for x in torchao_inputs():
        t = torch.from_numpy(x.copy())
        pts_t = nvt.per_tensor_amax_to_scale(torch.max(torch.abs(t)))
        assert u32([pts_t.item()]).tolist() == u32([nvfp4_per_tensor_scale_ref(x)]).tolist()
        for pts in (None, "amax", 0.0123):
            if pts is None:
                arg = None
            elif pts == "amax":
                arg = pts_t
            else:
                arg = torch.tensor(pts, dtype=torch.float32)
            scales_t, packed_t = nvt.nvfp4_quantize(t, 16, arg)
            q = nvfp4_quantize_ref(x, per_tensor_scale=pts)
            codes_t = unpack_fp4_ref(packed_t.numpy(), x.shape[1])
            assert np.array_equal(scales_t.view(torch.uint8).numpy(), q.scales), pts
            assert np.array_equal(codes_t, q.codes), pts
            # dequantisation: pts * s first, then the element
            tensor = nvt.NVFP4Tensor.to_nvfp4(t, per_tensor_scale=arg)
            dq_t = tensor.dequantize(torch.float32).numpy()
            dq = nvfp4_dequantize_ref(q.codes, q.scales, q.pts)
            assert np.array_equal(u32(dq_t), u32(dq)), pts


def test_against_torchao_bfloat16_input():
    torch, nvt = _torchao()
    x = random_blocks(23, rows=8, cols=64)
    tb = torch.from_numpy(x.copy()).to(torch.bfloat16)
    xb = tb.float().numpy()  # the bfloat16 values, widened exactly
    scales_t, packed_t = nvt.nvfp4_quantize(tb, 16, None)
    q = nvfp4_quantize_ref(xb, per_tensor_scale=None)
    assert np.array_equal(scales_t.view(torch.uint8).numpy(), q.scales)
    assert np.array_equal(unpack_fp4_ref(packed_t.numpy(), x.shape[1]), q.codes)
