"""NVFP4, 2-D tiles, the scale policies and the random Hadamard rotation: the kernels against the slow
reference ``tests/reference_blocks.py``, bit for bit (codes, scale bytes, per-tensor scale, values).

The reference in the package's layout (``reference``), the comparison of every output with it
(``check``), the data and the random cases are in ``tests/block_checks.py``, shared with the slow
sweeps of ``test_blocks_exhaustive.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import neuron_kernels as nk
from neuron_kernels.blocks.inputs import input_array
from neuron_kernels.blocks.layout import Pieces
from neuron_kernels.blocks.scheme import block_job
from neuron_kernels.errors import NotApplicableError, UnknownFormatError

from .block_checks import (
    BF16,
    CUSTOM_SIGNS,
    E2M1,
    F32,
    INPUT_DTYPES,
    MX_FORMATS,
    ROUNDINGS,
    SCALE_CODES,
    SCALE_MODES,
    TIES,
    Want,
    _signs,
    as_float32,
    assert_bits,
    binades,
    block_binades,
    check,
    check_four_over_six,
    check_mx_scale_search,
    check_nvfp4,
    cover_cases,
    e4m3,
    nvfp4_data,
    pack_along,
    policy_data,
    reference,
    scale_sweep_blocks,
    special_blocks,
    tile_data,
)
from .reference_blocks import (
    RHT_DEFAULT_SIGNS,
    block_errors_ref,
    dequantize_2d_ref,
    neuron_quantize_mx_ref,
    nvfp4_per_tensor_scale_ref,
    rht_inverse_ref,
    rht_ref,
)

DETERMINISTIC = ROUNDINGS[:3]


# ---- 1. NVFP4, 1-D blocks --------------------------------------------------------------------------

PER_TENSOR = [None, "amax", 1.0, 0.75, 2.0**-20, 3.0e-3, 1.0e-40]


@pytest.mark.parametrize("per_tensor_scale", PER_TENSOR, ids=str)
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_nvfp4_special_and_binade_blocks(per_tensor_scale, rounding):
    check_nvfp4(nvfp4_data(), per_tensor_scale=per_tensor_scale, rounding=rounding)


@pytest.mark.parametrize("per_tensor_scale", [None, "amax", 0.5])
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_nvfp4_blocks_over_many_binades(per_tensor_scale, rounding):
    # Without the huge row: the default per-tensor scale then comes from ordinary values.
    x = np.concatenate([block_binades((20, 64), 3, -20, 20), binades((8, 64), 4, -12, 12)])
    check_nvfp4(x, per_tensor_scale=per_tensor_scale, rounding=rounding)


@pytest.mark.parametrize("per_tensor_scale", [None, "amax", 0.01, 1e-40])
@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_nvfp4_stochastic(per_tensor_scale, seed):
    check_nvfp4(nvfp4_data(seed % 5), per_tensor_scale=per_tensor_scale, rounding="stochastic", seed=seed)


@pytest.mark.parametrize("block_size", [16, 32, 7, 1, 5, 48])
@pytest.mark.parametrize("per_tensor_scale", [None, "amax"])
def test_nvfp4_block_sizes_and_partial_blocks(block_size, per_tensor_scale):
    for cols in (45, 16, 3, 50):
        x = block_binades((5, cols), cols, -8, 8)
        x[1, ::4] = 0.0
        check_nvfp4(x, block_size=block_size, per_tensor_scale=per_tensor_scale)


@pytest.mark.parametrize("axis", [0, 1, 2, -2])
@pytest.mark.parametrize("per_tensor_scale, rounding", [(None, "nearest_even"), ("amax", "stochastic")])
def test_nvfp4_any_axis(axis, per_tensor_scale, rounding):
    x = binades((19, 6, 35), 11, -6, 6)
    x[3, 2, :] = np.nan
    x[:, 1, 4] = 0.0
    check_nvfp4(x, axis=axis, per_tensor_scale=per_tensor_scale, rounding=rounding, seed=5)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("block_size", [16, 5])
def test_nvfp4_other_axis_with_odd_block_sizes(axis, block_size):
    x = binades((33, 21), 12, -5, 5)
    check_nvfp4(x, axis=axis, block_size=block_size, rounding="stochastic", seed=3)
    check_nvfp4(x, axis=axis, block_size=block_size, per_tensor_scale=None)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("per_tensor_scale, axis", [("amax", -1), (0.125, -1), (None, 0)])
def test_nvfp4_input_dtypes(dtype, per_tensor_scale, axis):
    x = block_binades((32, 48), 21, -10, 10)
    if np.dtype(dtype) == np.float64:
        # Values that round on the way to float32, and some beyond its range (inf there).
        x = x.astype(np.float64) * (1 + 2.0**-30)
        x[5, 3] = 1e39
        x[6, 7] = -1e300
        x[7, :16] = 1e-50
    else:
        with np.errstate(over="ignore"):
            x = x.astype(dtype)
    check_nvfp4(x, per_tensor_scale=per_tensor_scale, axis=axis)
    check_nvfp4(x, per_tensor_scale=per_tensor_scale, axis=axis, rounding="stochastic", seed=4)


def test_nvfp4_default_options_are_two_level_blocks_of_16():
    x = block_binades((4, 40), 8, -4, 4)
    want = reference(x, "nvfp4")
    q = nk.quantize_nvfp4(x)
    assert (q.fmt, q.block_size, q.axis, q.block_rows, q.packed) == ("nvfp4", 16, 1, 1, True)
    assert q.per_tensor_scale == float(nvfp4_per_tensor_scale_ref(x))
    assert_bits(q.unpacked_codes(), want.codes)
    assert_bits(q.scales.view(np.uint8), want.scales)
    assert_bits(nk.fake_quantize_nvfp4(x), want.values)
    assert_bits(nk.quantize(x, "nvfp4").codes, q.codes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16], ids=lambda d: np.dtype(d).name)
def test_nvfp4_dequantize_dtypes_and_out(dtype):
    x = block_binades((6, 48), 9, -6, 6)
    x[0, :16] = np.nan
    q = nk.quantize_nvfp4(x)
    want = reference(x, "nvfp4").values
    with np.errstate(over="ignore"):
        expect = want.astype(dtype)
    assert_bits(nk.dequantize(q, dtype), expect)
    out = np.zeros(x.shape, dtype)
    assert nk.dequantize(q, dtype, out=out) is out
    assert_bits(out, expect)
    strided = np.zeros((6, 96), dtype)[:, ::2]
    assert q.dequantize(dtype, out=strided) is strided
    assert_bits(np.ascontiguousarray(strided), expect)


@pytest.mark.parametrize("pts", [None, 0.37, 1e-30, 3e30, 2.0**-149])
def test_nvfp4_dequantize_every_scale_byte_and_code(pts):
    # Any container (a file, from_parts) dequantises by the formula, whatever its scale bytes:
    # every e4m3fn byte (subnormal, negative, NaN) with every E2M1 code, single and two level. The
    # package writes the positive quiet NaN for the NaN bytes; the reference's 0xff is a negative
    # NaN (the spec says only "NaN"), so NaNs compare as NaNs and every other value bit for bit.
    codes = np.tile(np.arange(16, dtype=np.uint8), (256, 1))
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1)
    q = nk.BlockArray.from_parts(codes, scales, nk.BlockLayout("nvfp4", (256, 16), 1, 16), per_tensor_scale=pts)
    want = dequantize_2d_ref(codes, scales, "nvfp4", (1, 16), pts)
    got = q.dequantize()
    assert_bits(got, want, nan_bits=False)
    assert_bits(got[:255], want[:255])
    packed = nk.BlockArray.from_parts(
        pack_along(codes, 1), scales, nk.BlockLayout("nvfp4", (256, 16), 1, 16, 1, True), per_tensor_scale=pts
    )
    assert_bits(packed.dequantize(), got)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_dequantize_every_scale_byte_and_code(fmt):
    n = 16 if fmt == "mxfp4_e2m1" else 64 if fmt.startswith("mxfp6") else 256
    codes = np.tile(np.arange(n, dtype=np.uint8), (256, 1))
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1)
    q = nk.BlockArray.from_parts(codes, scales, nk.BlockLayout(fmt, (256, n), 1, n))
    assert_bits(q.dequantize(), dequantize_2d_ref(codes, scales, fmt, (1, n)))
    tiles = nk.BlockArray.from_parts(codes, scales.reshape(32, 8)[:, :1].copy(), nk.BlockLayout(fmt, (256, n), 1, n, 8))
    assert_bits(tiles.dequantize(), dequantize_2d_ref(codes, tiles.scales.view(np.uint8), fmt, (8, n)))


def test_nvfp4_fake_quantize_out_and_layouts():
    x = block_binades((8, 64), 10, -6, 6)
    want = reference(x, "nvfp4", per_tensor_scale=None).values
    out = np.zeros((8, 64), F32, order="F")
    assert nk.fake_quantize_nvfp4(x, per_tensor_scale=None, out=out) is out
    assert_bits(np.ascontiguousarray(out), want)
    # Non-contiguous inputs: the values matter, not the layout.
    wide = np.zeros((8, 128), F32)
    wide[:, ::2] = x
    assert_bits(nk.fake_quantize_nvfp4(wide[:, ::2], per_tensor_scale=None), want)
    assert_bits(nk.fake_quantize_nvfp4(np.asfortranarray(x), per_tensor_scale=None), want)
    assert_bits(nk.fake_quantize_nvfp4(x.astype(">f4"), per_tensor_scale=None), want)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("per_tensor_scale", [None, "amax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_nvfp4_fake_quantize_is_dequantize_of_quantize(rounding, per_tensor_scale, axis):
    x = nvfp4_data(3)
    opts = dict(rounding=rounding, seed=17, per_tensor_scale=per_tensor_scale, axis=axis)
    dq = nk.quantize_nvfp4(x, **opts).dequantize()
    assert_bits(nk.fake_quantize_nvfp4(x, **opts), dq)
    assert_bits(nk.fake_quantize(x, "nvfp4", **opts), dq)


@pytest.mark.parametrize(
    "x",
    [
        np.zeros((2, 16), F32),
        -np.zeros((3, 20), F32),
        np.full((2, 16), np.nan, F32),
        np.full((1, 17), -np.inf, F32),
        np.array([[3.0]], F32),
        np.array([[1e-45]], F32),
        np.array([[-3e38, 3e38]], F32),
    ],
    ids=["zeros", "negative_zeros", "all_nan", "all_inf", "one", "one_subnormal", "two_huge"],
)
@pytest.mark.parametrize("per_tensor_scale", [None, "amax"])
def test_nvfp4_degenerate_tensors(x, per_tensor_scale):
    # No finite non-zero value: the default per-tensor scale is 1.0.
    want = check_nvfp4(x, per_tensor_scale=per_tensor_scale)
    check_nvfp4(x, per_tensor_scale=per_tensor_scale, block_shape=(16, 16))
    check_nvfp4(x.T.copy(), per_tensor_scale=per_tensor_scale, axis=0, four_over_six="mse")
    if per_tensor_scale == "amax" and not np.any(np.isfinite(x) & (x != 0)):
        assert want.pts == 1.0


@pytest.mark.parametrize(
    "shape, options",
    [
        ((0, 16), {}),
        ((4, 0), {}),
        ((5, 0), {"axis": 0}),
        ((0,), {"per_tensor_scale": None}),
        ((2, 0, 5), {"block_shape": (16, 16)}),
        ((0, 32), {"rht": True}),
        ((32, 0), {"rht": True, "axis": 0}),
    ],
    ids=str,
)
def test_nvfp4_empty_arrays(shape, options):
    x = np.zeros(shape, F32)
    q = nk.quantize_nvfp4(x, **options)
    assert q.shape == shape and q.dequantize().shape == shape and nk.fake_quantize_nvfp4(x, **options).shape == shape
    assert q.per_tensor_scale == (None if "per_tensor_scale" in options else 1.0)
    assert q.codes.size == 0 and q.scales.size == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cover_cases())
def test_random_cases_match_reference(case):
    """Random inputs and options on the kernels of the kernel cases (``KERNEL_COVER``)."""
    x, fmt, options = case
    check(x, fmt, unpacked=True, **options)


# ---- exhaustive: every scale code, every tie -----------------------------------------------------------


def test_every_scale_code_single_level():
    x = scale_sweep_blocks()
    want = check_nvfp4(x, per_tensor_scale=None)
    assert sorted(set(want.scales[::3, 0].tolist())) == SCALE_CODES  # amax = 6 s(c) gives c
    check_nvfp4(x, per_tensor_scale=None, rounding="stochastic", seed=1)


@pytest.mark.parametrize("pts", [2.0**-12, 0.37, 1000.0])
def test_every_scale_code_two_level(pts):
    # A given per-tensor scale P, then the default one: the tensor's amax 6 * 448 * P gives P back.
    x = scale_sweep_blocks(pts)
    want = check_nvfp4(x, per_tensor_scale=pts)
    codes = set(want.scales[::3, 0].tolist())
    assert codes == set(SCALE_CODES) if pts == 2.0**-12 else len(codes) > 110
    check_nvfp4(x, per_tensor_scale="amax")
    check_nvfp4(x, per_tensor_scale=pts, rounding="toward_zero")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("per_tensor_scale", [None, 1.0, 2.0**-3, 0.3])
def test_every_fp4_tie_at_every_scale(rounding, per_tensor_scale):
    # Block per code: amax 6 s and every E2M1 tie and grid value (both signs) times s: exact ties
    # of the element rounding when s * pts is a power of two, near-ties through 1/s otherwise.
    grid = E2M1[1:]
    row = np.array([6.0] + TIES + [-t for t in TIES] + [-6.0], np.float64)
    rows = []
    pts = 1.0 if per_tensor_scale is None else per_tensor_scale
    for c in SCALE_CODES:
        s = e4m3(c) * pts
        rows.append(row * s)
        rows.append(np.array([6.0] + grid + [-g for g in grid] + [0.0, -0.0], np.float64)[:16] * s)
    x = np.stack(rows).astype(F32)
    check_nvfp4(x, per_tensor_scale=per_tensor_scale, rounding=rounding, seed=5)


def test_scale_search_reaches_the_codes_below_the_clamp():
    # Blocks with amax / 6 below 2^-6 (computed code 0x08): the search may pick 0x06 or 0x07.
    rng = np.random.default_rng(3)
    x = (rng.uniform(-1, 1, (128, 16)) * np.exp2(rng.uniform(-12, -5, (128, 1)))).astype(F32)
    want = check_nvfp4(x, per_tensor_scale=None, scale_search="mse")
    assert {6, 7} <= set(want.scales.ravel().tolist())


# ---- 2-D tiles ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(40, 37), (16, 16), (5, 70), (33, 16), (3, 20, 33), (2, 2, 17, 18)], ids=str)
@pytest.mark.parametrize("per_tensor_scale", [None, "amax", 0.02])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_nvfp4_16x16_tiles(shape, per_tensor_scale, rounding):
    check_nvfp4(
        tile_data(shape, len(shape)),
        block_shape=(16, 16),
        per_tensor_scale=per_tensor_scale,
        rounding=rounding,
        seed=23,
    )


@pytest.mark.parametrize("block_shape", [(2, 3), (3, 16), (16, 1), (7, 5), (1, 16), (16,)], ids=str)
def test_nvfp4_other_tiles(block_shape):
    # Odd tile widths make packed bytes straddle two tiles; (1, c) and (c,) are 1-D blocks.
    x = tile_data((2, 19, 23), 4)
    check_nvfp4(x, block_shape=block_shape)
    check_nvfp4(x, block_shape=block_shape, per_tensor_scale=None, rounding="stochastic", seed=9)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_tiles_input_dtypes(dtype):
    with np.errstate(over="ignore"):
        x = tile_data((24, 20), 6).astype(dtype)
    check_nvfp4(x, block_shape=(16, 16))
    check(x, "mxfp8_e4m3", block_shape=(8, 4))
    check(x, "mxfp4_e2m1", block_shape=(8, 4), scale_mode="rceil", rounding="stochastic", seed=2)


@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_mx_8x4_tiles(fmt, scale_mode):
    for shape in [(20, 22), (2, 16, 12)]:
        x = tile_data(shape, 7)
        check(x, fmt, block_shape=(8, 4), scale_mode=scale_mode)
        check(x, fmt, block_shape=(8, 4), scale_mode=scale_mode, rounding="stochastic", seed=31)


@pytest.mark.parametrize("fmt", MX_FORMATS)
@pytest.mark.parametrize("rounding", ["nearest_away", "toward_zero"])
def test_mx_tiles_rounding_and_shapes(fmt, rounding):
    for block_shape in [(8, 4), (32, 32), (3, 5), (2, 1)]:
        check(tile_data((1, 35, 13), 8), fmt, block_shape=block_shape, rounding=rounding)


def test_quantize_mx_takes_block_shape():
    x = tile_data((16, 12), 9)
    want = reference(x, "mxfp8_e5m2", block_shape=(8, 4), scale_mode="neuron")
    q = nk.quantize_mx(x, "mxfp8_e5m2", block_shape=(8, 4), scale_mode="neuron")
    assert (q.block_rows, q.block_size, q.axis, q.block_shape) == (8, 4, 1, (8, 4))
    assert_bits(q.codes, want.codes)
    assert_bits(q.scales.view(np.uint8), want.scales)
    fq = nk.fake_quantize_mx(x, "mxfp8_e5m2", block_shape=(8, 4), scale_mode="neuron")
    assert_bits(fq, want.values)


# ---- Neuron's quantize_mx ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("pf", [(32, 4), (32, 64), (64, 8), (128, 16), (96, 12)], ids=str)
def test_neuron_quantize_mx_emulation(fmt, dtype, pf):
    p, f = pf
    rng = np.random.default_rng(p + f)
    x = (rng.standard_normal((p, f)) * np.exp2(rng.integers(-14, 14, (p // 8, 1))).repeat(8, 0)).astype(dtype)
    x[:8, :4] = 0
    x[8:16, 4 % f : 4 % f + 4] = np.asarray(rng.standard_normal((8, 4)) * 2.0**-20, dtype)  # float16 subnormals
    x[-1, -1] = np.asarray(np.nan, dtype)
    if p >= 64:
        x[40, 1] = np.asarray(-np.inf, dtype)
        x[16:24, :4] = np.asarray(448.0 * 2**5, dtype)  # the group maximum on a power of two times max
    packed, scales = neuron_quantize_mx_ref(x, fmt)
    q = nk.quantize_mx(x, fmt, block_shape=(8, 4), scale_mode="neuron")
    x4 = q.to_x4()
    assert_bits(x4, packed, "x4 containers")
    assert_bits(q.scales.view(np.uint8), scales, "scales")
    assert_bits(nk.unpack_x4(x4, nk.BLOCK_FORMATS[fmt].x4).view(np.uint8), q.codes, "unpacked containers")


# ---- scale policies ----------------------------------------------------------------------------------------


#: (measure, scale_bound, per_tensor_scale): a few of the grid the slow sweep runs in full.
FOUR_OVER_SIX_CASES = [
    ("mae", 448.0, None),
    ("mse", 256.0, None),
    ("mse", 448.0, "amax"),
    ("mae", 256.0, "amax"),
    ("mse", 256.0, "amax"),
    ("mae", 448.0, 0.01),
]


@pytest.mark.parametrize("measure, scale_bound, per_tensor_scale", FOUR_OVER_SIX_CASES, ids=str)
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_four_over_six(measure, scale_bound, per_tensor_scale, rounding):
    check_four_over_six(measure, scale_bound, per_tensor_scale, rounding)


def test_four_over_six_toward_zero():
    check_four_over_six("mse", 448.0, "amax", "toward_zero")


@pytest.mark.parametrize("scale_bound", [448.0, 256, 100.0, 1.0, 0.5, 300.25, 2.0**-20])
def test_scale_bound_sets_the_per_tensor_scale(scale_bound):
    x = block_binades((8, 48), 2, -8, 8)
    check_nvfp4(x, scale_bound=scale_bound)
    check_nvfp4(x, scale_bound=scale_bound, block_shape=(16, 16), four_over_six="mae")


@pytest.mark.parametrize("scale_bound", [300.1, 100.3])
def test_scale_bound_that_is_not_a_float32(scale_bound):
    x = np.array([[1.0, 0.25] * 8], F32)
    assert reference(x, "nvfp4", scale_bound=scale_bound).pts == F32(1.0) / (F32(scale_bound) * F32(6.0))
    check_nvfp4(x, scale_bound=scale_bound)


def test_four_over_six_picks_both_scales():
    # The comparison is meaningful only if both candidates win somewhere.
    x = policy_data(2)
    plain = reference(x, "nvfp4", per_tensor_scale=None).scales
    for measure in ("mae", "mse"):
        chosen = check_nvfp4(x, per_tensor_scale=None, four_over_six=measure).scales
        assert (chosen == plain).any() and (chosen != plain).any()


@pytest.mark.parametrize(
    "per_tensor_scale, rounding",
    [
        (None, "nearest_even"),
        ("amax", "nearest_even"),
        (3e-4, "nearest_away"),
        (None, "stochastic"),
        ("amax", "stochastic"),
    ],
)
def test_nvfp4_scale_search(per_tensor_scale, rounding):
    x = policy_data(3)
    check_nvfp4(x, scale_search="mse", per_tensor_scale=per_tensor_scale, rounding=rounding, seed=12)
    check_nvfp4(x[:, :33], axis=0, scale_search="mse", per_tensor_scale=per_tensor_scale, rounding=rounding, seed=1)
    check_nvfp4(x[:24], block_shape=(16, 16), scale_search="mse", per_tensor_scale=per_tensor_scale)


def test_nvfp4_scale_search_near_the_ends_of_the_codes():
    # Computed codes 0x08 (the lower clamp: candidates 0x06, 0x07 are subnormal scales) and
    # 0x7e (448: candidates above are skipped), single and two level.
    x = np.zeros((4, 16), F32)
    x[0] = np.linspace(-0.01, 0.02, 16)  # amax / 6 below 2^-6
    x[1] = np.linspace(-2000, 2600, 16)  # amax / 6 above 448
    x[2] = np.linspace(1e-3, 6 * 2.0**-6, 16)
    x[3] = np.linspace(-2688, 100, 16)
    for pts in (None, 1.0, "amax"):
        want = check_nvfp4(x, scale_search="mse", per_tensor_scale=pts)
        assert want.scales.min() <= 0x08 or pts == "amax"


@pytest.mark.parametrize(
    "fmt, scale_mode",
    [(f, "floor") for f in MX_FORMATS] + [("mxfp4_e2m1", "rceil"), ("mxfp8_e4m3", "neuron"), ("mxint8", "ceil")],
    ids=str,
)
def test_mx_scale_search(fmt, scale_mode):
    check_mx_scale_search(fmt, scale_mode)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1"])
def test_quantize_mx_takes_scale_search(fmt):
    x = policy_data(5)
    want = reference(x, fmt, scale_search="mse", block_size=16)
    q = nk.quantize_mx(x, fmt, scale_search="mse", block_size=16)
    assert_bits(q.scales.view(np.uint8), want.scales)
    assert_bits(q.unpacked_codes(), want.codes)
    assert_bits(nk.fake_quantize_mx(x, fmt, scale_search="mse", block_size=16), want.values)


#: (format, policy, error measure, whether some 1-D block or 8 x 4 tile improves on this data).
POLICY_CASES = [
    ("nvfp4", {"four_over_six": "mae"}, "mae", True),
    ("nvfp4", {"four_over_six": "mse"}, "mse", True),
    ("nvfp4", {"four_over_six": "mse", "scale_bound": 256.0}, "mse", True),
    ("nvfp4", {"four_over_six": "mae", "per_tensor_scale": None}, "mae", True),
    ("nvfp4", {"scale_search": "mse"}, "mse", True),
    ("nvfp4", {"scale_search": "mse", "per_tensor_scale": None}, "mse", True),
    ("mxfp4_e2m1", {"scale_search": "mse"}, "mse", True),
    ("mxfp6_e3m2", {"scale_search": "mse"}, "mse", True),
    ("mxfp6_e2m3", {"scale_search": "mse", "scale_mode": "ceil"}, "mse", False),
    ("mxfp8_e4m3", {"scale_search": "mse", "scale_mode": "rceil"}, "mse", False),
    ("mxint8", {"scale_search": "mse"}, "mse", False),
]


def banded(seed: int) -> np.ndarray:
    """Normal values, one binade per band of 16 rows, with outliers (x4) here and there."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 16, 48)) * np.exp2(rng.integers(-8, 8, (6, 1, 1)))
    x = x.reshape(96, 48)
    x[::5, ::7] *= 4
    return x.astype(F32)


