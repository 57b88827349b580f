"""quantize_mx, dequantize_mx, fake_quantize_mx, BlockArray and load_blocks against bad input: wrong types,
bad values and options, bad out= arrays, inconsistent MXArrays, 0-d and empty arrays, odd layouts, Python
values, non-finite data and corrupt, truncated or inconsistent files.

Each case ends in the right answer (checked against numpy, the slow references of ``tests/reference_mx.py``
or the same call on a native, C-contiguous copy) or in a clear exception: ``TypeError`` for a wrong type,
``ValueError`` for a bad value, ``FileNotFoundError`` for a missing file, with a message naming the problem.
Cases that may crash or hang the interpreter run in a subprocess (two at a time, in the background; see
``isolated`` in ``helpers.py``). The bad-input tests of cast() are in ``test_cast_bad_input.py``, those of
the command line in ``test_cli_bad_input.py``.
"""

import io
import zipfile

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels import MX_FORMATS, BlockArray, BlockLayout

from .helpers import (
    BAD_OUTS,
    BASE,
    BF16,
    EXACT,
    F32,
    GOOD_OUTS,
    LAYOUTS,
    META,
    MISSING,
    NONFINITE,
    WRONG_DTYPES,
    WRONG_IDS,
    X_MX,
    assert_raised,
    assert_same_bits,
    assert_same_mx,
    bits,
    isolated,
    kw_id,
    meta_bytes,
    meta_with,
    ml_cast,
    mx8_exact,
    native,
    outcome_of,
    write_mx,
)
from .reference_mx import dequantize_mx_ref, quantize_mx_ref

#: The cases run in a subprocess: name -> (body, timeout in seconds).
ISOLATED: dict[str, tuple[str, float]] = {}

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
MX8_EXACT = mx8_exact()
MX_CALLS = {"quantize_mx": nk.quantize_mx, "fake_quantize_mx": nk.fake_quantize_mx}

#: The code every element of a block holding a NaN or an infinity gets (spec: the element format's
#: positive NaN code, or 0 where it has none).
SPECIAL_CODE = {"mxfp8_e4m3": 0x7F, "mxfp8_e5m2": 0x7E, "mxfp6_e2m3": 0, "mxfp6_e3m2": 0, "mxfp4_e2m1": 0, "mxint8": 0}


# ---- out= --------------------------------------------------------------------------------------

OUT_CALLS = {
    "dequantize_mx": (lambda out: nk.dequantize_mx(MX8_EXACT, out=out), np.dtype(F32), lambda: EXACT),
    "dequantize_bf16": (
        lambda out: nk.dequantize_mx(MX8_EXACT, "bfloat16", out=out),
        BF16,
        lambda: ml_cast(EXACT, "bfloat16"),
    ),
    "BlockArray.dequantize": (
        lambda out: MX8_EXACT.dequantize(np.float64, out=out),
        np.dtype(np.float64),
        lambda: EXACT.astype(np.float64),
    ),
    "fake_quantize_mx": (
        lambda out: nk.fake_quantize_mx(EXACT, "mxfp8_e4m3", block_size=8, out=out),
        np.dtype(F32),
        lambda: EXACT,
    ),
}


@pytest.mark.parametrize("call", list(OUT_CALLS))
@pytest.mark.parametrize("make, error, pattern", [b[1:] for b in BAD_OUTS], ids=[b[0] for b in BAD_OUTS])
def test_bad_out(call, make, error, pattern):
    """A wrong out= is refused before anything is written."""
    fn, dtype, _ = OUT_CALLS[call]
    with pytest.raises(error, match=pattern):
        fn(make(dtype))


@pytest.mark.parametrize("call", list(OUT_CALLS))
@pytest.mark.parametrize("layout", list(GOOD_OUTS))
def test_out_any_layout(call, layout):
    """A strided, negative-stride or Fortran out= receives the right values and is returned."""
    fn, dtype, want = OUT_CALLS[call]
    out = GOOD_OUTS[layout](dtype)
    assert fn(out) is out
    assert_same_bits(np.ascontiguousarray(out), want())


def test_out_overlapping_input():
    """out= sharing memory with the input, in whole or in part, is refused; so is dequantize_mx into an array
    that holds the codes it reads."""
    buf = np.zeros(80, F32)
    buf[:64] = EXACT.reshape(-1)
    with pytest.raises(ValueError, match="out overlaps the input"):
        nk.fake_quantize_mx(buf[:64].reshape(2, 32), "mxfp8_e4m3", out=buf[16:].reshape(2, 32))
    out = np.zeros((2, 32), F32)
    codes = out.view(np.uint8)[:, :32]
    codes[...] = MX8_EXACT.codes
    mx = BlockArray(codes, MX8_EXACT.scales, BlockLayout("mxfp8_e4m3", (2, 32), 1, 8, 1, False))
    with pytest.raises(ValueError, match="out overlaps the input"):
        nk.dequantize_mx(mx, out=out)


MATRIX_OUT = {
    "dequantize_bf16": ("BF16", 'nk.dequantize_mx(MX8, "bfloat16", out=out)'),
    "dequantize_f32": ("np.float32", "nk.dequantize_mx(MX8, out=out)"),
    "fake_quantize": ("np.float32", "nk.fake_quantize_mx(EXACT, block_size=8, out=out)"),
}
for _name, (_dtype, _call) in MATRIX_OUT.items():
    isolated(
        ISOLATED,
        f"matrix_out_{_name}",
        f"""
        out = np.asmatrix(np.zeros((2, 32), {_dtype}))

        def call():
            result = np.asarray({_call})
            return result.view(f"u{{result.itemsize}}").tolist()

        report(call)
    """,
    )


