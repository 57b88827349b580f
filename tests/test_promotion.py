"""Tests for the promotion layer (promote_type and friends), against docs/promotion.md.

The grid below is the whole 25x25 promotion table, derived from the spec's rules:

* floats x floats: the e8m0 guard first (e8m0 with e8m0 -> e8m0; e8m0 with any other float -> the
  other float), then wider itemsize wins, then on equal itemsize the ladder
  f64 > f32r > f32 > bf16 > f16 > e4m3 > e4m3fn > e5m2; no rung -> no-path error (`-`);
* floats x ints (either order): the float;
* ints x ints: same signedness -> wider (tie: t0); mixed -> the signed one if strictly wider,
  else int16 (for uint8) / int32 (for uint16), else float32 (uint32 / uint64).

Rows are t0, columns are t1.
"""
# ruff: noqa: E501

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels import (
    NoPromotionPathError,
    as_dtype,
    can_merge_type,
    explain_promotion,
    get_x1_from_x4,
    get_x4_from_x1,
    is_floating,
    is_x4_dtype,
    launder_x4_dtype,
    merge_type,
    promote_type,
    promotion_table,
)

# fmt: off
PROMOTION_GRID = r"""
t0\t1    f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i8       i16      i32      i64      u8       u16      u32      u64
f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64      f64
f32r     f64      f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r     f32r
f32      f64      f32r     f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32      f32
tf32     f64      f32r     f32      -        tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32     tf32
bf16     f64      f32r     f32      tf32     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16     bf16
f16      f64      f32r     f32      tf32     bf16     f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16      f16
e4m3     f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3     e4m3
e4m3fn   f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn   e4m3fn
e4m3fnuz f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        e4m3fnuz e4m3fnuz e4m3fnuz e4m3fnuz e4m3fnuz e4m3fnuz e4m3fnuz e4m3fnuz e4m3fnuz
e4m3b11  f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        e4m3b11  e4m3b11  e4m3b11  e4m3b11  e4m3b11  e4m3b11  e4m3b11  e4m3b11  e4m3b11
e5m2     f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2     e5m2
e5m2fnuz f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        e5m2fnuz e5m2fnuz e5m2fnuz e5m2fnuz e5m2fnuz e5m2fnuz e5m2fnuz e5m2fnuz e5m2fnuz
e3m4     f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        e3m4     e3m4     e3m4     e3m4     e3m4     e3m4     e3m4     e3m4     e3m4
f6e2m3   f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        f6e2m3   f6e2m3   f6e2m3   f6e2m3   f6e2m3   f6e2m3   f6e2m3   f6e2m3   f6e2m3
f6e3m2   f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        f6e3m2   f6e3m2   f6e3m2   f6e3m2   f6e3m2   f6e3m2   f6e3m2   f6e3m2   f6e3m2
f4e2m1   f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   -        -        e5m2     -        -        -        -        -        f4e2m1   f4e2m1   f4e2m1   f4e2m1   f4e2m1   f4e2m1   f4e2m1   f4e2m1   f4e2m1
e8m0     f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     e8m0     e8m0     e8m0     e8m0     e8m0     e8m0     e8m0     e8m0
i8       f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i8       i16      i32      i64      i16      i32      f32      f32
i16      f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i16      i16      i32      i64      i16      i32      f32      f32
i32      f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i32      i32      i32      i64      i32      i32      f32      f32
i64      f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i64      i64      i64      i64      i64      i64      i64      f32
u8       f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i16      i16      i32      i64      u8       u16      u32      u64
u16      f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     i32      i32      i32      i64      u16      u16      u32      u64
u32      f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     f32      f32      f32      i64      u32      u32      u32      u64
u64      f64      f32r     f32      tf32     bf16     f16      e4m3     e4m3fn   e4m3fnuz e4m3b11  e5m2     e5m2fnuz e3m4     f6e2m3   f6e3m2   f4e2m1   e8m0     f32      f32      f32      f32      u64      u64      u64      u64
"""
# fmt: on

NO_PATH = "-"