@pytest.mark.parametrize("fmt, policy, metric, improves", POLICY_CASES, ids=str)
@pytest.mark.parametrize("block_shape", [(1, 16), (16, 16), (8, 4)], ids=str)
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_policies_never_increase_a_block_error(fmt, policy, metric, improves, block_shape, rounding):
    # Per-block float64 errors of the dequantised values: a policy keeps the plain scale unless a
    # candidate is strictly better, so no block may get worse (every candidate sees the same draws).
    x = banded(6)
    base = {k: v for k, v in policy.items() if k in ("scale_bound", "scale_mode", "per_tensor_scale")}
    opts = dict(block_shape=block_shape, rounding=rounding, seed=6)
    plain = block_errors_ref(x, nk.fake_quantize(x, fmt, **base, **opts), block_shape, metric)
    chosen = block_errors_ref(x, nk.fake_quantize(x, fmt, **policy, **opts), block_shape, metric)
    assert np.isfinite(plain).all() and plain.size >= 18
    assert np.all(chosen <= plain)
    if improves and block_shape != (16, 16):  # 256-element tiles rarely gain
        assert np.any(chosen < plain)


# ---- the random Hadamard rotation ----------------------------------------------------------------------


def rotation_data(shape, seed: int) -> np.ndarray:
    """Groups whose values span up to 200 binades (the float64 butterfly then rounds), exact small
    integers, zeros, float32 subnormals and values near the top of float32 (sums overflow)."""
    x = binades(shape, seed, -100, 100)
    flat = x.reshape(-1)
    n = flat.size
    flat[: min(n, 64)] = np.arange(min(n, 64)) - 20.0
    if n >= 160:
        flat[64:80] = 0.0
        flat[80:96] = np.float32(1e-42) * np.arange(16)
        flat[96:112] = np.float32(3e38) * np.sign(np.arange(16) - 7.5)
        flat[112:128] = np.float32(1.0) + np.float32(2.0**-23) * np.arange(16)
        flat[128:144] = np.float32(2.0**24) + np.arange(16) * np.float32(2.0**-30)  # 1 + 2^-24 + 2^-80 cases
    return x


