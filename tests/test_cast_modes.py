"""cast(): every rounding mode, saturation, source type and packed container, bit for bit.

The oracle is ``tests/reference_casts.py`` (independent of the package). The random bits of
stochastic rounding are recomputed here from the hash that the package documents:
``mix32(((mix32(idx_lo ^ key_lo) + idx_hi) mod 2^32) ^ key_hi)`` with ``key`` = SplitMix64's
output function of the seed and ``idx`` the element's index in the C-order flattened array.
"""

from __future__ import annotations

import functools
import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.formats import FORMATS

from .cast_cases import HAND_CASES
from .reference import random_bits
from .reference_casts import (
    FORMATS_REF,
    ROUNDING_MODES,
    decode_ref,
    encode_float64_ref,
    encode_ref,
    float64_to_target_ref,
    int_to_target_ref,
    magnitudes_ref,
)

DIRECTED_AND_AWAY = ["nearest_away", "toward_zero", "toward_positive", "toward_negative"]
SMALL_SOURCES = [n for n in FORMATS_REF if n != "tfloat32"]  # bfloat16, float16 and every small format
ML_DTYPES = {n: np.dtype(np.float16 if n == "float16" else getattr(ml_dtypes, n)) for n in SMALL_SOURCES}
#: The registered casts where a test means every pair of a kind, so that a newly registered cast is tested
#: without editing a list (and fails until the reference knows its format): float32 to every narrower
#: float (the encoders), and every float small enough to try each code of to float32 (the decoders).
ENCODERS = [
    k
    for k in nk.supported_casts()
    if k.source == "float32" and FORMATS[k.target].kind == "float" and FORMATS[k.target].bits < 32
]
DECODERS = [
    k.source
    for k in nk.supported_casts()
    if k.target == "float32" and FORMATS[k.source].kind == "float" and FORMATS[k.source].itemsize <= 2
]
SEED = 0x0123456789ABCDEF  # both 32-bit halves of the key are non-zero
INF32 = np.float32(np.inf)


# ---- helpers ------------------------------------------------------------------------------------


def codes_of(a: np.ndarray) -> np.ndarray:
    """A result array as unsigned codes (float32 containers as their bit patterns)."""
    return a.view(f"uint{8 * a.dtype.itemsize}")


def result_dtype(name: str) -> np.dtype:
    return ML_DTYPES.get(name, np.dtype(np.float32))


def f32(values) -> np.ndarray:
    """float32 from a list of floats (exact or overflowing on purpose) or ints (bit patterns)."""
    if all(isinstance(v, int) for v in values):
        return np.array(values, dtype=np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        return np.array(values, dtype=np.float64).astype(np.float32)


def describe(x: np.ndarray, i: int) -> str:
    v = np.asarray(x).ravel()[i]
    if np.asarray(x).dtype == np.float32:
        return f"0x{int(np.array(v).view(np.uint32)):08x} ({float(v)!r})"
    if np.asarray(x).dtype == np.float64:
        return f"0x{int(np.array(v).view(np.uint64)):016x} ({float(v)!r})"
    return repr(v)


def assert_same(x: np.ndarray, got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} differ; first: element {i}, input "
            f"{describe(x, i)} -> 0x{int(got[i]):x}, expected 0x{int(want[i]):x}"
        )


def with_neighbours(v: np.ndarray, steps: int = 1) -> np.ndarray:
    """float32 values, their ``steps`` float32 neighbours on each side, both signs."""
    v = np.asarray(v, dtype=np.float32)
    out, up, down = [v], v, v
    with np.errstate(over="ignore"):  # the neighbour above float32's max is inf
        for _ in range(steps):
            up, down = np.nextafter(up, INF32), np.nextafter(down, -INF32)
            out += [up, down]
    a = np.concatenate(out)
    return np.concatenate([a, -a])


def magnitude_sample(name: str, rng: np.random.Generator, limit: int, sample: int) -> np.ndarray:
    """Magnitude codes to use: all of them, or, when there are more than ``limit`` (tfloat32), about
    ``sample`` of them: the lowest and highest codes, the codes around 1.0 and random ones."""
    n = len(magnitudes_ref(name))
    if n <= limit:
        return np.arange(n)
    one = int(np.searchsorted(magnitudes_ref(name), 1.0))
    q = sample // 8
    parts = [np.arange(q), np.arange(n - q, n), np.arange(one - q, one + q), rng.integers(0, n, 3 * q)]
    return np.unique(np.concatenate(parts))


@functools.cache
def float32_inputs(name: str) -> np.ndarray:
    """The float32 input set of one target format (cached: do not modify)."""
    fmt = FORMATS_REF[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    mags = magnitudes_ref(name)
    beyond = fmt.value_of_magnitude_code(fmt.max_code + 1)  # the virtual value after the max
    ext = np.append(mags, beyond)
    idx = magnitude_sample(name, rng, 1 << 16, 1 << 14)
    lo, hi = ext[idx], ext[idx + 1]
    points = np.concatenate([lo, (lo + hi) / 2, [beyond]])
    p32 = f32(points)
    finite = np.isfinite(p32)
    assert np.array_equal(p32[finite].astype(np.float64), points[finite])  # all exact in float32
    over = f32([fmt.max_finite, (fmt.max_finite + beyond) / 2, beyond, 2 * beyond, 3.4028234663852886e38])
    nan_bits = [0x7FC00000, 0x7F800001, 0x7FA00000, 0x7FFFFFFF, 0x7F802000, 0x7F801FFF, 0x7FC00001, 0x7FE12345]
    specials = nan_bits + [b | 0x80000000 for b in nan_bits] + [0, 0x80000000, 0x7F800000, 0xFF800000]
    subnormals = [1, 2, 3, 0x400000, 0x600000, 0x7FFFFF, 0x800000] + rng.integers(1, 0x800000, 500).tolist()
    subnormals += [b | 0x80000000 for b in subnormals]
    patterns = rng.integers(0, 1 << 32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    lo_exp, hi_exp = math.log2(fmt.min_subnormal) - 3, math.log2(fmt.max_finite) + 1
    spread = f32(np.exp2(rng.uniform(lo_exp, hi_exp, 2000)) * rng.choice([-1.0, 1.0], 2000))
    x = np.concatenate(
        [with_neighbours(p32[finite]), with_neighbours(over, steps=4), f32(specials), f32(subnormals), patterns, spread]
    )
    return x


def stochastic_kwargs(rounding: str, seed: int = SEED) -> dict:
    return {"seed": seed} if rounding == "stochastic" else {}


# ---- 1. float32 sources: every target x every mode x saturate ------------------------------------


ENCODER_CASES = [
    (k.target, rounding, saturate)
    for k in ENCODERS
    for rounding in sorted(k.roundings)
    for saturate in ((False, True) if k.saturate else (False,))
]


@pytest.mark.parametrize(
    "name, rounding, saturate",
    ENCODER_CASES,
    ids=[f"{n}-{r}-{'saturate' if s else 'wrap'}" for n, r, s in ENCODER_CASES],
)
def test_float32_source_every_mode(name, rounding, saturate):
    x = float32_inputs(name)
    rand = random_bits(SEED, x.size) if rounding == "stochastic" else None
    got = nk.cast(x, name, rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding))
    assert got.dtype == result_dtype(name) and got.shape == x.shape
    want = encode_ref(x, name, rounding=rounding, saturate=saturate, rand=rand)
    assert_same(x, codes_of(got), want, f"float32 -> {name} {rounding} saturate={saturate}")


@pytest.mark.parametrize("saturate", [False, True], ids=["wrap", "saturate"])
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_float32_to_float32r_copies_bits(rounding, saturate):
    # docs/casts.md: float32r is numerically float32, "a cast to it copies the bits". Whether
    # saturate=True keeps +-inf for this exact cast ("Saturation") is not checked here.
    x = float32_inputs("bfloat16")
    if saturate:
        x = x[~np.isinf(x)]
    got = nk.cast(x, "float32r", rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding))
    assert got.dtype == np.float32
    assert_same(x, codes_of(got), x.view(np.uint32), f"float32 -> float32r {rounding}")


