"""The registry's cast ufuncs (``CastKernel.ufunc``, numba ``@vectorize``) against its array kernels.

Oracle: the pair's array kernel (``CastKernel.function``) on the same items. Sources of 16 bits or
fewer are swept over all their codes (2^16, 2^8, or the 2^bits codes of FP6 / FP4), 32- and 64-bit
sources over named specials and random bit patterns. Each ufunc is built once per test process.

The fast run checks a representative subset of pairs (the ones the rest of the suite compiles:
float32 <-> the common targets, one of each source family, a saturating and a directed-rounding
variant); under ``slow``, pairs in which every source and every target appear; all ~490 registered
pairs with ``NEURON_KERNELS_UFUNC_SWEEP=1`` as well (minutes of ufunc building on a cold cache).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.dtypes import get_format
from neuron_kernels.registry import CastOptions, supported_casts

from .helpers import special_float32

UFUNC_PAIRS = sorted((k.source, k.target) for k in supported_casts() if k.has_ufunc)

#: One pair of each kind (float and integer sources and targets, 16- and 8-bit sources, FP6/FP4,
#: the package's float32 formats), mostly kernels the other tests compile anyway.
FAST_PAIRS = [
    ("float32", "bfloat16"),
    ("float32", "float8_e4m3fn"),
    ("float32", "float4_e2m1fn"),
    ("float32", "tfloat32"),
    ("bfloat16", "float32"),
    ("float16", "float8_e5m2"),
    ("float8_e4m3fn", "float32"),
    ("float6_e2m3fn", "bfloat16"),
    ("int32", "float16"),
]


def _codes(name: str, rng: np.random.Generator) -> np.ndarray:
    """Every code of a format of 16 bits or fewer; specials and random patterns of wider ones. As an
    array of the format's result dtype."""
    fmt = get_format(name)
    dtype = fmt.result_dtype
    if fmt.bits <= 16:
        bits = np.arange(1 << fmt.bits, dtype=np.uint16 if fmt.itemsize == 2 else np.uint8)
        return bits.view(dtype)
    if dtype == np.float32:
        return np.concatenate([special_float32(), rng.integers(0, 1 << 32, 4096, dtype=np.uint32).view(np.float32)])
    if dtype == np.float64:
        special = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 65504.0, 3.4e38, 1e-40, 2.0**-149])
        return np.concatenate([special, rng.integers(0, 1 << 64, 4096, dtype=np.uint64).view(np.float64)])
    info = np.iinfo(dtype)
    extremes = np.array([info.min, info.max, 0, 1, -1 if info.min else 2], dtype)
    return np.concatenate([extremes, rng.integers(info.min, info.max, 4096, dtype=dtype, endpoint=True)])


def _kernel(source: str, target: str, x: np.ndarray, rounding: str = "nearest_even", saturate: bool = False):
    kernel = nk.lookup_cast(source, target)
    out = np.empty(x.shape, get_format(target).result_dtype)
    kernel.function(x.reshape(-1), out.reshape(-1), CastOptions(rounding, saturate), 0)
    return out


def _ufunc(source: str, target: str, rounding: str = "nearest_even", saturate: bool = False):
    ufunc = nk.lookup_cast(source, target).ufunc(rounding, saturate)
    arg, res = (np.dtype(t) for t in ufunc.types[0].split("->"))
    return ufunc, arg, res


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind not in "iu" else a


def _check(source: str, target: str, rounding: str = "nearest_even", saturate: bool = False) -> None:
    x = _codes(source, np.random.default_rng(7))
    ufunc, arg, res = _ufunc(source, target, rounding, saturate)
    with np.errstate(all="ignore"):  # signalling NaN inputs raise "invalid", as in NumPy's own loops
        got = ufunc(x.view(arg))
    assert got.dtype == res
    expected = _kernel(source, target, x, rounding, saturate)
    np.testing.assert_array_equal(_bits(got), _bits(expected), err_msg=f"{source} -> {target} ({rounding})")


@pytest.mark.parametrize("source,target", FAST_PAIRS)
def test_ufunc_equals_array_kernel(source, target):
    _check(source, target)


@pytest.mark.parametrize("rounding,saturate", [("toward_zero", False), ("nearest_even", True)])
def test_ufunc_options_equal_array_kernel(rounding, saturate):
    _check("float32", "float8_e4m3fn", rounding, saturate)