@pytest.mark.parametrize(
    "call, want",
    [
        ("dequantize_bf16", lambda: ml_cast(EXACT, "bfloat16")),
        ("dequantize_f32", lambda: EXACT),
        ("fake_quantize", lambda: EXACT),
    ],
    ids=list(MATRIX_OUT),
)
def test_out_ndarray_subclass(isolated_runs, call, want):
    """An np.matrix out= (an ndarray subclass of the right shape and dtype) gets the right values, or is refused
    with a TypeError/ValueError naming out; it never corrupts memory."""
    outcome = outcome_of(isolated_runs, f"matrix_out_{call}")
    if "raised" in outcome:
        assert {"TypeError", "ValueError"} & set(outcome["raised"]) and "out" in outcome["message"], outcome
        return
    np.testing.assert_array_equal(np.array(outcome["value"]), bits(want()))


# ---- dtypes, names, options --------------------------------------------------------------------

MX_WRONG_DTYPES = [
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint64,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e8m0fnu,
    *WRONG_DTYPES,
]
MX_WRONG_IDS = ["int8", "int16", "int32", "int64", "uint8", "uint64", "float8_e4m3fn", "e8m0", *WRONG_IDS]


@pytest.mark.parametrize("call", list(MX_CALLS))
@pytest.mark.parametrize("dtype", MX_WRONG_DTYPES, ids=MX_WRONG_IDS)
def test_mx_refuses_input_dtype(call, dtype):
    """Only float32/16/64 and bfloat16 arrays are quantised; anything else is a TypeError naming the dtype."""
    x = np.zeros((2, 32), dtype)
    with pytest.raises(
        TypeError,
        match=r"block quantisation takes float32, float16, bfloat16 or float64 arrays; "
        r"got dtype",
    ):
        MX_CALLS[call](x)


MX_BAD_OPTIONS = [
    ({"fmt": "mxfp9"}, ValueError, "unknown MX format 'mxfp9'; accepted: mxfp8_e4m3"),
    ({"fmt": "MXFP8_E4M3"}, ValueError, "unknown MX format"),
    ({"fmt": "float8_e4m3fn"}, ValueError, "unknown MX format 'float8_e4m3fn'"),
    ({"fmt": ""}, ValueError, "unknown MX format ''"),
    ({"fmt": None}, (TypeError, ValueError), "MX format None"),
    ({"fmt": 3}, (TypeError, ValueError), "MX format 3"),
    ({"scale_mode": "round"}, ValueError, "unknown scale mode 'round'; accepted: floor, ceil, even, rceil, neuron"),
    ({"scale_mode": "FLOOR"}, ValueError, "unknown scale mode"),
    ({"scale_mode": None}, (TypeError, ValueError), "scale mode None"),
    ({"rounding": "toward_positive"}, ValueError, "unknown rounding mode 'toward_positive'"),
    ({"rounding": "even"}, ValueError, "unknown rounding mode 'even'"),
    ({"rounding": None}, (TypeError, ValueError), "rounding mode None"),
    ({"block_size": 0}, ValueError, "block_size must be a positive int, got 0"),
    ({"block_size": -1}, ValueError, "block_size must be a positive int, got -1"),
    ({"block_size": 1.5}, TypeError, "block_size must be a positive int, got 1.5"),
    ({"block_size": np.float64(8)}, TypeError, "block_size must be a positive int"),
    ({"block_size": True}, TypeError, "block_size must be a positive int, got True"),
    ({"block_size": "32"}, TypeError, "block_size must be a positive int, got '32'"),
    ({"block_size": None}, TypeError, "block_size must be a positive int, got None"),
    ({"axis": 2}, ValueError, "axis 2 is out of range for an array of 2 dimensions"),
    ({"axis": -3}, ValueError, "axis -3 is out of range"),
    ({"axis": 10**20}, ValueError, "is out of range"),
    ({"axis": 1.0}, TypeError, "axis must be an int, got 1.0"),
    ({"axis": "0"}, TypeError, "axis must be an int, got '0'"),
    ({"axis": None}, TypeError, "axis must be an int, got None"),
    ({"axis": True}, TypeError, "axis must be an int, got True"),
    ({"seed": -1, "rounding": "stochastic"}, ValueError, "seed"),
    ({"seed": 1.5, "rounding": "stochastic"}, TypeError, "seed"),
    ({"seed": "7", "rounding": "stochastic"}, TypeError, "seed"),
    ({"seed": True, "rounding": "stochastic"}, TypeError, "seed"),
]


@pytest.mark.parametrize("call", list(MX_CALLS))
@pytest.mark.parametrize("kwargs, error, pattern", MX_BAD_OPTIONS, ids=[kw_id(c[0]) for c in MX_BAD_OPTIONS])
def test_mx_bad_options(call, kwargs, error, pattern):
    """Unknown names and out-of-range numbers are a ValueError, wrong types a TypeError, each naming the option."""
    with pytest.raises(error, match=pattern):
        MX_CALLS[call](np.ones((2, 32), F32), **kwargs)


@pytest.mark.parametrize("pack", ["no", 1.5])
def test_mx_pack_must_be_a_bool(pack):
    """pack= is a flag: anything but a bool is a TypeError (as cast's saturate=), not silently truthy."""
    with pytest.raises(TypeError, match="pack"):
        nk.quantize_mx(EXACT, "mxfp4_e2m1", pack=pack)