# ---- 2. float64 sources -------------------------------------------------------------------------


@functools.cache
def float64_inputs(name: str) -> np.ndarray:
    """float64 values that tell one rounding from two: just above/below every representable value
    and every midpoint by a relative 2^-30 (float32 rounding would land exactly on them), plus
    values beyond float32's range, below its subnormals, specials and random values."""
    fmt = FORMATS_REF[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 64)
    mags = magnitudes_ref(name)
    beyond = fmt.value_of_magnitude_code(fmt.max_code + 1)
    ext = np.append(mags, beyond)
    idx = magnitude_sample(name, rng, 4096, 4096)
    lo, hi = ext[idx], ext[idx + 1]
    mid = (lo + hi) / 2
    eps = 2.0**-30
    near = [lo, mid, lo * (1 + eps), mid * (1 + eps), mid * (1 - eps), hi * (1 - eps)]
    tiny = fmt.min_subnormal * np.array([2.0**-40, 0.25, 0.5 * (1 - eps), 0.5, 0.5 * (1 + eps), 1 - eps])
    f32max = 3.4028234663852886e38
    huge = [
        f32max,
        f32max * (1 + eps),
        2.0**128 * (1 - 2.0**-25),
        2.0**128,
        1e39,
        1e300,
        np.inf,
        5e-324,
        1e-300,
        1e-46,
        0.0,
    ]
    spread = np.exp2(rng.uniform(math.log2(fmt.min_subnormal) - 3, math.log2(fmt.max_finite) + 1, 3000))
    spread = spread * (1 + rng.uniform(-(2.0**-20), 2.0**-20, spread.size))  # full float64 mantissas
    patterns = rng.integers(0, 1 << 64, 2000, dtype=np.uint64).view(np.float64)
    patterns = patterns[~np.isnan(patterns)]  # NaN payloads of float64 are not specified
    x = np.concatenate(near + [tiny, np.array(huge), spread, patterns])
    x = np.concatenate([x, -x, [np.nan, -np.nan]])
    return x


F64_CASES = [(n, m) for n in ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu") for m in DIRECTED_AND_AWAY] + [
    ("float16", "toward_zero"),
    ("float16", "nearest_away"),
    ("float4_e2m1fn", "toward_positive"),
    ("float4_e2m1fn", "toward_negative"),
    ("float8_e5m2fnuz", "nearest_away"),
    ("tfloat32", "toward_positive"),
]


@pytest.mark.parametrize("name, rounding", F64_CASES)
def test_float64_source_rounds_once_in_other_modes(name, rounding):
    x = float64_inputs(name)
    got = codes_of(nk.cast(x, name, rounding=rounding))
    want = encode_float64_ref(x, name, rounding=rounding)
    with np.errstate(over="ignore", invalid="ignore"):
        twice = encode_ref(x.astype(np.float32), name, rounding=rounding)
    assert (twice != want).sum() > 10, "the input set must tell single from double rounding"
    assert_same(x, got, want, f"float64 -> {name} {rounding}")


@pytest.mark.parametrize("name, rounding", [("float8_e4m3fn", "toward_positive"), ("bfloat16", "nearest_away")])
def test_float64_source_saturate(name, rounding):
    x = float64_inputs(name)
    got = codes_of(nk.cast(x, name, rounding=rounding, saturate=True))
    assert_same(x, got, encode_float64_ref(x, name, rounding=rounding, saturate=True), f"float64 -> {name}")


def test_float64_to_float16_default_rounds_once_like_numpy():
    x = float64_inputs("float16")
    got = codes_of(nk.cast(x, "float16"))
    want = encode_float64_ref(x, "float16")
    assert_same(x, got, want, "float64 -> float16 (one rounding)")
    with np.errstate(over="ignore", invalid="ignore"):
        np16 = x.astype(np.float16).view(np.uint16)
        twice = encode_ref(x.astype(np.float32), "float16")
    keep = ~np.isnan(x)
    assert_same(x[keep], got[keep], np16[keep], "float64 -> float16 against numpy")
    assert (twice != want).sum() > 10
    # 1 + 2^-11 + 2^-40: float32 would make it the tie 1 + 2^-11 (-> 0x3c00); once: 0x3c01
    assert codes_of(nk.cast(np.array([1 + 2.0**-11 + 2.0**-40]), "float16")).tolist() == [0x3C01]


@pytest.mark.parametrize("name", [n for n in SMALL_SOURCES if n not in ("float16", "float8_e8m0fnu")])
def test_float64_source_default_rounds_once_like_ml_dtypes(name):
    x = float64_inputs(name)
    got = codes_of(nk.cast(x, name))
    with np.errstate(over="ignore", invalid="ignore"):
        ml = x.astype(ML_DTYPES[name]).view(f"uint{8 * ML_DTYPES[name].itemsize}")
    assert_same(x, got, ml, f"float64 -> {name} against ml_dtypes")
    assert_same(x, got, encode_float64_ref(x, name), f"float64 -> {name} against the reference")
    assert (float64_to_target_ref(x, name) != got).sum() > 10, "the input set must tell single from double rounding"


