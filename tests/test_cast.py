"""cast(): the compiled kernels against their oracles, and the API around them."""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels import _parallel

from .helpers import special_float32
from .reference import pack_lanes, round_float32_to_mbits

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"uint{8 * a.dtype.itemsize}")


def mld_bf16(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(BF16)


# ---- the compiled kernels -----------------------------------------------------------------


def test_float32_to_bfloat16_special_cases():
    x = special_float32()
    np.testing.assert_array_equal(bits(nk.cast(x, "bfloat16")), bits(mld_bf16(x)))


def test_float32_to_bfloat16_named_results():
    # Written out from the rounding rule, not from the code: ties go to the even code.
    cases = {
        0x3F808000: 0x3F80,  # 1 + 2^-8: tie, 0x3f80 is even -> down
        0x3F818000: 0x3F82,  # 1 + 3*2^-8: tie, 0x3f81 odd -> up
        0x3F808001: 0x3F81,  # just above the tie -> up
        0x7F7F8000: 0x7F80,  # max + half an ulp -> +inf
        0x7F7F7FFF: 0x7F7F,  # just below -> max
        0x80000000: 0x8000,  # -0 keeps its sign
        0x00000001: 0x0000,  # smallest float32 subnormal -> +0
        0x7F800001: 0x7FC0,  # signalling NaN -> quiet NaN, payload dropped
        0xFFFFFFFF: 0xFFC0,  # negative NaN keeps its sign
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(bits(nk.cast(x, "bfloat16")), np.array(list(cases.values()), np.uint16))


def test_float32_to_bfloat16_random_patterns(rng):
    u = rng.integers(0, 2**32, 1 << 20, dtype=np.uint32)
    x = u.view(np.float32)
    np.testing.assert_array_equal(bits(nk.cast(x, BF16)), bits(mld_bf16(x)))


def test_bfloat16_to_float32_every_code():
    codes = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    ours = nk.cast(codes, np.float32)
    assert ours.dtype == np.float32
    with np.errstate(invalid="ignore"):
        ref = codes.astype(np.float32)
    np.testing.assert_array_equal(bits(ours), bits(ref))


def test_bfloat16_round_trip_every_non_nan_code():
    codes = np.arange(1 << 16, dtype=np.uint16)
    values = codes.view(BF16)
    back = nk.cast(nk.cast(values, "float32"), "bfloat16")
    keep = ~np.isnan(values.astype(np.float32))
    np.testing.assert_array_equal(bits(back)[keep], codes[keep])


def test_float32_to_tfloat32_special_and_random(rng):
    x = np.concatenate([special_float32(), rng.integers(0, 2**32, 1 << 20, dtype=np.uint32).view(np.float32)])
    ours = nk.cast(x, "tfloat32")
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(bits(ours), bits(round_float32_to_mbits(x, 10)))
    finite = np.isfinite(ours)
    assert not (bits(ours)[finite] & np.uint32(0x1FFF)).any()


def test_tfloat32_named_results():
    cases = {
        0x3F801000: 0x3F800000,  # 1 + 2^-11: tie to even -> 1
        0x3F803000: 0x3F804000,  # 1 + 3*2^-11: tie to even -> up
        0x7F7FF000: 0x7F800000,  # max + half an ulp -> inf
        0x7F7FEFFF: 0x7F7FE000,  # just below -> max
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(bits(nk.cast(x, "tf32")), np.array(list(cases.values()), np.uint32))


# ---- shapes, strides, byte order ----------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (0, 3)])
def test_any_shape(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    y = nk.cast(x, "bfloat16")
    assert y.shape == shape and y.dtype == BF16
    np.testing.assert_array_equal(bits(y), bits(mld_bf16(x)))


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[::-1],
        lambda a: a[:, ::3],
        lambda a: a[::-2, 1::2],
        lambda a: a.T,
        lambda a: np.asfortranarray(a),
        lambda a: a.astype(">f4"),
        lambda a: a.astype(">f4")[:, ::-1],
    ],
)
def test_non_contiguous_and_big_endian(make, rng):
    base = rng.standard_normal((64, 300)).astype(np.float32)
    x = make(base)
    np.testing.assert_array_equal(bits(nk.cast(x, "bfloat16")), bits(mld_bf16(x.astype(np.float32))))


def test_big_endian_bfloat16_source_decodes_correctly(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    # bytes of a big-endian float32 array are not float32 little-endian values; the result must
    # still be the values themselves
    y = nk.cast(x.astype(">f4"), "float32")
    np.testing.assert_array_equal(y, x)


def test_python_scalars_and_lists():
    assert nk.cast(1.0, "bfloat16").shape == ()
    assert float(nk.cast(1.0, "bfloat16")) == 1.0
    y = nk.cast([[1.5, -2.0], [3.0, 1e40]], "bfloat16")
    assert y.shape == (2, 2) and y.dtype == BF16
    np.testing.assert_array_equal(bits(y), bits(mld_bf16(np.array([[1.5, -2.0], [3.0, 1e40]]))))


def test_float64_source_rounds_once_like_ml_dtypes_0_7():
    # 1 + 2^-8 + 2^-30 is just above the halfway point between two bfloat16 values: rounded once it
    # goes up (0x3F81); rounded to float32 first it would become the tie 1 + 2^-8 and go to even
    # (0x3F80), as ml_dtypes before 0.7 does. 3.4e38 is above halfway to 2^128: infinity.
    x = np.array([1.0 + 2.0**-8 + 2.0**-30, 1.0 + 2.0**-8, 3.4e38, 1e-50], dtype=np.float64)
    expected = np.array([0x3F81, 0x3F80, 0x7F80, 0], np.uint16)
    np.testing.assert_array_equal(bits(nk.cast(x, "bfloat16")), expected)
    if ml_dtypes.__version__ == "0.7.0":  # the oracle the default rounding reproduces
        np.testing.assert_array_equal(bits(x.astype(BF16)), expected)


# ---- out= -----------------------------------------------------------------------------------


def test_out_is_written_and_returned(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    out = np.empty((4, 6), BF16)
    res = nk.cast(x, "bfloat16", out=out)
    assert res is out
    np.testing.assert_array_equal(bits(out), bits(mld_bf16(x)))


def test_out_non_contiguous(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    big = np.zeros((4, 12), BF16)
    nk.cast(x, "bfloat16", out=big[:, ::2])
    np.testing.assert_array_equal(bits(big[:, ::2]), bits(mld_bf16(x)))
    assert not bits(big[:, 1::2]).any()


@pytest.mark.parametrize(
    "out, match",
    [
        (np.empty((3, 6), BF16), "shape"),
        (np.empty((4, 6), np.float16), "dtype"),
        ([0] * 24, "numpy array"),
    ],
)
def test_bad_out(out, match):
    x = np.zeros((4, 6), np.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        nk.cast(x, "bfloat16", out=out)


def test_read_only_out():
    out = np.empty(8, BF16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        nk.cast(np.zeros(8, np.float32), "bfloat16", out=out)


def test_overlapping_out():
    buf = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        nk.cast(buf[:8], "float32r", out=buf[4:12])


# ---- options and bad input ------------------------------------------------------------------


def test_unknown_rounding_lists_modes():
    with pytest.raises(ValueError, match="nearest_even.*stochastic"):
        nk.cast(np.zeros(3, np.float32), "bfloat16", rounding="nearest")


@pytest.mark.parametrize(
    "source, target, kwargs",
    [
        ("int32", "bfloat16", {"rounding": "toward_zero"}),
        ("int64", "float8_e4m3fn", {"rounding": "stochastic", "seed": 1}),
        ("float64", "float32", {"saturate": True}),
        ("float64", "float32", {"rounding": "toward_zero"}),
    ],
)
def test_unimplemented_options_raise_not_implemented(source, target, kwargs):
    with pytest.raises(NotImplementedError, match=f"{source} -> {target}"):
        nk.cast(np.zeros(3, source), target, **kwargs)


@pytest.mark.parametrize(
    "seed, error", [(-1, ValueError), (1 << 64, ValueError), (1.5, TypeError), ("x", TypeError), (True, TypeError)]
)
def test_bad_seed(seed, error):
    with pytest.raises(error, match=r"seed must be None or an int in \[0, 2\*\*64\)"):
        nk.cast(np.zeros(3, np.float32), "bfloat16", seed=seed)


def test_bad_saturate():
    with pytest.raises(TypeError, match="saturate"):
        nk.cast(np.zeros(3, np.float32), "bfloat16", saturate="yes")


def test_unknown_target_names_close_matches():
    with pytest.raises(TypeError, match="bfloat16"):
        nk.cast(np.zeros(3, np.float32), "bfloat61")


@pytest.mark.parametrize("target", [np.complex64, object, str, "datetime64[s]", bool])
def test_non_numeric_target(target):
    with pytest.raises(TypeError, match="unsupported dtype"):
        nk.cast(np.zeros(3, np.float32), target)


@pytest.mark.parametrize(
    "x",
    [
        np.zeros(3, np.complex64),
        np.array(["a"]),
        np.array([object()]),
        np.zeros(3, "datetime64[s]"),
    ],
)
def test_non_numeric_source(x):
    with pytest.raises(TypeError, match="cannot cast an array of dtype"):
        nk.cast(x, "bfloat16")


def test_bool_source_is_refused_clearly():
    with pytest.raises(TypeError, match="dtype bool"):
        nk.cast(np.array([True, False]), "bfloat16")


def test_unsupported_pair_names_pair_and_targets():
    with pytest.raises(nk.UnsupportedCastError, match=r"float32 to int8.*supported targets.*bfloat16"):
        nk.cast(np.zeros(3, np.float32), "int8")


# ---- packed containers ----------------------------------------------------------------------


#: How each packed container holds its elements: (element dtype, lane bits, container).
X4_LAYOUT = {
    "float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8, np.uint32),
    "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 8, np.uint32),
    "float4_e2m1fn_x4": (ml_dtypes.float4_e2m1fn, 4, np.uint16),
}


@pytest.mark.parametrize(
    "target", [k.target for k in nk.supported_casts() if k.source == "float32" and nk.is_x4_dtype(k.target)]
)
def test_pack_x4_layout(target, rng):
    """Every registered float32 -> packed cast, against X4_LAYOUT (which must describe a new one)."""
    element, lane_bits, container = X4_LAYOUT[target]
    x = (rng.standard_normal((3, 16)) * 4).astype(np.float32)
    packed = nk.cast(x, target)
    assert packed.dtype == container and packed.shape == (3, 4)
    codes = x.astype(element).view(np.uint8)
    np.testing.assert_array_equal(packed, pack_lanes(codes, lane_bits, container))


def test_pack_x4_needs_multiple_of_four():
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.cast(np.zeros((2, 6), np.float32), "float8_e4m3fn_x4")
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.cast(np.float32(1.0), "float4_e2m1fn_x4")


def test_pack_x4_non_contiguous(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    np.testing.assert_array_equal(nk.cast(x.T, "float8_e5m2_x4"), nk.cast(np.ascontiguousarray(x.T), "float8_e5m2_x4"))


# ---- threads ------------------------------------------------------------------------------


def test_parallel_equals_serial(threads, rng):
    n = _parallel.PARALLEL_MIN_ELEMENTS * 2 + 13
    x = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)
    threads(1)
    one = nk.cast(x, "bfloat16")
    threads(3)
    three = nk.cast(x, "bfloat16")
    np.testing.assert_array_equal(bits(one), bits(three))
    np.testing.assert_array_equal(bits(three), bits(mld_bf16(x)))


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_thread_count(bad, threads):
    with pytest.raises(ValueError, match="positive int"):
        threads(bad)


def test_thread_count_from_environment(monkeypatch):
    monkeypatch.setenv("NEURON_KERNELS_NUM_THREADS", "3")
    assert nk.get_num_threads() == 3
    monkeypatch.setenv("NEURON_KERNELS_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="NEURON_KERNELS_NUM_THREADS"):
        nk.get_num_threads()


# ---- pack_x4 / unpack_x4 --------------------------------------------------------------------


@pytest.mark.parametrize(
    "x4, element, lane_bits, container",
    [
        ("float8_e4m3fn_x4", ml_dtypes.float8_e4m3fn, 8, np.uint32),
        ("float8_e5m2_x4", ml_dtypes.float8_e5m2, 8, np.uint32),
        ("float4_e2m1fn_x4", ml_dtypes.float4_e2m1fn, 4, np.uint16),
    ],
)
def test_pack_and_unpack_every_code(x4, element, lane_bits, container):
    n_codes = 1 << lane_bits
    codes = np.tile(np.arange(n_codes, dtype=np.uint8), 2).reshape(2, n_codes)  # NaN payloads included
    packed = nk.pack_x4(codes.view(element), x4)
    assert packed.dtype == container and packed.shape == (2, n_codes // 4)
    np.testing.assert_array_equal(packed, pack_lanes(codes, lane_bits, container))
    back = nk.unpack_x4(packed, x4)
    assert back.dtype == np.dtype(element)
    np.testing.assert_array_equal(back.view(np.uint8), codes)


def test_pack_x4_errors():
    with pytest.raises(TypeError, match="needs an array of float8_e4m3fn codes"):
        nk.pack_x4(np.zeros(8, np.float32), "float8_e4m3fn_x4")
    with pytest.raises(TypeError, match="not a packed x4 type"):
        nk.pack_x4(np.zeros(8, ml_dtypes.float8_e4m3fn), "float8_e4m3fn")
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.pack_x4(np.zeros(6, ml_dtypes.float8_e4m3fn), "float8_e4m3fn_x4")
    with pytest.raises(TypeError, match="needs a uint16 array"):
        nk.unpack_x4(np.zeros(2, np.uint32), "float4_e2m1fn_x4")
    with pytest.raises(ValueError, match="0-d"):
        nk.unpack_x4(np.uint32(7), "float8_e5m2_x4")
