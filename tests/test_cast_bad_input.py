"""cast() against bad input: wrong types, bad values and options, bad out= arrays, 0-d and empty arrays,
odd layouts, Python values and non-finite data.

Each case ends in the right answer (checked against ml_dtypes, numpy or the same call on a native,
C-contiguous copy) or in a clear exception: ``TypeError`` for a wrong type, ``ValueError`` for a bad
value, with a message naming the problem. A case that may crash the interpreter runs in a subprocess
(``isolated`` in ``helpers.py``). The bad-input tests of the other entry points: ``test_mx_bad_input.py``,
``test_cli_bad_input.py``, and the bad-input sections of ``test_promotion.py`` (promote_type) and
``test_registry.py`` (auto_cast).
"""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.formats import FORMATS

from .helpers import (
    BAD_OUTS,
    BASE,
    BF16,
    EXACT,
    F32,
    GOOD_OUTS,
    LAYOUTS,
    WRONG_DTYPES,
    WRONG_IDS,
    assert_same_bits,
    bits,
    isolated,
    kw_id,
    ml_cast,
    native,
    outcome_of,
)

#: The cases run in a subprocess: name -> (body, timeout in seconds).
ISOLATED: dict[str, tuple[str, float]] = {}


# ---- dtypes, names, options --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", WRONG_DTYPES, ids=WRONG_IDS)
def test_cast_refuses_source_dtype(dtype):
    """Non-numeric sources are a TypeError naming the dtype."""
    x = np.zeros(4, dtype)
    with pytest.raises(TypeError, match=r"cannot cast an array of dtype"):
        nk.cast(x, "bfloat16")


@pytest.mark.parametrize(
    "target, error, pattern",
    [
        *[(dt, TypeError, "unsupported dtype") for dt in WRONG_DTYPES],
        ("bogus", TypeError, "unknown dtype 'bogus'"),
        ("", TypeError, "unknown dtype ''"),
        ("FLOAT32", TypeError, "Did you mean 'float32'"),
        ("bfloat61", TypeError, "bfloat16"),
        (5, TypeError, "not a dtype: 5"),
        (3.5, TypeError, "not a dtype: 3.5"),
        (None, TypeError, "None"),
    ],
    ids=[*WRONG_IDS, "bogus", "empty", "upper", "typo", "int", "float", "None"],
)
def test_cast_refuses_target(target, error, pattern):
    """An unsupported or unknown target (None included) is a TypeError naming it."""
    with pytest.raises(error, match=pattern):
        nk.cast(np.zeros(4, F32), target)


CAST_BAD_OPTIONS = [
    ({"rounding": "nearest"}, ValueError, "unknown rounding mode 'nearest'; accepted: nearest_even"),
    ({"rounding": "NEAREST_EVEN"}, ValueError, "unknown rounding mode"),
    ({"rounding": None}, (TypeError, ValueError), "rounding mode None"),
    ({"rounding": 0}, (TypeError, ValueError), "rounding mode 0"),
    ({"saturate": "yes"}, TypeError, "saturate must be True or False"),
    ({"saturate": None}, TypeError, "saturate must be True or False"),
    ({"saturate": 1}, TypeError, "saturate must be True or False"),
    ({"seed": -1, "rounding": "stochastic"}, ValueError, "seed"),
    ({"seed": 1.5, "rounding": "stochastic"}, TypeError, "seed"),
    ({"seed": "7", "rounding": "stochastic"}, TypeError, "seed"),
    ({"seed": True, "rounding": "stochastic"}, TypeError, "seed"),
    ({"seed": [1], "rounding": "stochastic"}, TypeError, "seed"),
]


@pytest.mark.parametrize("kwargs, error, pattern", CAST_BAD_OPTIONS, ids=[kw_id(c[0]) for c in CAST_BAD_OPTIONS])
def test_cast_bad_options(kwargs, error, pattern):
    """Unknown modes are a ValueError; a seed or flag of the wrong type is a TypeError (as block_size/axis are)."""
    with pytest.raises(error, match=pattern):
        nk.cast(np.zeros(4, F32), "bfloat16", **kwargs)


@pytest.mark.parametrize("seed", [np.int64(5), np.uint64(5), np.int8(5)])
def test_cast_numpy_integer_seed(seed):
    """A numpy integer seed is the same seed as the Python int."""
    x = np.linspace(-3, 3, 301, dtype=F32)
    assert_same_bits(
        nk.cast(x, "float8_e5m2", rounding="stochastic", seed=seed),
        nk.cast(x, "float8_e5m2", rounding="stochastic", seed=5),
    )


@pytest.mark.parametrize("saturate", [np.bool_(True), np.bool_(False)])
def test_cast_numpy_bool_saturate(saturate):
    """numpy booleans are booleans."""
    x = np.array([1.0, 1e6, -1e6], F32)
    want = np.array([1.0, 448.0, -448.0], F32) if saturate else np.array([1.0, np.nan, np.nan], F32)
    np.testing.assert_array_equal(nk.cast(x, "float8_e4m3fn", saturate=saturate).astype(F32), want)