@pytest.mark.parametrize("name", ["float8_e8m0fnu", "tfloat32"])
def test_float64_source_default_rounds_once_without_ml_dtypes(name):
    x = float64_inputs(name)
    got = codes_of(nk.cast(x, name))
    assert_same(x, got, encode_float64_ref(x, name), f"float64 -> {name}")


def test_float64_named_single_rounding():
    # docs/casts.md: 1.0625 + 2^-40 -> e4m3fn 0x39: the float64 value is above the tie 1.0625 (through
    # float32, which makes it the tie itself, it would go to the even 0x38)
    assert codes_of(nk.cast(np.array([1.0625 + 2.0**-40]), "float8_e4m3fn")).tolist() == [0x39]
    # every mode rounds the float64 value once: nearest_away -> 0x39, toward_positive -> 0x39,
    # toward_zero -> 0x38
    for rounding, code in [("nearest_away", 0x39), ("toward_positive", 0x39), ("toward_zero", 0x38)]:
        got = nk.cast(np.array([1.0625 + 2.0**-40]), "float8_e4m3fn", rounding=rounding)
        assert codes_of(got).tolist() == [code], rounding
    # 1.0625 - 2^-40: float32 makes it 1.0625 (the tie); nearest_away of the float64 value: 0x38
    assert codes_of(nk.cast(np.array([1.0625 - 2.0**-40]), "float8_e4m3fn", rounding="nearest_away")).tolist() == [0x38]
    # 1 + 2^-30: toward_positive of the float64 value is the next e4m3fn value (0x39), although
    # float32 would round it to exactly 1.0
    assert codes_of(nk.cast(np.array([1 + 2.0**-30]), "float8_e4m3fn", rounding="toward_positive")).tolist() == [0x39]
    # e8m0: 3 + 2^-30 is above the tie 3 (float32 would make it the tie, to even 0x80): 4 = 0x81;
    # 3 - 2^-30 is below it, so nearest_away of the float64 value -> 0x80 (through float32 it would be 0x81)
    assert codes_of(nk.cast(np.array([3 + 2.0**-30]), "float8_e8m0fnu")).tolist() == [0x81]
    assert codes_of(nk.cast(np.array([3 - 2.0**-30]), "float8_e8m0fnu", rounding="nearest_away")).tolist() == [0x80]


@pytest.mark.parametrize(
    "name",
    ["bfloat16", "float16", "tfloat32", "float8_e4m3fn", "float8_e5m2fnuz", "float6_e3m2fn", "float4_e2m1fn",
     "float8_e8m0fnu"],
)  # fmt: skip
def test_float64_source_stochastic_rounds_once(name):
    # The float64 value itself is rounded (no float32 on the way), bit for bit with the reference,
    # for values next to every representable value and midpoint, beyond float32's range and below
    # its subnormals.
    x = float64_inputs(name)
    got = codes_of(nk.cast(x, name, rounding="stochastic", seed=SEED))
    want = encode_float64_ref(x, name, rounding="stochastic", rand=random_bits(SEED, x.size))
    assert_same(x, got, want, f"float64 -> {name} stochastic")
    got = codes_of(nk.cast(x, name, rounding="stochastic", seed=SEED, saturate=True))
    want = encode_float64_ref(x, name, rounding="stochastic", saturate=True, rand=random_bits(SEED, x.size))
    assert_same(x, got, want, f"float64 -> {name} stochastic, saturate")


def test_float64_source_stochastic_resolves_2_to_the_minus_32():
    # 1 + 2^-30 lies 2^-23 of a bfloat16 ulp above 1: it rounds up with probability 2^-23, about
    # 0.5 times in 4 Mi draws (a float32 rounded to odd on the way made it 71 times: 2^-16 each).
    n = 1 << 22
    ups = int((codes_of(nk.cast(np.full(n, 1 + 2.0**-30), "bfloat16", rounding="stochastic", seed=3)) != 0x3F80).sum())
    assert ups <= 6  # Poisson(0.5) exceeds 6 with probability below 1e-6
    # 2^-12 of an ulp: 1024 expected
    x = np.full(n, 1 + 2.0**-19)
    ups = int((codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=4)) == 0x3F81).sum())
    assert abs(ups - 1024) <= 5 * 32
    # e8m0 binades: 2^-20 of the way from 2 to 4 rounds up 4 times in 4 Mi draws on average
    x = np.full(n, 2 + 2.0**-19)
    ups = int((codes_of(nk.cast(x, "float8_e8m0fnu", rounding="stochastic", seed=5)) == 0x81).sum())
    assert ups <= 20


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn"])
def test_float64_source_stochastic_is_unbiased(name):
    n = 1 << 16
    mags = magnitudes_ref(name)
    i = int(np.searchsorted(mags, 1.0))
    lo, hi = float(mags[i]), float(mags[i + 1])
    for frac in (1 / 3, 2 / 3):
        for sign in (1.0, -1.0):
            x = sign * (lo + frac * (hi - lo))  # not a float32
            got = nk.cast(np.full(n, x), name, rounding="stochastic", seed=SEED + 1)
            v = np.abs(decode_ref(codes_of(got), name).astype(np.float64))
            assert set(np.unique(v).tolist()) <= {lo, hi}
            ups = int((v == hi).sum())
            sigma = math.sqrt(n * frac * (1 - frac))
            assert abs(ups - n * frac) <= 5 * sigma + 1, (name, x, ups)
            assert abs(v.mean() - abs(x)) <= (hi - lo) * (5 * sigma / n + 2.0**-14)


# ---- 3. other sources ---------------------------------------------------------------------------


def every_code(name: str) -> np.ndarray:
    """Every code of a source array (float6/float4: every byte; the decode rule covers them all)."""
    dt = ML_DTYPES[name]
    return np.arange(1 << (8 * dt.itemsize), dtype=np.uint64).astype(f"uint{8 * dt.itemsize}")


def _narrowing_cases() -> list[tuple[str, str, str, bool]]:
    """One target per source (each small format is a target once), rotating modes and saturate;
    plus e8m0 from a few sources (its encoder is separate)."""
    targets = [
        "float8_e4m3fn",
        "float8_e5m3fnu",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e3m4",
        "float6_e3m2fn",
        "float4_e2m1fn",
        "float8_e4m3b11fnuz",
        "float6_e2m3fn",
        "float8_e5m2fnuz",
        "float8_e4m3",
        "float8_e8m0fnu",
        "float4_e2m1fn",
        "float8_e4m3fn",
    ]
    cases = []
    for i, src in enumerate(SMALL_SOURCES):
        target = targets[i] if targets[i] != src else targets[(i + 1) % len(targets)]
        cases.append((src, target, ROUNDING_MODES[i % 6], i % 2 == 1))
    for i, src in enumerate(["bfloat16", "float16", "float8_e5m2", "float6_e3m2fn"]):
        cases.append((src, "float8_e8m0fnu", ROUNDING_MODES[(i + 3) % 6], i % 2 == 0))
    return cases