MX_EQUIVALENT_OPTIONS = [
    ({"block_size": np.int64(8)}, {"block_size": 8}),
    ({"block_size": np.uint8(8)}, {"block_size": 8}),
    ({"block_size": 10**12}, {"block_size": 40}),
    ({"axis": np.int64(0)}, {"axis": 0}),
    ({"axis": np.int8(-2)}, {"axis": 0}),
    ({"seed": np.int64(9), "rounding": "stochastic"}, {"seed": 9, "rounding": "stochastic"}),
]


@pytest.mark.parametrize("call", list(MX_CALLS))
@pytest.mark.parametrize("kwargs, same_as", MX_EQUIVALENT_OPTIONS, ids=[kw_id(c[0]) for c in MX_EQUIVALENT_OPTIONS])
def test_mx_numpy_and_huge_options(call, kwargs, same_as):
    """numpy integers are integers; a block larger than the axis is one partial block."""
    got, want = MX_CALLS[call](X_MX, "mxfp4_e2m1", **kwargs), MX_CALLS[call](X_MX, "mxfp4_e2m1", **same_as)
    if call == "quantize_mx":
        assert_same_bits(got.codes, want.codes)
        assert_same_bits(got.scales.view(np.uint8), want.scales.view(np.uint8))
        assert_same_bits(got.dequantize(), want.dequantize())
    else:
        assert_same_bits(got, want)


@pytest.mark.parametrize("block_size", [2**63 - 1, 2**63, 2**64, 10**20], ids=["2^63-1", "2^63", "2^64", "10^20"])
def test_quantize_block_size_beyond_int64(block_size):
    """A block size no array can fill is either one block per row (the right answer) or a ValueError naming
    block_size; never an OverflowError or a numba typing error."""
    try:
        mx = nk.quantize_mx(X_MX, "mxint8", block_size=block_size)
    except ValueError as exc:
        assert "block_size" in str(exc), exc
        return
    want = nk.quantize_mx(X_MX, "mxint8", block_size=40)
    assert_same_bits(mx.codes, want.codes)
    assert_same_bits(mx.scales.view(np.uint8), want.scales.view(np.uint8))
    assert_same_bits(mx.dequantize(), want.dequantize())


# ---- dequantize_mx: arguments and inconsistent MXArrays ------------------------------------------


@pytest.mark.parametrize(
    "dtype, error, pattern",
    [
        (np.int32, TypeError, "writes float32, float64, float16 or bfloat16; got int32"),
        ("float8_e4m3fn", TypeError, "got float8_e4m3fn"),
        ("tfloat32", TypeError, "got tfloat32"),
        (np.complex64, TypeError, "unsupported dtype"),
        ("bogus", TypeError, "unknown dtype 'bogus'"),
        (None, TypeError, "None"),
    ],
)
def test_dequantize_bad_dtype(dtype, error, pattern):
    """The result dtype must be one of the four float types; None is not a dtype."""
    with pytest.raises(error, match=pattern):
        MX8_EXACT.dequantize(dtype)


@pytest.mark.parametrize("dtype", [">f4", "<f4", ">f8", np.float16, "bfloat16"])
def test_dequantize_dtype_spellings(dtype):
    """Any spelling of the four float types gives the exact values."""
    got = MX8_EXACT.dequantize(dtype)
    np.testing.assert_array_equal(got.astype(F32), EXACT)


@pytest.mark.parametrize("obj", [EXACT, None, [1.0, 2.0], MX8_EXACT.codes], ids=["array", "None", "list", "codes"])
def test_dequantize_needs_an_mxarray(obj):
    """dequantize_mx of anything but an BlockArray is a TypeError."""
    with pytest.raises(TypeError, match="dequantize_mx takes an MX BlockArray"):
        nk.dequantize_mx(obj)


def test_dequantize_strided_parts():
    """An BlockArray over strided codes and plain uint8 scale bytes dequantises to the same values."""
    wide = np.zeros((2, 64), np.uint8)
    wide[:, ::2] = MX8_EXACT.codes
    mx = BlockArray(wide[:, ::2], MX8_EXACT.scales.view(np.uint8), BlockLayout("mxfp8_e4m3", (2, 32), 1, 8, 1, False))
    np.testing.assert_array_equal(mx.dequantize(), EXACT)