def _covering(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A few pairs in which every source and every target of ``pairs`` appears."""
    chosen: list[tuple[str, str]] = []
    sources: set[str] = set()
    targets: set[str] = set()
    for source, target in pairs:
        if source not in sources or target not in targets:
            chosen.append((source, target))
            sources.add(source)
            targets.add(target)
    return chosen


def _sweep(pairs: list[tuple[str, str]]) -> None:
    failures = []
    for source, target in pairs:
        try:
            _check(source, target)
        except AssertionError as exc:
            failures.append(f"{source} -> {target}: {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_every_source_and_target_ufunc_equals_array_kernel():
    """Every source and every target at least once (about 50 pairs), default options."""
    _sweep(_covering(UFUNC_PAIRS))


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("NEURON_KERNELS_UFUNC_SWEEP") != "1",
    reason="building all ~490 ufuncs takes minutes on a cold cache; set NEURON_KERNELS_UFUNC_SWEEP=1",
)
def test_every_registered_ufunc_equals_array_kernel():
    """All registered pairs, default options."""
    _sweep(UFUNC_PAIRS)


def test_ufunc_broadcasting_and_out(rng):
    ufunc, arg, _ = _ufunc("float32", "bfloat16")
    x = rng.standard_normal((3, 1, 5)).astype(np.float32)
    # broadcasting: a broadcast view in, and a small input broadcast into a larger out=
    full = np.broadcast_to(x, (3, 4, 5))
    np.testing.assert_array_equal(ufunc(full), nk.cast(np.ascontiguousarray(full), "bfloat16").view(np.uint16))
    out = np.full((3, 4, 5), 0xFFFF, np.uint16)
    assert ufunc(x, out=out) is out  # broadcast into out
    np.testing.assert_array_equal(out, np.broadcast_to(nk.cast(x, "bfloat16").view(np.uint16), out.shape))
    out[...] = 0xABCD
    ufunc(x, out=out, where=True)
    np.testing.assert_array_equal(out, np.broadcast_to(nk.cast(x, "bfloat16").view(np.uint16), out.shape))
    # strided (non-contiguous) input
    z = rng.standard_normal((8, 6)).astype(np.float32)[::2, ::3]
    np.testing.assert_array_equal(ufunc(z), nk.cast(z, "bfloat16").view(np.uint16))


@pytest.mark.xfail(
    raises=ValueError,
    strict=True,
    reason="numba's @vectorize ufuncs (0.68, NumPy 2.4) reject a where= mask array: 'An iterator operand was "
    "flagged as the ARRAYMASK, but no WRITEMASKED operands were given' (any numba ufunc, not only the package's)",
)
@pytest.mark.parametrize("mask", ["array", "False"])
def test_ufunc_where_mask(rng, mask):
    ufunc, _, _ = _ufunc("float32", "bfloat16")
    x = rng.standard_normal(8).astype(np.float32)
    where = x > 0 if mask == "array" else np.zeros(8, bool)
    out = np.full(8, 0xABCD, np.uint16)
    ufunc(x, out=out, where=where if mask == "array" else False)
    np.testing.assert_array_equal(out, np.where(where, nk.cast(x, "bfloat16").view(np.uint16), 0xABCD))


def test_ufunc_decodes_back(rng):
    """Codes out, then the decoding ufunc back: the array kernels' round trip."""
    x = rng.standard_normal(1000).astype(np.float32)
    encode, _, _ = _ufunc("float32", "float8_e4m3fn")
    decode, _, _ = _ufunc("float8_e4m3fn", "float32")
    np.testing.assert_array_equal(decode(encode(x)), nk.cast(nk.cast(x, "float8_e4m3fn"), np.float32))


def test_ufunc_is_known_to_the_registry_and_kept():
    kernel = nk.lookup_cast("float32", "bfloat16")
    assert kernel.has_ufunc and "has_ufunc=True" in repr(kernel)
    assert kernel.ufunc() is kernel.ufunc()
    assert isinstance(kernel.ufunc(), np.ufunc)


def test_ufunc_refusals_name_what_is_accepted():
    with pytest.raises(NotImplementedError, match="stochastic rounding has no ufunc"):
        nk.lookup_cast("float32", "bfloat16").ufunc("stochastic")
    with pytest.raises(NotImplementedError, match="no ufunc .packed containers"):
        nk.lookup_cast("float32", "float8_e4m3fn_x4").ufunc()
