"""The block formats against the slow reference ``tests/reference_blocks.py``, bit for bit: the checks,
data and random cases ``test_blocks.py`` and ``test_blocks_exhaustive.py`` share.

The reference quantises 2-D arrays with 1-D blocks along the last axis or r x c tiles. The helper
``reference`` takes the package's options, moves the block axis last (1-D blocks) or splits the
leading axes (2-D tiles, one matrix at a time with the whole tensor's per-tensor scale), and gives
codes, scale bytes and values in the package's layout; ``check`` compares every output of
``quantize`` (packed codes, and unpacked ones where asked), ``dequantize`` (with and without
``out=``) and ``fake_quantize`` with it. Stochastic draws are ``reference.random_bits`` by C-order
index.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

import neuron_kernels as nk

from .reference import random_bits
from .reference_blocks import (
    RHT_DEFAULT_SIGNS,
    dequantize_2d_ref,
    nvfp4_per_tensor_scale_ref,
    quantize_2d_ref,
    rht_inverse_ref,
    rht_ref,
)
from .reference_casts import decode_ref
from .reference_mx import pack_fp4_ref

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
MX_FORMATS = list(nk.MX_FORMATS)
SCALE_MODES = ["floor", "ceil", "even", "rceil", "neuron"]
ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero", "stochastic"]
INPUT_DTYPES = [np.float32, np.float16, BF16, np.float64]
#: E2M1 magnitudes by code 0..7.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
CUSTOM_SIGNS = (-1, 1, 1, -1, -1, 1, -1, 1, 1, 1, -1, -1, 1, -1, 1, 1)


# ---- the reference in the package's layout ------------------------------------------------------


class Want(NamedTuple):
    """What the package must give: unpacked codes (x's shape), scale bytes (the package's scales
    shape), the per-tensor scale (np.float32 or None), dequantised values (float32, x's shape; the
    rotated values for ``rht``) and, for ``rht``, the values rotated back."""

    codes: np.ndarray
    scales: np.ndarray
    pts: np.float32 | None
    values: np.ndarray
    unrotated: np.ndarray | None


def as_float32(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(F32)


def _signs(rht) -> tuple[int, ...] | None:
    if rht is None or rht is False:
        return None
    return tuple(RHT_DEFAULT_SIGNS) if rht is True else tuple(int(s) for s in rht)


def reference(
    x,
    fmt: str,
    *,
    block_size: int | None = None,
    block_shape: tuple[int, ...] | None = None,
    axis: int = -1,
    scale_mode: str | None = None,
    rounding: str = "nearest_even",
    seed: int | None = None,
    per_tensor_scale: Any = "default",
    scale_bound: float = 448.0,
    four_over_six: str | None = None,
    scale_search: str | None = None,
    rht: Any = False,
) -> Want:
    """The reference's answer to ``nk.quantize(x, fmt, **options)`` (see :class:`Want`)."""
    nv = fmt == "nvfp4"
    x32 = as_float32(x)
    rand = random_bits(seed, x32.size).reshape(x32.shape) if rounding == "stochastic" else None
    kw: dict[str, Any] = {"rounding": rounding}
    if nv:
        kw.update(pts_bound=scale_bound, scale_search=scale_search)
        if four_over_six is not None:
            kw["policy"] = ("four_over_six", four_over_six)
    else:
        kw.update(scale_mode=scale_mode or "floor", scale_search=scale_search)
    if per_tensor_scale == "default" and nv:
        per_tensor_scale = "amax"
    signs = _signs(rht)
    if block_shape is not None and len(block_shape) == 2 and block_shape[0] > 1:
        return _reference_2d(x32, fmt, tuple(block_shape), rand, per_tensor_scale, kw)
    if block_shape is not None:
        block_size = block_shape[-1]
    size = block_size or (16 if nv else 32)
    moved = np.moveaxis(x32, axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    if signs is not None:
        flat = rht_ref(flat, signs)
    if rand is not None:
        kw["rand"] = np.moveaxis(rand, axis, -1).reshape(flat.shape)
    q = quantize_2d_ref(flat, fmt, (1, size), per_tensor_scale=per_tensor_scale if nv else None, **kw)
    values = dequantize_2d_ref(q.codes, q.scales, fmt, (1, size), q.pts)
    unrotated = None
    if signs is not None:
        unrotated = np.moveaxis(rht_inverse_ref(values, signs).reshape(moved.shape), -1, axis)
    nb = q.scales.shape[1]
    return Want(
        np.moveaxis(q.codes.reshape(moved.shape), -1, axis),
        np.moveaxis(q.scales.reshape(moved.shape[:-1] + (nb,)), -1, axis),
        q.pts,
        np.moveaxis(values.reshape(moved.shape), -1, axis),
        unrotated,
    )


def _reference_2d(x32, fmt, block_shape, rand, per_tensor_scale, kw) -> Want:
    """Tiles over the last two axes: each matrix on its own, with the whole tensor's pts."""
    nv = fmt == "nvfp4"
    pts = None
    if nv and per_tensor_scale == "amax":
        pts = nvfp4_per_tensor_scale_ref(x32, kw["pts_bound"])
    elif nv and per_tensor_scale is not None:
        pts = F32(per_tensor_scale)
    mats = x32.reshape(-1, *x32.shape[-2:])
    codes, scales, values = [], [], []
    for a in range(mats.shape[0]):
        if rand is not None:
            kw["rand"] = rand.reshape(mats.shape)[a]
        q = quantize_2d_ref(mats[a], fmt, block_shape, per_tensor_scale=pts, **kw)
        codes.append(q.codes)
        scales.append(q.scales)
        values.append(dequantize_2d_ref(q.codes, q.scales, fmt, block_shape, q.pts))
    lead = x32.shape[:-2]
    return Want(
        np.stack(codes).reshape(x32.shape),
        np.stack(scales).reshape(lead + scales[0].shape),
        pts,
        np.stack(values).reshape(x32.shape),
        None,
    )


# ---- comparisons ----------------------------------------------------------------------------------


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_bits(got: np.ndarray, want: np.ndarray, what: str = "values", nan_bits: bool = True) -> None:
    """Equal bit patterns; with ``nan_bits=False`` any NaN equals any NaN (for results whose NaN
    comes from NaN inputs: which input's payload an IEEE operation passes on is unspecified)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    g, w = bits(got), bits(want)
    differ = g != w
    if not nan_bits:
        differ &= ~(np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(differ.reshape(-1))
    if bad.size:
        i = np.unravel_index(bad[0], got.shape)
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} differ; first at {tuple(int(k) for k in i)}: "
            f"got {got[i]!r} (0x{int(g[i]):x}), want {want[i]!r} (0x{int(w[i]):x})"
        )


def pack_along(codes: np.ndarray, axis: int) -> np.ndarray:
    """``pack_fp4_ref`` along ``axis`` (element 2i in the low nibble)."""
    return np.moveaxis(pack_fp4_ref(np.moveaxis(codes, axis, -1)), -1, axis)


def block_axis(q: nk.BlockArray) -> int:
    return len(q.shape) - 1 if q.block_rows > 1 else q.axis


def check(x, fmt: str = "nvfp4", *, unpacked: bool = False, **options) -> Want:
    """Every output of the package against :func:`reference` (see the module docstring).

    The codes of a 4-bit format are checked as the package stores them by default, two per byte;
    with ``unpacked`` also one per byte (``pack=False``: kernels of their own, compiled for the
    cases that ask, those of :data:`KERNEL_COVER` among them)."""
    want = reference(x, fmt, **options)
    packable = nk.BLOCK_FORMATS[fmt].packable
    q = nk.quantize(x, fmt, pack=packable and not unpacked, **options)
    assert q.shape == np.shape(x)
    assert_bits(q.unpacked_codes(), want.codes, "codes")
    assert_bits(q.scales.view(np.uint8), want.scales, "scale bytes")
    assert q.scales.dtype == nk.BLOCK_FORMATS[fmt].scale_format.dtype
    if want.pts is None:
        assert q.per_tensor_scale is None
    else:
        assert q.per_tensor_scale is not None
        assert_bits(np.array([q.per_tensor_scale], F32), np.array([want.pts], F32), "per-tensor scale")
    assert_bits(q.dequantize(), want.values, "dequantised values")
    if packable:
        p = nk.quantize(x, fmt, **options) if unpacked else q
        assert p.packed
        assert_bits(p.codes, pack_along(want.codes, block_axis(p)), "packed codes")
        assert_bits(p.scales.view(np.uint8), want.scales, "scale bytes (packed)")
        assert_bits(p.unpacked_codes(), want.codes, "unpacked codes")
        assert_bits(nk.dequantize(p), want.values, "dequantised values (packed)")
    out = np.full(np.shape(x), 7.0, F32)
    assert nk.dequantize(q, out=out) is out
    assert_bits(out, want.values, "dequantised values (out=)")
    assert_bits(nk.fake_quantize(x, fmt, **options), want.values, "fake-quantised values")
    if want.unrotated is not None:
        assert_bits(q.dequantize(unrotate=True), want.unrotated, "values rotated back")
    return want


def check_nvfp4(x, **options) -> Want:
    return check(x, "nvfp4", **options)


# ---- data -----------------------------------------------------------------------------------------


def binades(shape, seed: int, lo: int = -40, hi: int = 40) -> np.ndarray:
    """Normal values scaled by 2^k, k uniform in [lo, hi) per element: blocks spanning many binades."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        return (rng.standard_normal(shape) * np.exp2(rng.integers(lo, hi, shape))).astype(F32)


def block_binades(shape, seed: int, lo: int = -60, hi: int = 60) -> np.ndarray:
    """Normal values, one binade offset per row of 16 (blocks of a few binades, many overall)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    x *= np.exp2(rng.integers(lo, hi, shape[:-1] + (-(-shape[-1] // 16),))).repeat(16, axis=-1)[..., : shape[-1]]
    return x.astype(F32)


def special_blocks() -> np.ndarray:
    """Rows of 48 (three blocks of 16) holding NVFP4's special blocks and edge cases."""
    rng = np.random.default_rng(5)
    rows = []

    def add(*blocks):
        rows.append(np.concatenate([np.asarray(b, F32).reshape(16) for b in blocks]))

    normal = rng.standard_normal(16).astype(F32)
    zeros = np.zeros(16, F32)
    zeros[1::3] = -0.0
    add(zeros, normal, -np.zeros(16, F32))  # all-zero blocks (both signs)
    nan = normal.copy()
    nan[4] = np.nan
    inf = normal.copy()
    inf[15] = np.inf
    ninf = normal.copy()
    ninf[0] = -np.inf
    add(nan, inf, ninf)  # NaN / inf blocks
    add(np.full(16, np.nan, F32), -np.full(16, np.nan, F32), np.full(16, np.inf, F32))
    sub = (rng.standard_normal(16) * 1e-40).astype(F32)  # float32 subnormals
    tiny = np.zeros(16, F32)
    tiny[3] = np.float32(1.4e-45)  # the smallest subnormal alone
    tiny[7] = -np.float32(1.4e-45)
    add(sub, tiny, sub * np.float32(2.0**100))
    huge = (rng.uniform(-1, 1, 16) * 3.4e38).astype(F32)
    huge[2] = np.finfo(F32).max
    add(huge, -huge, huge * np.float32(2.0**-1))
    ties = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 0], F32)
    add(ties, ties * np.float32(2.0**-6), ties * np.float32(256.0))  # scales 1, 2^-6, 256: exact ties
    one = np.zeros(16, F32)
    one[9] = -3.0
    add(one, ties * np.float32(2.0**-9), ties * np.float32(2.0**9))  # beyond the scale clamps
    near = np.full(16, np.nextafter(F32(6.0), F32(0)), F32)
    near[::2] = np.nextafter(F32(6.0), F32(7))
    add(near, near * np.float32(2.0**-7), near * np.float32(448.0))
    return np.stack(rows)