INCONSISTENT = {
    "codes_too_short": (
        "BlockArray(MX8.codes[:, :4], MX8.scales, BlockLayout('mxfp8_e4m3', (2, 32), 1, 8, 1, False))",
        "codes",
    ),
    "scales_too_short": (
        "BlockArray(MX8.codes, MX8.scales[:, :1], BlockLayout('mxfp8_e4m3', (2, 32), 1, 8, 1, False))",
        "scales",
    ),
    "no_scales": (
        "BlockArray(MX8.codes, MX8.scales[:, :0], BlockLayout('mxfp8_e4m3', (2, 32), 1, 8, 1, False))",
        "scales",
    ),
    "shape_too_big": (
        "BlockArray(MX8.codes, MX8.scales, BlockLayout('mxfp8_e4m3', (2, 10**6), 1, 8, 1, False))",
        "codes|scales|shape",
    ),
    "block_size_0": (
        "BlockArray(MX8.codes, MX8.scales, BlockLayout('mxfp8_e4m3', (2, 32), 1, 0, 1, False))",
        "block_size",
    ),
    "packed_fp8": ("BlockArray(MX8.codes, MX8.scales, BlockLayout('mxfp8_e4m3', (2, 32), 1, 8, 1, True))", "packed"),
    "fp4_not_packed": (
        "BlockArray(MX4.codes, MX4.scales, BlockLayout('mxfp4_e2m1', (2, 32), 1, 8, 1, False))",
        "codes|packed",
    ),
    "fp4_codes_unpacked_flagged_packed": (
        "BlockArray(MX4.unpacked_codes(), MX4.scales, BlockLayout('mxfp4_e2m1', (2, 32), 1, 8, 1, True))",
        "codes|packed",
    ),
    "codes_float32": (
        "BlockArray(MX8.codes.astype(np.float32), MX8.scales, BlockLayout('mxfp8_e4m3', (2, 32), 1, 8, 1, False))",
        "codes",
        (TypeError, ValueError),
    ),
}
for _name, (_expr, *_) in INCONSISTENT.items():
    isolated(ISOLATED, f"inconsistent_{_name}", f"report(lambda: ({_expr}).dequantize().view(np.uint32).tolist())")
isolated(
    ISOLATED,
    "inconsistent_unpacked_codes",
    "report(lambda: BlockArray(MX4.codes[:, :2], MX4.scales, BlockLayout('mxfp4_e2m1', (2, 32), 1, 8, 1, True))"
    ".unpacked_codes().tolist())",
)


@pytest.mark.parametrize("case", [*INCONSISTENT, "unpacked_codes"])
def test_inconsistent_mxarray_is_refused(isolated_runs, case):
    """An BlockArray whose codes/scales do not fit its metadata is refused when it is made (a ValueError
    naming the part; a TypeError also for codes of a wrong dtype), never read out of bounds."""
    _, pattern, *errors = INCONSISTENT.get(case, (None, "codes"))
    assert_raised(outcome_of(isolated_runs, f"inconsistent_{case}"), errors[0] if errors else (ValueError,), pattern)


@pytest.mark.parametrize(
    "make, pattern",
    [
        (
            lambda: BlockArray(MX8_EXACT.codes, MX8_EXACT.scales, BlockLayout("mxfp9", (2, 32), 1, 8, 1, False)),
            "unknown block format 'mxfp9'",
        ),
        (
            lambda: BlockArray(MX8_EXACT.codes, MX8_EXACT.scales, BlockLayout("mxfp8_e4m3", (2, 32), 5, 8, 1, False)),
            "axis",
        ),
        (
            lambda: BlockArray(
                MX8_EXACT.codes.tolist(), MX8_EXACT.scales, BlockLayout("mxfp8_e4m3", (2, 32), 1, 8, 1, False)
            ),
            "codes",
        ),
    ],
    ids=["fmt", "axis", "codes_list"],
)
def test_mxarray_bad_fields(make, pattern):
    """A hand-built BlockArray with a bad field is a TypeError/ValueError naming the field, not a KeyError,
    IndexError or AttributeError."""
    with pytest.raises((TypeError, ValueError), match=pattern):
        make().dequantize()


def test_to_x4_of_inconsistent_mxarray():
    """An BlockArray with short codes cannot be made, so to_x4 never sees one."""
    with pytest.raises(ValueError, match="codes"):
        BlockArray(
            MX8_EXACT.codes[:, :4].copy(), MX8_EXACT.scales, BlockLayout("mxfp8_e4m3", (2, 32), 1, 8, 1, False)
        ).to_x4()


# ---- 0-d and empty arrays -------------------------------------------------------------------------


@pytest.mark.parametrize("call", list(MX_CALLS))
@pytest.mark.parametrize(
    "x",
    [np.float32(1.0), np.array(2.0, F32), np.array(2.0, ">f2"), 1.5],
    ids=["np_scalar", "0d", "0d_big_endian", "python_float"],
)
def test_mx_0d_is_refused(call, x):
    """MX blocks run along an axis: a 0-d input is a ValueError saying so."""
    with pytest.raises(ValueError, match="cannot quantise a 0-d array"):
        MX_CALLS[call](x)


