"""The format table: derived values against ml_dtypes.finfo, invariants, the name normaliser."""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.dtypes import get_format
from neuron_kernels.formats import FORMATS

ML_FLOATS = [n for n, f in FORMATS.items() if f.kind == "float" and hasattr(ml_dtypes, n)]
NUMPY_FLOATS = ["float16", "float32", "float64"]


@pytest.mark.parametrize("name", ML_FLOATS + NUMPY_FLOATS)
def test_format_info_matches_finfo(name):
    t = getattr(ml_dtypes, name, None) or np.dtype(name)
    ref = ml_dtypes.finfo(t) if hasattr(ml_dtypes, name) else np.finfo(t)
    info = nk.format_info(name)
    assert info.bits == ref.bits
    assert info.ebits == ref.nexp
    assert info.mbits == ref.nmant
    assert info.max == float(ref.max)
    assert info.min == float(ref.min)
    assert info.smallest_normal == float(ref.smallest_normal)
    assert info.smallest_subnormal == float(ref.smallest_subnormal)
    assert info.eps == float(ref.eps)
    assert info.itemsize == np.dtype(t).itemsize
    assert info.container == np.dtype(t)


@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f.kind == "float"])
def test_invariants(name):
    f = FORMATS[name]
    assert f.ebits + f.mbits + (1 if f.signed else 0) == f.bits
    assert f.bits <= 8 * f.itemsize
    assert f.max_code < (1 << (f.bits - (1 if f.signed else 0)))
    assert f.smallest_subnormal <= f.smallest_normal < f.max


@pytest.mark.parametrize("name", ML_FLOATS)
def test_codes_decode_as_ml_dtypes_says(name):
    f = FORMATS[name]
    t = np.dtype(getattr(ml_dtypes, name))

    def value(code):
        return float(np.array([code], np.uint8 if f.itemsize == 1 else np.uint16).view(t).astype(np.float64)[0])

    assert value(f.max_code) == f.max
    if f.inf_code is not None:
        assert value(f.inf_code) == np.inf
    if f.nan_code is not None:
        assert np.isnan(value(f.nan_code))


def test_package_only_formats():
    tf = nk.format_info("tfloat32")
    assert (tf.ebits, tf.mbits, tf.bias, tf.bits) == (8, 10, 127, 19)
    assert tf.max == (2 - 2**-10) * 2.0**127 and tf.container == np.float32
    assert nk.format_info("float32r").max == float(np.finfo(np.float32).max)
    x4 = nk.format_info("float4_e2m1fn_x4")
    assert (x4.container, x4.element, x4.lanes, x4.max) == (np.dtype(np.uint16), "float4_e2m1fn", 4, 6.0)
    assert nk.format_info("float8_e5m2_x4").container == np.uint32


def test_how_kernels_read_a_format_follows_its_row():
    # Which formats' items are float32 patterns, hold every float32 value, or are float64 values:
    # what the cast kernels ask of a row instead of naming formats. The oracle is the dtype the
    # format's arrays have and the values it holds (finfo).
    f32 = np.finfo(np.float32)
    for name, fmt in FORMATS.items():
        container = fmt.result_dtype if fmt.kind == "float" else None
        assert fmt.float32_items == (container == np.float32), name
        holds_all = (
            fmt.float32_items and fmt.max == float(f32.max) and fmt.smallest_subnormal == float(f32.smallest_subnormal)
        )
        assert fmt.float32_values == holds_all, name
        assert fmt.float64_items == (container == np.float64), name
    assert [n for n, f in FORMATS.items() if f.float32_values] == ["float32", "float32r"]


@pytest.mark.parametrize("name", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
def test_integer_formats(name):
    info = nk.format_info(name)
    ii = np.iinfo(name)
    assert (info.bits, info.max, info.min, info.kind) == (ii.bits, float(ii.max), float(ii.min), "int")


@pytest.mark.parametrize("spelling", [ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16), "bfloat16", "bf16", " BF16 "])
def test_normaliser_spellings(spelling):
    assert nk.as_dtype(spelling) == np.dtype(ml_dtypes.bfloat16)
    assert nk.canonical_name(spelling) == "bfloat16"


def test_normaliser_numpy_spellings():
    assert nk.as_dtype("f4") == np.float32
    assert nk.as_dtype(">f4") == np.dtype("float32")  # byte order is not part of the format
    assert nk.as_dtype(np.float16) == np.float16
    assert nk.canonical_name(float) == "float64"


def test_package_dtype_objects():
    tf = nk.as_dtype("tf32")
    assert isinstance(tf, nk.NKDType)
    assert tf == "tfloat32" and tf.name == "tfloat32" and tf.itemsize == 4
    assert nk.as_dtype(tf) is tf and hash(tf) == hash(nk.as_dtype("tfloat32"))
    assert "tfloat32" in repr(tf)
    assert tf != nk.as_dtype("float32r")


def test_unknown_name_lists_close_matches():
    with pytest.raises(TypeError, match=r"unknown dtype 'float8_e4m3f'.*'float8_e4m3fn'"):
        nk.as_dtype("float8_e4m3f")


def test_non_dtype_object():
    with pytest.raises(TypeError, match="not a dtype"):
        nk.as_dtype(object())


@pytest.mark.parametrize("t", [np.complex64, bool, object, "U3", "datetime64[s]"])
def test_format_info_rejects_non_numeric(t):
    with pytest.raises(TypeError, match="unsupported dtype"):
        nk.format_info(t)


def test_get_format_rejects_int4():
    with pytest.raises(TypeError, match="unsupported dtype"):
        get_format(ml_dtypes.int4)
