"""The dispatch registry and auto_cast: every promotion result resolves to a kernel; users'
kernels for new pairs and in place of the package's, registered before or after the first cast."""

import itertools
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels import registry
from neuron_kernels.formats import FORMATS
from neuron_kernels.neuron.promotion import grid_dtypes

from .helpers import BASE, BF16, F32, WRONG_DTYPES, WRONG_IDS, assert_same_bits, ml_cast, native
from .reference import pack_lanes, round_float32_to_mbits
from .reference_casts import encode_ref

X4 = [n for n, f in FORMATS.items() if f.kind == "packed"]
VALUE_TYPES = grid_dtypes()


def _plan(t0, t1):
    """The auto-cast plan of docs/promotion.md: launder, promote, restore x4 where it exists."""
    r = nk.promote_type(nk.launder_x4_dtype(t0), nk.launder_x4_dtype(t1))
    if nk.is_x4_dtype(t0) or nk.is_x4_dtype(t1):
        try:
            r = nk.get_x4_from_x1(r)
        except TypeError:
            pass
    return r


def _promotable_pairs():
    for t0, t1 in itertools.product(VALUE_TYPES + X4, repeat=2):
        try:
            yield t0, t1, _plan(t0, t1)
        except TypeError:
            continue


def test_every_promotion_result_has_a_kernel():
    missing = []
    for t0, t1, r in _promotable_pairs():
        for src in (t0, t1):
            try:
                nk.lookup_cast(src, r)
            except nk.UnsupportedCastError:
                missing.append((src, r.name))
    assert not missing


def test_package_kernels_are_builtin():
    kernels = nk.supported_casts()
    assert len(kernels) > 500 and all(k.builtin for k in kernels)
    assert nk.lookup_cast("float64", "bfloat16").builtin


def test_lookup_error_names_pair_and_targets():
    pattern = r"no cast from float32 to int8.*supported targets are: .*float8_e4m3fn"
    with pytest.raises(nk.UnsupportedCastError, match=pattern):
        nk.lookup_cast("float32", "int8")
    with pytest.raises(TypeError, match="unknown dtype"):
        nk.lookup_cast("float32", "nope")


# ---- users' kernels ---------------------------------------------------------------------------


def _before_or_after(order):
    """``after``: the package's kernels load (a first lookup) before the user registers."""
    assert not registry._loaded
    if order == "after":
        nk.lookup_cast("float32", "float16")
        assert registry._loaded


def truncate_to_bfloat16(src, dst, options, start):
    """A user's float32 -> bfloat16 kernel: drop the low 16 bits (round toward zero, NaN kept)."""
    dst.view(np.uint16)[...] = src.view(np.uint32) >> np.uint32(16)


def round_to_int8(src, dst, options, start):
    """A user's kernel for a pair the package does not have: float32 -> int8, saturating."""
    dst[...] = np.clip(np.rint(src), -128, 127)


ORDERS = ["before", "after"]


@pytest.mark.parametrize("order", ORDERS)
def test_user_kernel_replaces_a_pair(fresh_registry, order, rng):
    _before_or_after(order)
    fn = nk.register_cast("float32", ml_dtypes.bfloat16, roundings=("toward_zero",), replace=True)(truncate_to_bfloat16)
    assert fn is truncate_to_bfloat16
    k = nk.lookup_cast(np.float32, "bf16")
    assert (k.function, k.builtin, k.roundings, k.saturate) == (fn, False, {"toward_zero"}, False)
    x = rng.standard_normal((3, 50)).astype(np.float32)[:, ::2]  # non-contiguous too
    y = nk.cast(x, "bfloat16", rounding="toward_zero")
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint32) >> 16)
    with pytest.raises(NotImplementedError, match="rounding='nearest_even' is not implemented"):
        nk.cast(x, "bfloat16")  # only what the user's kernel declares reaches it
    with pytest.raises(NotImplementedError, match="saturate=True"):
        nk.cast(x, "bfloat16", rounding="toward_zero", saturate=True)
    # every other pair keeps the package's kernel
    assert nk.lookup_cast("float32", "float16").builtin
    assert nk.lookup_cast("bfloat16", "float32").builtin
    np.testing.assert_array_equal(nk.cast(x, "float16"), x.astype(np.float16))
    assert [k for k in nk.supported_casts() if not k.builtin] == [nk.lookup_cast("float32", "bfloat16")]


