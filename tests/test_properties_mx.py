"""Property tests of MX quantisation against ``reference_mx`` and of cast round trips.

- Any shape, block axis, block size, layout and input dtype: ``quantize_mx`` / ``dequantize_mx`` /
  ``fake_quantize_mx`` equal the slow reference bit for bit.
- Quantise then dequantise: a non-saturated finite element is within half an element ulp (times
  the scale) of its input under nearest rounding, within one ulp under the other modes.
- Every non-NaN code of every float format survives decode then encode, in every rounding mode.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuron_kernels as nk
from neuron_kernels.formats import FORMATS

from .block_checks import KERNEL_COVER
from .reference import random_bits
from .reference_casts import FORMATS_REF, decode_ref
from .reference_mx import (
    MX_FORMATS_REF,
    SCALE_MODES,
    dequantize_mx_ref,
    element_mantissa_bits_ref,
    pack_fp4_ref,
    quantize_mx_ref,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BF16,
    "float64": np.dtype(np.float64),
}
MX_NAMES = list(MX_FORMATS_REF)


def _configs() -> dict[str, list[tuple[str, str, str]]]:
    """(scale mode, rounding, input dtype) per MX format: every scale mode once per format (a run-time
    choice), with the rounding and input dtype of the row kernels of the kernel cases
    (``KERNEL_COVER``: together they take every pair of format, rounding and dtype) and of the default
    kernel (nearest-even from float32), in turn. Only kernels those cases compile anyway."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for fmt in MX_NAMES:
        kernels = [("nearest_even", "float32")] + [
            (r, np.dtype(d).name)
            for f, d, r, layout, policy in KERNEL_COVER
            if (f, layout, policy) == (fmt, "rows", "plain")
        ]
        kernels = list(dict.fromkeys(kernels))
        out[fmt] = [(scale, *kernels[i % len(kernels)]) for i, scale in enumerate(SCALE_MODES)]
    return out


CONFIGS = _configs()

#: float32 bit patterns planted into the data: signed zeros, subnormals, the normal boundary, the
#: top of float32, powers of two and their neighbours.
FINITE_SPECIALS = [
    0x00000000,
    0x80000000,
    0x00000001,
    0x80000001,
    0x007FFFFF,
    0x00800000,
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F000000,
    0x3F800000,
    0x3F7FFFFF,
    0x40C00000,
    0x43E00000,
    0xC3E00000,
]
NONFINITE = [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001]


def _f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