@pytest.mark.parametrize("signs", [True, CUSTOM_SIGNS, list(RHT_DEFAULT_SIGNS), np.array(CUSTOM_SIGNS)], ids=str)
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("shape, axis", [((12, 64), -1), ((64, 10), 0), ((3, 32, 5), 1), ((2, 3, 48), 2)], ids=str)
def test_rotate_matches_reference(signs, inverse, shape, axis):
    x = rotation_data(shape, shape[axis])
    ref = rht_inverse_ref if inverse else rht_ref
    want = ref(x, _signs(signs if not isinstance(signs, np.ndarray) else tuple(signs)), axis=axis)
    got = nk.rotate(x, signs, axis=axis, inverse=inverse)
    assert_bits(got, want)


def test_rotate_butterfly_rounds_like_the_reference():
    # Groups whose exact sums need more than 53 bits: the package must round where the reference does.
    rng = np.random.default_rng(9)
    x = (rng.choice([-1.0, 1.0], (512, 16)) * np.exp2(rng.integers(-60, 60, (512, 16)))).astype(F32)
    for signs in (True, CUSTOM_SIGNS):
        for inverse in (False, True):
            ref = rht_inverse_ref if inverse else rht_ref
            assert_bits(nk.rotate(x, signs, inverse=inverse), ref(x, _signs(signs)))