def nvfp4_data(seed: int = 0) -> np.ndarray:
    """Special rows, then rows of many binades (the tensor's amax from the huge row)."""
    return np.concatenate([special_blocks(), block_binades((12, 48), seed), binades((4, 48), seed + 1)])


# ---- random cases --------------------------------------------------------------------------------

#: The kernel variants besides format, input dtype and rounding: blocks along the last axis (row
#: kernels), along another axis or 2-D (tile kernels), rotated; plain scale rule or a scale policy.
KERNEL_LAYOUTS = ("rows", "tiles", "rotated")
POLICY_KINDS = ("plain", "policy")


def pairwise_cover(axes: list[list]) -> list[tuple]:
    """Rows of the product of ``axes`` such that every pair of values of two axes occurs in some row
    (a covering array of strength 2), chosen greedily: each next row is the first of the product
    (in its order) that covers the most pairs not yet covered. Deterministic."""
    rows = list(itertools.product(*axes))
    pairs = lambda row: {(i, a, j, b) for (i, a), (j, b) in itertools.combinations(enumerate(row), 2)}  # noqa: E731
    missing = set().union(*(pairs(r) for r in rows))
    cover = []
    while missing:
        best = max(rows, key=lambda r: len(pairs(r) & missing))
        cover.append(best)
        missing -= pairs(best)
    return cover