# ---- out= --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, error, pattern", [b[1:] for b in BAD_OUTS], ids=[b[0] for b in BAD_OUTS])
def test_bad_out(make, error, pattern):
    """A wrong out= is refused before anything is written."""
    with pytest.raises(error, match=pattern):
        nk.cast(EXACT, "bfloat16", out=make(BF16))


@pytest.mark.parametrize("layout", list(GOOD_OUTS))
def test_out_any_layout(layout):
    """A strided, negative-stride or Fortran out= receives the right values and is returned."""
    out = GOOD_OUTS[layout](BF16)
    assert nk.cast(EXACT, "bfloat16", out=out) is out
    assert_same_bits(np.ascontiguousarray(out), ml_cast(EXACT, "bfloat16"))


def test_out_overlapping_input():
    """out= sharing memory with the input, in whole or in part, is refused."""
    x = EXACT.copy()
    with pytest.raises(ValueError, match="out overlaps the input"):
        nk.cast(x, "bfloat16", out=x.view(BF16)[:, ::2])
    with pytest.raises(ValueError, match="out overlaps the input"):
        nk.cast(x, "float32", out=x[::-1])


isolated(
    ISOLATED,
    "matrix_out_cast",
    """
    out = np.asmatrix(np.zeros((2, 32), BF16))

    def call():
        result = np.asarray(nk.cast(EXACT, "bfloat16", out=out))
        return result.view(f"u{result.itemsize}").tolist()

    report(call)
""",
)


def test_out_ndarray_subclass(isolated_runs):
    """An np.matrix out= (an ndarray subclass of the right shape and dtype) gets the right values, or is refused
    with a TypeError/ValueError naming out; it never corrupts memory."""
    outcome = outcome_of(isolated_runs, "matrix_out_cast")
    if "raised" in outcome:
        assert {"TypeError", "ValueError"} & set(outcome["raised"]) and "out" in outcome["message"], outcome
        return
    np.testing.assert_array_equal(np.array(outcome["value"]), bits(ml_cast(EXACT, "bfloat16")))


# ---- 0-d and empty arrays -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [
        np.float32(1.5),
        np.array(-2.75, F32),
        np.array(3.0, ">f4"),
        np.float64(1e40),
        np.array(0.1, np.float16),
        np.int16(-300),
    ],
    ids=["np_scalar", "0d", "0d_big_endian", "float64_overflow", "float16", "int16"],
)
@pytest.mark.parametrize("target", ["bfloat16", "float8_e4m3fn", "float16"])
def test_cast_0d(x, target):
    """0-d inputs give 0-d results equal to ml_dtypes'."""
    got = nk.cast(x, target)
    assert got.shape == ()
    assert_same_bits(got, ml_cast(native(np.asarray(x)), target))
    out = np.empty((), got.dtype)
    assert nk.cast(x, target, out=out) is out
    assert_same_bits(out, got)


def test_cast_0d_to_packed_is_refused():
    """A 0-d array has no last axis to pack."""
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.cast(np.float32(1.0), "float8_e5m2_x4")


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0), (0, 0), (2, 0, 4)])
@pytest.mark.parametrize("target", ["bfloat16", "float8_e4m3fn_x4", "float16"])
def test_cast_empty(shape, target):
    """Empty arrays cast to empty results (packed: the last axis must still be a multiple of 4)."""
    x = np.zeros(shape, F32)
    if target.endswith("_x4"):
        if shape[-1] % 4:
            with pytest.raises(ValueError, match="multiple of 4"):
                nk.cast(x, target)
            return
        want_shape, want_dtype = shape[:-1] + (shape[-1] // 4,), np.dtype(np.uint32)
    else:
        want_shape, want_dtype = shape, ml_cast(x, target).dtype
    got = nk.cast(x, target)
    assert (got.shape, got.dtype) == (want_shape, want_dtype)
    assert nk.cast(x[..., ::-1] if x.ndim else x, target).shape == want_shape


# ---- strides and byte order ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    "target, kwargs",
    [
        ("bfloat16", {}),
        ("float8_e5m2", {"rounding": "stochastic", "seed": 3}),
        ("float4_e2m1fn", {"rounding": "toward_zero"}),
        ("float8_e4m3fn_x4", {"saturate": True}),
    ],
    ids=["bfloat16", "e5m2_stochastic", "fp4_toward_zero", "e4m3fn_x4"],
)
def test_cast_layouts(layout, target, kwargs):
    """Strided, negative-stride and big-endian inputs give the result of a native C-contiguous copy (the
    stochastic bits follow the C-order index)."""
    x = LAYOUTS[layout](BASE)
    assert_same_bits(nk.cast(x, target, **kwargs), nk.cast(native(x), target, **kwargs))