def test_rotate_non_finite_inputs():
    # NaN and infinities follow float64 arithmetic in the butterfly's order (inf - inf is NaN). Which
    # payload a sum of two NaNs passes on is left open by IEEE, so NaNs compare as NaNs.
    x = np.zeros((6, 16), F32)
    x[0, 3] = np.inf
    x[1, [2, 9]] = [np.inf, np.inf]
    x[2, [0, 1]] = [np.inf, -np.inf]
    x[3, 5] = np.nan
    x[4, [0, 1]] = np.array([0x7FC00001, 0xFFC00002], np.uint32).view(F32)
    x[5] = np.array(RHT_DEFAULT_SIGNS, F32) * np.float32(2e38)  # a sum overflows float32 (not float64)
    for signs in (True, CUSTOM_SIGNS):
        for inverse in (False, True):
            ref = rht_inverse_ref if inverse else rht_ref
            want = ref(x, _signs(signs))
            got = nk.rotate(x, signs, inverse=inverse)
            assert_bits(got, want, nan_bits=False)
            assert_bits(got[:4], want[:4])  # a single NaN passes on its own payload


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_rotate_input_dtypes(dtype):
    x = rotation_data((4, 48), 2)
    if np.dtype(dtype) == np.float64:
        x = x.astype(np.float64) * (1 + 2.0**-40)
        x[1, 3] = 1e300
    else:
        with np.errstate(over="ignore"):
            x = x.astype(dtype)
    assert_bits(nk.rotate(x), rht_ref(as_float32(x)))
    x16 = x[:, :32].T.copy()
    assert_bits(nk.rotate(x16, CUSTOM_SIGNS, axis=0, inverse=True), rht_inverse_ref(as_float32(x16), CUSTOM_SIGNS, 0))


def test_rotate_round_trip_is_close():
    # Each value comes back within a few float32 ulps of its group's largest magnitude.
    x = binades((16, 64), 3, -3, 3)
    back = nk.rotate(nk.rotate(x), inverse=True)
    group_max = np.abs(x).reshape(16, 4, 16).max(axis=-1, keepdims=True)
    assert np.all(np.abs(back - x).reshape(16, 4, 16) <= 4 * 2.0**-24 * group_max)


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("signs", [True, CUSTOM_SIGNS], ids=["default", "custom"])
@pytest.mark.parametrize("per_tensor_scale", [None, "amax", 0.05])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_nvfp4_rht_matches_reference(axis, signs, per_tensor_scale, rounding):
    # quantize(x, rht=...) is the reference of the rotated input, pts from the rotated amax, and
    # dequantize(unrotate=True) the inverse rotation of the dequantised values.
    x = np.concatenate([block_binades((16, 64), 4, -10, 10), special_blocks()[:, :32].reshape(-1, 64)])
    x = x if axis == -1 else np.ascontiguousarray(x.T)
    check_nvfp4(x, rht=signs, axis=axis, per_tensor_scale=per_tensor_scale, rounding=rounding, seed=3)


@pytest.mark.parametrize("block_size", [32, 48])
def test_nvfp4_rht_longer_blocks(block_size):
    x = block_binades((6, 96), 5, -6, 6)
    check_nvfp4(x, rht=True, block_size=block_size)
    check_nvfp4(x[:, :80], rht=True, block_size=block_size, rounding="stochastic", seed=1)  # a partial last block
    check_nvfp4(x[:, :80].T.copy(), rht=True, block_size=block_size, axis=0, four_over_six="mse")


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_nvfp4_rht_input_dtypes(dtype):
    with np.errstate(over="ignore"):
        x = block_binades((8, 48), 6, -8, 8).astype(dtype)
    check_nvfp4(x, rht=True)
    check_nvfp4(x.reshape(2, 4, 48).transpose(2, 0, 1), rht=True, axis=0)


@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_mx_rht_matches_reference(fmt):
    x = block_binades((8, 64), 7, -6, 6)
    check(x, fmt, rht=True)
    check(x.T.copy(), fmt, rht=CUSTOM_SIGNS, axis=0, scale_search="mse")


@pytest.mark.parametrize("policy", [{"four_over_six": "mae"}, {"scale_search": "mse"}], ids=str)
def test_nvfp4_rht_with_policies(policy):
    x = policy_data(8, special=False)
    check_nvfp4(x, rht=True, **policy)
    check_nvfp4(x, rht=True, rounding="stochastic", seed=2, block_size=32, **policy)
    check_nvfp4(x[:, :32].T.copy(), rht=CUSTOM_SIGNS, axis=0, rounding="stochastic", seed=2, **policy)


def test_unrotate_to_other_dtypes_and_out():
    x = block_binades((8, 64), 8, -6, 6)
    q = nk.quantize_nvfp4(x, rht=True)
    want = reference(x, "nvfp4", rht=True).unrotated
    for dtype in (np.float64, np.float16, BF16):
        with np.errstate(over="ignore"):
            expect = want.astype(dtype)
        assert_bits(q.dequantize(dtype, unrotate=True), expect)
    out = np.zeros((8, 64), F32)
    assert q.dequantize(unrotate=True, out=out) is out
    assert_bits(out, want)


def grid_operand(shape, seed: int) -> np.ndarray:
    """Values on the E2M1 grid with every block's largest magnitude 6 (so NVFP4 with scale 1 holds
    them exactly), as float32."""
    rng = np.random.default_rng(seed)
    y = rng.choice(np.array(E2M1 + [-v for v in E2M1[1:]]), shape)
    y.reshape(-1, 16)[:, 0] = 6.0
    return y.astype(F32)


def test_block_matmul_of_rotated_operands_exact():
    # a and b whose rotations along K lie on the NVFP4 grid exactly (scale 1): quantising them
    # with rht loses nothing, and the product of the rotated operands is the plain product.
    ya = grid_operand((8, 64), 1)
    yb = np.ascontiguousarray(grid_operand((6, 64), 2).T)  # (K, N): groups along K
    a = rht_inverse_ref(ya)  # exact: multiples of 1/8 well inside float32
    b = rht_inverse_ref(yb, axis=0)
    assert_bits(rht_ref(a), ya)
    qa = nk.quantize_nvfp4(a, rht=True, per_tensor_scale=None)
    qb = nk.quantize_nvfp4(b, rht=True, per_tensor_scale=None, axis=0)
    assert_bits(qa.dequantize(), ya)
    assert_bits(qb.dequantize(), yb)
    assert_bits(qa.dequantize(unrotate=True), a)
    assert_bits(qb.dequantize(unrotate=True), b)
    product = nk.block_matmul(qa, qb)
    assert_bits(product, (a.astype(np.float64) @ b.astype(np.float64)).astype(F32))
    assert_bits(product, ya @ yb)