# Each (format, input dtype, rounding, layout, policy) is a kernel of its own to compile (about two
# seconds each, 1,344 of them): the kernel cases cover every pair of those values, the same ones on
# every run, and every randomised block test draws its kernels from them, so that a test run compiles
# each of them once (the numba cache on disk is shared by the test workers).
KERNEL_AXES = [["nvfp4", *MX_FORMATS], INPUT_DTYPES, ROUNDINGS, list(KERNEL_LAYOUTS), list(POLICY_KINDS)]
KERNEL_COVER = pairwise_cover(KERNEL_AXES)


def cover_cases() -> Any:
    """:func:`block_cases` of a row of :data:`KERNEL_COVER` (its kernels, its layout and policy)."""
    return st.sampled_from(KERNEL_COVER).flatmap(
        lambda row: block_cases(kernels=(row[:3],), layout=row[3], policy=row[4])
    )


@st.composite
def block_cases(draw, kernels, layout=None, policy=None):
    """An input and the options of one quantisation: any rank, axis, block (1-D or tile), per-tensor
    scale, policy, rotation and data; the format, input dtype and rounding from ``kernels``; the
    kernel variant (``layout`` of KERNEL_LAYOUTS, ``policy`` of POLICY_KINDS) drawn too unless given."""
    fmt, dtype, rounding = draw(st.sampled_from(kernels))
    nv = fmt == "nvfp4"
    ndim = draw(st.integers(2 if layout == "tiles" else 1, 3))
    shape = draw(st.lists(st.integers(1, {1: 64, 2: 20, 3: 8}[ndim]), min_size=ndim, max_size=ndim))
    options: dict[str, Any] = {"rounding": rounding, "seed": draw(st.integers(0, 2**63 - 1))}
    tiles = ndim >= 2 and (draw(st.booleans()) if layout in (None, "tiles") else False)
    if tiles:
        options["block_shape"] = (draw(st.integers(2, 17)), draw(st.integers(1, 17)))
    else:
        if layout == "rows":
            axis = draw(st.sampled_from([-1, ndim - 1]))
        elif layout == "tiles":  # a 1-D block along an axis other than the last
            axis = draw(st.integers(-ndim, ndim - 2))
        else:
            axis = draw(st.integers(-ndim, ndim - 1))
        options["axis"] = axis
        rotated = layout == "rotated" if layout is not None else draw(st.integers(0, 3)) == 0
        if rotated:
            shape[axis] = 16 * draw(st.integers(1, 3))
            options["block_size"] = draw(st.sampled_from([16, 32]))
            options["rht"] = draw(st.sampled_from([True, CUSTOM_SIGNS]))
        else:
            options["block_size"] = draw(st.sampled_from([None, 1, 2, 3, 5, 8, 16, 17, 32]))
    if nv:
        options["per_tensor_scale"] = draw(
            st.sampled_from([None, "amax"]) | st.floats(1e-30, 1e30).map(lambda v: float(np.float32(v)))
        )
        options["scale_bound"] = draw(st.sampled_from([448.0, 256.0]))
        four_over_six = {None: [None, None, "mae", "mse"], "plain": [None], "policy": [None, "mae", "mse"]}[policy]
        options["four_over_six"] = draw(st.sampled_from(four_over_six))
    else:
        options["scale_mode"] = draw(st.sampled_from(SCALE_MODES))
    if options.get("four_over_six") is None:
        searches = {None: [None, None, "mse"], "plain": [None], "policy": ["mse"]}[policy]
        options["scale_search"] = draw(st.sampled_from(searches))
    lo = draw(st.integers(-150, 110))
    x = binades(tuple(shape), draw(st.integers(0, 2**32 - 1)), lo, min(lo + draw(st.integers(1, 40)), 129))
    flat = x.reshape(-1)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, flat.size - 1))
        flat[i] = draw(st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 6.0, 1e-45, 3e38]))
    with np.errstate(over="ignore"):
        return x.astype(dtype), fmt, options