@st.composite
def mx_cases(draw, fmt: str, clean: bool = False):
    """One quantisation problem of ``fmt``: (x, kwargs) with x of any layout and input dtype;
    ``clean`` leaves out NaN and infinities (float16 and float64 inputs may still overflow)."""
    scale_mode, rounding, dtype_name = draw(st.sampled_from(CONFIGS[fmt]))
    dtype = DTYPES[dtype_name]
    ndim = draw(st.integers(1, 4))
    axis = draw(st.integers(-ndim, ndim - 1))
    block_size = draw(st.one_of(st.just(32), st.integers(1, 40)))
    other = max(1, 6 // max(1, ndim - 1))
    shape = [draw(st.integers(1, other)) for _ in range(ndim)]
    shape[axis] = 0 if draw(st.sampled_from([False] * 15 + [True])) else draw(st.integers(1, 70))
    shape = tuple(shape)
    n = math.prod(shape)

    # The values: around 2^base, spread over a few binades, with short mantissas (ties) on demand.
    lo_base, hi_base = (-26, 16) if dtype_name == "float16" else (-150, 128)
    base = draw(st.integers(lo_base, hi_base))
    spread = draw(st.sampled_from([0, 1, 2, 4, 8, 16, 30]))
    m = element_mantissa_bits_ref(fmt)  # m + 1 kept bits: ties of the element rounding at every binade
    kept_bits = draw(st.sampled_from([23, m + 1, m + 1, m + 2, 1]))
    zero_frac = draw(st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.5, 1.0]))
    special_frac = draw(st.sampled_from([0.0, 0.0, 0.02, 0.1]))
    nonfinite = not clean and draw(st.booleans())
    data_seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(data_seed)
    mant = rng.integers(0, 1 << 23, n) & ~((1 << (23 - kept_bits)) - 1)
    exps = np.clip(base + rng.integers(-spread, 2, n), -170, 127)
    vals = np.ldexp(1.0 + mant / 2.0**23, exps) * rng.choice([-1.0, 1.0], n)
    x32 = vals.astype(np.float32)  # rounds below float32's normal range
    x32[rng.random(n) < zero_frac] = 0.0
    pool = FINITE_SPECIALS + (NONFINITE if nonfinite else [])
    special = rng.random(n) < special_frac
    x32[special] = _f32(rng.choice(pool, int(special.sum())))
    for i, bits in draw(st.lists(st.tuples(st.integers(0, max(0, n - 1)), st.sampled_from(pool)), max_size=3)):
        if n:
            x32[i] = _f32(bits)
    x32 = x32.reshape(shape)

    with np.errstate(over="ignore", invalid="ignore"):
        logical = x32.astype(dtype)
    if dtype_name == "float64" and draw(st.booleans()):
        # Low bits below float32's precision: the conversion to float32 has to round.
        u = logical.view(np.uint64)
        finite = np.isfinite(logical) & (logical != 0)
        u[finite] |= rng.integers(0, 1 << 29, int(finite.sum()), dtype=np.uint64)

    # The layout: a view with permuted axes and/or steps into a NaN-filled base array.
    layout = draw(st.sampled_from(["C", "transposed", "negative", "strided"]))
    perm = list(range(ndim))
    steps = [1] * ndim
    if layout == "transposed":
        perm = draw(st.permutations(range(ndim)))
    elif layout == "negative":
        steps = [draw(st.sampled_from([1, -1])) for _ in range(ndim)]
        steps[axis] = -1
    elif layout == "strided":
        perm = draw(st.permutations(range(ndim)))
        steps = [draw(st.sampled_from([1, -1, 2, -2, 3])) for _ in range(ndim)]
    base_shape = tuple(shape[p] * abs(steps[p]) for p in perm)
    with np.errstate(invalid="ignore"):
        buf = np.full(base_shape, np.nan, dtype=dtype)
    view = np.transpose(buf, np.argsort(perm))[tuple(slice(None, None, s) for s in steps)]
    view[...] = logical
    assert view.shape == shape

    kwargs = {"block_size": block_size, "axis": axis, "scale_mode": scale_mode, "rounding": rounding}
    if rounding == "stochastic":
        kwargs["seed"] = draw(st.integers(0, 2**64 - 1))
    return view, kwargs