def test_rotation_cancels_in_a_product():
    # Without quantisation: the product of the rotated operands is the plain product to float32
    # rounding (a few ulps of the sum of |products|, as float32 accumulation allows).
    rng = np.random.default_rng(4)
    a = rng.standard_normal((16, 128)).astype(F32)
    b = rng.standard_normal((128, 24)).astype(F32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    for signs in (True, CUSTOM_SIGNS):
        rotated = nk.rotate(a, signs, axis=-1) @ nk.rotate(b, signs, axis=0)
        assert np.all(np.abs(rotated - exact) <= 8 * 2.0**-24 * bound)


def test_block_matmul_of_rotated_operands_is_close():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((32, 128)).astype(F32)
    a[:, ::37] *= 20  # outliers: what the rotation spreads
    b = rng.standard_normal((128, 16)).astype(F32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    qa, qb = nk.quantize_nvfp4(a, rht=True), nk.quantize_nvfp4(b, rht=True, axis=0)
    rotated = nk.block_matmul(qa, qb)
    assert_bits(rotated, qa.dequantize() @ qb.dequantize())
    plain = nk.block_matmul(nk.quantize_nvfp4(a), nk.quantize_nvfp4(b, axis=0))

    def rel(p):
        return np.linalg.norm(p - exact) / np.linalg.norm(exact)

    assert rel(rotated) < 0.25 and rel(plain) < 0.25
    assert rel(rotated) < 1.5 * rel(plain) and rel(plain) < 1.5 * rel(rotated)
    # The unrotated dequantised operands give nearly the same product.
    back = qa.dequantize(unrotate=True) @ qb.dequantize(unrotate=True)
    assert np.all(np.abs(back - rotated) <= 1e-5 * (np.abs(qa.dequantize()) @ np.abs(qb.dequantize())))


@pytest.mark.parametrize("b_options", [{"block_shape": (16, 16)}, {"axis": 0}], ids=["tiles", "blocks"])
def test_block_matmul_of_tiles(b_options):
    a = block_binades((40, 48), 3, -3, 3)
    b = np.ascontiguousarray(block_binades((20, 48), 4, -3, 3).T)
    qa, qb = nk.quantize_nvfp4(a, block_shape=(16, 16)), nk.quantize_nvfp4(b, **b_options)
    assert_bits(nk.block_matmul(qa, qb), qa.dequantize() @ qb.dequantize())
    mx_a = nk.quantize_mx(a, "mxfp8_e4m3", block_shape=(8, 4), scale_mode="neuron")
    mx_b = nk.quantize_mx(b, "mxfp8_e4m3", block_shape=(4, 8), scale_mode="neuron")
    assert_bits(nk.block_matmul(mx_a, mx_b), mx_a.dequantize() @ mx_b.dequantize())
    with pytest.raises(ValueError, match="block sizes differ along K"):
        nk.block_matmul(mx_a, nk.quantize_mx(b, "mxfp8_e4m3", block_shape=(8, 4)))


def test_block_matmul_of_tiles_longer_than_k():
    a, b = block_binades((4, 8), 1, -2, 2), block_binades((8, 4), 2, -2, 2)
    qa, qb = nk.quantize_nvfp4(a, block_shape=(16, 16)), nk.quantize_nvfp4(b, block_shape=(16, 16))
    assert_bits(nk.block_matmul(qa, qb), qa.dequantize() @ qb.dequantize())


def test_block_matmul_refuses_mismatched_rotations():
    a = binades((4, 32), 1, -2, 2)
    b = binades((32, 4), 2, -2, 2)
    with pytest.raises(ValueError, match="rht"):
        nk.block_matmul(nk.quantize_nvfp4(a, rht=True), nk.quantize_nvfp4(b, axis=0))
    with pytest.raises(ValueError, match="rht"):
        nk.block_matmul(nk.quantize_nvfp4(a, rht=True), nk.quantize_nvfp4(b, axis=0, rht=CUSTOM_SIGNS))


# ---- reproducibility: threads and pieces -----------------------------------------------------------------

#: (id, shape, options): large enough (over 2 Mi elements) for two threads to split the work.
THREAD_CASES = [
    ("two_level", (2049, 1024), {}),
    ("odd_blocks_packed", (2051, 1023), {"block_size": 5, "per_tensor_scale": None}),
    ("axis0_odd_blocks", (1023, 2051), {"axis": 0, "block_size": 7}),
    ("tiles_16x16", (3, 700, 1000), {"block_shape": (16, 16)}),
    ("stochastic", (2049, 1024), {"rounding": "stochastic", "seed": 77}),
    ("stochastic_axis0", (1030, 2048), {"rounding": "stochastic", "seed": 5, "axis": 0}),
    ("rht", (1024, 2064), {"rht": True, "four_over_six": "mse"}),
    ("search_tiles", (2, 1030, 1030), {"block_shape": (16, 16), "scale_search": "mse"}),
]


@pytest.mark.parametrize("shape, options", [c[1:] for c in THREAD_CASES], ids=[c[0] for c in THREAD_CASES])
def test_results_do_not_depend_on_threads(threads, shape, options):
    x = block_binades(shape, 1, -20, 20)
    x.reshape(-1)[[5, 2**20 + 7, -1]] = [np.inf, np.nan, -np.inf]  # left out of the per-tensor amax
    assert x.size > 2**21
    runs = []
    for n in (1, 2):
        threads(n)
        q = nk.quantize_nvfp4(x, **options)
        runs.append((q, nk.fake_quantize_nvfp4(x, **options)))
    (q1, f1), (q2, f2) = runs
    assert_bits(q2.codes, q1.codes, "codes")
    assert_bits(q2.scales.view(np.uint8), q1.scales.view(np.uint8), "scales")
    assert q1.per_tensor_scale == q2.per_tensor_scale
    if "per_tensor_scale" not in options and "rht" not in options:  # the finite amax over 6 * 448
        assert q1.per_tensor_scale == F32(np.abs(x[np.isfinite(x)]).max()) / (F32(448) * F32(6))
    assert_bits(f2, f1, "fake-quantised values")
    assert_bits(q2.dequantize(), f1, "dequantised values")
    if "rounding" not in options and len(shape) == 2 and options.get("axis", -1) == -1:
        # The last rows against the reference, with the whole tensor's per-tensor scale.
        pts = options.get("per_tensor_scale", q1.per_tensor_scale)
        want = reference(x[-3:], "nvfp4", **{**options, "per_tensor_scale": pts})
        assert_bits(q1.unpacked_codes()[-3:], want.codes)
        assert_bits(f1[-3:], want.values)


def quantize_in_pieces(x, fmt: str, budget: int, **options) -> tuple[np.ndarray, np.ndarray, Any]:
    """Codes, scale bytes (flat) and per-tensor scale of ``x`` quantised piece by piece, as the
    file commands do: the job resolved on the whole array, each piece at its C-order offset."""
    arr, src = input_array(x)
    job = block_job(fmt, arr.ndim, **options).resolved(arr, src)
    pieces = Pieces(job.layout(arr.shape))
    cuts = pieces.cuts(budget)
    assert len(cuts) > 2
    codes, scales = [], []
    for cut in cuts:
        start, stop, shape = pieces.values(cut)
        piece_job = dataclasses.replace(job, axis=pieces.piece_layout(cut).axis)
        q = piece_job.quantize(arr.reshape(-1)[start:stop].reshape(shape), src, idx0=start)
        c0, c1, _ = pieces.codes(cut)
        s0, s1, _ = pieces.scales(cut)
        assert (c1 - c0, s1 - s0) == (q.codes.size, q.scales.size)
        codes.append(q.codes.reshape(-1))
        scales.append(q.scales.view(np.uint8).reshape(-1))
    return np.concatenate(codes), np.concatenate(scales), job.per_tensor_scale


PIECE_CASES = [
    ("nvfp4_two_level", "nvfp4", (6, 200), {}, 64),
    ("nvfp4_rows", "nvfp4", (40, 48), {"per_tensor_scale": 0.5}, 100),
    ("nvfp4_axis1_odd", "nvfp4", (10, 23, 3), {"axis": 1, "block_size": 5}, 30),
    ("nvfp4_axis0", "nvfp4", (50, 6), {"axis": 0, "rounding": "stochastic", "seed": 9}, 40),
    ("nvfp4_stochastic", "nvfp4", (5, 160), {"rounding": "stochastic", "seed": 11, "four_over_six": "mae"}, 48),
    ("nvfp4_tiles", "nvfp4", (3, 40, 36), {"block_shape": (16, 16), "rounding": "stochastic", "seed": 2}, 1000),
    ("nvfp4_tile_rows", "nvfp4", (2, 50, 36), {"block_shape": (16, 16), "scale_search": "mse"}, 600),
    ("nvfp4_odd_tiles", "nvfp4", (2, 21, 15), {"block_shape": (3, 5), "per_tensor_scale": None}, 100),
    ("nvfp4_rht", "nvfp4", (4, 128), {"rht": True, "rounding": "stochastic", "seed": 4}, 64),
    ("nvfp4_rht_axis0", "nvfp4", (64, 5), {"rht": True, "axis": 0}, 100),
    ("mx_tiles", "mxfp8_e4m3", (4, 24, 20), {"block_shape": (8, 4), "scale_mode": "neuron"}, 200),
    ("mxfp4_tiles", "mxfp4_e2m1", (2, 33, 18), {"block_shape": (8, 4), "rounding": "stochastic", "seed": 8}, 200),
]


@pytest.mark.parametrize("fmt, shape, options, budget", [c[1:] for c in PIECE_CASES], ids=[c[0] for c in PIECE_CASES])
def test_pieces_reassemble_the_whole(fmt, shape, options, budget):
    x = block_binades(shape, 3, -12, 12)
    whole = nk.quantize(x, fmt, **options)
    codes, scales, pts = quantize_in_pieces(x, fmt, budget, **options)
    assert_bits(codes, whole.codes.reshape(-1), "codes")
    assert_bits(scales, whole.scales.view(np.uint8).reshape(-1), "scales")
    assert pts == whole.per_tensor_scale


# ---- containers: files, x4, codes, error statistics ------------------------------------------------------

SAVE_CASES = [
    ("nvfp4_two_level", "nvfp4", (6, 40), {}),
    ("nvfp4_given_pts", "nvfp4", (6, 40), {"per_tensor_scale": 3e-3, "pack": False}),
    ("nvfp4_single_level_axis0", "nvfp4", (33, 5), {"per_tensor_scale": None, "axis": 0}),
    ("nvfp4_tiles", "nvfp4", (2, 20, 35), {"block_shape": (16, 16)}),
    ("nvfp4_rht", "nvfp4", (4, 64), {"rht": CUSTOM_SIGNS}),
    ("nvfp4_rht_axis0", "nvfp4", (32, 3), {"rht": True, "axis": 0, "four_over_six": "mse"}),
    ("mx_tiles", "mxfp8_e4m3", (16, 12), {"block_shape": (8, 4), "scale_mode": "neuron"}),
    ("mxfp4_tiles", "mxfp4_e2m1", (3, 17, 9), {"block_shape": (8, 4)}),
]


@pytest.mark.parametrize("fmt, shape, options", [c[1:] for c in SAVE_CASES], ids=[c[0] for c in SAVE_CASES])
def test_save_load_round_trip(tmp_path, fmt, shape, options):
    x = block_binades(shape, 5, -10, 10)
    q = nk.quantize(x, fmt, **options)
    nk.save_blocks(tmp_path / "q", q)  # .npz is appended
    back = nk.load_blocks(tmp_path / "q.npz")
    for field in ("fmt", "block_size", "axis", "shape", "packed", "block_rows", "rotation", "block_shape"):
        assert getattr(back, field) == getattr(q, field), field
    if q.per_tensor_scale is None:
        assert back.per_tensor_scale is None
    else:
        assert_bits(np.array([back.per_tensor_scale], F32), np.array([q.per_tensor_scale], F32))
    assert_bits(back.codes, q.codes)
    assert back.scales.dtype == q.scales.dtype
    assert_bits(back.scales.view(np.uint8), q.scales.view(np.uint8))
    assert_bits(back.dequantize(), q.dequantize())
    if q.rotation is not None:
        assert_bits(back.dequantize(unrotate=True), q.dequantize(unrotate=True))
    assert repr(back) == repr(q)


def test_moved_file_methods_say_where_they_went(tmp_path):
    q = nk.quantize(block_binades((2, 32), 1), "mxfp8_e4m3")
    with pytest.raises(AttributeError, match=r"neuron_kernels\.save_blocks\(path, q\)"):
        q.save(tmp_path / "q.npz")
    with pytest.raises(AttributeError, match=r"neuron_kernels\.load_blocks\(path"):
        nk.BlockArray.load(tmp_path / "q.npz")
    assert not (tmp_path / "q.npz").exists()


def test_save_blocks_refuses_what_is_not_a_block_array(tmp_path):
    with pytest.raises(TypeError, match="save_blocks writes a BlockArray"):
        nk.save_blocks(tmp_path / "q.npz", np.zeros(4))


def test_nvfp4_per_tensor_scale_is_exact_float32_in_files(tmp_path):
    # A pts that is not a short decimal (the float32 nearest 1 / 3) survives the file bit for bit.
    x = block_binades((2, 32), 2)
    q = nk.quantize_nvfp4(x, per_tensor_scale=1 / 3)
    assert q.per_tensor_scale == float(np.float32(1 / 3))
    nk.save_blocks(tmp_path / "q.npz", q)
    back = nk.load_blocks(tmp_path / "q.npz")
    assert back.per_tensor_scale == q.per_tensor_scale
    assert_bits(back.dequantize(), reference(x, "nvfp4", per_tensor_scale=1 / 3).values)


@pytest.mark.parametrize("options", [{}, {"pack": False}, {"axis": 0}, {"block_shape": (16, 16)}], ids=str)
def test_nvfp4_to_x4(options):
    x = block_binades((32, 48), 6, -4, 4)
    q = nk.quantize_nvfp4(x, **options)
    codes = reference(x, "nvfp4", **{k: v for k, v in options.items() if k != "pack"}).codes
    x4 = q.to_x4()
    assert x4.dtype == np.uint16 and x4.shape == (32, 12)
    want = np.zeros((32, 12), np.uint16)
    for i in range(4):  # lane i of container j: element 4j + i, bits [4i, 4i + 4)
        want |= codes[:, i::4].astype(np.uint16) << (4 * i)
    assert_bits(x4, want)
    assert_bits(nk.unpack_x4(x4, "float4_e2m1fn_x4").view(np.uint8), codes)
    assert q.element_codes().dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    assert_bits(q.element_codes().view(np.uint8), codes)


def test_nvfp4_to_x4_needs_a_multiple_of_4():
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.quantize_nvfp4(np.ones((2, 18), F32)).to_x4()


def test_nvfp4_element_codes_decode_to_the_values():
    # Single level: value = decode(code) * s, with s the scale's float8_e4m3fn value.
    x = block_binades((8, 48), 4, -6, 6)
    q = nk.quantize_nvfp4(x, per_tensor_scale=None)
    scales = np.repeat(q.scales.astype(F32), 16, axis=1)
    assert_bits(q.element_codes().astype(F32) * scales, q.dequantize())


def reference_error_stats(x, want: Want, fmt: str, block_shape, pts) -> dict[str, float]:
    """The statistics of ``QuantizationStats`` from the reference's values (float64; blocks with a
    NaN value and non-finite inputs left out)."""
    x64 = as_float32(x).astype(np.float64)
    dq = (want.unrotated if want.unrotated is not None else want.values).astype(np.float64)
    keep = np.isfinite(x64) & ~np.isnan(dq)
    err = np.abs(x64 - dq)[keep]
    xs = x64[keep]
    top = np.full(want.codes.shape, 0x7 if fmt == "nvfp4" else 0x6, np.uint8)  # 6 and 448 codes
    lim = dequantize_2d_ref(top, want.scales, fmt, block_shape, pts)
    quantised = as_float32(rht_ref(as_float32(x))) if want.unrotated is not None else as_float32(x)
    sat = np.abs(quantised.astype(np.float64))[keep] > lim.astype(np.float64)[keep]
    nz = xs != 0
    return {
        "mse": float(np.sum(err * err) / max(err.size, 1)),
        "max_abs_error": float(err.max()),
        "max_rel_error": float((err[nz] / np.abs(xs[nz])).max()),
        "saturated": float(sat.sum() / max(err.size, 1)),
        "flushed": float((dq[keep][nz] == 0).sum() / max(err.size, 1)),
        "sqnr_db": float(10 * np.log10(np.sum(xs * xs) / np.sum(err * err))),
    }


@pytest.mark.parametrize(
    "options, block_shape",
    [
        ({}, (1, 16)),
        ({"per_tensor_scale": None}, (1, 16)),
        ({"block_shape": (16, 16)}, (16, 16)),
        ({"rht": True}, (1, 16)),
    ],
    ids=["two_level", "single_level", "tiles", "rht"],
)
def test_quantization_error_of_nvfp4(options, block_shape):
    x = np.concatenate([block_binades((32, 64), 7, -6, 6), special_blocks()[:2, :32].reshape(-1, 64)])
    x[3, 5] *= 1e5  # single level: its block scale clamps at 448 and the element saturates
    q = nk.quantize_nvfp4(x, **options)
    want = reference(x, "nvfp4", **options)
    stats = nk.quantization_error(x, q).as_dict()
    expect = reference_error_stats(x, want, "nvfp4", block_shape, want.pts)
    for name, value in expect.items():
        assert stats[name] == pytest.approx(value, rel=1e-9, abs=0), name


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", list(nk.BLOCK_FORMATS))
def test_one_pass_error_sums_equal_statistics_of_the_codes(fmt, dtype):
    """The error table's pass that writes no codes (``BlockJob.error_sums``) against quantise-then-
    statistics, for every scale mode and policy of each format: specials, saturating and flushed
    elements, and a short last block."""
    from neuron_kernels.blocks.stats import ErrorStats
    from neuron_kernels.io.file_jobs import POLICIES

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 77)) * np.exp2(rng.integers(-30, 30, (6, 1)))).astype(F32)
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    x[1, 3] = 3e38
    x[2, 40] *= 1e-7
    x = x.astype(dtype)
    arr, src = input_array(x)
    bf = nk.BLOCK_FORMATS[fmt]
    if bf.integer:  # the statistics of integer codes come from the codes (tests/test_integers.py)
        assert block_job(fmt, 2).error_sums(arr, src) is None
        return
    for mode in bf.scale_modes:
        for policy, kwargs in POLICIES.items():
            if (fmt == "nvfp4" or "four_over_six" not in kwargs) and not (bf.float_scales and kwargs):
                job = block_job(fmt, 2, scale_mode=mode, **kwargs).resolved(arr, src)
                if job.block_rows > 1:  # 2-D tiles: the statistics need the codes; their rows instead
                    assert job.error_sums(arr, src) is None
                    kwargs = {**kwargs, "block_size": bf.block_size}
                    job = block_job(fmt, 2, scale_mode=mode, **kwargs).resolved(arr, src)
                stats = ErrorStats()
                stats.add_row_sums(job.error_sums(arr, src))
                want = nk.quantization_error(x, nk.quantize(x, fmt, scale_mode=mode, **kwargs))
                assert stats.result() == want, (mode, policy)
    assert block_job(fmt, 2, axis=0).error_sums(arr, src) is None  # blocks along the first axis: codes needed