EMPTY = [
    ((0,), 0),
    ((0, 5), 0),
    ((0, 5), 1),
    ((3, 0), 0),
    ((3, 0), 1),
    ((0, 0), 0),
    ((0, 0), 1),
    ((2, 0, 4), 0),
    ((2, 0, 4), 1),
    ((2, 0, 4), 2),
    ((2, 0, 4), -1),
]


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1"])
@pytest.mark.parametrize("shape, axis", EMPTY, ids=[f"{s}-axis{a}" for s, a in EMPTY])
def test_mx_empty(tmp_path, fmt, shape, axis):
    """Empty arrays along any axis: codes and scales of the documented shapes, empty results, a file round trip."""
    x = np.zeros(shape, F32)
    mx = nk.quantize_mx(x, fmt, axis=axis, block_size=3)
    ax = axis % len(shape)
    n = shape[ax]
    codes_shape = list(shape)
    codes_shape[ax] = (n + 1) // 2 if fmt == "mxfp4_e2m1" else n
    scales_shape = list(shape)
    scales_shape[ax] = -(-n // 3)
    assert (mx.shape, mx.axis, mx.codes.shape, mx.scales.shape) == (shape, ax, tuple(codes_shape), tuple(scales_shape))
    assert mx.codes.dtype == np.uint8 and mx.scales.dtype == E8M0
    for dtype in (F32, np.float64, np.float16, BF16):
        dq = mx.dequantize(dtype)
        assert dq.shape == shape and dq.dtype == np.dtype(dtype)
        out = np.empty(shape, dtype)
        assert mx.dequantize(dtype, out=out) is out
    fq = nk.fake_quantize_mx(x, fmt, axis=axis, block_size=3, out=np.empty(shape, F32))
    assert fq.shape == shape and fq.dtype == F32
    nk.save_blocks(tmp_path / "e.npz", mx)
    assert_same_mx(nk.load_blocks(tmp_path / "e.npz"), mx)


# ---- strides and byte order ---------------------------------------------------------------------


MX_LAYOUT_CASES = [
    *[
        (layout, fmt, kwargs)
        for layout in LAYOUTS
        if "float16" not in layout and "float64" not in layout
        for fmt, kwargs in (
            ("mxfp4_e2m1", {"block_size": 5}),
            ("mxint8", {"block_size": 7, "rounding": "stochastic", "seed": 4}),
            ("mxfp8_e4m3", {"block_size": 32, "scale_mode": "rceil"}),
        )
    ],
    *[(layout, "mxfp4_e2m1", {"block_size": 5}) for layout in LAYOUTS if "float16" in layout or "float64" in layout],
]


@pytest.mark.parametrize("layout, fmt, kwargs", MX_LAYOUT_CASES, ids=[f"{c[0]}-{c[1]}" for c in MX_LAYOUT_CASES])
def test_mx_layouts(layout, fmt, kwargs):
    """quantize_mx and fake_quantize_mx of strided, negative-stride and big-endian inputs, along each axis,
    equal the calls on a native C-contiguous copy."""
    x = LAYOUTS[layout](BASE)
    for axis in range(x.ndim):
        assert_same_mx(nk.quantize_mx(x, fmt, axis=axis, **kwargs), nk.quantize_mx(native(x), fmt, axis=axis, **kwargs))
        assert_same_bits(
            nk.fake_quantize_mx(x, fmt, axis=axis, **kwargs), nk.fake_quantize_mx(native(x), fmt, axis=axis, **kwargs)
        )


# ---- Python scalars and lists --------------------------------------------------------------------


@pytest.mark.parametrize("call", list(MX_CALLS))
@pytest.mark.parametrize(
    "value",
    [[1.0, 2.0, -3.5], [[0.1] * 33, [-2.0] * 33], [[[1.0, 1e-3]], [[1e3, -0.0]]]],
    ids=["list", "nested", "nested3"],
)
def test_mx_python_lists(call, value):
    """Lists of Python floats are quantised like the float64 array they make."""
    got, want = MX_CALLS[call](value, "mxfp6_e3m2"), MX_CALLS[call](np.asarray(value), "mxfp6_e3m2")
    if call == "quantize_mx":
        assert_same_mx(got, want)
    else:
        assert_same_bits(got, want)


@pytest.mark.parametrize("call", list(MX_CALLS))
def test_mx_python_ints_are_integers(call):
    """A list of Python ints makes an int64 array, which MX refuses like any integer array."""
    with pytest.raises(TypeError, match="got dtype int64"):
        MX_CALLS[call]([1, 2, 3])


# ---- NaN and infinities ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(MX_FORMATS))
@pytest.mark.parametrize("case", list(NONFINITE))
def test_mx_nonfinite(fmt, case):
    """Blocks holding a NaN or an infinity get scale byte 0xff and the format's NaN code (or 0) in every element,
    and dequantise to NaN; the other blocks are ordinary (all as the slow reference says)."""
    x = NONFINITE[case]
    mx = nk.quantize_mx(x, fmt, pack=False)
    codes, scales = quantize_mx_ref(x, fmt, 32, "floor")
    assert_same_bits(mx.codes, codes)
    assert_same_bits(mx.scales.view(np.uint8), scales)
    special = np.array([not np.all(np.isfinite(x[i : i + 32])) for i in range(0, x.size, 32)])
    assert np.all(scales[special] == 0xFF)
    per_element = np.repeat(special, 32)[: x.size]
    assert np.all(codes[per_element] == SPECIAL_CODE[fmt])
    dq = mx.dequantize()
    assert np.all(np.isnan(dq[per_element])) and np.all(np.isfinite(dq[~per_element]))
    np.testing.assert_array_equal(dq, dequantize_mx_ref(codes, scales, fmt, 32))
    assert_same_bits(nk.fake_quantize_mx(x, fmt), dq)
    for dtype in (np.float64, np.float16, BF16):
        np.testing.assert_array_equal(mx.dequantize(dtype).astype(np.float64), dq.astype(np.float64))


@pytest.mark.parametrize(
    "scale_mode, rounding",
    [
        *[(m, "nearest_even") for m in ("floor", "ceil", "even", "rceil", "neuron")],
        *[("floor", r) for r in ("nearest_away", "toward_zero", "stochastic")],
    ],
)
def test_mx_nonfinite_every_mode(scale_mode, rounding):
    """No scale mode or rounding changes the special-block rule: every format under every scale
    mode; the other roundings (their kernels compiled for this test alone, a minute each for all
    formats) on an 8-bit and a 4-bit format."""
    formats = MX_FORMATS if rounding == "nearest_even" else ("mxfp8_e4m3", "mxfp4_e2m1")
    for fmt in formats:
        for case in ("all_nan", "all_neg_inf", "mixed"):
            x = NONFINITE[case]
            mx = nk.quantize_mx(x, fmt, scale_mode=scale_mode, rounding=rounding, seed=1)
            assert np.all(mx.scales.view(np.uint8) == 0xFF), (fmt, case)
            assert np.all(mx.unpacked_codes() == SPECIAL_CODE[fmt]), (fmt, case)
            assert np.all(np.isnan(mx.dequantize()))
            assert np.all(np.isnan(nk.fake_quantize_mx(x, fmt, scale_mode=scale_mode, rounding=rounding, seed=1)))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, BF16, ">f4"])