@pytest.mark.parametrize("order", ORDERS)
def test_user_kernel_for_a_new_pair(fresh_registry, order):
    _before_or_after(order)
    nk.register_cast("float32", "int8")(round_to_int8)
    x = np.array([[-300.0, -1.5, 0.4], [2.5, 126.6, 1e9]], np.float32)
    y = nk.cast(x, "int8")
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [[-128, -2, 0], [2, 127, 127]])
    assert nk.lookup_cast("float32", "bfloat16").builtin
    assert "int8" in {k.target for k in nk.supported_casts() if k.source == "float32"}


@pytest.mark.parametrize("order", ORDERS)
def test_register_an_existing_pair_is_refused_without_replace(fresh_registry, order):
    _before_or_after(order)
    with pytest.raises(ValueError, match="float32 -> bfloat16 is already registered; pass replace=True"):
        nk.register_cast("float32", "bfloat16")(truncate_to_bfloat16)
    assert nk.lookup_cast("float32", "bfloat16").builtin  # the refusal changed nothing
    assert len(nk.supported_casts()) > 500
    nk.register_cast("float32", "int8")(round_to_int8)
    with pytest.raises(ValueError, match="already registered"):  # a user's kernel is kept the same way
        nk.register_cast("float32", "int8")(round_to_int8)
    nk.register_cast("float32", "int8", replace=True)(truncate_to_bfloat16)
    assert nk.lookup_cast("float32", "int8").function is truncate_to_bfloat16


def test_register_refuses_bad_arguments(fresh_registry):
    with pytest.raises(ValueError, match="unknown rounding"):
        nk.register_cast("float32", "bfloat16", roundings=("up",))
    with pytest.raises(TypeError, match="unknown dtype"):
        nk.register_cast("float32", "bfloat17")
    with pytest.raises(TypeError, match=r"fn\(src, dst, options, start\)"):
        nk.register_cast("float32", "int8")("not a function")
    assert all(k.builtin for k in nk.supported_casts())