@pytest.mark.parametrize("source, target, rounding, saturate", _narrowing_cases())
def test_small_source_to_small_target_in_one_pass(source, target, rounding, saturate):
    c = every_code(source)
    x = c.view(ML_DTYPES[source])
    rand = random_bits(SEED, c.size) if rounding == "stochastic" else None
    got = nk.cast(x, target, rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding))
    assert got.dtype == result_dtype(target)
    want = encode_ref(decode_ref(c, source), target, rounding=rounding, saturate=saturate, rand=rand)
    assert_same(c, codes_of(got), want, f"{source} -> {target} {rounding} saturate={saturate}")


SIXTEEN_BIT_TO_ONE_BYTE = [
    (s, k.target, m)
    for s in ("float16", "bfloat16")
    for i, k in enumerate(k for k in ENCODERS if FORMATS[k.target].itemsize == 1)
    for m in (("nearest_even", ROUNDING_MODES[i % len(ROUNDING_MODES)]) if s == "float16" else ("nearest_even",))
]


@pytest.mark.parametrize("source, target, rounding", sorted(set(SIXTEEN_BIT_TO_ONE_BYTE)))
def test_every_16_bit_code_to_every_one_byte_format(source, target, rounding):
    """The 16-bit sources' element loops (no table of results) on every code: float16 in the
    default mode and one more per target, bfloat16 in the default mode."""
    c = every_code(source)
    rand = random_bits(SEED, c.size) if rounding == "stochastic" else None
    got = nk.cast(c.view(ML_DTYPES[source]), target, rounding=rounding, **stochastic_kwargs(rounding))
    want = encode_ref(decode_ref(c, source), target, rounding=rounding, rand=rand)
    assert_same(c, codes_of(got), want, f"{source} -> {target} {rounding}")


INT_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@functools.cache
def int_inputs(name: str) -> np.ndarray:
    """Every value of 8/16-bit types; edges, powers of two +-3, float32 and bfloat16 near-ties and
    random magnitudes of every bit length for the wider ones."""
    info = np.iinfo(name)
    if info.bits <= 16:
        return np.arange(info.min, info.max + 1, dtype=np.int64).astype(name)
    rng = np.random.default_rng(2 * info.bits + (info.min < 0))
    vals = {0, 1, info.max, info.min, info.max - 1, info.min + 1}
    for k in range(info.bits):
        for d in range(-3, 4):
            vals.add((1 << k) + d)
            vals.add(-(1 << k) + d)
    for k in range(9, info.bits - 1):  # near-ties of float32 (24 bits) and bfloat16 (8 bits)
        for keep in (8, 24):
            if k > keep:
                base = (1 << k) + (1 << (k - keep))
                vals.update({base, base + 1, base - 1, base + (1 << (k - keep - 1)), base + (1 << (k - keep - 1)) + 1})
    lengths = rng.integers(1, info.bits + 1, 20000).tolist()
    mags = rng.integers(0, 1 << 64, 20000, dtype=np.uint64).tolist()  # 64 random bits, then cut
    vals.update(m >> (64 - b) for m, b in zip(mags, lengths))
    vals.update(-(m >> (64 - b)) for m, b in zip(mags[:10000], lengths[:10000]))
    kept = sorted(v for v in vals if info.min <= v <= info.max)
    return np.array(kept, dtype=object).astype(name)


INT_CASES = [  # every integer type to two targets; the wide ones to bfloat16 (near-ties) and e8m0 (ties)
    ("int8", "float4_e2m1fn"),
    ("int8", "float8_e4m3fn"),
    ("int16", "float6_e3m2fn"),
    ("int16", "float8_e8m0fnu"),
    ("int32", "bfloat16"),
    ("int32", "float8_e8m0fnu"),
    ("int64", "bfloat16"),
    ("int64", "float16"),
    ("uint8", "float8_e8m0fnu"),
    ("uint8", "float8_e5m2fnuz"),
    ("uint16", "float16"),
    ("uint16", "bfloat16"),
    ("uint32", "float8_e4m3fn"),
    ("uint32", "float8_e8m0fnu"),
    ("uint64", "bfloat16"),
    ("uint64", "float8_e3m4"),
]


@pytest.mark.parametrize("source, target", INT_CASES)
def test_integer_source_matches_ml_dtypes(source, target):
    x = int_inputs(source)
    got = codes_of(nk.cast(x, target))
    with np.errstate(over="ignore", invalid="ignore"):
        once = int_to_target_ref(x, target)
        if target == "float8_e8m0fnu":
            want = once  # the tie rule of docs/casts.md, not ml_dtypes'
        else:
            want = x.astype(ML_DTYPES[target]).view(f"uint{8 * ML_DTYPES[target].itemsize}")
    assert_same(x, got, want, f"{source} -> {target}")
    assert_same(x, got, once, f"{source} -> {target} (the reference)")


@pytest.mark.parametrize("source, target", [("int64", "float32"), ("uint64", "float64")])
def test_integer_source_to_float32_and_float64_like_numpy(source, target):
    x = int_inputs(source)
    got = nk.cast(x, target)
    assert got.dtype == np.dtype(target)
    assert_same(x, codes_of(got), codes_of(x.astype(target)), f"{source} -> {target}")


@pytest.mark.parametrize(
    "source, target, rounding, saturate",
    [
        ("int16", "bfloat16", "toward_zero", False),
        ("int16", "bfloat16", "stochastic", False),
        ("uint8", "float4_e2m1fn", "toward_positive", False),
        ("int16", "float8_e4m3fn", "nearest_away", True),
    ],
)
def test_narrow_integer_source_other_modes(source, target, rounding, saturate):
    x = int_inputs(source)
    rand = random_bits(SEED, x.size) if rounding == "stochastic" else None
    got = codes_of(nk.cast(x, target, rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding)))
    want = encode_ref(x.astype(np.float32), target, rounding=rounding, saturate=saturate, rand=rand)
    assert_same(x, got, want, f"{source} -> {target} {rounding} saturate={saturate}")


@pytest.mark.parametrize(
    "source, target", [("int64", "int8"), ("int32", "uint8"), ("uint64", "int16"), ("int8", "uint64")]
)
def test_integer_to_integer_wraps_like_numpy(source, target):
    x = int_inputs(source)
    got = nk.cast(x, target)
    assert got.dtype == np.dtype(target)
    np.testing.assert_array_equal(got, x.astype(target))


