"""FP8 E4M3 with float scales (``fp8_block``, ``fp8_channel``, ``fp8_tensor``): the kernels against the
slow reference ``tests/reference_fp8.py``, bit for bit (codes, scales in their dtype, dequantised
values), and ``fake_quantize`` against ``quantize(...).dequantize()``.

``expected`` turns the package's options into the reference's tiles: ``fp8_block`` tiles the last
two axes (128 x 128 by default), ``fp8_channel`` takes 1-D blocks along ``axis`` (the whole axis by
default, ``block_size`` elements per group), ``fp8_tensor`` one tile per matrix (a 1-D array: one
for the whole array). Stochastic draws are ``reference.random_bits`` by C-order index of the input.

Every distinct (source dtype, rounding, scale mode, scale dtype, rows or tiles) compiles kernels of
its own: the tests share a few such combinations and keep their arrays small.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.errors import InvalidValueError, NotApplicableError
from neuron_kernels.registry import block_kernels

from .reference import random_bits
from .reference_casts import decode_ref
from .reference_fp8 import SCALE_EPS, fp8_dequantize_ref, fp8_quantize_ref

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
SCALE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": BF16, "float16": np.dtype(np.float16)}
FORMATS = ("fp8_block", "fp8_channel", "fp8_tensor")
SCALE_MODES = ("divide", "reciprocal", "pow2")

#: Every finite float8_e4m3fn code (all but the NaNs 0x7F and 0xFF) and its value.
FINITE_CODES = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
FINITE_VALUES = decode_ref(FINITE_CODES, "float8_e4m3fn")
#: The non-negative finite values in increasing order (magnitude codes 0x00..0x7E).
MAGNITUDES = decode_ref(np.arange(0x7F, dtype=np.uint8), "float8_e4m3fn")


# ---- the reference in the package's layout ------------------------------------------------------


class Want(NamedTuple):
    codes: np.ndarray
    scales: np.ndarray
    values: np.ndarray


def _ref_2d(x2: np.ndarray, block_shape, rand, **kw) -> Want:
    codes, scales = fp8_quantize_ref(x2, block_shape, rand=rand, **kw)
    return Want(codes, scales, fp8_dequantize_ref(codes, scales, block_shape))


def expected(
    x,
    fmt: str,
    *,
    block_size: int | None = None,
    block_shape: tuple[int, int] | None = None,
    axis: int = -1,
    scale_mode: str = "divide",
    scale_dtype: str = "float32",
    rounding: str = "nearest_even",
    seed: int | None = None,
) -> Want:
    """The reference's answer to ``nk.quantize(x, fmt, **options)``."""
    x = np.asarray(x)
    rand = random_bits(seed, x.size).reshape(x.shape) if rounding == "stochastic" else None
    kw: dict[str, Any] = {"scale_mode": scale_mode, "scale_dtype": scale_dtype, "rounding": rounding}
    tiled = fmt == "fp8_tensor" or (fmt == "fp8_block" and block_size is None)
    if tiled and x.ndim >= 2 and axis in (-1, x.ndim - 1):
        r, c = x.shape[-2:]
        shape = (block_shape or (128, 128)) if fmt == "fp8_block" else (max(r, 1), max(c, 1))
        mats = x.reshape(-1, r, c)
        rands = None if rand is None else rand.reshape(mats.shape)
        parts = [_ref_2d(mats[a], shape, None if rands is None else rands[a], **kw) for a in range(len(mats))]
        lead = x.shape[:-2]
        return Want(
            np.stack([p.codes for p in parts]).reshape(x.shape),
            np.stack([p.scales for p in parts]).reshape(lead + parts[0].scales.shape),
            np.stack([p.values for p in parts]).reshape(x.shape),
        )
    # 1-D blocks along ``axis``: rows of the reference (fp8_channel, or a 1-D fp8_tensor)
    moved = np.moveaxis(x, axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    size = block_size or max(flat.shape[1], 1)
    flat_rand = None if rand is None else np.moveaxis(rand, axis, -1).reshape(flat.shape)
    want = _ref_2d(flat, (1, size), flat_rand, **kw)
    nb = want.scales.shape[1]
    return Want(
        np.moveaxis(want.codes.reshape(moved.shape), -1, axis),
        np.moveaxis(want.scales.reshape(moved.shape[:-1] + (nb,)), -1, axis),
        np.moveaxis(want.values.reshape(moved.shape), -1, axis),
    )


# ---- comparisons ----------------------------------------------------------------------------------


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Same shape, dtype and bit patterns (NaNs included)."""
    got = np.asarray(got)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    bad = np.flatnonzero((bits(got) != bits(want)).reshape(-1))
    if bad.size:
        i = np.unravel_index(bad[0], got.shape)
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} differ; first at {tuple(int(k) for k in i)}: "
            f"got {got[i]!r} (0x{int(bits(got)[i]):x}), want {want[i]!r} (0x{int(bits(want)[i]):x})"
        )


def check(x, fmt: str, *, fake: bool = False, **options) -> tuple[nk.BlockArray, Want]:
    """``quantize`` (codes, scales), ``dequantize`` and, with ``fake``, ``fake_quantize`` against the
    reference; returns the block array and the reference's answer."""
    want = expected(x, fmt, **options)
    q = nk.quantize(x, fmt, **options)
    assert q.fmt == fmt
    assert q.shape == np.shape(x)
    assert_bits(q.codes, want.codes, "codes")
    assert_bits(q.scales, want.scales, "scales")
    dq = q.dequantize()
    assert_bits(dq, want.values, "dequantised values")
    if fake:
        fq = nk.fake_quantize(x, fmt, **options)
        assert_bits(fq, dq, "fake_quantize vs quantize().dequantize()")
    return q, want


# ---- data -----------------------------------------------------------------------------------------


def spread(shape, seed: int, lo: int = -6, hi: int = 6) -> np.ndarray:
    """float32 values of random sign, significand and binade 2^lo .. 2^hi, with a few zeros."""
    rng = np.random.default_rng(seed)
    mant = rng.uniform(1.0, 2.0, size=shape)
    exp = rng.integers(lo, hi + 1, size=shape)
    sign = rng.choice([-1.0, 1.0], size=shape)
    x = (sign * np.ldexp(mant, exp)).astype(F32)
    x.reshape(-1)[rng.integers(0, x.size, size=max(x.size // 17, 1))] = 0.0
    return x


def tiled(shape, tile: tuple[int, int], seed: int) -> np.ndarray:
    """``spread`` with each tile multiplied by its own power of two (scales of every size)."""
    x = spread(shape, seed)
    rng = np.random.default_rng(seed + 1000)
    r, c = tile
    for i in range(0, shape[-2], r):
        for j in range(0, shape[-1], c):
            x[..., i : i + r, j : j + c] *= F32(2.0 ** int(rng.integers(-30, 31)))
    return x


def ties(shape, seed: int, k: int = 0) -> np.ndarray:
    """Rows whose first element is 448 * 2^k (so that the divide rule's scale is 2^k exactly) and
    whose others are midpoints of neighbouring E4M3 magnitudes times 2^k, or E4M3 values, random
    signs: every element divided by the scale is a tie or exact."""
    rng = np.random.default_rng(seed)
    mids = (MAGNITUDES[:-1].astype(np.float64) + MAGNITUDES[1:]) / 2
    pool = np.concatenate([mids, MAGNITUDES])
    x = rng.choice(pool, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    x[..., 0] = 448.0
    return np.ldexp(x, k).astype(F32)


# ---- 1. the three formats ----------------------------------------------------------------------------


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_fp8_block_small_tiles_with_partial_edges(scale_mode):
    x = tiled((10, 21), (4, 8), seed=1)  # tiles of 4 x 8: the last row and column of tiles are partial
    q, _ = check(x, "fp8_block", block_shape=(4, 8), scale_mode=scale_mode)
    assert q.scales.shape == (3, 3)
    assert (q.block_rows, q.block_size) == (4, 8)


def test_fp8_block_default_tiles_partial_edges():
    x = tiled((300, 260), (128, 128), seed=2)
    q, _ = check(x, "fp8_block")
    assert q.scales.shape == (3, 3) and q.scales.dtype == np.float32
    assert (q.block_rows, q.block_size) == (128, 128)


def test_fp8_block_deepseek_576_rows():
    """DeepSeek-V3's 576-row projections: 4.5 tiles of 128 rows, so 5 rows of scales."""
    x = tiled((576, 200), (128, 128), seed=3)
    q, _ = check(x, "fp8_block")
    assert q.scales.shape == (5, 2)


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_fp8_channel_one_scale_per_row(scale_mode):
    x = spread((7, 45), seed=4)
    x[2] *= F32(2.0**-40)
    x[5] *= F32(2.0**40)
    q, _ = check(x, "fp8_channel", scale_mode=scale_mode)
    assert q.scales.shape == (7, 1)


def test_fp8_channel_groups():
    x = tiled((6, 40), (1, 16), seed=5)  # groups of 16, 16 and a partial 8
    q, _ = check(x, "fp8_channel", block_size=16)
    assert q.scales.shape == (6, 3)
    assert q.block_size == 16


def test_fp8_channel_along_axis_0():
    x = tiled((33, 9), (33, 1), seed=6)  # one scale per column
    q, _ = check(x, "fp8_channel", axis=0)
    assert q.scales.shape == (1, 9)
    assert q.axis == 0


def test_fp8_tensor_matrix():
    x = spread((9, 14), seed=7)
    q, _ = check(x, "fp8_tensor")
    assert q.scales.shape == (1, 1)


def test_fp8_tensor_each_matrix_of_a_stack():
    x = spread((3, 5, 7), seed=8)
    x[1] *= F32(2.0**20)
    x[2] *= F32(2.0**-20)
    q, _ = check(x, "fp8_tensor")
    assert q.scales.shape == (3, 1, 1)
    assert len(set(q.scales.reshape(-1).tolist())) == 3


def test_fp8_tensor_vector():
    x = spread((50,), seed=9)
    q, _ = check(x, "fp8_tensor")
    assert q.scales.shape == (1,)
    assert q.scales[0] == F32(F32(np.abs(x).max()) / F32(448))


# ---- 2. every E4M3 value ----------------------------------------------------------------------------

#: Row multipliers of the all-codes array: powers of two (amax exactly 448 for 1, a subnormal float32
#: scale for 2^-140, where the reciprocal rule's multiplier overflows), 3 (the divide rule gives the
#: values back exactly, the reciprocal one does not: 448 / 1344 is inexact) and inexact ones.
CODE_SCALES = (1.0, 2.0**-20, 2.0**30, 2.0**-140, 3.0, 0.1, 1.0e-3, 7.0e20)


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_every_e4m3_value(scale_mode):
    x = np.stack([FINITE_VALUES * F32(k) for k in CODE_SCALES]).astype(F32)
    q, want = check(x, "fp8_channel", scale_mode=scale_mode)
    # rows whose values divided (or multiplied) by the scale come back exactly: every code, as is
    exact = [0, 1, 2] + ([3, 4] if scale_mode == "divide" else [])  # pow2: 2^-126 at least, and 1344 / 4
    for row in exact:
        assert_bits(q.codes[row], FINITE_CODES, f"codes of row {row}")
        assert_bits(want.codes[row], FINITE_CODES, f"reference codes of row {row}")
    assert q.scales[0, 0] == 1.0  # amax exactly 448
    if scale_mode == "divide":
        assert q.scales[3, 0] == F32(2.0**-140)  # a subnormal float32 scale
    elif scale_mode == "pow2":
        assert q.scales[3, 0] == F32(2.0**-126) and q.scales[4, 0] == 4.0  # 896 < 1344 <= 1792
    else:
        assert q.scales[3, 0] == 0.0  # m = 448 / amax overflows to inf: 1 / m = 0
        assert set(q.codes[3].tolist()) == {0x00, 0x80, 0x7E, 0xFE}


# ---- 3. special tiles ----------------------------------------------------------------------------------


def special_tiles() -> np.ndarray:
    """A 12 x 24 array of 4 x 8 tiles, 3 x 3 of them, each a special case."""
    x = spread((12, 24), seed=10)
    t = [[x[i : i + 4, j : j + 8] for j in range(0, 24, 8)] for i in range(0, 12, 4)]
    t[0][0][...] = 0.0  # all zero, with negative zeros
    t[0][0][::2, 1::3] = -0.0
    t[0][1][2, 5] = np.nan
    t[0][2][3, 7] = np.inf
    t[1][0][0, 0] = -np.inf
    t[1][1][...] *= F32(1e-40) / np.abs(t[1][1]).max()  # amax 1e-40 (a subnormal): 448 / amax overflows
    t[1][1][1, :4] = [-0.0, 0.0, -1e-45, 1e-45]
    t[1][2][...] *= F32(1e-44) / np.abs(t[1][2]).max()  # amax / 448 underflows to zero
    t[2][0][...] = np.clip(t[2][0], -1, 1) * 400
    t[2][0][0, 0] = -448.0  # amax exactly 448, with negative zeros
    t[2][0][3, :3] = -0.0
    t[2][1][0, 1] = np.finfo(F32).max
    t[2][2][1, 2] = -np.finfo(F32).tiny  # the smallest normal among ordinary values
    return x


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
def test_special_tiles(scale_mode):
    x = special_tiles()
    q, _ = check(x, "fp8_block", block_shape=(4, 8), scale_mode=scale_mode, fake=True)
    s, codes, dq = q.scales, q.codes, q.dequantize()
    fq = nk.fake_quantize(x, "fp8_block", block_shape=(4, 8), scale_mode=scale_mode)
    # what the rules say, written out
    for i, j in [(0, 1), (0, 2), (1, 0)]:
        tile = np.s_[4 * i : 4 * i + 4, 8 * j : 8 * j + 8]
        assert np.isnan(s[i, j])
        assert (codes[tile] == 0x7F).all()
        assert np.isnan(dq[tile]).all() and np.isnan(fq[tile]).all()
    assert np.isnan(dq).sum() == 3 * 32 and np.array_equal(np.isnan(fq), np.isnan(dq))
    zero = np.s_[0:4, 0:8]
    assert_bits(codes[zero], np.where(np.signbit(x[zero]), 0x80, 0x00).astype(np.uint8), "zero tile codes")
    assert_bits(dq[zero], x[zero], "zero tile values")  # signed zeros
    if scale_mode == "divide":
        assert s[0, 0] == SCALE_EPS["float32"] == 2.0**-23
        assert s[1, 2] == 2.0**-23  # 1e-44 / 448 is zero in float32
        amax = np.abs(x[4:8, 8:16]).max()
        assert s[1, 1] == amax / F32(448) and 0 < s[1, 1] < np.finfo(F32).tiny  # a subnormal scale
    elif scale_mode == "pow2":
        assert s[0, 0] == s[1, 2] == 2.0**-23  # all zero (the second flushed to zeros): the epsilon
        assert s[1, 1] == 2.0**-126  # amax 1e-40: the smallest scale the rule gives
        assert s[2, 1] == 2.0**120  # float32's largest: 448 * 2^119 < 3.4e38 <= 448 * 2^120
    else:
        assert s[0, 0] == 1.0
        assert s[1, 1] == 0.0  # m = inf
        tiny = x[4:8, 8:16]
        assert_bits(
            codes[4:8, 8:16],
            np.where(tiny == 0, np.where(np.signbit(tiny), 0x80, 0), np.where(tiny < 0, 0xFE, 0x7E)).astype(np.uint8),
            "codes of the tile whose multiplier is inf",
        )
    assert s[2, 0] == 1.0  # amax exactly 448 (448 / 448 and 1 / (448 / 448))
    assert_bits(codes[8:12, 0:8], x[8:12, 0:8].astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "codes at scale 1")


def test_nearest_even_matches_ml_dtypes_cast():
    """The divide rule is ``clip(x / s, -448, 448)`` cast to float8_e4m3fn: ml_dtypes' cast as a
    second oracle, with s from the reference's rule."""
    x = tiled((16, 32), (4, 8), seed=11)
    q = nk.quantize(x, "fp8_block", block_shape=(4, 8))
    s = np.repeat(np.repeat(q.scales, 4, axis=0), 8, axis=1)
    amax = np.abs(x).reshape(4, 4, 4, 8).max(axis=(1, 3))
    assert_bits(q.scales, (amax / F32(448)).astype(F32), "scales")
    with np.errstate(all="ignore"):
        oracle = np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert_bits(q.codes, oracle, "codes")


# ---- 4. scale dtypes ---------------------------------------------------------------------------------


def scale_dtype_rows() -> np.ndarray:
    x = spread((8, 20), seed=12)
    x[1] = 0.0
    x[1, ::3] = -0.0
    x[2] *= F32(1e-6) / np.abs(x[2]).max()  # float16: amax / 448 underflows to zero
    x[3] *= F32(3e7) / np.abs(x[3]).max()  # float16: amax / 448 = 66964 is past its largest, 65504
    x[4] *= F32(1e-40) / np.abs(x[4]).max()  # bfloat16 (and float16): amax / 448 rounds to zero
    x[5, 7] = np.nan
    x[6] *= F32(1e-4) / np.abs(x[6]).max()  # float16: a subnormal scale
    x[7] = np.clip(x[7], -1, 1) * F32(2.0**127)
    x[7, 3] = np.finfo(F32).max
    return x


@pytest.mark.parametrize("scale_dtype", list(SCALE_DTYPES))
def test_scale_dtypes(scale_dtype):
    x = scale_dtype_rows()
    q, want = check(x, "fp8_channel", scale_dtype=scale_dtype, fake=True)
    s = q.scales[:, 0]
    assert s.dtype == SCALE_DTYPES[scale_dtype]
    assert s[1] == SCALE_EPS[scale_dtype] == np.finfo(SCALE_DTYPES[scale_dtype]).eps
    assert np.isnan(s[5])
    if scale_dtype == "float16":
        assert s[2] == 2.0**-10  # underflow: eps
        assert s[3] == 65504.0  # overflow: the largest float16 (the scale saturates)
        assert s[4] == 2.0**-10
        assert 0 < s[6] < np.finfo(np.float16).tiny  # subnormal
        # 3e7 / 65504 > 448: the row's largest elements saturate
        big = np.abs(x[3]) == np.abs(x[3]).max()
        assert (q.codes[3][big] & 0x7F == 0x7E).all()
    if scale_dtype == "bfloat16":
        assert s[4] == 2.0**-7  # underflow: eps
    # the stored scale, widened, is what the elements were divided by
    with np.errstate(all="ignore"):
        s32 = s.astype(F32)[:, None]
        oracle = np.clip(x / s32, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    finite = np.isfinite(s32[:, 0])
    assert_bits(q.codes[finite], oracle[finite], "codes against ml_dtypes' cast")


@pytest.mark.parametrize(
    "scale_dtype",
    [np.float16, BF16, ml_dtypes.bfloat16, np.dtype(np.float32)],
    ids=["f16-type", "bf16", "bf16-type", "f32"],
)
def test_scale_dtype_as_a_dtype(scale_dtype):
    x = scale_dtype_rows()
    name = np.dtype(scale_dtype).name
    q = nk.quantize(x, "fp8_channel", scale_dtype=scale_dtype)
    assert_bits(q.scales, nk.quantize(x, "fp8_channel", scale_dtype=name).scales, "scales")
    assert_bits(q.scales, expected(x, "fp8_channel", scale_dtype=name).scales, "scales")


# ---- 5. sources --------------------------------------------------------------------------------------


def float64_data() -> np.ndarray:
    x = tiled((8, 16), (4, 8), seed=13).astype(np.float64)
    x[:4, :8] /= np.abs(x[:4, :8]).max()  # the first tile's scale is 1 (its amax: 448 below)
    x[0, :7] = [1 + 2.0**-24, 1 + 3 * 2.0**-24, -(1 + 2.0**-23 + 2.0**-24), 1e-50, -1e-50, 448 + 2.0**-30, 0]
    # just above the E4M3 tie between 1 and 1.125: float32 rounds it onto the tie, which goes to 1
    x[0, 6] = 1.0625 + 2.0**-40
    x[1, :3] = [0.1, 1 / 3, -2 / 3]
    x[4, 9] = 1e39  # past float32's range: infinity, so a NaN tile
    x[5, 3] = float(np.finfo(F32).max) * (1 + 2.0**-26)  # rounds down to float32's largest
    return x


@pytest.mark.parametrize("source", ["float16", "bfloat16", "float64"])
def test_sources(source):
    if source == "float64":
        x = float64_data()
    else:
        with np.errstate(over="ignore"):
            x = (spread((8, 16), seed=14, lo=-12, hi=12) * F32(4.0)).astype(SCALE_DTYPES[source])
        x[5, 3] = -np.inf
    q, _ = check(x, "fp8_block", block_shape=(4, 8))
    # the package reads the input as its float32 rounding, ties to even
    with np.errstate(over="ignore"):
        x32 = x.astype(F32)
    assert_bits(q.codes, nk.quantize(x32, "fp8_block", block_shape=(4, 8)).codes, "codes of the float32 input")
    if source == "float64":
        assert np.isnan(q.scales[1, 1]) and q.scales[1, 0] == np.finfo(F32).max / F32(448)
        assert q.scales[0, 0] == 1.0
        assert q.codes[0, :7].tolist() == [0x38, 0x38, 0xB8, 0x00, 0x80, 0x7E, 0x38]  # 1, 1, -1, 0, -0, 448, 1


# ---- 6. rounding modes ------------------------------------------------------------------------------


def test_nearest_away_on_ties():
    x = ties((6, 40), seed=15)
    x[3] = np.ldexp(x[3], 9)
    q, want = check(x, "fp8_channel", rounding="nearest_away")
    even = expected(x, "fp8_channel")
    assert (want.codes != even.codes).sum() > 20  # the ties make a difference
    assert (q.scales[[0, 1, 2, 4, 5], 0] == 1.0).all() and q.scales[3, 0] == 2.0**9


def test_toward_zero():
    x = np.concatenate([ties((8, 16), seed=16, k=-5), tiled((8, 16), (4, 8), seed=17)], axis=1)
    q, want = check(x, "fp8_block", block_shape=(4, 8), rounding="toward_zero")
    # the tiles of the first 8 columns have the scale 2^-5: there, never away from zero
    assert (q.scales[:, 0] == 2.0**-5).all()
    assert (np.abs(q.dequantize()[:, :8]) <= np.abs(x[:, :8])).all()
    assert (want.codes != expected(x, "fp8_block", block_shape=(4, 8)).codes).any()


@pytest.mark.parametrize("seed", [0, 2**40 + 3])
def test_stochastic(seed):
    x = np.concatenate([ties((2, 6, 10), seed=18, k=3), spread((2, 6, 10), seed=19)], axis=2)
    q, want = check(x, "fp8_tensor", rounding="stochastic", seed=seed, fake=True)
    again = nk.quantize(x, "fp8_tensor", rounding="stochastic", seed=seed)
    assert_bits(again.codes, q.codes, "codes of the same seed")
    other = expected(x, "fp8_tensor", rounding="stochastic", seed=seed + 1)
    assert (other.codes != want.codes).any()  # the draws matter


# ---- 7. fake_quantize, statistics, files ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_fake_quantize_is_quantize_then_dequantize(fmt):
    x = special_tiles() if fmt == "fp8_block" else scale_dtype_rows()
    options: dict[str, Any] = {"block_shape": (4, 8)} if fmt == "fp8_block" else {}
    q = nk.quantize(x, fmt, **options)
    fq = nk.fake_quantize(x, fmt, **options)
    dq = q.dequantize()
    assert fq.dtype == np.float32
    assert np.isnan(dq).any()
    assert_bits(fq, dq, "fake_quantize")
    assert_bits(nk.dequantize(q), dq, "nk.dequantize")


def test_quantization_error():
    x = tiled((12, 24), (4, 8), seed=20)
    x[0, 1] = np.abs(x[:4, :8]).max() * F32(2.0**-22)  # below half the smallest element: flushed to zero
    q = nk.quantize(x, "fp8_block", block_shape=(4, 8))
    want = expected(x, "fp8_block", block_shape=(4, 8))
    stats = nk.quantization_error(x, q)
    x64, d = x.astype(np.float64), want.values.astype(np.float64) - x.astype(np.float64)
    assert stats.mse == pytest.approx(np.mean(d * d), rel=1e-12)
    assert stats.max_abs_error == np.abs(d).max()
    assert stats.sqnr_db == pytest.approx(10 * np.log10((x64 * x64).sum() / (d * d).sum()), rel=1e-12)
    nonzero = x64 != 0
    assert stats.max_rel_error == pytest.approx((np.abs(d[nonzero]) / np.abs(x64[nonzero])).max(), rel=1e-12)
    assert stats.flushed == pytest.approx(np.mean(nonzero & (want.values == 0)), rel=1e-12)
    assert stats.flushed > 0
    # saturated: beyond the block's largest value, 448 * s
    top = np.repeat(np.repeat(want.scales * F32(448), 4, axis=0), 8, axis=1)[:12, :24]
    assert stats.saturated == pytest.approx(np.mean(np.abs(x) > top), rel=1e-12)


@pytest.mark.parametrize("scale_dtype", list(SCALE_DTYPES))
def test_save_and_load(tmp_path, scale_dtype):
    x = scale_dtype_rows()
    q = nk.quantize(x, "fp8_channel", scale_dtype=scale_dtype)
    nk.save_blocks(tmp_path / "q", q)
    back = nk.load_blocks(tmp_path / "q.npz")
    assert (back.fmt, back.shape, back.axis, back.block_size, back.block_rows) == (
        q.fmt,
        q.shape,
        q.axis,
        q.block_size,
        q.block_rows,
    )
    assert_bits(back.codes, q.codes, "codes")
    assert_bits(back.scales, q.scales, "scales")
    assert back.scales.dtype == SCALE_DTYPES[scale_dtype]
    assert_bits(back.dequantize(), expected(x, "fp8_channel", scale_dtype=scale_dtype).values, "values")


def test_save_and_load_tiles(tmp_path):
    x = tiled((10, 21), (4, 8), seed=1)
    q = nk.quantize(x, "fp8_block", block_shape=(4, 8))
    nk.save_blocks(tmp_path / "tiles.npz", q)
    back = nk.load_blocks(tmp_path / "tiles.npz")
    assert (back.block_rows, back.block_size) == (4, 8)
    assert_bits(back.scales, q.scales, "scales")
    assert_bits(back.dequantize(), q.dequantize(), "values")


# ---- 8. options that do not apply ----------------------------------------------------------------------

BAD_OPTIONS = [
    pytest.param(
        {"four_over_six": "mse"}, NotApplicableError, r"four_over_six.*fp8_\w+'s are floats", id="four_over_six"
    ),
    pytest.param({"scale_search": "mse"}, NotApplicableError, r"scale_search.*fp8_\w+'s are floats", id="scale_search"),
    pytest.param({"per_tensor_scale": 1.0}, NotApplicableError, r"fp8_\w+ has no per-tensor scale", id="pts-float"),
    pytest.param({"per_tensor_scale": "amax"}, NotApplicableError, r"fp8_\w+ has no per-tensor scale", id="pts-amax"),
    pytest.param(
        {"scale_dtype": "float8_e4m3fn"},
        InvalidValueError,
        r"scale_dtype 'float8_e4m3fn' is not one of fp8_\w+'s: float32, bfloat16, float16",
        id="scale_dtype-e4m3",
    ),
    pytest.param(
        {"scale_dtype": np.float64}, InvalidValueError, r"scale_dtype .*float64.* is not one of", id="scale_dtype-f64"
    ),
    pytest.param(
        {"scale_mode": "reciprocal", "scale_dtype": "bfloat16"},
        NotApplicableError,
        r"'reciprocal' stores float32 scales.*'bfloat16'",
        id="reciprocal-bf16",
    ),
    pytest.param(
        {"scale_mode": "reciprocal", "scale_dtype": "float16"},
        NotApplicableError,
        r"'reciprocal' stores float32 scales.*'float16'",
        id="reciprocal-f16",
    ),
    pytest.param(
        {"scale_mode": "pow2", "scale_dtype": "float16"},
        NotApplicableError,
        r"'pow2' stores float32 or bfloat16 scales.*'float16'",
        id="pow2-f16",
    ),
    pytest.param(
        {"scale_mode": "floor"},
        NotApplicableError,
        r"'floor' is not valid for fp8_\w+ \(valid: divide, reciprocal, pow2\)",
        id="scale_mode-floor",
    ),
    pytest.param({"rounding": "toward_positive"}, InvalidValueError, r"rounding mode 'toward_positive'", id="rounding"),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("options, error, match", BAD_OPTIONS)
def test_bad_options(fmt, options, error, match):
    x = np.ones((4, 32), F32)
    with pytest.raises(error, match=match):
        nk.quantize(x, fmt, **options)
    with pytest.raises(error, match=match):
        nk.fake_quantize(x, fmt, **options)


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_tensor"])
def test_rht_on_tiles(fmt):
    with pytest.raises(InvalidValueError, match=r"rht= rotates along the block axis of 1-D blocks, not 2-D tiles"):
        nk.quantize(np.ones((4, 32), F32), fmt, rht=True)


@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16"])
def test_pow2_scales_keep_values_on_a_power_of_two_grid(scale_dtype):
    """MXFP4's values (E2M1 codes times powers of two) through ``pow2`` tiles come back bit for bit
    where a tile's binades fit E4M3's, against the reference; every scale a power of two."""
    x = nk.quantize(spread((16, 64), seed=21, lo=-4, hi=4), "mxfp4_e2m1").dequantize()
    q, want = check(x, "fp8_block", block_shape=(4, 8), scale_mode="pow2", scale_dtype=scale_dtype, fake=True)
    s = q.scales.astype(F32)
    assert (s.view(np.uint32) & 0x7FFFFF == 0).all()
    assert_bits(q.dequantize(), x, "values")


BAND_CASES = {
    "plain": ({}, None),
    "nan": ({}, "nan"),
    "inf": ({}, "inf"),
    "zeros": ({}, "zeros"),
    "reciprocal": ({"scale_mode": "reciprocal"}, None),
    "pow2-bf16-scales": ({"scale_mode": "pow2", "scale_dtype": "bfloat16"}, None),
    "stochastic": ({"rounding": "stochastic", "seed": 5}, None),
    "bfloat16-input": ({}, "bfloat16"),
    "stack-of-2": ({}, "stack"),
}


@pytest.mark.parametrize("case", list(BAND_CASES))
def test_fp8_tensor_in_bands_is_the_one_tile(case):
    """A large matrix of ``fp8_tensor`` is quantised in bands of rows on every thread, each band
    given the matrix's amax: the codes, scale and fake-quantised values of one task over the whole
    matrix (one thread, checked against the reference above), bit for bit, NaN and infinite
    matrices included (every band's scale NaN)."""
    options, special = BAND_CASES[case]
    shape = (2, 2100, 1030) if special == "stack" else (2100, 1030)  # 2 Mi elements a matrix or more
    x = spread(shape, seed=30)
    if special == "nan":
        x[1500, 3] = np.nan
    elif special == "inf":
        x[7, 1000] = -np.inf
    elif special == "zeros":
        x[...] = 0.0
        x[::7, ::3] = -0.0
    if special == "bfloat16":
        x = x.astype(BF16)
    job = nk.blocks.scheme.block_job("fp8_tensor", x.ndim, **options)
    nk.set_num_threads(4)  # more threads than matrices (two cores run them)
    try:
        assert block_kernels().bands(job, x.shape) > 0  # the banded path is the one taken
        q, f = nk.quantize(x, "fp8_tensor", **options), nk.fake_quantize(x, "fp8_tensor", **options)
        nk.set_num_threads(1)
        assert block_kernels().bands(job, x.shape) == 0
        q1, f1 = nk.quantize(x, "fp8_tensor", **options), nk.fake_quantize(x, "fp8_tensor", **options)
    finally:
        nk.set_num_threads(None)
    assert_bits(q.codes, q1.codes, "codes")
    assert_bits(q.scales, q1.scales, "scales")
    assert_bits(f, f1, "fake-quantised values")
    if special in ("nan", "inf"):
        assert np.isnan(q.scales.astype(F32)).all() and (q.codes == 0x7F).all()