#: Short grid label -> canonical dtype name.
LABELS = {
    "f64": "float64",
    "f32r": "float32r",
    "f32": "float32",
    "tf32": "tfloat32",
    "bf16": "bfloat16",
    "f16": "float16",
    "e4m3": "float8_e4m3",
    "e4m3fn": "float8_e4m3fn",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e4m3b11": "float8_e4m3b11fnuz",
    "e5m2": "float8_e5m2",
    "e5m2fnuz": "float8_e5m2fnuz",
    "e3m4": "float8_e3m4",
    "f6e2m3": "float6_e2m3fn",
    "f6e3m2": "float6_e3m2fn",
    "f4e2m1": "float4_e2m1fn",
    "e8m0": "float8_e8m0fnu",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
}


def parse_grid(text: str) -> tuple[list[str], dict[tuple[str, str], str | None]]:
    """Parse the ASCII grid into (ordered canonical names, {(t0, t1): result name or None})."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    columns = [LABELS[label] for label in lines[0].split()[1:]]
    cells: dict[tuple[str, str], str | None] = {}
    rows = []
    for line in lines[1:]:
        label, *entries = line.split()
        t0 = LABELS[label]
        rows.append(t0)
        assert len(entries) == len(columns), f"row {label!r} has {len(entries)} cells"
        for t1, entry in zip(columns, entries, strict=True):
            cells[t0, t1] = None if entry == NO_PATH else LABELS[entry]
    assert rows == columns, "the grid must list the same dtypes, in the same order, on both axes"
    return columns, cells


GRID_DTYPES, GRID = parse_grid(PROMOTION_GRID)

NUMPY_NAMES = {
    "float64",
    "float32",
    "float16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
}
PACKAGE_ONLY_NAMES = {"float32r", "tfloat32"}
INT_NAMES = [n for n in GRID_DTYPES if n.startswith(("int", "uint"))]
FLOAT_NAMES = [n for n in GRID_DTYPES if n not in INT_NAMES]
E8M0 = "float8_e8m0fnu"
NO_RUNG_NAMES = [
    "tfloat32",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2fnuz",
    "float8_e3m4",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
]

X4_ELEMENT = {
    "float8_e4m3fn_x4": "float8_e4m3fn",
    "float8_e5m2_x4": "float8_e5m2",
    "float4_e2m1fn_x4": "float4_e2m1fn",
}


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype for a name numpy or ml_dtypes has (independent of the package)."""
    if name in NUMPY_NAMES:
        return np.dtype(name)
    return np.dtype(getattr(ml_dtypes, name))


def scalar_type(name: str) -> type:
    """The numpy / ml_dtypes scalar type for a name (np.float16, ml_dtypes.bfloat16, ...)."""
    if name in NUMPY_NAMES:
        return getattr(np, name)
    return getattr(ml_dtypes, name)


def assert_is(result, name: str) -> None:
    """``result`` is the dtype called ``name`` (and equals numpy's dtype when numpy has it)."""
    assert result.name == name, f"got {result!r}, expected {name}"
    if name not in PACKAGE_ONLY_NAMES:
        assert result == np_dtype(name)


def assert_no_path(excinfo, t0: str, t1: str) -> None:
    message = str(excinfo.value)
    assert message.startswith("No available implicit dtype promotion path"), message
    assert t0 in message and t1 in message, message


# --------------------------------------------------------------------------------------------
# The grid itself
# --------------------------------------------------------------------------------------------


def test_grid_covers_every_dtype():
    assert len(GRID_DTYPES) == 25
    assert set(GRID_DTYPES) == set(LABELS.values())
    assert len(GRID) == 25 * 25


@pytest.mark.parametrize(("t0", "t1"), sorted(GRID, key=lambda k: (GRID_DTYPES.index(k[0]), GRID_DTYPES.index(k[1]))))
def test_grid_cell(t0, t1):
    expected = GRID[t0, t1]
    if expected is None:
        with pytest.raises(NoPromotionPathError) as excinfo:
            promote_type(t0, t1)
        assert_no_path(excinfo, t0, t1)
        assert isinstance(explain_promotion(t0, t1).error, NoPromotionPathError)
    else:
        assert_is(promote_type(t0, t1), expected)
        explained = explain_promotion(t0, t1)
        assert explained.error is None
        assert_is(explained.result, expected)