def test_options_a_pair_implements():
    every = set(ROUNDING_MODES)
    for src, dst in [
        ("float32", "bfloat16"),
        ("float64", "float8_e4m3fn"),
        ("int16", "bfloat16"),
        ("float8_e5m2", "float4_e2m1fn"),
        ("float32", "float4_e2m1fn_x4"),
    ]:
        k = nk.lookup_cast(src, dst)
        assert set(k.roundings) == every and k.saturate, (src, dst)
    for src, dst in [("int32", "bfloat16"), ("uint64", "float8_e4m3fn"), ("float64", "float32")]:
        k = nk.lookup_cast(src, dst)
        assert set(k.roundings) == {"nearest_even"} and not k.saturate, (src, dst)
    with pytest.raises(NotImplementedError):
        nk.cast(np.arange(4, dtype=np.int32), "bfloat16", rounding="toward_zero")
    with pytest.raises(NotImplementedError):
        nk.cast(np.arange(4, dtype=np.int64), "float8_e4m3fn", saturate=True)
    with pytest.raises(NotImplementedError):
        nk.cast(np.arange(4, dtype=np.float64), "float32", rounding="stochastic", seed=1)


# ---- 4. decode ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DECODERS)
def test_decode_every_code_to_float32(name):
    c = every_code(name)
    got = nk.cast(c.view(ML_DTYPES[name]), np.float32)
    assert got.dtype == np.float32
    assert_same(c, codes_of(got), decode_ref(c, name).view(np.uint32), f"{name} -> float32")


DECODE_WIDE = [(n, ("float64", "float16", "bfloat16")[i % 3]) for i, n in enumerate(SMALL_SOURCES) if i > 1] + [
    ("bfloat16", "float64"),
    ("bfloat16", "float16"),
    ("float16", "float64"),
    ("float16", "bfloat16"),
]


@pytest.mark.parametrize("name", [n for n, out in DECODE_WIDE if out == "float64"])
def test_decode_every_code_to_float64(name):
    c = every_code(name)
    got = nk.cast(c.view(ML_DTYPES[name]), np.float64)
    assert got.dtype == np.float64
    with np.errstate(invalid="ignore"):
        want = decode_ref(c, name).astype(np.float64)
    keep = ~np.isnan(want)
    assert_same(c[keep], codes_of(got)[keep], codes_of(want)[keep], f"{name} -> float64")
    # NaN codes: a float64 NaN of the same sign (docs/casts.md does not fix float64 payloads)
    assert np.isnan(got[~keep]).all()
    assert np.array_equal(np.signbit(got[~keep]), np.signbit(want[~keep]))


@pytest.mark.parametrize("name, out", [(n, out) for n, out in DECODE_WIDE if out != "float64"])
def test_decode_every_code_to_16_bit_floats(name, out):
    c = every_code(name)
    got = nk.cast(c.view(ML_DTYPES[name]), out)
    assert got.dtype == ML_DTYPES[out]
    want = encode_ref(decode_ref(c, name), out)  # through the exact float32 value
    assert_same(c, codes_of(got), want, f"{name} -> {out}")


@pytest.mark.parametrize("name", DECODERS)
def test_round_trip_every_non_nan_code_every_mode(name):
    fmt = FORMATS_REF[name]
    width = fmt.ebits + fmt.mbits + (1 if fmt.signed else 0)
    c = np.arange(1 << width, dtype=np.uint64).astype(fmt.container)
    values = nk.cast(c.view(ML_DTYPES[name]), np.float32)
    for rounding in ROUNDING_MODES:
        for saturate in (False, True):
            keep = ~np.isnan(values) & ~(saturate & np.isinf(values))  # saturate maps +-inf to +-max
            back = nk.cast(values, name, rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding))
            assert_same(c[keep], codes_of(back)[keep], c[keep], f"{name} round trip {rounding} saturate={saturate}")


# ---- 5. packed containers -----------------------------------------------------------------------

PACKED = {  # name: (element, lane bits, container)
    "float8_e4m3fn_x4": ("float8_e4m3fn", 8, np.uint32),
    "float8_e5m2_x4": ("float8_e5m2", 8, np.uint32),
    "float4_e2m1fn_x4": ("float4_e2m1fn", 4, np.uint16),
}
#: The registered casts from float32 to a packed container, and from each container to its element (PACKED
#: must describe every container they name).
PACKERS = [k for k in nk.supported_casts() if k.source == "float32" and FORMATS[k.target].kind == "packed"]
UNPACKERS = [
    k.source
    for k in nk.supported_casts()
    if FORMATS[k.source].kind == "packed" and k.target == FORMATS[k.source].element
]