# ---- every scale code, every tie -----------------------------------------------------------------

#: The float8_e4m3fn codes the plain rule can give a finite block: 2^-6 (the lower clamp) to 448.
SCALE_CODES = list(range(0x08, 0x7F))
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]  # midpoints of adjacent E2M1 magnitudes


def e4m3(code: int) -> float:
    return float(decode_ref(np.array([code], np.uint8), "float8_e4m3fn")[0])


def scale_sweep_blocks(multiplier: float = 1.0) -> np.ndarray:
    """Three blocks of 16 per positive finite scale code c the plain rule reaches: amax = 6 s(c)
    (gives c), the midpoint of s(c) and the next code times 6 (a tie of the scale's rounding), and
    one float32 ulp above that midpoint; the other elements are ties, grid values and fractions of
    the block's scale. ``multiplier`` (a per-tensor scale) multiplies every amax."""
    rng = np.random.default_rng(0)
    rows = []
    for c in SCALE_CODES:
        s = e4m3(c)
        mid = (s + e4m3(c + 1)) / 2 if c < 0x7E else s * 1.0625
        for amax in (6 * s, 6 * mid, float(np.nextafter(F32(6 * mid), F32(np.inf)))):
            amax = float(F32(amax * multiplier))
            fill = np.array(TIES + [-t for t in TIES] + [0.5], np.float64) * s * multiplier
            row = np.concatenate([[amax], fill[: 16 - 1]])
            row[8:] = row[8:] * rng.uniform(0.5, 1.0, 8)
            rows.append(row.astype(F32))
            rows[-1][0] = amax if len(rows) % 2 else -amax
    return np.stack(rows)