def test_mx_nonfinite_other_input_dtypes(dtype):
    """NaN and infinities in float64, float16, bfloat16 and big-endian inputs behave as in float32, along axis 0."""
    x = NONFINITE["some_blocks"][:96].reshape(16, 6)
    with np.errstate(all="ignore"):
        xd = x.astype(dtype)
    assert_same_mx(
        nk.quantize_mx(xd, "mxfp4_e2m1", axis=0, block_size=5), nk.quantize_mx(x, "mxfp4_e2m1", axis=0, block_size=5)
    )
    assert_same_bits(
        nk.fake_quantize_mx(xd, "mxfp4_e2m1", axis=0, block_size=5),
        nk.fake_quantize_mx(x, "mxfp4_e2m1", axis=0, block_size=5),
    )


# ---- load_blocks: corrupt, truncated and inconsistent files ---------------------------------------


META_CASES = [
    ("version_0", meta_with(version=0), {}, "block file version 0 is not supported"),
    ("version_9", meta_with(version=9), {}, "block file version 9 is not supported"),
    ("version_str", meta_with(version="1"), {}, r"version '1' is not supported"),
    ("version_null", meta_with(version=None), {}, "version None is not supported"),
    ("version_true", meta_with(version=True), {}, "version True is not supported"),
    ("version_missing", meta_with(version=MISSING), {}, "corrupt block file metadata.*version"),
    ("fmt_unknown", meta_with(fmt="mxfp9"), {}, "unknown block format 'mxfp9'"),
    ("fmt_null", meta_with(fmt=None), {}, "unknown block format None"),
    ("fmt_int", meta_with(fmt=3), {}, "unknown block format 3"),
    ("fmt_upper", meta_with(fmt="MXFP8_E4M3"), {}, "unknown block format 'MXFP8_E4M3'"),
    ("fmt_missing", meta_with(fmt=MISSING), {}, "corrupt block file metadata.*fmt"),
    ("fmt_codes_out_of_range", meta_with(fmt="mxfp6_e2m3"), {}, "codes"),
    ("block_size_0", meta_with(block_size=0), {}, "invalid block_size 0"),
    ("block_size_negative", meta_with(block_size=-1), {}, "invalid block_size -1"),
    ("block_size_float", meta_with(block_size=1.5), {}, "invalid block_size 1.5"),
    ("block_size_true", meta_with(block_size=True), {}, "invalid block_size True"),
    ("block_size_str", meta_with(block_size="8"), {}, "invalid block_size '8'"),
    ("block_size_null", meta_with(block_size=None), {}, "invalid block_size None"),
    ("block_size_inconsistent", meta_with(block_size=16), {}, r"scales must be e8m0 bytes of shape \(2, 2\)"),
    ("block_size_missing", meta_with(block_size=MISSING), {}, "corrupt block file metadata.*block_size"),
    ("axis_2", meta_with(axis=2), {}, r"invalid axis 2 for shape \(2, 32\)"),
    ("axis_negative", meta_with(axis=-1), {}, "invalid axis -1"),
    ("axis_float", meta_with(axis=1.0), {}, "invalid axis 1.0"),
    ("axis_true", meta_with(axis=True), {}, "invalid axis True"),
    ("axis_str", meta_with(axis="1"), {}, "invalid axis '1'"),
    ("axis_null", meta_with(axis=None), {}, "invalid axis None"),
    ("axis_inconsistent", meta_with(axis=0), {}, "scales must be|codes must be"),
    ("axis_missing", meta_with(axis=MISSING), {}, "corrupt block file metadata.*axis"),
    ("shape_short", meta_with(shape=[2]), {}, "invalid axis 1 for shape|invalid shape"),
    ("shape_inconsistent", meta_with(shape=[2, 31]), {}, r"codes must be uint8 of shape \(2, 31\)"),
    ("shape_long", meta_with(shape=[2, 32, 1]), {}, "codes must be"),
    ("shape_empty", meta_with(shape=[]), {}, r"invalid shape \(\)"),
    ("shape_negative", meta_with(shape=[2, -32]), {}, "invalid shape"),
    ("shape_floats", meta_with(shape=[2.0, 32.0]), {}, "invalid shape"),
    ("shape_str", meta_with(shape="ab"), {}, "invalid shape"),
    ("shape_int", meta_with(shape=5), {}, "corrupt block file metadata|invalid shape"),
    ("shape_null", meta_with(shape=None), {}, "corrupt block file metadata|invalid shape"),
    (
        "shape_bool",
        meta_with(shape=[True, 32]),
        {"codes": MX8_EXACT.codes[:1], "scales": MX8_EXACT.scales.view(np.uint8)[:1]},
        "invalid shape",
    ),
    ("shape_missing", meta_with(shape=MISSING), {}, "corrupt block file metadata.*shape"),
    ("packed_fp8", meta_with(packed=True), {}, "invalid packed flag True for mxfp8_e4m3"),
    ("packed_null", meta_with(packed=None), {}, "invalid packed flag None"),
    ("packed_int", meta_with(packed=1), {}, "invalid packed flag 1"),
    ("packed_str", meta_with(packed="false"), {}, "invalid packed flag 'false'"),
    ("packed_missing", meta_with(packed=MISSING), {}, "corrupt block file metadata.*packed"),
]