def pack_loop(codes: np.ndarray, lane_bits: int, container: type) -> np.ndarray:
    """Four codes of the last axis per container, element 0 in the least significant lane."""
    rows = codes.reshape(-1, codes.shape[-1])
    out = np.zeros((rows.shape[0], rows.shape[1] // 4), dtype=container)
    for r in range(rows.shape[0]):
        for j in range(out.shape[1]):
            word = 0
            for lane in range(4):
                word |= (int(rows[r, 4 * j + lane]) & ((1 << lane_bits) - 1)) << (lane_bits * lane)
            out[r, j] = word
    return out.reshape(codes.shape[:-1] + (codes.shape[-1] // 4,))


def pack_vectorised(codes: np.ndarray, lane_bits: int, container: type) -> np.ndarray:
    """The same packing with shifts (for large arrays; checked against pack_loop below)."""
    c = codes.reshape(codes.shape[:-1] + (-1, 4)).astype(np.uint64) & np.uint64((1 << lane_bits) - 1)
    shifts = np.arange(4, dtype=np.uint64) * np.uint64(lane_bits)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(container)


def unpack_lanes(containers: np.ndarray, lane_bits: int) -> np.ndarray:
    c = containers.astype(np.uint64)[..., None]
    shifts = np.arange(4, dtype=np.uint64) * np.uint64(lane_bits)
    lanes = (c >> shifts) & np.uint64((1 << lane_bits) - 1)
    return lanes.reshape(containers.shape[:-1] + (containers.shape[-1] * 4,)).astype(np.uint8)


@pytest.mark.parametrize(
    "packed, rounding, saturate",
    [(k.target, m, False) for k in PACKERS for m in sorted(k.roundings)]
    + [(k.target, "nearest_even", True) for k in PACKERS if k.saturate],
)
def test_pack_every_mode(packed, rounding, saturate):
    element, lane_bits, container = PACKED[packed]
    x = float32_inputs(element)
    x = x[: x.size - x.size % 32].reshape(-1, 32)
    rand = random_bits(SEED, x.size).reshape(x.shape) if rounding == "stochastic" else None
    got = nk.cast(x, packed, rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding))
    assert got.dtype == container and got.shape == (x.shape[0], 8)
    codes = encode_ref(x, element, rounding=rounding, saturate=saturate, rand=rand)
    want = pack_loop(codes, lane_bits, container)
    assert_same(x[:, ::4], got, want, f"float32 -> {packed} {rounding}")
    np.testing.assert_array_equal(pack_vectorised(codes, lane_bits, container), want)  # the helper used below


@pytest.mark.parametrize("packed", UNPACKERS)
def test_unpack_gives_the_element_values(packed):
    element, lane_bits, container = PACKED[packed]
    rng = np.random.default_rng(5)
    if container == np.uint16:
        c = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)  # every container
    else:
        c = rng.integers(0, 1 << 32, (64, 160), dtype=np.uint64).astype(np.uint32)
    lanes = unpack_lanes(c, lane_bits)
    values, other = nk.auto_cast(c, np.zeros(2, np.float32), a_dtype=packed)
    assert values.dtype == np.float32 and values.shape == lanes.shape and other.dtype == np.float32
    assert_same(lanes, codes_of(values), decode_ref(lanes, element).view(np.uint32), f"{packed} -> float32")
    # the registry function, to the element format (1-D arrays)
    k = nk.lookup_cast(packed, element)
    dst = np.empty(lanes.size, ML_DTYPES[element])
    k.function(c.reshape(-1), dst, nk.CastOptions(), 0)
    assert_same(lanes, codes_of(dst), lanes.ravel(), f"{packed} -> {element}")
    # and back: every container of non-NaN lanes packs to itself
    if packed != "float8_e5m2_x4":  # e5m2 has several NaN codes, which come back as 0x7e / 0xfe
        np.testing.assert_array_equal(nk.cast(values, packed), c)


@pytest.mark.parametrize(
    "source, packed, rounding",
    [
        ("int8", "float4_e2m1fn_x4", "nearest_even"),
        ("uint16", "float8_e5m2_x4", "toward_negative"),
        ("float64", "float8_e4m3fn_x4", "nearest_even"),
        ("float64", "float4_e2m1fn_x4", "toward_zero"),
    ],
)
def test_pack_from_integer_and_float64_sources(source, packed, rounding):
    element, lane_bits, container = PACKED[packed]
    if source == "float64":
        x = float64_inputs(element)
        x = x[: x.size - x.size % 16].reshape(-1, 16)
        codes = encode_float64_ref(x, element, rounding=rounding)
    else:
        x = int_inputs(source)
        x = x[: x.size - x.size % 16].reshape(-1, 16)
        codes = int_to_target_ref(x, element, rounding=rounding)
    got = nk.cast(x, packed, rounding=rounding)
    assert got.dtype == container
    np.testing.assert_array_equal(got, pack_vectorised(codes, lane_bits, container))


@pytest.mark.parametrize(
    "source, target, rounding",
    [
        ("float8_e4m3fn_x4", "float4_e2m1fn_x4", "stochastic"),
        ("float8_e5m2_x4", "float8_e4m3fn_x4", "toward_positive"),
        ("float4_e2m1fn_x4", "float8_e8m0fnu", "toward_zero"),
    ],
)
def test_packed_source_through_the_registry(source, target, rounding):
    s_el, s_bits, s_container = PACKED[source]
    rng = np.random.default_rng(17)
    c = rng.integers(0, 1 << (4 * s_bits), 3000, dtype=np.uint64).astype(s_container)
    lanes = unpack_lanes(c, s_bits)
    rand = random_bits(SEED, lanes.size, 40) if rounding == "stochastic" else None
    codes = encode_ref(
        decode_ref(lanes, s_el), PACKED[target][0] if target in PACKED else target, rounding=rounding, rand=rand
    )
    if target in PACKED:
        want = pack_vectorised(codes, PACKED[target][1], PACKED[target][2])
        dst = np.empty(c.size, PACKED[target][2])
    else:
        want = codes
        dst = np.empty(lanes.size, ML_DTYPES[target])
    k = nk.lookup_cast(source, target)
    assert rounding in k.roundings
    k.function(c, dst, nk.CastOptions(rounding, False, SEED), 40)  # element 0 has index 40
    assert_same(lanes[::4] if target in PACKED else lanes, codes_of(dst), want, f"{source} -> {target}")


def test_auto_cast_of_two_packed_operands():
    rng = np.random.default_rng(18)
    fp8 = rng.integers(0, 1 << 32, (6, 10), dtype=np.uint64).astype(np.uint32)
    fp4 = rng.integers(0, 1 << 16, (6, 10), dtype=np.uint64).astype(np.uint16)
    a, b = nk.auto_cast(fp8, fp4, a_dtype="float8_e4m3fn_x4", b_dtype="float4_e2m1fn_x4")
    assert a is fp8 and b.dtype == np.uint32 and b.shape == (6, 10)  # fp4 widens into e4m3fn lanes
    want = encode_ref(decode_ref(unpack_lanes(fp4, 4), "float4_e2m1fn"), "float8_e4m3fn")
    np.testing.assert_array_equal(b, pack_vectorised(want, 8, np.uint32))


@pytest.mark.parametrize("shape", [(3, 6), (5,), (2, 0, 3), ()])
@pytest.mark.parametrize("packed", [k.target for k in PACKERS])
def test_pack_last_axis_must_be_multiple_of_four(packed, shape):
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.cast(np.zeros(shape, np.float32), packed)


# ---- 6. stochastic rounding ---------------------------------------------------------------------


def test_stochastic_seed_rules():
    x = np.full(1 << 14, 1 + 2.0**-8, np.float32)  # the bfloat16 tie between 1.0 and 1 + 2^-7
    a = codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=5))
    assert 0.4 < (a == 0x3F81).mean() < 0.6
    np.testing.assert_array_equal(a, codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=5)))
    assert (a != codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=6))).any()
    # every seed in [0, 2^64) is its own: 2^63 + 5 is not 5 (the bits were once keyed on seed mod 2^63)
    for other in (5 + (1 << 63), (1 << 64) - 1, np.uint64((1 << 64) - 1)):
        b = codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=other))
        assert 0.4 < (b == 0x3F81).mean() < 0.6
        assert 0.4 < (a == b).mean() < 0.6, other  # independent coin flips agree half the time
    for bad in (1 << 64, 5 + (3 << 63), -1):
        with pytest.raises(ValueError, match=r"seed must be None or an int in \[0, 2\*\*64\)"):
            nk.cast(x, "bfloat16", rounding="stochastic", seed=bad)
    # seed=None: fresh entropy each call
    n1 = codes_of(nk.cast(x, "bfloat16", rounding="stochastic"))
    n2 = codes_of(nk.cast(x, "bfloat16", rounding="stochastic"))
    assert (n1 != n2).any()