@pytest.mark.parametrize("dtype", [">i2", ">u2", ">i4", ">i8", ">u1"])
@pytest.mark.parametrize("target", ["bfloat16", "float8_e5m2", "int8", "float32"])
def test_cast_big_endian_integers(dtype, target):
    """Big-endian, reversed integer sources give the native result (integer targets wrap like numpy)."""
    x = np.arange(-40, 88, 3).astype(np.int64)
    x = (x if dtype[1] == "i" else np.abs(x)).astype(dtype)[::-1]
    got = nk.cast(x, target)
    assert_same_bits(got, nk.cast(native(x), target))
    if target in ("int8", "float32", "bfloat16"):
        assert_same_bits(got, ml_cast(native(x), target))


# ---- Python scalars and lists --------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [1.5, -3, 2**40, -0.0, 1e40, [[1.5, -2.0], [3.0, 1e40]], [[[1, 2.5]], [[3, -4]]], [1, 2, 3], [[]]],
    ids=["float", "int", "big_int", "neg_zero", "overflow", "nested", "nested3", "ints", "empty"],
)
@pytest.mark.parametrize("target", ["bfloat16", "float8_e4m3fn", "float16"])
def test_cast_python_values(value, target):
    """Python scalars and nested lists cast like the numpy array they make."""
    assert_same_bits(nk.cast(value, target), ml_cast(np.asarray(value), target))


@pytest.mark.parametrize(
    "value, error, pattern",
    [
        (2**70, TypeError, "cannot cast an array of dtype object"),
        (True, TypeError, "dtype bool"),
        (1j, TypeError, "dtype complex128"),
        ("1.5", TypeError, "dtype <U3"),
        (None, TypeError, "dtype object"),
        ([[1, 2], [3]], ValueError, "inhomogeneous"),
    ],
    ids=["int_beyond_int64", "bool", "complex", "str", "None", "ragged"],
)
def test_cast_python_values_refused(value, error, pattern):
    """Python values that make no numeric array are refused with the reason."""
    with pytest.raises(error, match=pattern):
        nk.cast(value, "bfloat16")


def test_cast_python_int_wraps_like_numpy():
    """Integer targets from Python ints wrap as numpy's astype does."""
    for v in (-2, 300, -129, 2**40 + 5):
        assert_same_bits(nk.cast(v, "int8"), np.asarray(v).astype(np.int8))


# ---- NaN and infinities ----------------------------------------------------------------------------

SPECIAL_VALUES = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.0, -0.0, np.nan, np.inf], F32)
#: Every registered cast from float32 to a narrower float that numpy or ml_dtypes also encodes (the oracle),
#: in each rounding mode it implements; e8m0, which has no infinities, has its own test below.
NONFINITE_CASES = [
    (rounding, k.target)
    for k in nk.supported_casts()
    if k.source == "float32"
    and FORMATS[k.target].kind == "float"
    and FORMATS[k.target].bits < 32
    and FORMATS[k.target].numpy_name is not None
    and FORMATS[k.target].specials != "e8m0"
    for rounding in sorted(k.roundings)
]


@pytest.mark.parametrize("rounding, target", NONFINITE_CASES, ids=[f"{r}-{t}" for r, t in NONFINITE_CASES])
def test_cast_nonfinite(target, rounding):
    """NaN and infinities encode as ml_dtypes does in every rounding mode; with saturate=True infinities become
    +-max and NaN stays NaN. A format without a sign bit has no -max: -inf stays NaN (docs/casts.md, "The two
    formats without a sign bit")."""
    want = ml_cast(SPECIAL_VALUES, target)
    assert_same_bits(nk.cast(SPECIAL_VALUES, target, rounding=rounding, seed=2), want)
    sat = nk.cast(SPECIAL_VALUES, target, rounding=rounding, seed=2, saturate=True).astype(np.float64)
    big = float(ml_dtypes.finfo(getattr(ml_dtypes, target, target)).max)
    expected = want.astype(np.float64)
    expected[[2, 7]] = big
    expected[3] = -big if FORMATS[target].signed else np.nan
    np.testing.assert_array_equal(sat, expected)
    whole = np.full((3, 40), np.nan, F32)
    assert_same_bits(nk.cast(whole, target, rounding=rounding, seed=2), ml_cast(whole, target))


def test_cast_nonfinite_e8m0():
    """e8m0 has only NaN (0xff): NaN and +inf give it; saturating, +inf gives 2^127 (0xfe)."""
    x = np.array([np.nan, np.inf, 1.0], F32)
    np.testing.assert_array_equal(nk.cast(x, "float8_e8m0fnu").view(np.uint8), [0xFF, 0xFF, 0x7F])
    np.testing.assert_array_equal(nk.cast(x, "float8_e8m0fnu", saturate=True).view(np.uint8), [0xFF, 0xFE, 0x7F])