def _as_float32(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(x).astype(np.float32)


def _reference(x: np.ndarray, fmt: str, kwargs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, scale bytes and dequantised values of the reference, block axis moved last."""
    axis, size = kwargs["axis"], kwargs["block_size"]
    x32 = np.moveaxis(_as_float32(x), axis, -1)
    index = np.moveaxis(np.arange(x.size).reshape(x.shape), axis, -1)
    bits = random_bits(kwargs["seed"], x.size) if kwargs["rounding"] == "stochastic" else None
    nblocks = -(-x32.shape[-1] // size)
    codes = np.zeros(x32.shape, np.uint8)
    scales = np.zeros(x32.shape[:-1] + (nblocks,), np.uint8)
    values = np.zeros(x32.shape, np.float32)
    for r in np.ndindex(*x32.shape[:-1]):
        rand = None if bits is None else bits[index[r]]
        codes[r], scales[r] = quantize_mx_ref(x32[r], fmt, size, kwargs["scale_mode"], kwargs["rounding"], rand)
        values[r] = dequantize_mx_ref(codes[r], scales[r], fmt, size)
    return codes, scales, values


def _check_equal(got: np.ndarray, want: np.ndarray, what: str, x32: np.ndarray, size: int, per: int = 1) -> None:
    """Bitwise equality of two arrays whose last axis is the block axis (an entry of it covering
    ``per`` elements); names the input block of the first difference."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    unsigned = f"u{got.dtype.itemsize}"
    bad = np.argwhere(got.view(unsigned) != want.view(unsigned))
    if bad.size:
        pos = tuple(int(i) for i in bad[0])
        k = pos[-1] * per // size
        block = x32[pos[:-1]][k * size : (k + 1) * size]
        raise AssertionError(
            f"{what}: {len(bad)} differ; first at {pos}: got 0x{int(got.view(unsigned)[pos]):x}, "
            f"want 0x{int(want.view(unsigned)[pos]):x}; block input bits "
            f"{[hex(int(b)) for b in block.view(np.uint32)]}"
        )


@pytest.mark.parametrize("fmt", MX_NAMES)
# Most examples draw a kernel not compiled yet (rounding x dtype x layout): 50 a format keep the
# run near a minute; test_blocks_exhaustive's random cases reach the rest.
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mx_matches_reference(fmt, data):
    """quantize_mx (pack=False), dequantize_mx and fake_quantize_mx equal the reference."""
    x, kwargs = data.draw(mx_cases(fmt))
    axis, size = kwargs["axis"], kwargs["block_size"]
    codes, scales, values = _reference(x, fmt, kwargs)
    x32 = np.moveaxis(_as_float32(x), axis, -1)

    mx = nk.quantize_mx(x, fmt, pack=False, **kwargs)
    assert mx.codes.shape == x.shape and not mx.packed
    _check_equal(np.moveaxis(mx.scales.view(np.uint8), axis, -1), scales, "scales", x32, size, per=size)
    _check_equal(np.moveaxis(mx.codes, axis, -1), codes, "codes", x32, size)
    dq = nk.dequantize_mx(mx)
    assert dq.dtype == np.float32 and dq.shape == x.shape
    _check_equal(np.moveaxis(dq, axis, -1), values, "dequantize_mx", x32, size)
    fq = nk.fake_quantize_mx(x, fmt, **kwargs)
    _check_equal(np.moveaxis(fq, axis, -1), values, "fake_quantize_mx", x32, size)

    if fmt == "mxfp4_e2m1":
        packed = nk.quantize_mx(x, fmt, pack=True, **kwargs)
        assert packed.packed
        _check_equal(np.moveaxis(packed.codes, axis, -1), pack_fp4_ref(codes), "packed codes", x32, size, per=2)
        _check_equal(np.moveaxis(nk.dequantize_mx(packed), axis, -1), values, "packed dequantize", x32, size)


# ---- quantise / dequantise error bound --------------------------------------------------------


def _floor_log2(q: Fraction) -> int:
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    return e


def _element_ulp(fmt: str, v: Fraction) -> Fraction:
    """The spacing of the element format's values around the magnitude ``v > 0``: 2^-6 for
    mxint8 (c / 64), else 2^(max(floor(log2 v), emin) - mbits)."""
    elem = MX_FORMATS_REF[fmt][0]
    if elem == "int8":
        return Fraction(1, 64)
    ref = FORMATS_REF[elem]
    emin = 1 - ref.bias
    return Fraction(2) ** (max(_floor_log2(v), emin) - ref.mbits)


def _element_value(fmt: str, code: int) -> Fraction:
    elem = MX_FORMATS_REF[fmt][0]
    if elem == "int8":
        return Fraction(code - 256 if code >= 128 else code, 64)
    return Fraction(float(decode_ref(np.array([code], np.uint8), elem)[0]))


@pytest.mark.parametrize("fmt", MX_NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_quantization_error_bound(fmt, data):
    """|x - dq| <= ulp/2 * X (nearest) or < ulp * X (toward_zero, stochastic) for every finite
    element of a block without NaN/inf whose magnitude is at most max_element * X."""
    x, kwargs = data.draw(mx_cases(fmt, clean=data.draw(st.booleans())))
    axis, size, rounding = kwargs["axis"], kwargs["block_size"], kwargs["rounding"]
    mx = nk.quantize_mx(x, fmt, pack=False, **kwargs)
    x32 = np.moveaxis(_as_float32(x), axis, -1)
    dq = np.moveaxis(nk.dequantize_mx(mx), axis, -1)
    codes = np.moveaxis(mx.codes, axis, -1)
    scales = np.moveaxis(mx.scales.view(np.uint8), axis, -1)
    max_element = Fraction(MX_FORMATS_REF[fmt][2])
    nearest = rounding.startswith("nearest")
    for r in np.ndindex(*x32.shape[:-1]):
        for k in range(scales[r].size):
            block = x32[r][k * size : (k + 1) * size]
            if not np.all(np.isfinite(block)):
                continue
            byte = int(scales[r][k])
            assert byte != 0xFF, (r, k, block)
            scale = Fraction(2) ** (byte - 127)
            for j, xv in enumerate(block.tolist(), start=k * size):
                xq = Fraction(xv)
                if abs(xq) > max_element * scale:
                    continue
                got = float(dq[r][j])
                if math.isinf(got):
                    # documented: X * P = 2^128 at the top of float32 in the rounding-up scale modes
                    assert kwargs["scale_mode"] != "floor" and abs(xv) >= 2.0**127, (r, j, xv, got)
                    value = _element_value(fmt, int(codes[r][j])) * scale
                else:
                    value = Fraction(got)
                err = abs(xq - value)
                if xq == 0:
                    assert err == 0, (r, j, xv, got)
                    continue
                ulp = _element_ulp(fmt, abs(xq) / scale) * scale
                where = (
                    f"x={xv!r} (0x{int(np.float32(xv).view(np.uint32)):08x}) -> {got!r}, X=2^{byte - 127}, "
                    f"{kwargs}, shape {x.shape}"
                )
                if nearest:
                    assert err <= ulp / 2, where
                else:
                    assert err < ulp, where
                if rounding == "toward_zero":
                    assert abs(value) <= abs(xq), where
                assert value == 0 or (value > 0) == (xq > 0), where


# ---- cast round trips ----------------------------------------------------------------------------

ROUND_TRIP_FORMATS = [
    n for n, f in FORMATS.items() if f.kind == "float" and n not in ("float32", "float64", "float32r")
]
EXACT_MODES = [
    ("nearest_even", None),
    ("nearest_away", None),
    ("toward_zero", None),
    ("toward_positive", None),
    ("toward_negative", None),
    ("stochastic", 0),
    ("stochastic", 1),
    ("stochastic", 0xDEADBEEF),
    ("stochastic", 2**63 + 12345),
]


def _all_codes(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every code of format ``name`` as unsigned ints, and as an array of the format's dtype."""
    ref = FORMATS_REF[name]
    fmt = FORMATS[name]
    n_bits = fmt.bits
    codes = (np.arange(1 << n_bits, dtype=np.uint64) << np.uint64(ref.code_shift)).astype(fmt.storage_dtype)
    return codes, codes.view(fmt.result_dtype)


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", ROUND_TRIP_FORMATS)
def test_every_code_round_trips(name, saturate):
    """encode(decode(c)) == c for every non-NaN code c, from float32 and from float64, in every
    rounding mode; +-inf gives +-max under saturation; NaN stays NaN."""
    ref = FORMATS_REF[name]
    codes, values = _all_codes(name)
    with np.errstate(invalid="ignore"):
        as_f32 = values.astype(np.float32)  # numpy / ml_dtypes decoding, to classify the codes
    nan = np.isnan(as_f32)
    inf = np.isinf(as_f32)
    want = codes.copy()
    if saturate:
        sign = np.where(np.signbit(as_f32), ref.sign_bit, 0)
        want[inf] = (sign[inf] | (ref.max_code << ref.code_shift)).astype(codes.dtype)
    unsigned = codes.dtype
    for source in (np.float32, np.float64):
        decoded = nk.cast(values, source)
        for rounding, seed in EXACT_MODES:
            got = nk.cast(decoded, name, rounding=rounding, saturate=saturate, seed=seed).view(unsigned)
            bad = np.flatnonzero((got != want) & ~nan)
            assert bad.size == 0, (
                f"{name} via {np.dtype(source).name}, {rounding} seed={seed} saturate={saturate}: "
                f"{bad.size} codes change; first 0x{int(codes[bad[0]]):x} -> 0x{int(got[bad[0]]):x}, "
                f"want 0x{int(want[bad[0]]):x}"
            )
            if nan.any():
                with np.errstate(invalid="ignore"):
                    back = got.view(values.dtype).astype(np.float32)
                assert np.isnan(back[nan]).all(), (name, rounding, saturate)