# ---- bad input ---------------------------------------------------------------------------------------------

X2 = np.ones((32, 32), F32)
X1 = np.ones(32, F32)
SIGNS_15 = [1] * 15

#: (id, format, input, options, error, pattern): every wrong value of a new option, and the error naming it.
BAD_OPTIONS = [
    ("shape_zero_rows", "nvfp4", X2, {"block_shape": (0, 16)}, ValueError, "block_shape must be a positive int"),
    ("shape_zero_cols", "nvfp4", X2, {"block_shape": (16, 0)}, ValueError, "block_shape must be a positive int"),
    ("shape_negative", "mxfp8_e4m3", X2, {"block_shape": (-8, 4)}, ValueError, "block_shape must be a positive int"),
    (
        "shape_three_dims",
        "nvfp4",
        X2,
        {"block_shape": (2, 4, 4)},
        TypeError,
        "block_shape must be a tuple of one or two",
    ),
    ("shape_empty", "nvfp4", X2, {"block_shape": ()}, TypeError, "block_shape must be a tuple of one or two"),
    ("shape_int", "nvfp4", X2, {"block_shape": 16}, TypeError, "block_shape must be a tuple"),
    ("shape_string", "nvfp4", X2, {"block_shape": "16x16"}, TypeError, "block_shape must be a tuple"),
    ("shape_float", "nvfp4", X2, {"block_shape": (16.0, 16)}, TypeError, "block_shape must be a positive int"),
    ("shape_bool", "nvfp4", X2, {"block_shape": (True, 16)}, TypeError, "block_shape must be a positive int"),
    ("shape_2d_on_1d", "nvfp4", X1, {"block_shape": (16, 16)}, ValueError, r"2-D blocks \(16, 16\) need an array of 2"),
    ("shape_2d_axis0", "nvfp4", X2, {"block_shape": (16, 16), "axis": 0}, ValueError, "axis must be -1, got 0"),
    ("shape_and_size", "mxfp8_e4m3", X2, {"block_shape": (8, 4), "block_size": 8}, ValueError, "disagree"),
    ("pts_zero", "nvfp4", X2, {"per_tensor_scale": 0.0}, ValueError, "per_tensor_scale must be a positive finite"),
    ("pts_int_zero", "nvfp4", X2, {"per_tensor_scale": 0}, ValueError, "per_tensor_scale must be a positive finite"),
    ("pts_negative", "nvfp4", X2, {"per_tensor_scale": -0.5}, ValueError, "per_tensor_scale must be a positive finite"),
    ("pts_nan", "nvfp4", X2, {"per_tensor_scale": float("nan")}, ValueError, "per_tensor_scale must be a positive"),
    ("pts_f32_nan", "nvfp4", X2, {"per_tensor_scale": F32("nan")}, ValueError, "per_tensor_scale must be a positive"),
    ("pts_inf", "nvfp4", X2, {"per_tensor_scale": float("inf")}, ValueError, "per_tensor_scale must be a positive"),
    ("pts_string", "nvfp4", X2, {"per_tensor_scale": "max"}, ValueError, "per_tensor_scale must be 'amax'"),
    ("pts_upper", "nvfp4", X2, {"per_tensor_scale": "AMAX"}, ValueError, "per_tensor_scale must be 'amax'"),
    ("pts_list", "nvfp4", X2, {"per_tensor_scale": [1.0]}, TypeError, "per_tensor_scale must be 'amax'"),
    ("pts_array", "nvfp4", X2, {"per_tensor_scale": np.array([1.0])}, TypeError, "per_tensor_scale must be"),
    ("pts_bool", "nvfp4", X2, {"per_tensor_scale": True}, TypeError, "per_tensor_scale must be"),
    ("pts_complex", "nvfp4", X2, {"per_tensor_scale": 1 + 0j}, TypeError, "per_tensor_scale must be"),
    ("pts_on_mx", "mxfp8_e4m3", X2, {"per_tensor_scale": 1.0}, ValueError, "mxfp8_e4m3 has no per-tensor scale"),
    ("pts_amax_on_mx", "mxfp4_e2m1", X2, {"per_tensor_scale": "amax"}, ValueError, "has no per-tensor scale"),
    (
        "four_six_on_mx",
        "mxfp4_e2m1",
        X2,
        {"four_over_six": "mse"},
        NotApplicableError,
        r"not valid for mxfp4_e2m1 \(valid: nvfp4",
    ),
    ("four_six_unknown", "nvfp4", X2, {"four_over_six": "l1"}, ValueError, "unknown four_over_six .*'l1'.*mae, mse"),
    ("four_six_true", "nvfp4", X2, {"four_over_six": True}, ValueError, "unknown four_over_six"),
    (
        "four_six_and_search",
        "nvfp4",
        X2,
        {"four_over_six": "mae", "scale_search": "mse"},
        ValueError,
        "four_over_six and scale_search",
    ),
    ("search_unknown", "nvfp4", X2, {"scale_search": "mae"}, ValueError, "unknown scale search 'mae'; accepted: mse"),
    ("search_unknown_mx", "mxint8", X2, {"scale_search": "grid"}, ValueError, "unknown scale search 'grid'"),
    ("search_true", "nvfp4", X2, {"scale_search": True}, ValueError, "unknown scale search"),
    ("rht_15_signs", "nvfp4", X2, {"rht": SIGNS_15}, ValueError, "rht must be 16 signs"),
    ("rht_17_signs", "nvfp4", X2, {"rht": SIGNS_15 + [1, 1]}, ValueError, "rht must be 16 signs"),
    ("rht_zero_sign", "nvfp4", X2, {"rht": SIGNS_15 + [0]}, ValueError, "each 1 or -1"),
    ("rht_two", "nvfp4", X2, {"rht": SIGNS_15 + [2]}, ValueError, "each 1 or -1"),
    ("rht_half", "nvfp4", X2, {"rht": SIGNS_15 + [0.5]}, ValueError, "each 1 or -1"),
    ("rht_bools", "nvfp4", X2, {"rht": [True] * 16}, ValueError, "each 1 or -1"),
    ("rht_string", "nvfp4", X2, {"rht": "yes"}, TypeError, "rht must be True, False or a sequence of 16 signs"),
    ("rht_one", "nvfp4", X2, {"rht": 1}, TypeError, "rht must be True, False or a sequence"),
    ("rht_length", "nvfp4", np.ones((4, 20), F32), {"rht": True}, ValueError, "length 20 is not a multiple of 16"),
    (
        "rht_length_axis0",
        "nvfp4",
        np.ones((20, 32), F32),
        {"rht": True, "axis": 0},
        ValueError,
        "axis 0, whose length 20",
    ),
    ("rht_block_size", "nvfp4", X2, {"rht": True, "block_size": 8}, ValueError, "block_size must be a multiple of 16"),
    ("rht_tiles", "nvfp4", X2, {"rht": True, "block_shape": (16, 16)}, ValueError, "rht= .* not 2-D tiles"),
    ("bound_zero", "nvfp4", X2, {"scale_bound": 0}, ValueError, r"scale_bound must be a float in \(0, 448\]"),
    ("bound_negative", "nvfp4", X2, {"scale_bound": -256.0}, ValueError, r"scale_bound must be a float in \(0, 448\]"),
    ("bound_above", "nvfp4", X2, {"scale_bound": 448.5}, ValueError, r"scale_bound must be a float in \(0, 448\]"),
    ("bound_nan", "nvfp4", X2, {"scale_bound": float("nan")}, ValueError, "scale_bound must be a float"),
    ("bound_inf", "nvfp4", X2, {"scale_bound": float("inf")}, ValueError, "scale_bound must be a float"),
    ("bound_string", "nvfp4", X2, {"scale_bound": "256"}, TypeError, "scale_bound must be a float"),
    ("bound_bool", "nvfp4", X2, {"scale_bound": True}, TypeError, "scale_bound must be a float"),
    # known scale modes that do not apply: said so, with the valid ones; unknown ones: said so
    (
        "nvfp4_floor",
        "nvfp4",
        X2,
        {"scale_mode": "floor"},
        NotApplicableError,
        r"'floor' is not valid for nvfp4 \(valid: nearest\)",
    ),
    (
        "nvfp4_rceil",
        "nvfp4",
        X2,
        {"scale_mode": "rceil"},
        NotApplicableError,
        r"'rceil' is not valid for nvfp4 \(valid: nearest\)",
    ),
    (
        "mx_nearest",
        "mxfp8_e4m3",
        X2,
        {"scale_mode": "nearest"},
        NotApplicableError,
        "'nearest' is not valid for mxfp8_e4m3",
    ),
    (
        "nvfp4_mode_unknown",
        "nvfp4",
        X2,
        {"scale_mode": "round"},
        ValueError,
        "unknown scale mode 'round'; accepted: nearest",
    ),
    ("pts_on_mx_kind", "mxfp8_e4m3", X2, {"per_tensor_scale": 2.0}, NotApplicableError, "has no per-tensor scale"),
    ("unknown_format", "nvfp5", X2, {}, UnknownFormatError, "unknown block format 'nvfp5'"),
    ("nvfp4_rounding", "nvfp4", X2, {"rounding": "toward_positive"}, ValueError, "unknown rounding mode"),
]