@pytest.mark.parametrize("start", [(1 << 32) + 12345, (1 << 32) - 700, (5 << 40) + 3])
def test_stochastic_index_above_2_32_through_the_registry(start):
    x = float32_inputs("float8_e5m2")[:1500].copy()
    k = nk.lookup_cast("float32", "float8_e5m2")
    dst = np.empty(x.size, ML_DTYPES["float8_e5m2"])
    k.function(x, dst, nk.CastOptions("stochastic", False, SEED), start)
    want = encode_ref(x, "float8_e5m2", rounding="stochastic", rand=random_bits(SEED, x.size, start))
    assert_same(x, codes_of(dst), want, f"start={start}")


def test_stochastic_is_independent_of_threads(threads):
    n = 5 << 20  # large enough to be split over two threads
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(n) * 8).astype(np.float32)
    results = {}
    for t in (1, 2):
        threads(t)
        results[t] = (
            codes_of(nk.cast(x, "float8_e4m3fn", rounding="stochastic", seed=SEED)),
            nk.cast(x.reshape(-1, 64), "float4_e2m1fn_x4", rounding="stochastic", seed=SEED),
        )
    threads(None)
    np.testing.assert_array_equal(results[1][0], results[2][0])
    np.testing.assert_array_equal(results[1][1], results[2][1])
    elem = results[2][0]
    assert (elem != codes_of(nk.cast(x, "float8_e4m3fn"))).any()
    for start in (0, n // 2 - 4000, n - 8000):  # both chunks, and across their boundary
        piece = x[start : start + 8000]
        want = encode_ref(piece, "float8_e4m3fn", rounding="stochastic", rand=random_bits(SEED, piece.size, start))
        assert_same(piece, elem[start : start + 8000], want, f"elements from {start}")
    # packing uses the element index too: the packed result is the packed elementwise result
    fp4 = codes_of(nk.cast(x, "float4_e2m1fn", rounding="stochastic", seed=SEED)).reshape(-1, 64)
    np.testing.assert_array_equal(results[2][1], pack_vectorised(fp4, 4, np.uint16))


def test_unpacking_in_parallel(threads):
    rng = np.random.default_rng(12)
    c = rng.integers(0, 1 << 32, (1 << 21) + 12, dtype=np.uint64).astype(np.uint32)
    table = decode_ref(np.arange(256, dtype=np.uint8), "float8_e4m3fn").view(np.uint32)
    want = table[unpack_lanes(c, 8)]
    for t in (1, 2):
        threads(t)
        got, _ = nk.auto_cast(c, np.zeros(1, np.float32), a_dtype="float8_e4m3fn_x4")
        np.testing.assert_array_equal(codes_of(got), want)


def test_stochastic_index_is_the_c_order_index_for_any_layout():
    rng = np.random.default_rng(13)
    base = (rng.standard_normal((700, 400)) * 3).astype(np.float32)  # more than one buffer of 2^16
    kw = {"rounding": "stochastic", "seed": SEED}
    t = base.T
    want = encode_ref(
        np.ascontiguousarray(t), "bfloat16", rounding="stochastic", rand=random_bits(SEED, t.size).reshape(t.shape)
    )
    assert_same(np.ascontiguousarray(t), codes_of(nk.cast(t, "bfloat16", **kw)), want, "transposed")
    views = {
        "reversed": base[::-1, ::-1],
        "strided": base[:, ::2],
        "big-endian": base.astype(">f4"),
        "transposed-3d": base.reshape(70, 10, 400).transpose(2, 0, 1),
    }
    for what, v in views.items():
        got = codes_of(nk.cast(v, "bfloat16", **kw))
        assert_same(v, got, codes_of(nk.cast(np.ascontiguousarray(v, dtype=np.float32), "bfloat16", **kw)), what)
    out = np.empty((400, 1400), ML_DTYPES["bfloat16"])[:, ::2]
    nk.cast(t, "bfloat16", out=out, **kw)
    assert_same(t, codes_of(np.ascontiguousarray(out)), want, "non-contiguous out")
    # packing from a non-contiguous array: element indices are still the C-order ones
    packed = nk.cast(t, "float8_e4m3fn_x4", **kw)
    codes = encode_ref(
        np.ascontiguousarray(t), "float8_e4m3fn", rounding="stochastic", rand=random_bits(SEED, t.size).reshape(t.shape)
    )
    np.testing.assert_array_equal(packed, pack_vectorised(codes, 8, np.uint32))


@pytest.mark.parametrize(
    "name", ["bfloat16", "float16", "tfloat32", "float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn", "float8_e8m0fnu"]
)
def test_stochastic_far_below_the_smallest_subnormal(name):
    # Discarded fractions of every size: shifts from inside the subnormal range to far beyond 32
    # bits (2^-k of the smallest subnormal, k up to 40), checked bit for bit with many draws.
    fmt = FORMATS_REF[name]
    ks = np.arange(0, 41, dtype=np.float64)
    mags = fmt.min_subnormal * np.concatenate([0.75 * 2.0**-ks, 0.3 * 2.0**-ks, 1.6 * 2.0**-ks, [1.25, 2.5]])
    with np.errstate(under="ignore"):
        x32 = mags.astype(np.float32)
    x32 = x32[x32 > 0]
    x = np.repeat(np.concatenate([x32, -x32]), 512)
    got = codes_of(nk.cast(x, name, rounding="stochastic", seed=SEED))
    want = encode_ref(x, name, rounding="stochastic", rand=random_bits(SEED, x.size))
    assert_same(x, got, want, f"float32 -> {name} stochastic, tiny values")


def _unbiased_cases() -> list[tuple[str, str]]:
    return [
        (n, where)
        for n in [
            "bfloat16",
            "float16",
            "tfloat32",
            "float8_e4m3fn",
            "float8_e5m2fnuz",
            "float6_e3m2fn",
            "float4_e2m1fn",
            "float8_e8m0fnu",
        ]
        for where in ("one", "lowest")
    ]


@pytest.mark.parametrize("name, where", _unbiased_cases())
def test_stochastic_is_unbiased(name, where):
    n = 1 << 16
    mags = magnitudes_ref(name)
    i = int(np.searchsorted(mags, 1.0)) if where == "one" else 0
    lo, hi = float(mags[i]), float(mags[i + 1])
    signs = (1.0,) if name == "float8_e8m0fnu" else (1.0, -1.0)
    for frac in (0.25, 0.5, 0.9):
        x32 = np.float32(lo + frac * (hi - lo))
        p = (float(x32) - lo) / (hi - lo)  # exact fraction of the float32 input
        p_up = math.floor(p * 2**32) / 2**32
        for sign in signs:
            x = np.full(n, sign * x32, np.float32)
            got = nk.cast(x, name, rounding="stochastic", seed=SEED + int(frac * 100))
            v = np.abs(decode_ref(codes_of(got), name).astype(np.float64))
            assert set(np.unique(v).tolist()) <= {lo, hi}, (name, float(x32))
            ups = int((v == hi).sum())
            sigma = math.sqrt(n * p_up * (1 - p_up))
            assert abs(ups - n * p_up) <= 5 * sigma, (name, float(x32), sign, ups, n * p_up)
            assert abs(v.mean() - float(x32)) <= 5 * (hi - lo) * sigma / n, (name, float(x32), sign)


@pytest.mark.parametrize("name, sign_bit", [("float6_e2m3fn", 0x20), ("float6_e3m2fn", 0x20), ("float4_e2m1fn", 0x8)])
def test_float6_float4_nan_is_the_default_code_in_every_mode(name, sign_bit):
    # These formats have no NaN. The default mode gives ml_dtypes' codes (+NaN -> the -0 code,
    # -NaN -> +0); the other modes and saturation give the same codes (one rule, documented),
    # from every source, packed containers included.
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    want = [sign_bit, 0, sign_bit, 0]
    with np.errstate(invalid="ignore"):  # signalling NaNs
        sources = [nans, nans.astype(np.float64), nk.cast(nans, "bfloat16")]
    for rounding in ROUNDING_MODES:
        for saturate in (False, True):
            kw = {"rounding": rounding, "saturate": saturate, **stochastic_kwargs(rounding)}
            for x in sources:
                assert codes_of(nk.cast(x, name, **kw)).tolist() == want, (x.dtype, rounding, saturate)
    if name == "float4_e2m1fn":
        packed = nk.cast(nans.reshape(1, 4), "float4_e2m1fn_x4", rounding="toward_zero")
        assert packed.tolist() == [[sign_bit | sign_bit << 8]]


# ---- 6b. the streams of different seeds are independent --------------------------------------


def _chi_square(observed: np.ndarray, expected: np.ndarray, variance: np.ndarray) -> float:
    return float((((observed - expected) ** 2) / variance).sum())


# A chi-square statistic with 64 degrees of freedom lies in [30, 110] with probability above 0.999;
# the seeds below are fixed, so these tests are deterministic.
CHI2_64 = (30.0, 110.0)


def test_round_up_counts_across_seeds_are_binomial():
    # Each seed must give its own coin flips: the number of round-ups of one value over an array
    # varies from seed to seed as binomial draws. (When the seed was XORed into the index, every
    # seed of a small range gave the same bits in another order, hence the same count.)
    n = 1 << 16
    x = np.full(n, np.uint32(0x3F804CCD)).view(np.float32)  # rounds up with p = 0x4ccd / 2^16
    p = 0x4CCD / 65536
    for seeds in (range(64), [s << 40 for s in range(64)], [(1 << 64) - 1 - s for s in range(64)]):
        counts = np.array(
            [int((codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=s)) == 0x3F81).sum()) for s in seeds]
        )
        stat = _chi_square(counts, np.full(64, n * p), np.full(64, n * p * (1 - p)))
        assert CHI2_64[0] < stat < CHI2_64[1], (stat, counts[:8])