def test_no_path_error_is_a_type_error():
    assert issubclass(NoPromotionPathError, TypeError)
    with pytest.raises(TypeError):
        promote_type("float4_e2m1fn", "float8_e3m4")


# --------------------------------------------------------------------------------------------
# The spec's example rows, equal operands, the e8m0 guard
# --------------------------------------------------------------------------------------------

SPEC_EXAMPLES = [
    ("float32", "float32r", "float32r"),
    ("bfloat16", "float16", "bfloat16"),
    ("float8_e5m2", "float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e8m0fnu", "float4_e2m1fn", "float4_e2m1fn"),
    ("float4_e2m1fn", "float8_e4m3", "float8_e4m3"),
    ("float16", "int64", "float16"),
    ("uint8", "int8", "int16"),
    ("uint64", "int8", "float32"),
    ("int64", "uint32", "int64"),
]


@pytest.mark.parametrize(("t0", "t1", "expected"), SPEC_EXAMPLES)
def test_spec_example(t0, t1, expected):
    assert_is(promote_type(t0, t1), expected)


def test_spec_example_float4_with_itself_has_no_path():
    with pytest.raises(NoPromotionPathError) as excinfo:
        promote_type("float4_e2m1fn", "float4_e2m1fn")
    assert_no_path(excinfo, "float4_e2m1fn", "float4_e2m1fn")


def test_spec_example_bool_with_int8():
    with pytest.raises(TypeError, match=r"^unexpected dtype: "):
        promote_type("bool", "int8")


def test_float16_with_int64_is_numpy_float16():
    assert promote_type("float16", "int64") == np.dtype("float16")


@pytest.mark.parametrize("name", [n for n in GRID_DTYPES if n not in NO_RUNG_NAMES])
def test_equal_operands_give_themselves(name):
    assert_is(promote_type(name, name), name)


@pytest.mark.parametrize("name", NO_RUNG_NAMES)
def test_equal_operands_without_a_rung_have_no_path(name):
    with pytest.raises(NoPromotionPathError) as excinfo:
        promote_type(name, name)
    assert_no_path(excinfo, name, name)


@pytest.mark.parametrize("other", [n for n in FLOAT_NAMES if n != E8M0])
def test_e8m0_guard_gives_the_other_float_in_both_orders(other):
    assert_is(promote_type(E8M0, other), other)
    assert_is(promote_type(other, E8M0), other)


def test_e8m0_with_itself():
    assert_is(promote_type(E8M0, E8M0), E8M0)


# --------------------------------------------------------------------------------------------
# Operands that are neither float nor integer
# --------------------------------------------------------------------------------------------

BAD_DTYPES = [
    np.dtype(bool),
    np.dtype(np.complex64),
    np.dtype(np.complex128),
    np.dtype(object),
    np.dtype(str),
    np.dtype("S4"),
    np.dtype("V8"),
    np.dtype("datetime64[ns]"),
]