def test_user_kernel_first_in_a_new_process():
    """The reported sequence, as a user's program runs it: register before anything was cast."""
    code = textwrap.dedent("""
        import numpy as np, neuron_kernels as nk

        @nk.register_cast("float32", "bfloat16", replace=True)
        def zeros(src, dst, options, start):
            dst.view(np.uint16)[...] = 0

        x = np.float32([1.5, -2.0])
        assert (nk.cast(x, "bfloat16").view(np.uint16) == 0).all()
        assert nk.lookup_cast("float32", "float16").builtin
        assert not nk.lookup_cast("float32", "bfloat16").builtin
        print(len(nk.supported_casts()))
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(nk.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    # A process of its own: the kernel is registered before the process has cast anything.
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(nk.supported_casts())


def _sample(fmt_name, rng):
    """Values of a format: random float32 spread over binades, cast by ml_dtypes (an oracle)."""
    f = FORMATS[fmt_name]
    x = (rng.standard_normal(64) * np.exp2(rng.integers(-8, 8, 64))).astype(np.float32)
    if f.kind == "int":
        return rng.integers(np.iinfo(fmt_name).min // 2, np.iinfo(fmt_name).max // 2, 64, dtype=fmt_name, endpoint=True)
    if f.kind == "packed":
        element = np.dtype(getattr(ml_dtypes, f.element))
        codes = x.astype(element).view(np.uint8)
        return pack_lanes(codes, 8 * f.itemsize // 4, f.result_dtype.type)
    if fmt_name == "tfloat32":
        return round_float32_to_mbits(x, 10)
    if f.numpy_name is None:
        return x
    with np.errstate(over="ignore"):
        return x.astype(f.result_dtype)


def _values(arr, fmt_name):
    """Decode an array of a format to float64 values (independently of the package)."""
    f = FORMATS[fmt_name]
    if f.kind == "packed":
        lane = 8 * f.itemsize // 4
        codes = np.stack(
            [(arr.astype(np.uint64) >> np.uint64(lane * i)) & np.uint64((1 << lane) - 1) for i in range(4)], axis=-1
        ).reshape(arr.shape[:-1] + (-1,))
        return codes.astype(np.uint8).view(getattr(ml_dtypes, f.element)).astype(np.float64)
    return arr.astype(np.float64)


@pytest.mark.parametrize("src, dst", sorted({(s, r.name) for t0, t1, r in _promotable_pairs() for s in (t0, t1)}))
def test_promotion_casts_agree_with_ml_dtypes(src, dst, rng):
    x = _sample(src, rng)
    y = nk.auto_cast(x, np.zeros(0, FORMATS[dst].result_dtype), a_dtype=src, b_dtype=dst)[0] if src != dst else x
    t = FORMATS[dst]
    values = _values(x, src)
    with np.errstate(over="ignore", invalid="ignore"):
        if t.kind == "packed":
            element = np.dtype(getattr(ml_dtypes, t.element))
            expected = pack_lanes(
                values.astype(np.float32).astype(element).view(np.uint8), 8 * t.itemsize // 4, t.result_dtype.type
            )
        elif dst == "tfloat32":
            expected = round_float32_to_mbits(values.astype(np.float32), 10)
        elif dst == "float32r":
            expected = values.astype(np.float32)
        elif dst == "float8_e8m0fnu":  # ties to even (docs/casts.md), unlike ml_dtypes
            f32 = x.astype(np.float32) if src == "float64" or FORMATS[src].kind == "int" else values.astype(np.float32)
            expected = encode_ref(f32, dst).view(t.result_dtype)
        elif src == "float64" or FORMATS[src].kind == "int":
            expected = x.astype(t.result_dtype)  # ml_dtypes' own cast
        else:
            expected = values.astype(np.float32).astype(t.result_dtype)  # exact decode, one rounding
    assert y.dtype == expected.dtype and y.shape == expected.shape
    np.testing.assert_array_equal(y.view(f"u{y.dtype.itemsize}"), expected.view(f"u{y.dtype.itemsize}"))


def test_auto_cast_plain_arrays(rng):
    a = rng.standard_normal(8).astype(np.float16)
    b = rng.standard_normal(8).astype(ml_dtypes.bfloat16)
    ca, cb = nk.auto_cast(a, b)
    assert ca.dtype == cb.dtype == np.dtype(ml_dtypes.bfloat16)
    assert cb is b
    ia, ib = nk.auto_cast(np.arange(4, dtype=np.uint8), np.arange(4, dtype=np.int8))
    assert ia.dtype == ib.dtype == np.int16


def test_auto_cast_restores_x4(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    packed = nk.cast(x, "float8_e4m3fn_x4")
    a, b = nk.auto_cast(packed, x.astype(ml_dtypes.float8_e5m2), a_dtype="float8_e4m3fn_x4")
    assert a is packed
    assert b.dtype == np.uint32 and b.shape == (2, 2)
    expected = pack_lanes(x.astype(ml_dtypes.float8_e5m2).astype(ml_dtypes.float8_e4m3fn).view(np.uint8), 8, np.uint32)
    np.testing.assert_array_equal(b, expected)


def test_auto_cast_unpacks_when_result_has_no_x4_form(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    packed = nk.cast(x, "float4_e2m1fn_x4")
    a, b = nk.auto_cast(packed, x.astype(np.float16), a_dtype="float4_e2m1fn_x4")
    assert a.dtype == np.float16 and a.shape == (2, 8)
    np.testing.assert_array_equal(a, x.astype(ml_dtypes.float4_e2m1fn).astype(np.float16))


def test_auto_cast_errors():
    with pytest.raises(nk.NoPromotionPathError):
        nk.auto_cast(np.zeros(4, ml_dtypes.float4_e2m1fn), np.zeros(4, ml_dtypes.float4_e2m1fn))
    with pytest.raises(ValueError, match="declared float8_e4m3fn_x4"):
        nk.auto_cast(np.zeros(4, np.float32), np.zeros(4, np.float32), a_dtype="float8_e4m3fn_x4")
    with pytest.raises(TypeError, match="cannot cast an array of dtype complex"):
        nk.auto_cast(np.zeros(4, np.complex64), np.zeros(4, np.float32))


# ---- auto_cast against bad input: wrong dtypes, bad declared dtypes, 0-d and empty arrays, odd layouts,
# Python values (the bad-input tests of cast() are in test_cast_bad_input.py)


def test_auto_cast_0d_and_empty():
    """auto_cast keeps shapes, 0-d and empty included."""
    a, b = nk.auto_cast(np.float16(1.5), np.array(2, np.int8))
    assert (a.shape, a.dtype, float(a), b.shape, b.dtype, float(b)) == ((), np.float16, 1.5, (), np.float16, 2.0)
    a, b = nk.auto_cast(np.zeros((0, 5), np.float16), np.zeros((3, 0), BF16))
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((0, 5), BF16, (3, 0), BF16)


@pytest.mark.parametrize("layout", ["reversed", "negative_step_2", "big_endian_reversed"])
def test_auto_cast_layouts(layout):
    """auto_cast of strided and big-endian operands equals the call on native copies, dtype included."""
    half = BASE.astype(np.float16)
    a = {"reversed": half[::-1], "negative_step_2": half[:, ::-2], "big_endian_reversed": half.astype(">f2")[:, ::-1]}[
        layout
    ]
    b = ml_cast(BASE[:, ::-3], "bfloat16")
    got, want = nk.auto_cast(a, b), nk.auto_cast(native(a), native(b))
    for g, w in zip(got, want):
        assert_same_bits(g, w)


def test_auto_cast_big_endian_operand_of_the_result_type():
    """An operand that already holds the promoted type's values, but big-endian, comes back in the promoted
    (native) dtype like the other operand."""
    a = np.arange(8, dtype=">f2")
    got = nk.auto_cast(a, np.zeros(8, np.int8))
    assert nk.promote_type(a.dtype, np.int8) == np.float16
    for g in got:
        assert g.dtype == np.dtype(np.float16), g.dtype
    np.testing.assert_array_equal(got[0].astype(F32), np.arange(8, dtype=F32))


@pytest.mark.parametrize("layout", ["big_endian", "reversed", "negative_step"])
def test_auto_cast_packed_operand_layouts(layout):
    """A packed x4 operand declared with a_dtype is read right whatever its layout or byte order."""
    packed = nk.cast(BASE[:4, :16], "float8_e4m3fn_x4")
    a = {"big_endian": lambda p: p.astype(">u4"), "reversed": lambda p: p[::-1], "negative_step": lambda p: p[:, ::-2]}[
        layout
    ](packed)
    got = nk.auto_cast(a, np.zeros(1, np.float16), a_dtype="float8_e4m3fn_x4")
    want = nk.auto_cast(native(a), np.zeros(1, np.float16), a_dtype="float8_e4m3fn_x4")
    assert_same_bits(got[0], want[0])
    assert_same_bits(nk.unpack_x4(a, "float8_e4m3fn_x4"), nk.unpack_x4(native(a), "float8_e4m3fn_x4"))


def test_auto_cast_python_values():
    """Python scalars and lists promote as float64 and int64 arrays do."""
    a, b = nk.auto_cast(1.5, 2)
    assert (a.dtype, b.dtype, float(a), float(b)) == (np.float64, np.float64, 1.5, 2.0)
    a, b = nk.auto_cast([1.5, -2.5], [[1, 2]])
    assert (a.shape, b.shape, a.dtype, b.dtype) == ((2,), (1, 2), np.float64, np.float64)
    np.testing.assert_array_equal(b, [[1.0, 2.0]])


@pytest.mark.parametrize("dtype", WRONG_DTYPES, ids=WRONG_IDS)
@pytest.mark.parametrize("other", [np.float32, np.int8])
def test_auto_cast_refuses_dtype(dtype, other):
    """auto_cast of a non-numeric array is a TypeError naming its dtype, on either side."""
    for a, b in ((np.zeros(4, dtype), np.zeros(4, other)), (np.zeros(4, other), np.zeros(4, dtype))):
        with pytest.raises(TypeError, match="cannot cast an array of dtype|unexpected dtype"):
            nk.auto_cast(a, b)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"a_dtype": "bogus"}, TypeError, "unknown dtype 'bogus'"),
        ({"a_dtype": np.complex64}, TypeError, "unsupported dtype"),
        (
            {"a_dtype": "tfloat32"},
            ValueError,
            "a is declared tfloat32, whose arrays have dtype float32, but a has dtype float16",
        ),
        ({"b_dtype": "float8_e4m3fn_x4"}, ValueError, "b is declared float8_e4m3fn_x4"),
    ],
)
def test_auto_cast_bad_declared_dtypes(kwargs, error, pattern):
    """A declared dtype that is unknown or does not match the array is refused."""
    with pytest.raises(error, match=pattern):
        nk.auto_cast(np.zeros(4, np.float16), np.zeros(4, BF16), **kwargs)


def test_auto_cast_no_promotion_path():
    """Two operands with no promotion path raise the compiler's no-path TypeError."""
    fp4 = np.zeros(4, ml_dtypes.float4_e2m1fn)
    with pytest.raises(nk.NoPromotionPathError, match="float4_e2m1fn and float4_e2m1fn"):
        nk.auto_cast(fp4, fp4)