@pytest.mark.parametrize(
    "fmt, x, options, error, pattern", [c[1:] for c in BAD_OPTIONS], ids=[c[0] for c in BAD_OPTIONS]
)
def test_bad_options(fmt, x, options, error, pattern):
    with pytest.raises(error, match=pattern):
        nk.quantize(x, fmt, **options)
    with pytest.raises(error, match=pattern):
        nk.fake_quantize(x, fmt, **options)
    if fmt == "nvfp4" and "scale_mode" not in options:
        with pytest.raises(error, match=pattern):
            nk.quantize_nvfp4(x, **options)
        with pytest.raises(error, match=pattern):
            nk.fake_quantize_nvfp4(x, **options)


@pytest.mark.parametrize(
    "call, pattern",
    [
        (
            lambda: nk.quantize_mx(X2, "nvfp4"),
            r"nvfp4 is not valid here, where an MX format is expected \(valid: mxfp8",
        ),
        (
            lambda: nk.dequantize_mx(nk.quantize_nvfp4(X2)),
            "dequantize_mx takes MX arrays, not NVFP4 .*dequantize takes",
        ),
        (lambda: nk.mx_matmul(nk.quantize_nvfp4(X2), nk.quantize_nvfp4(X2.T, axis=0)), "mx_matmul takes MX arrays"),
        (lambda: nk.quantize_mx(X2, block_shape=(0, 4)), "block_shape must be a positive int"),
        (lambda: nk.quantize_mx(X1, block_shape=(8, 4)), "2-D blocks"),
        (lambda: nk.fake_quantize_mx(X2, scale_search="mae"), "unknown scale search"),
        (lambda: nk.quantize_nvfp4(X2).dequantize(unrotate=True), "unrotate=True needs an array quantised with"),
        (lambda: nk.rotate(X2, rht=False), "rotate needs rht=True or 16 signs"),
        (lambda: nk.rotate(X2, SIGNS_15), "rht must be 16 signs"),
        (lambda: nk.rotate(X2, [2] * 16), "each 1 or -1"),
        (lambda: nk.rotate(np.ones((20, 32), F32), axis=0), "length 20 is not a multiple of 16"),
        (lambda: nk.rotate(X2, axis=2), "axis 2 is out of range"),
        (lambda: nk.rotate(np.float32(1.0)), "0-d"),
    ],
    ids=[
        "mx_nvfp4",
        "dequantize_mx_nvfp4",
        "mx_matmul_nvfp4",
        "mx_shape",
        "mx_2d_on_1d",
        "mx_search",
        "unrotate",
        "rotate_false",
        "rotate_15",
        "rotate_two",
        "rotate_length",
        "rotate_axis",
        "rotate_0d",
    ],
)
def test_bad_calls(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_bad_types_of_rotate_and_dequantize():
    with pytest.raises(TypeError, match="inverse must be True or False"):
        nk.rotate(X2, inverse="yes")
    with pytest.raises(TypeError, match="rht must be True, False or a sequence"):
        nk.rotate(X2, "default")
    with pytest.raises(TypeError, match="unrotate must be True or False"):
        nk.quantize_nvfp4(X2, rht=True).dequantize(unrotate=1)
    with pytest.raises(TypeError, match="quantize_nvfp4"):
        nk.quantize_nvfp4(X2, scale_mode="nearest")
    with pytest.raises(TypeError, match="except pack"):
        nk.fake_quantize_nvfp4(X2, pack=False)


@pytest.mark.parametrize("pts", [1e-50, 1e39], ids=["underflows", "overflows"])
def test_per_tensor_scale_that_is_not_a_float32(pts):
    for call in (nk.quantize_nvfp4, nk.fake_quantize_nvfp4):
        with pytest.raises(ValueError, match="per_tensor_scale must be a positive finite"):
            call(X2, per_tensor_scale=pts)


def test_rht_signs_must_be_a_vector():
    with pytest.raises(ValueError, match="rht must be 16 signs"):
        nk.quantize_nvfp4(X2, rht=np.ones((4, 4)))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3"])
def test_per_tensor_scale_string_default_is_refused(fmt):
    with pytest.raises(ValueError, match="per_tensor_scale|no per-tensor scale"):
        nk.quantize(X2, fmt, per_tensor_scale="default")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "fmt, policy",
    [
        ("nvfp4", {}),
        ("nvfp4", {"four_over_six": "mse"}),
        ("nvfp4", {"four_over_six": "mae", "per_tensor_scale": 0.01}),
        ("nvfp4", {"scale_search": "mse"}),
        ("mxfp4_e2m1", {"scale_search": "mse"}),
        ("mxfp8_e4m3", {}),
        ("mxfp6_e2m3", {"scale_search": "mse"}),
        ("nvfp4", {"rounding": "stochastic", "seed": 2}),
        ("nvfp4", {"unpacked": True, "per_tensor_scale": 1e-30}),  # multipliers overflow to inf
        ("mxfp4_e2m1", {"rounding": "toward_zero", "unpacked": True}),
        ("mxint8", {"scale_mode": "even"}),
        ("mxfp8_e5m2", {"rounding": "stochastic", "seed": 5}),
    ],
    ids=str,
)
def test_rows_across_the_grouped_loops_and_runs(dtype, fmt, policy):
    """Rows of 3 x 64 + 1 whole blocks and a partial one: the scale and element loops over runs of
    64 blocks (kernels/block_kernels/runs.py) and the policies' groups of up to 64 blocks
    (kernels/block_kernels/policies.py) cross their bounds, and the partial block takes the per-block
    loops; every rounding, packed and not; all against the reference."""
    length = 193 * nk.BLOCK_FORMATS[fmt].block_size + 5
    x = np.tile(policy_data(3), (1, length // 48 + 1))[:, :length]  # the special blocks among them
    with np.errstate(over="ignore"):
        check(x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype), fmt, **policy)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "fmt, options",
    [
        ("nvfp4", {"axis": 0}),
        ("nvfp4", {"axis": 0, "block_size": 5, "rounding": "stochastic", "seed": 3}),  # pairs of rows share bytes
        ("nvfp4", {"axis": 0, "four_over_six": "mse"}),
        ("mxfp8_e4m3", {"axis": 0}),
        ("mxfp4_e2m1", {"block_shape": (8, 32)}),  # codes packed along the columns, an odd width
        ("nvfp4", {"block_shape": (16, 16), "scale_search": "mse"}),
        ("mxfp6_e2m3", {"block_shape": (4, 3), "rounding": "stochastic", "seed": 4}),
    ],
    ids=str,
)
def test_tiles_across_column_chunks(dtype, fmt, options):
    """Tile kernels (a block axis other than the last, 2-D tiles) work through a row of tiles in
    chunks of about CHUNK_COLUMNS columns (kernels/block_kernels/tiles.py): rows of two chunks and an odd
    remainder cross their bounds; every output against the reference."""
    from neuron_kernels.kernels.block_kernels.tiles import CHUNK_COLUMNS

    width = 2 * CHUNK_COLUMNS + 35
    x = np.tile(policy_data(5), (1, width // 48 + 1))[:37, :width].copy()
    with np.errstate(over="ignore"):
        x[:, CHUNK_COLUMNS - 1 : CHUNK_COLUMNS + 1] *= 300.0  # large values on both sides of a bound
        check(x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype), fmt, **options)