@pytest.mark.parametrize("pair", [(0, 1), (5, 5 ^ (1 << 20)), (7, 7 + (1 << 63)), (123, 123 ^ 0xFFFF), (2, 3 << 32)])
def test_streams_of_two_seeds_are_not_a_permutation_and_uncorrelated(pair):
    # random_bits is the package's documented hash; every stochastic test above checks the
    # package against it bit for bit.
    n = 1 << 16
    a, b = (random_bits(s, n).astype(np.float64) for s in pair)
    assert len(np.intersect1d(a, b)) < 16  # about n^2 / 2^32 = 1 shared value by chance
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(n)
    # and through the package: the round-up decisions of a tie agree half of the time
    x = np.full(n, 1 + 2.0**-8, np.float32)
    da, db = (codes_of(nk.cast(x, "bfloat16", rounding="stochastic", seed=s)) for s in pair)
    assert abs((da == db).mean() - 0.5) < 5 * 0.5 / math.sqrt(n)


@pytest.mark.parametrize(
    "name, source",
    [("bfloat16", "float32"), ("float8_e4m3fn", "float32"), ("float4_e2m1fn", "float32"), ("float8_e8m0fnu", "float32"),
     ("bfloat16", "float64"), ("float16", "float64")],
)  # fmt: skip
def test_probability_of_rounding_up_is_the_discarded_fraction(name, source):
    # Dense inputs between two neighbours lo < hi whose discarded fractions f cover [0, 1): the
    # round-up counts of 64 bins of f against their expectation (sum of f), chi-square.
    mags = magnitudes_ref(name)
    i = int(np.searchsorted(mags, 1.0))
    lo, hi = float(mags[i]), float(mags[i + 1])
    m, reps = 1 << 14, 64
    frac = (np.arange(m) + (1 / 3 if source == "float64" else 0.5)) / m
    x = (lo + frac * (hi - lo)).astype(source)
    exact = (x.astype(np.float64) - lo) / (hi - lo)  # the fraction of the value actually cast
    got = codes_of(nk.cast(np.tile(x, reps), name, rounding="stochastic", seed=SEED)).reshape(reps, m)
    up = np.abs(decode_ref(got, name).astype(np.float64)) == hi
    bins = np.arange(m) * 64 // m
    observed = np.bincount(bins, up.sum(axis=0), 64)
    expected = np.bincount(bins, reps * exact, 64)
    variance = np.bincount(bins, reps * exact * (1 - exact), 64)
    stat = _chi_square(observed, expected, variance)
    assert CHI2_64[0] < stat < CHI2_64[1], stat


# ---- 7. directed-mode overflow and saturation, and every hand-written case (cast_cases.py) -----


@pytest.mark.parametrize("name, x, rounding, saturate, expected", HAND_CASES)
def test_named_overflow_and_saturation(name, x, rounding, saturate, expected):
    arr = f32([x])
    got = codes_of(nk.cast(arr, name, rounding=rounding, saturate=saturate, **stochastic_kwargs(rounding)))
    assert int(got[0]) == expected, f"{name} {describe(arr, 0)} {rounding} saturate={saturate}: 0x{int(got[0]):x}"
    rand = np.array([0]) if rounding == "stochastic" else None  # these rows do not depend on the draw
    assert int(encode_ref(arr, name, rounding=rounding, saturate=saturate, rand=rand)[0]) == expected  # oracle agrees