# ---- 2-D tiles -----------------------------------------------------------------------------------


def tile_data(shape, seed: int) -> np.ndarray:
    """Values over a few binades per 8-row band, with a NaN, an infinity, a zero tile and subnormals."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    bands = np.exp2(rng.integers(-12, 12, shape[:-2] + (-(-shape[-2] // 8), 1))).repeat(8, axis=-2)
    x = (x * bands[..., : shape[-2], :]).astype(F32)
    m = x.reshape(-1, *shape[-2:])
    m[0, :8, :4] = 0.0
    m[0, 1, 1] = -0.0
    if shape[-2] > 9 and shape[-1] > 6:
        m[-1, 9, 5] = np.nan
        m[-1, -1, -1] = -np.inf
        m[0, 8:, -4:] *= np.float32(1e-41)
    return x


# ---- scale policies ------------------------------------------------------------------------------


def policy_data(seed: int, special: bool = True) -> np.ndarray:
    """Blocks where the policies matter: a few large values over small ones, near-ties of the
    scale rounding, blocks on the E2M1 grid, plus (``special``) the special blocks."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((24, 48)) * np.exp2(rng.integers(-8, 8, (24, 1)))
    x[::3, ::16] *= 6  # one outlier per block
    x[1::3] = np.round(x[1::3] * 2) / 2  # values on a coarse grid
    x[2, :16] = np.array(E2M1 * 2)[:16] * 3.0
    return np.concatenate([x.astype(F32), special_blocks()]) if special else x.astype(F32)


def check_four_over_six(measure, scale_bound, per_tensor_scale, rounding) -> None:
    """Four-over-six along the last axis, along axis 0 with odd blocks, and on 16 x 16 tiles."""
    x = policy_data(1)
    opts = dict(four_over_six=measure, scale_bound=scale_bound, per_tensor_scale=per_tensor_scale)
    check_nvfp4(x, rounding=rounding, seed=8, **opts)
    check_nvfp4(x[:, :40], axis=0, block_size=7, rounding=rounding, seed=8, **opts)
    check_nvfp4(x[:24], block_shape=(16, 16), rounding=rounding, seed=8, **opts)


def check_mx_scale_search(fmt: str, scale_mode: str) -> None:
    """MX's search (the exponent and the one above) on 1-D blocks, odd blocks along axis 0, 8 x 4 tiles."""
    x = np.concatenate([policy_data(4), nvfp4_data()])
    x[0, :32] = 3.0e38  # amax near the top: the exponent above may be 0xff (skipped)
    check(x, fmt, scale_search="mse", scale_mode=scale_mode)
    check(x, fmt, scale_search="mse", scale_mode=scale_mode, axis=0, block_size=9, rounding="stochastic", seed=4)
    check(x, fmt, scale_search="mse", scale_mode=scale_mode, block_shape=(8, 4))
