"""Slow sweeps of the block formats against the reference (``tests/reference_blocks.py``): every
float16 and bfloat16 bit pattern as NVFP4 input and through the rotation, every scale code under
the scale policies, larger 2-D tiles in every MX format and scale mode, and random cases over every
format, input dtype, rounding mode, layout and policy (every pair of them). Deselect with ``-m 'not slow'``.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuron_kernels as nk

from .block_checks import (
    CUSTOM_SIGNS,
    INPUT_DTYPES,
    KERNEL_AXES,
    KERNEL_COVER,
    MX_FORMATS,
    ROUNDINGS,
    SCALE_MODES,
    as_float32,
    assert_bits,
    block_cases,
    check,
    check_four_over_six,
    check_mx_scale_search,
    check_nvfp4,
    scale_sweep_blocks,
    tile_data,
)
from .reference_blocks import rht_inverse_ref, rht_ref

pytestmark = pytest.mark.slow

BF16 = np.dtype(ml_dtypes.bfloat16)


def every_pattern(dtype, shuffled: bool) -> np.ndarray:
    """All 2^16 bit patterns of a 16-bit float as (4096, 16): in order (each block of 16 holds
    neighbouring values, so every block amax and scale occurs) or shuffled (blocks mixing binades,
    NaNs and infinities)."""
    codes = np.arange(1 << 16, dtype=np.uint16)
    if shuffled:
        codes = np.random.default_rng(0).permutation(codes)
    return codes.view(dtype).reshape(4096, 16)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("shuffled", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("per_tensor_scale", [None, "amax"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_every_16_bit_pattern_as_nvfp4_input(dtype, shuffled, per_tensor_scale, rounding):
    check_nvfp4(every_pattern(dtype, shuffled), per_tensor_scale=per_tensor_scale, rounding=rounding, seed=3)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("signs", [True, CUSTOM_SIGNS], ids=["default", "custom"])
def test_every_16_bit_pattern_through_the_rotation(dtype, signs):
    # Groups holding two NaNs may pass on either payload (IEEE leaves it open; the reference's Python
    # floats and the compiled butterfly pick differently): NaN results are compared as NaN only.
    x = every_pattern(dtype, shuffled=True)
    x32 = as_float32(x)
    s = tuple(signs) if signs is not True else None
    assert_bits(nk.rotate(x, signs), rht_ref(x32, s), nan_bits=False)
    assert_bits(nk.rotate(x, signs, inverse=True), rht_inverse_ref(x32, s), nan_bits=False)
    assert_bits(nk.rotate(x.T.copy(), signs, axis=0), rht_ref(x32.T, s, axis=0), nan_bits=False)
    finite = np.isfinite(x32).all(axis=1)  # without NaN inputs: every bit
    assert_bits(nk.rotate(x[finite], signs), rht_ref(x32[finite], s))


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_every_16_bit_pattern_rotated_and_quantised(dtype):
    x = every_pattern(dtype, shuffled=True).reshape(2048, 32)
    check_nvfp4(x, rht=True)
    check_nvfp4(x, rht=True, block_size=32, per_tensor_scale=None, rounding="stochastic", seed=8)


@pytest.mark.parametrize(
    "policy",
    [{"four_over_six": "mae"}, {"four_over_six": "mse"}, {"four_over_six": "mse", "scale_bound": 256.0}]
    + [{"scale_search": "mse"}],
    ids=str,
)
@pytest.mark.parametrize("per_tensor_scale", [None, 2.0**-12, "amax"])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_every_scale_code_under_the_policies(policy, per_tensor_scale, rounding):
    multiplier = 1.0 if per_tensor_scale in (None, "amax") else per_tensor_scale
    x = scale_sweep_blocks(multiplier)
    check_nvfp4(x, per_tensor_scale=per_tensor_scale, rounding=rounding, seed=2, **policy)
    check_nvfp4(x[:352].reshape(-1, 32), block_shape=(16, 16), per_tensor_scale=per_tensor_scale, **policy)


# The tile sweeps pair each format (or input dtype) with one rounding mode, every mode appearing:
# kernels are compiled per format, dtype and rounding (about 1.2 s each), while the tile walk they
# test is the same for every mode; the random cases below draw from every combination.
MX_TILE_CASES = [(fmt, ROUNDINGS[(i + 3) % len(ROUNDINGS)]) for i, fmt in enumerate(MX_FORMATS)]
NVFP4_TILE_CASES = [
    *[(dtype, ROUNDINGS[i]) for i, dtype in enumerate(INPUT_DTYPES)],
    (np.float32, "stochastic"),
]


@pytest.mark.parametrize("fmt, rounding", MX_TILE_CASES)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_mx_tiles_sweep(fmt, scale_mode, rounding):
    x = tile_data((2, 64, 60), 11)
    check(x, fmt, block_shape=(8, 4), scale_mode=scale_mode, rounding=rounding, seed=4)
    check(x, fmt, block_shape=(32, 32), scale_mode=scale_mode, rounding=rounding, seed=4, scale_search="mse")


@pytest.mark.parametrize("per_tensor_scale", [None, "amax", 1e-3])
@pytest.mark.parametrize(
    "dtype, rounding", NVFP4_TILE_CASES, ids=[f"{np.dtype(d).name}-{r}" for d, r in NVFP4_TILE_CASES]
)
def test_nvfp4_tiles_sweep(per_tensor_scale, rounding, dtype):
    with np.errstate(over="ignore"):
        x = tile_data((3, 64, 72), 12).astype(dtype)
    for policy in ({}, {"four_over_six": "mae"}, {"scale_search": "mse"}):
        check_nvfp4(x, block_shape=(16, 16), per_tensor_scale=per_tensor_scale, rounding=rounding, seed=6, **policy)


@pytest.mark.parametrize("measure", ["mae", "mse"])
@pytest.mark.parametrize("scale_bound", [448.0, 256.0])
@pytest.mark.parametrize("per_tensor_scale", [None, "amax", 0.01])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_four_over_six_grid(measure, scale_bound, per_tensor_scale, rounding):
    check_four_over_six(measure, scale_bound, per_tensor_scale, rounding)


#: One MX format per element width (4, 6 and 8-bit floats, 8-bit integers): the search's code is
#: the same for every format, its kernels are compiled per format (about 35 s of CI each).
SEARCH_FORMATS = sorted(
    {(nk.BLOCK_FORMATS[f].element_bits, nk.BLOCK_FORMATS[f].element_format.kind): f for f in MX_FORMATS[::-1]}.values()
)


@pytest.mark.parametrize("fmt", SEARCH_FORMATS)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_mx_scale_search_grid(fmt, scale_mode):
    check_mx_scale_search(fmt, scale_mode)


def test_the_kernel_cases_cover_every_pair():
    assert len(KERNEL_COVER) <= 40
    for (i, a), (j, b) in itertools.combinations(enumerate(KERNEL_AXES), 2):
        for u, v in itertools.product(a, b):
            assert any(row[i] == u and row[j] == v for row in KERNEL_COVER), (u, v)


@pytest.mark.parametrize(
    "fmt, dtype, rounding, layout, policy",
    KERNEL_COVER,
    ids=[f"{f}-{np.dtype(d).name}-{r}-{lay}-{p}" for f, d, r, lay, p in KERNEL_COVER],
)
@settings(max_examples=3, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cases_over_every_pair_of_kernel_choices(fmt, dtype, rounding, layout, policy, data):
    x, fmt, options = data.draw(block_cases(kernels=((fmt, dtype, rounding),), layout=layout, policy=policy))
    check(x, fmt, unpacked=True, **options)