@pytest.mark.parametrize("meta, members, pattern", [c[1:] for c in META_CASES], ids=[c[0] for c in META_CASES])
def test_load_bad_metadata(tmp_path, meta, members, pattern):
    """Each metadata field wrong in each way: a ValueError naming the file and the field."""
    path = write_mx(tmp_path / "bad.npz", meta=meta, **members)
    with pytest.raises(ValueError, match=pattern) as info:
        nk.load_blocks(path)
    assert "bad.npz" in str(info.value)


@pytest.mark.parametrize(
    "raw",
    [b"[1, 2]", b'"hello"', b"3", b"null", b"\xff\xfe", b"", b"{not json", b'{"version": 1'],
    ids=["list", "string", "number", "null", "not_utf8", "empty", "not_json", "cut_json"],
)
def test_load_metadata_not_an_object(tmp_path, raw):
    """Metadata that is not a JSON object is 'corrupt block file metadata'."""
    path = write_mx(tmp_path / "bad.npz", raw_meta=raw)
    with pytest.raises(ValueError, match="corrupt block file metadata"):
        nk.load_blocks(path)


MEMBER_CASES = [
    ("codes_int8", {"codes": MX8_EXACT.codes.view(np.int8)}, r"codes must be uint8 of shape \(2, 32\)"),
    ("codes_uint16", {"codes": MX8_EXACT.codes.astype(np.uint16)}, "codes must be uint8"),
    ("codes_float32", {"codes": MX8_EXACT.codes.astype(F32)}, "codes must be uint8"),
    ("codes_bool", {"codes": MX8_EXACT.codes.astype(bool)}, "codes must be uint8"),
    ("codes_short", {"codes": MX8_EXACT.codes[:, :31]}, "codes must be uint8"),
    ("codes_transposed", {"codes": np.ascontiguousarray(MX8_EXACT.codes.T)}, "codes must be uint8"),
    ("codes_0d", {"codes": np.uint8(3)}, "codes must be uint8"),
    ("codes_object", {"codes": np.array([None] * 64).reshape(2, 32)}, "Python objects"),
    ("scales_uint16", {"scales": MX8_EXACT.scales.view(np.uint8).astype(np.uint16)}, "scales must be e8m0 bytes"),
    ("scales_int8", {"scales": MX8_EXACT.scales.view(np.int8)}, "scales must be e8m0 bytes"),
    ("scales_bool", {"scales": MX8_EXACT.scales.view(np.uint8).astype(bool)}, "scales must be e8m0 bytes"),
    ("scales_float32", {"scales": MX8_EXACT.scales.view(np.uint8).astype(F32)}, "scales must be e8m0 bytes"),
    (
        "scales_short",
        {"scales": MX8_EXACT.scales.view(np.uint8)[:, :3]},
        r"scales must be e8m0 bytes of shape \(2, 4\)",
    ),
]


@pytest.mark.parametrize("members, pattern", [c[1:] for c in MEMBER_CASES], ids=[c[0] for c in MEMBER_CASES])
def test_load_bad_members(tmp_path, members, pattern):
    """codes/scales of the wrong dtype or shape: a ValueError saying what they must be."""
    path = write_mx(tmp_path / "bad.npz", **members)
    with pytest.raises(ValueError, match=pattern):
        nk.load_blocks(path)


def test_load_npz_without_mx_members(tmp_path):
    """A valid .npz that is not a block file says which members it has and which it needs."""
    np.savez(tmp_path / "a.npz", codes=MX8_EXACT.codes, scales=MX8_EXACT.scales.view(np.uint8))
    with pytest.raises(ValueError, match=r"not a block file \(it has \['codes', 'scales'\]; expected codes"):
        nk.load_blocks(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", w=EXACT)
    with pytest.raises(ValueError, match="not a block file"):
        nk.load_blocks(tmp_path / "b.npz")
    zipfile.ZipFile(tmp_path / "c.npz", "w").close()
    with pytest.raises(ValueError, match="holds no arrays"):
        nk.load_blocks(tmp_path / "c.npz")


@pytest.mark.parametrize("variant", ["fortran_codes", "compressed", "extra_member", "extra_meta_key", "scales_e8m0"])
def test_load_unusual_but_valid_files(tmp_path, variant):
    """Files that differ from what save writes but hold a consistent array load to the right values."""
    path = tmp_path / "ok.npz"
    if variant == "fortran_codes":
        write_mx(path, codes=np.asfortranarray(MX8_EXACT.codes))
    elif variant == "compressed":
        np.savez_compressed(
            path, codes=MX8_EXACT.codes, scales=MX8_EXACT.scales.view(np.uint8), meta=meta_bytes(**META)
        )
    elif variant == "extra_member":
        write_mx(path, other=np.zeros(3))
    elif variant == "extra_meta_key":
        write_mx(path, meta={**META, "comment": "x"})
    else:
        write_mx(path, scales=MX8_EXACT.scales)
    mx = nk.load_blocks(path)
    assert_same_mx(mx, MX8_EXACT)
    np.testing.assert_array_equal(mx.dequantize(), EXACT)


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mx") / "good.npz"
    nk.save_blocks(path, MX8_EXACT)
    return path.read_bytes()


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999])
def test_load_truncated_zip(tmp_path, good_file, fraction):
    """A saved file cut anywhere is a ValueError naming it ('cannot read')."""
    path = tmp_path / "cut.npz"
    path.write_bytes(good_file[: int(len(good_file) * fraction)])
    with pytest.raises(ValueError, match=r"cut\.npz: cannot read a block file"):
        nk.load_blocks(path)