@pytest.mark.parametrize("bad", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("integer", INT_NAMES)
def test_unexpected_dtype_against_ints(bad, integer):
    for t0, t1 in ((bad, integer), (integer, bad)):
        with pytest.raises(TypeError) as excinfo:
            promote_type(t0, t1)
        assert not isinstance(excinfo.value, NoPromotionPathError)
        message = str(excinfo.value)
        assert message.startswith("unexpected dtype: "), message
        assert repr(bad) in message, message


@pytest.mark.parametrize("name", ["bool", "complex64", "object"])
def test_unexpected_dtype_given_as_a_string(name):
    with pytest.raises(TypeError) as excinfo:
        promote_type(name, "int32")
    message = str(excinfo.value)
    assert message.startswith("unexpected dtype: ")
    assert repr(np.dtype(name)) in message


def test_unexpected_dtype_checks_t0_first():
    first, second = np.dtype(bool), np.dtype(np.complex128)
    with pytest.raises(TypeError) as excinfo:
        promote_type(first, second)
    message = str(excinfo.value)
    assert message.startswith("unexpected dtype: ")
    assert repr(first) in message and repr(second) not in message
    with pytest.raises(TypeError) as excinfo:
        promote_type(second, first)
    message = str(excinfo.value)
    assert repr(second) in message and repr(first) not in message


# The bad-input matrix: every kind of non-numeric operand, and float operands that win whatever the other is.


@pytest.mark.parametrize(
    "t0, t1",
    [
        (np.complex64, "int8"),
        ("int8", object),
        ("U3", "int8"),
        ("int8", "S3"),
        (bool, "int8"),
        ("int8", [("a", "f4")]),
        ("V4", "uint16"),
        ("datetime64[s]", "int8"),
        ("timedelta64[s]", "int8"),
        ("int32", "timedelta64"),
        (np.complex64, np.complex64),
        (bool, bool),
    ],
    ids=[
        "complex",
        "object",
        "unicode",
        "bytes",
        "bool",
        "structured",
        "void",
        "datetime64",
        "timedelta64",
        "timedelta64_second",
        "complex_pair",
        "bool_pair",
    ],
)
def test_promote_unexpected_dtypes(t0, t1):
    """Neither operand floating and one not an integer: TypeError('unexpected dtype: ...'); timedelta64 is no
    integer type of the compiler's."""
    with pytest.raises(TypeError, match="unexpected dtype"):
        promote_type(t0, t1)


@pytest.mark.parametrize(
    "t0, t1, want",
    [
        (np.complex64, "float32", np.float32),
        ("bfloat16", bool, np_dtype("bfloat16")),
        ("float16", object, np.float16),
        (">f2", "int8", np.float16),
        (">i2", "<u1", np.int16),
        (np.dtype(">f4"), "bfloat16", np.float32),
        (float, "int8", np.float64),
        (" bf16 ", "int64", np_dtype("bfloat16")),
    ],
)
def test_promote_documented_answers(t0, t1, want):
    """The float operand wins without the other being inspected (README rule 2); byte order does not matter."""
    got = promote_type(t0, t1)
    assert got == np.dtype(want) and got.isnative


# --------------------------------------------------------------------------------------------
# Input spellings
# --------------------------------------------------------------------------------------------


def _spellings(name: str) -> list[tuple[str, object]]:
    forms: list[tuple[str, object]] = [("name", name), ("object", as_dtype(name))]
    if name not in PACKAGE_ONLY_NAMES:
        forms += [("np.dtype", np_dtype(name)), ("scalar type", scalar_type(name))]
    return forms


SPELLING_CASES = [(name, kind, value) for name in GRID_DTYPES for kind, value in _spellings(name)]


@pytest.mark.parametrize(("name", "kind", "value"), SPELLING_CASES, ids=[f"{n}-{k}" for n, k, _ in SPELLING_CASES])
def test_every_spelling_gives_the_same_answer(name, kind, value):
    for other in GRID_DTYPES:
        for t0, t1, key in ((value, other, (name, other)), (other, value, (other, name))):
            expected = GRID[key]
            if expected is None:
                with pytest.raises(NoPromotionPathError):
                    promote_type(t0, t1)
            else:
                assert_is(promote_type(t0, t1), expected)


def test_ml_dtypes_and_numpy_scalar_types():
    assert promote_type(ml_dtypes.bfloat16, np.float16) == np.dtype(ml_dtypes.bfloat16)
    assert promote_type(np.float16, ml_dtypes.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert promote_type(np.uint8, np.int8) == np.dtype(np.int16)
    assert promote_type(ml_dtypes.float8_e8m0fnu, ml_dtypes.float4_e2m1fn) == np.dtype(ml_dtypes.float4_e2m1fn)


@pytest.mark.parametrize("position", [0, 1])
def test_unknown_name_raises_type_error_naming_close_names(position):
    args = ["float9", "float32"] if position == 0 else ["float32", "float9"]
    with pytest.raises(TypeError) as excinfo:
        promote_type(*args)
    message = str(excinfo.value)
    assert "float9" in message
    assert re.search(r"float(16|32|64|8_)", message), message


@pytest.mark.parametrize(
    "t0, t1, error, pattern",
    [
        ("bogus", "int8", TypeError, "unknown dtype 'bogus'"),
        ("int8", "", TypeError, "unknown dtype ''"),
        ("FLOAT32", "int8", TypeError, "Did you mean 'float32'"),
        (5, "int8", TypeError, "not a dtype: 5"),
        ("int8", 3.5, TypeError, "not a dtype: 3.5"),
        (None, "int8", TypeError, "None"),
        ("float32", None, TypeError, "None"),
        ("float8_e4m3fn_x4", "float32", TypeError, "launder it first"),
        ("float4_e2m1fn", "float4_e2m1fn", NoPromotionPathError, "No available implicit dtype promotion path"),
    ],
)
def test_promote_bad_names(t0, t1, error, pattern):
    """Unknown names, non-dtypes (None included) and packed containers are TypeErrors naming the operand."""
    with pytest.raises(error, match=pattern):
        promote_type(t0, t1)


# --------------------------------------------------------------------------------------------
# Packed *_x4 types
# --------------------------------------------------------------------------------------------

X4_NAMES = list(X4_ELEMENT)


@pytest.mark.parametrize("x4", X4_NAMES)
def test_is_x4_dtype_true_for_x4(x4):
    assert is_x4_dtype(x4) is True
    assert is_x4_dtype(as_dtype(x4)) is True


@pytest.mark.parametrize("name", GRID_DTYPES)
def test_is_x4_dtype_false_for_scalars(name):
    assert is_x4_dtype(name) is False
    assert is_x4_dtype(as_dtype(name)) is False


@pytest.mark.parametrize("x4", X4_NAMES)
def test_get_x1_from_x4(x4):
    element = X4_ELEMENT[x4]
    assert_is(get_x1_from_x4(x4), element)
    assert_is(get_x1_from_x4(as_dtype(x4)), element)


@pytest.mark.parametrize("name", GRID_DTYPES)
def test_get_x1_from_x4_rejects_non_x4(name):
    with pytest.raises(TypeError):
        get_x1_from_x4(name)


@pytest.mark.parametrize("x4", X4_NAMES)
def test_get_x4_from_x1(x4):
    element = X4_ELEMENT[x4]
    for form in (element, np_dtype(element), getattr(ml_dtypes, element)):
        packed = get_x4_from_x1(form)
        assert packed.name == x4
        assert is_x4_dtype(packed)
        assert_is(get_x1_from_x4(packed), element)


@pytest.mark.parametrize("name", [n for n in GRID_DTYPES if n not in X4_ELEMENT.values()])
def test_get_x4_from_x1_rejects_types_without_an_x4_form(name):
    with pytest.raises(TypeError):
        get_x4_from_x1(name)


@pytest.mark.parametrize("x4", X4_NAMES)
def test_launder_x4_dtype_strips_the_container(x4):
    assert_is(launder_x4_dtype(x4), X4_ELEMENT[x4])
    assert_is(launder_x4_dtype(as_dtype(x4)), X4_ELEMENT[x4])


@pytest.mark.parametrize("name", GRID_DTYPES)
def test_launder_x4_dtype_leaves_scalars_alone(name):
    dtype = as_dtype(name)
    laundered = launder_x4_dtype(dtype)
    assert laundered == dtype
    assert laundered.name == name


@pytest.mark.parametrize("x4", X4_NAMES)
@pytest.mark.parametrize(
    "other", ["float32", "bfloat16", "float8_e4m3fn", "int8", "uint32", "float8_e4m3fn_x4", "float4_e2m1fn_x4"]
)
def test_promote_type_rejects_x4_operands(x4, other):
    for t0, t1 in ((x4, other), (other, x4), (as_dtype(x4), other), (other, as_dtype(x4))):
        with pytest.raises(TypeError) as excinfo:
            promote_type(t0, t1)
        assert "launder" in str(excinfo.value).lower(), str(excinfo.value)


# --------------------------------------------------------------------------------------------
# merge_type / can_merge_type
# --------------------------------------------------------------------------------------------


def _mergeable(t0: str, t1: str) -> bool:
    if t0 == t1:
        return True
    return t0 in INT_NAMES and t1 in INT_NAMES and np.dtype(t0).itemsize == np.dtype(t1).itemsize


@pytest.mark.parametrize("name", GRID_DTYPES)
def test_merge_type_equal_gives_t0(name):
    assert_is(merge_type(name, name), name)


@pytest.mark.parametrize(
    ("t0", "t1"),
    [
        ("int32", "uint32"),
        ("uint32", "int32"),
        ("int8", "uint8"),
        ("uint8", "int8"),
        ("int16", "uint16"),
        ("uint16", "int16"),
        ("int64", "uint64"),
        ("uint64", "int64"),
    ],
)
def test_merge_type_same_itemsize_integers_give_t0(t0, t1):
    assert_is(merge_type(t0, t1), t0)
    assert_is(merge_type(np.dtype(t0), np.dtype(t1)), t0)


@pytest.mark.parametrize(
    ("t0", "t1"),
    [
        ("int32", "int64"),
        ("uint8", "uint16"),
        ("int8", "uint16"),
        ("float32", "int32"),
        ("int32", "float32"),
        ("float16", "int16"),
        ("uint8", "float8_e4m3fn"),
        ("float8_e8m0fnu", "uint8"),
        ("float16", "bfloat16"),
        ("float32", "float32r"),
        ("float32", "tfloat32"),
        ("float8_e4m3fn", "float8_e5m2"),
        ("float64", "float32"),
    ],
)
def test_merge_type_otherwise_raises_assertion_error(t0, t1):
    with pytest.raises(AssertionError) as excinfo:
        merge_type(t0, t1)
    assert type(excinfo.value) is AssertionError
    assert str(excinfo.value) == "Cannot merge type!"


@pytest.mark.parametrize("t0", GRID_DTYPES)
def test_can_merge_type_over_the_grid(t0):
    for t1 in GRID_DTYPES:
        answer = can_merge_type(t0, t1)
        assert type(answer) is bool
        assert answer is _mergeable(t0, t1), (t0, t1)
        if answer:
            assert_is(merge_type(t0, t1), t0)
        else:
            with pytest.raises(AssertionError):
                merge_type(t0, t1)


# --------------------------------------------------------------------------------------------
# is_floating
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FLOAT_NAMES)
def test_is_floating_true_for_floats(name):
    for _kind, value in _spellings(name):
        assert is_floating(value)


@pytest.mark.parametrize("name", INT_NAMES)
def test_is_floating_false_for_ints(name):
    for _kind, value in _spellings(name):
        assert not is_floating(value)


@pytest.mark.parametrize(
    "value", [np.float16, np.float32, np.float64, np.longdouble, np.dtype("float32"), np.dtype(">f8")], ids=str
)
def test_is_floating_true_for_numpy_floats(value):
    assert is_floating(value)


@pytest.mark.parametrize("value", [bool, np.bool_, np.dtype(bool), np.dtype(np.complex64), np.dtype(object)], ids=str)
def test_is_floating_false_for_non_floats(value):
    assert not is_floating(value)


# --------------------------------------------------------------------------------------------
# explain_promotion and promotion_table
# --------------------------------------------------------------------------------------------

RULE_CASES = {
    "e8m0 guard": ("float8_e8m0fnu", "float4_e2m1fn"),
    "itemsize": ("float32", "bfloat16"),
    "ladder": ("float32", "float32r"),
    "no path": ("float4_e2m1fn", "float4_e2m1fn"),
}
INT_RULE_CASES = [("int8", "int32"), ("uint8", "uint64"), ("int64", "uint32"), ("uint8", "int8"), ("uint64", "int8")]


@pytest.mark.parametrize("pair", INT_RULE_CASES, ids=str)
def test_explain_promotion_rules_are_distinct(pair):
    cases = dict(RULE_CASES, integers=pair)
    rules = {}
    for label, (t0, t1) in cases.items():
        explained = explain_promotion(t0, t1)
        assert isinstance(explained.rule, str) and explained.rule, label
        assert isinstance(explained.reason, str) and explained.reason, label
        rules[label] = explained.rule
        if label == "no path":
            assert isinstance(explained.error, NoPromotionPathError)
        else:
            assert explained.error is None
            assert explained.result == promote_type(t0, t1)
            assert explained.result.name == promote_type(t0, t1).name
    assert len(set(rules.values())) == len(rules), rules


def test_promotion_table_has_every_row():
    table = promotion_table()
    assert isinstance(table, str)
    first_tokens = [line.split()[0] for line in table.splitlines() if line.split()]
    for label in LABELS:
        assert label in first_tokens, label