def test_load_good_file_byte_for_byte(tmp_path, good_file):
    """The untouched file loads (the truncation cases start from a good file)."""
    (tmp_path / "g.npz").write_bytes(good_file)
    assert_same_mx(nk.load_blocks(tmp_path / "g.npz"), MX8_EXACT)


@pytest.mark.parametrize("head", [b"", b"PK\x03\x04", b"\x93NUMPY"], ids=["random", "zip_magic", "npy_magic"])
def test_load_random_bytes(tmp_path, head):
    """Random bytes, with or without a plausible magic number, are a ValueError ('cannot read')."""
    path = tmp_path / "junk.npz"
    path.write_bytes(head + np.random.default_rng(0).bytes(700))
    with pytest.raises(ValueError, match=r"junk\.npz: cannot read"):
        nk.load_blocks(path)


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_load_truncated_member(tmp_path, compression):
    """A zip whose codes member is shorter than its header says is a ValueError naming the file and member."""
    path = tmp_path / "short_member.npz"
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("meta.npy", _npy_bytes(meta_bytes(**META)))
        z.writestr("codes.npy", _npy_bytes(MX8_EXACT.codes)[:-10])
        z.writestr("scales.npy", _npy_bytes(MX8_EXACT.scales.view(np.uint8)))
    with pytest.raises(ValueError, match=r"short_member\.npz\[codes\].*truncated|short_member\.npz.*codes"):
        nk.load_blocks(path)


@pytest.mark.parametrize("where", ["meta_header", "codes_header"])
def test_load_corrupt_member_header(tmp_path, good_file, where):
    """Garbage over a member's .npy header is a ValueError naming the file."""
    data = bytearray(good_file)
    offset = data.index(b"\x93NUMPY", 0 if where == "meta_header" else data.index(b"codes.npy"))
    data[offset + 2 : offset + 12] = b"\x00" * 10
    path = tmp_path / "hdr.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"hdr\.npz"):
        nk.load_blocks(path)


def test_load_paths(tmp_path, good_file):
    """Missing files, folders, other suffixes and non-paths."""
    with pytest.raises(FileNotFoundError, match=r"missing\.npz: no such file"):
        nk.load_blocks(tmp_path / "missing.npz")
    (tmp_path / "folder.npz").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        nk.load_blocks(tmp_path / "folder.npz")
    np.save(tmp_path / "x.npy", EXACT)
    with pytest.raises(ValueError, match=r"a block file is a \.npz file"):
        nk.load_blocks(tmp_path / "x.npy")
    for bad in (None, 3, 1.5):
        with pytest.raises(TypeError):
            nk.load_blocks(bad)


def test_load_names(tmp_path):
    """name= picks one array of a file of several; a wrong name lists the ones there are."""
    two = tmp_path / "two.npz"
    np.savez(
        two,
        **{
            f"{n}/{part}": v
            for n in ("a", "b")
            for part, v in (
                ("codes", MX8_EXACT.codes),
                ("scales", MX8_EXACT.scales.view(np.uint8)),
                ("meta", meta_bytes(**META)),
            )
        },
    )
    assert_same_mx(nk.load_blocks(two, name="b"), MX8_EXACT)
    with pytest.raises(ValueError, match=r"holds 2 block arrays; pick one with name= \(a, b\)"):
        nk.load_blocks(two)
    with pytest.raises(ValueError, match="has no block array named 'c'; it has a, b"):
        nk.load_blocks(two, name="c")


def test_load_name_of_a_single_array_file(tmp_path):
    """name= on a file of one unnamed array says so, rather than listing 'None'."""
    one = tmp_path / "one.npz"
    nk.save_blocks(one, MX8_EXACT)
    with pytest.raises(ValueError, match="has no block array named 'w'") as info:
        nk.load_blocks(one, name="w")
    assert "it has None" not in str(info.value), info.value


# ---- last, so that its subprocess has had its time -------------------------------------------------


isolated(
    ISOLATED,
    "fake_quantize_block_2^63-1",
    """
    x = (np.random.default_rng(1).standard_normal((6, 40)) * 4).astype(np.float32)
    report(lambda: nk.fake_quantize_mx(x, "mxint8", block_size=2**63 - 1).view(np.uint32).tolist())
""",
    timeout=90,  # a hang never ends; a cold compile on a busy machine can take tens of seconds
)


def test_fake_quantize_block_size_near_int64_max(isolated_runs):
    """fake_quantize_mx with block_size 2^63 - 1 along the last axis: one block per row, or a ValueError; it
    must not hang."""
    outcome = outcome_of(isolated_runs, "fake_quantize_block_2^63-1")
    if "raised" in outcome:
        assert_raised(outcome, (ValueError,), "block_size")
        return
    want = nk.fake_quantize_mx(X_MX, "mxint8", block_size=40)
    np.testing.assert_array_equal(np.array(outcome["value"], np.uint32), bits(want))
