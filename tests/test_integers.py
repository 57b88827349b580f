"""The integer block formats (docs/integers.md): quantise and dequantise against the slow
references of tests/reference_integers.py, every code and zero point of every width, the block
array's checks, and the codes llm-compressor itself wrote (tests/fixtures/llmcompressor)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints.layouts.integer_weights import DENSE, PADDED, unpack_words
from neuron_kernels.formats import INTEGER_BITS, INTEGER_FORMATS
from tests.checkpoint_helpers import read_safetensors, write_safetensors
from tests.helpers import act_order_array
from tests.reference_integers import (
    ct_dequantize_ref,
    ct_pack_dense,
    ct_pack_padded,
    ct_quantize_ref,
    ct_unpack_dense,
    ct_unpack_zero_points,
)

BF16 = ml_dtypes.bfloat16
DTYPES = {"float32": np.float32, "bfloat16": BF16, "float16": np.float16}
FIXTURES = "tests/fixtures/llmcompressor"


def weights(rows: int, cols: int, dtype, seed: int = 0) -> np.ndarray:
    """Normal weights with the groups the rule treats apart: all zero, all positive, all negative,
    one outlier, and values that land on halves of the scale."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.05)
    w[0, :32] = 0
    w[1, :32] = np.abs(w[1, :32])
    w[2, :32] = -np.abs(w[2, :32])
    w[3, 5] = 3.0
    w[4, :32] = np.arange(32, dtype=np.float32) * np.float32(0.25) - 4  # multiples of half a step
    return w.astype(dtype)


def codes_of(q: nk.BlockArray) -> np.ndarray:
    return q.integer_codes()


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "zero-points"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bits", INTEGER_BITS)
def test_quantize_equals_the_reference(bits, dtype, symmetric):
    """Codes, scales (in the scale dtype, the weight's) and zero points of groups of 32 and of
    whole rows, against compressed-tensors' rule as the reference computes it."""
    w = weights(8, 96, DTYPES[dtype], seed=bits)
    asym = "" if symmetric else "_asym"
    for fmt, size in ((f"int{bits}_group{asym}", 32), (f"int{bits}_channel{asym}", None)):
        q = nk.quantize(w, fmt, block_size=size, scale_dtype=dtype, pack=False)
        rq, rs, rz = ct_quantize_ref(w, bits, size, symmetric, dtype)
        np.testing.assert_array_equal(codes_of(q), rq)
        assert q.scales.dtype == np.dtype(DTYPES[dtype])
        np.testing.assert_array_equal(q.scales.view(np.uint8), rs.view(np.uint8))
        if symmetric:
            assert q.zero_points is None
        else:
            np.testing.assert_array_equal(q.zero_points, rz)
        values = q.dequantize(dtype)
        np.testing.assert_array_equal(values.view(np.uint8), ct_dequantize_ref(rq, rs, rz, size).view(np.uint8))


def test_a_partial_last_group_is_a_group_of_its_own():
    """Columns that are no multiple of the group: the last group's codes are those of the same
    columns quantised alone (compressed-tensors refuses such weights; the package takes them)."""
    w = weights(6, 70, BF16)
    q = nk.quantize(w, "int4_group_asym", block_size=32, scale_dtype="bfloat16", pack=False)
    rq, rs, rz = ct_quantize_ref(w[:, 64:], 4, None, False, "bfloat16")
    np.testing.assert_array_equal(codes_of(q)[:, 64:], rq)
    np.testing.assert_array_equal(q.scales[:, 2:].view(np.uint16), rs.view(np.uint16))
    np.testing.assert_array_equal(q.zero_points[:, 2:], rz)


@pytest.mark.parametrize("bits", INTEGER_BITS)
def test_every_code_and_zero_point_dequantizes_as_the_reference(bits):
    """Each code of the width with each zero point, under a bfloat16 and a float16 scale."""
    n = 1 << bits
    code = np.arange(n, dtype=np.int16) - n // 2
    zp = np.arange(n, dtype=np.int16) - n // 2
    q = np.repeat(code[None, :], n, axis=0).astype(np.int8)  # row r: every code, zero point zp[r]
    lay = nk.BlockLayout(f"int{bits}_channel_asym", (n, n), 1, n)
    for dtype, scale in (("bfloat16", 0.0137), ("float16", 3.1e-5), ("float32", 0.1)):
        scales = np.full((n, 1), scale, DTYPES[dtype])
        arr = nk.BlockArray(
            (q.astype(np.int16) & (n - 1)).astype(np.uint8), scales, lay, zero_points=zp.astype(np.int8)[:, None]
        )
        want = ct_dequantize_ref(q, scales, zp.astype(np.int8)[:, None], None)
        np.testing.assert_array_equal(arr.dequantize(dtype).view(np.uint8), want.view(np.uint8))
        np.testing.assert_array_equal(arr.integer_codes(), q)


def test_group_index_chooses_each_columns_group():
    """Act-order's g_idx: column c takes group g_idx[c]'s scale and zero point."""
    rng = np.random.default_rng(3)
    q = rng.integers(-8, 8, (5, 64)).astype(np.int8)
    scales = rng.uniform(0.01, 0.1, (5, 4)).astype(BF16)
    zp = rng.integers(-8, 8, (5, 4)).astype(np.int8)
    g_idx = rng.permutation(np.arange(64) // 16).astype(np.int32)
    arr = nk.BlockArray(
        (q & 0xF).astype(np.uint8), scales, nk.BlockLayout("int4_group_asym", (5, 64), 1, 16),
        zero_points=zp, group_index=g_idx,
    )  # fmt: skip
    want = ct_dequantize_ref(q, scales, zp, 16, g_idx)
    np.testing.assert_array_equal(arr.dequantize("bfloat16").view(np.uint16), want.view(np.uint16))
    assert "group_index" in repr(arr) and "zero_points" in repr(arr)


def test_packed_int4_codes_round_trip():
    """4-bit codes two per byte (pack=True, the default) hold the same codes."""
    w = weights(8, 64, np.float32)
    a = nk.quantize(w, "int4_group", block_size=32)
    b = nk.quantize(w, "int4_group", block_size=32, pack=False)
    assert a.codes.shape == (8, 32) and a.packed
    np.testing.assert_array_equal(a.integer_codes(), b.integer_codes())
    np.testing.assert_array_equal(a.dequantize(), b.dequantize())


def test_a_group_holding_nan_or_inf_dequantizes_to_nan():
    w = weights(8, 64, np.float32)
    w[0, 3], w[1, 40] = np.nan, np.inf
    for fmt in ("int8_group", "int8_group_asym"):
        q = nk.quantize(w, fmt, block_size=32)
        assert np.isnan(q.scales[0, 0]) and np.isnan(q.scales[1, 1])
        d = q.dequantize()
        assert np.isnan(d[0, :32]).all() and np.isnan(d[1, 32:]).all()
        assert np.isfinite(d[0, 32:]).all() and np.isfinite(d[1, :32]).all()


def test_fake_quantize_is_quantize_then_dequantize():
    w = weights(8, 64, BF16)
    q = nk.quantize(w, "int4_group_asym", block_size=32, scale_dtype="bfloat16")
    got = nk.fake_quantize(w, "int4_group_asym", block_size=32, scale_dtype="bfloat16")
    np.testing.assert_array_equal(got, q.dequantize())


def test_the_table_holds_every_width_per_group_and_per_channel():
    assert sorted(INTEGER_FORMATS) == sorted(
        f"int{b}_{kind}{asym}" for b in range(2, 9) for kind in ("group", "channel") for asym in ("", "_asym")
    )
    for name, bf in INTEGER_FORMATS.items():
        assert bf.family == "INT" and bf.integer and bf.scale_modes == ("divide",)
        assert bf.zero_points == name.endswith("_asym")
        b = bf.element_bits
        assert (bf.element_format.lowest, bf.element_format.max) == (-(2 ** (b - 1)), 2 ** (b - 1) - 1)
        assert bf.block_size == (128 if "_group" in name else nk.formats.WHOLE)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"axis": 0}, "groups the last axis"),
        ({"block_shape": (2, 32)}, "groups the last axis"),
        ({"rounding": "stochastic", "seed": 1}, "rounds to nearest even"),
        ({"rht": True}, "no rotation"),
        ({"scale_mode": "reciprocal"}, "scale mode"),
        ({"scale_search": "mse"}, "float8_e4m3fn or e8m0"),
    ],
)
def test_integer_options_that_do_not_apply_are_refused(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        nk.quantize(np.ones((4, 64), np.float32), "int4_group", **options)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"zero_points": np.zeros((4, 2), np.int16)}, "int8"),
        ({"zero_points": np.zeros((4, 3), np.int8)}, "scales' shape"),
        ({"zero_points": np.full((4, 2), 8, np.int8)}, r"\[-8, 7\]"),
        ({"group_index": np.zeros(64, np.int64)}, "int32"),
        ({"group_index": np.zeros(63, np.int32)}, "one entry per column"),
        ({"group_index": np.full(64, 2, np.int32)}, r"\[0, 2\)"),
    ],
)
def test_inconsistent_integer_fields_are_refused(fields, message):
    lay = nk.BlockLayout("int4_group_asym" if "zero_points" in fields else "int4_group", (4, 64), 1, 32)
    with pytest.raises(ValueError, match=message):
        nk.BlockArray(np.zeros((4, 64), np.uint8), np.ones((4, 2), np.float32), lay, **fields)


def test_zero_points_are_there_exactly_for_the_asymmetric_formats():
    ones = np.ones((4, 2), np.float32)
    with pytest.raises(ValueError, match="has a zero point per block"):
        nk.BlockArray(np.zeros((4, 64), np.uint8), ones, nk.BlockLayout("int4_group_asym", (4, 64), 1, 32))
    with pytest.raises(ValueError, match="has no zero points"):
        nk.BlockArray(
            np.zeros((4, 64), np.uint8), ones, nk.BlockLayout("int4_group", (4, 64), 1, 32),
            zero_points=np.zeros((4, 2), np.int8),
        )  # fmt: skip


def test_zero_points_on_a_float_format_are_refused():
    lay = nk.BlockLayout("fp8_channel", (4, 64), 1, 32)
    with pytest.raises(ValueError, match="integer formats"):
        nk.BlockArray(
            np.zeros((4, 64), np.uint8), np.ones((4, 2), np.float32), lay, zero_points=np.zeros((4, 2), np.int8)
        )


@pytest.mark.parametrize("packing", [DENSE, PADDED])
@pytest.mark.parametrize("bits", range(2, 9))
def test_unpacking_words_equals_the_reference(bits, packing):
    """The readers' unpacking of compressed-tensors' int32 words, dense and padded, against the
    reference's, on codes packed by the reference (odd column counts included)."""
    rng = np.random.default_rng(bits)
    for cols in (1, 7, 33, 100):
        q = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (3, cols)).astype(np.int8)
        words = ct_pack_dense(q, bits) if packing == DENSE else ct_pack_padded(q, bits)
        got = unpack_words(words, bits, cols, packing).astype(np.int16) - (1 << (bits - 1))
        np.testing.assert_array_equal(got, q)
        if packing == DENSE:
            np.testing.assert_array_equal(ct_unpack_dense(words, bits, cols), q)


def _source_weights() -> dict:
    tensors, _ = read_safetensors("tests/fixtures/modelopt/bf16/model.safetensors")
    return tensors


@pytest.mark.parametrize(
    "folder, bits, symmetric",
    [("w4a16", 4, True), ("w4a16_asym", 4, False), ("w8a16", 8, True), ("w3a16", 3, True)],
)
def test_quantize_writes_the_codes_llm_compressor_wrote(folder, bits, symmetric):
    """llm-compressor's W4A16 / W4A16_ASYM / W8A16 / W3A16 (groups of 32) of the tiny Llama's
    bfloat16 weights: the package's codes, scales and zero points of the same weights, bit for bit."""
    source = _source_weights()
    tensors, _ = read_safetensors(f"{FIXTURES}/{folder}/model.safetensors")
    checked = 0
    for name, packed in tensors.items():
        if not name.endswith(".weight_packed"):
            continue
        base = name[: -len("_packed")]
        w = source[base]
        fmt = f"int{bits}_group" + ("" if symmetric else "_asym")
        q = nk.quantize(w, fmt, block_size=32, scale_dtype="bfloat16", pack=False)
        np.testing.assert_array_equal(codes_of(q), ct_unpack_dense(packed, bits, w.shape[1]), err_msg=name)
        np.testing.assert_array_equal(q.scales.view(np.uint16), tensors[f"{base}_scale"].view(np.uint16))
        if not symmetric:
            zp = ct_unpack_zero_points(tensors[f"{base}_zero_point"], bits, w.shape[0])
            np.testing.assert_array_equal(q.zero_points, zp)
        checked += 1
    assert checked == 7


def test_int8_per_channel_writes_the_codes_llm_compressor_wrote():
    """W8A8 (int-quantized, int8 per channel)."""
    source = _source_weights()
    tensors, _ = read_safetensors(f"{FIXTURES}/w8a8/model.safetensors")
    names = [n for n in tensors if n.endswith(".weight_scale")]
    assert len(names) == 7
    for name in names:
        base = name[: -len("_scale")]
        q = nk.quantize(source[base], "int8_channel", scale_dtype="bfloat16")
        np.testing.assert_array_equal(codes_of(q), tensors[base])
        np.testing.assert_array_equal(q.scales.view(np.uint16), tensors[name].view(np.uint16))


@pytest.mark.parametrize("fmt", ["int4_group", "int4_group_asym", "int8_channel"])
def test_error_statistics_of_integer_codes(fmt):
    """quantization_error from the codes, against the same sums in numpy: the error of the
    dequantised values, saturation beyond the block's lowest and highest values."""
    w = weights(8, 96, np.float32, seed=5)
    q = nk.quantize(w, fmt, block_size=None if "channel" in fmt else 32)
    stats = nk.quantization_error(w, q)
    x = w.astype(np.float64)
    d = q.dequantize().astype(np.float64)
    err = np.abs(x - d)
    nz = x != 0
    assert stats.mse == pytest.approx(np.mean(err**2), rel=1e-12)
    assert stats.max_abs_error == err.max()
    assert stats.max_rel_error == (err[nz] / np.abs(x[nz])).max()
    assert stats.flushed == np.sum(d[nz] == 0) / x.size
    assert stats.sqnr_db == pytest.approx(10 * np.log10(np.sum(x**2) / np.sum(err**2)), rel=1e-12)
    bits = nk.BLOCK_FORMATS[fmt].element_bits
    lo = -(1 << (bits - 1))
    top = nk.BlockArray(
        np.full_like(q.unpacked_codes(), (1 << (bits - 1)) - 1),
        q.scales,
        q.layout.normalised() if not q.packed else nk.BlockLayout(q.fmt, q.shape, q.axis, q.block_size),
        zero_points=q.zero_points,
    )
    low = nk.BlockArray(
        np.full_like(q.unpacked_codes(), lo & ((1 << bits) - 1)), q.scales, top.layout, zero_points=q.zero_points
    )
    lim = np.maximum(np.abs(top.dequantize()), np.abs(low.dequantize())).astype(np.float64)
    assert stats.saturated == np.sum(np.abs(x) > lim) / x.size


def test_integer_elements_are_no_cast_targets():
    """int2 ... int7 are elements of block formats only (as mxint8's fixed-point one): the registry
    has no cast to or from them, and a cast names what it accepts."""
    from neuron_kernels.registry import supported_casts

    narrow = {f"int{b}" for b in range(2, 8)}
    assert not [k for k in supported_casts() if k.source in narrow or k.target in narrow]
    with pytest.raises(nk.UnsupportedCastError, match="no cast from float32 to int4"):
        nk.cast(np.ones(4, np.float32), "int4")


def block_file_meta(path, name: str = "meta.npy") -> dict:
    import json
    import zipfile

    with zipfile.ZipFile(path) as z, z.open(name) as f:
        return json.loads(np.lib.format.read_array(f).tobytes())


@pytest.mark.parametrize("bits", [4, 8])
def test_block_files_keep_zero_points_and_the_group_index(bits, tmp_path):
    """save_blocks / load_blocks give back the codes, scales, zero points and group index bit for
    bit; the file is read piece by piece (whole rows, as each column's group is anywhere in its
    row) to the reference's values; a group index makes the file version 2."""
    from neuron_kernels.io.file_jobs import dequantize_file

    arr, want = act_order_array(bits)
    nk.save_blocks(tmp_path / "a.npz", arr)
    back = nk.load_blocks(tmp_path / "a.npz")
    for field in ("codes", "scales", "zero_points", "group_index"):
        got, expected = getattr(back, field), getattr(arr, field)
        assert got.dtype == expected.dtype and got.shape == expected.shape, field
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8), err_msg=field)
    assert block_file_meta(tmp_path / "a.npz")["version"] == 2
    np.testing.assert_array_equal(back.dequantize("bfloat16").view(np.uint16), want.view(np.uint16))
    dequantize_file(str(tmp_path / "a.npz"), str(tmp_path / "b.npy"), dtype="bfloat16", chunk_bytes=64 * 4)
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy").view(np.uint16), want.view(np.uint16))


def test_a_block_file_without_a_group_index_stays_version_1(tmp_path):
    w = weights(8, 96, np.float32)
    q = nk.quantize(w, "int4_group_asym", block_size=32)
    nk.save_blocks(tmp_path / "a.npz", q)
    assert block_file_meta(tmp_path / "a.npz")["version"] == 1
    back = nk.load_blocks(tmp_path / "a.npz")
    np.testing.assert_array_equal(back.zero_points, q.zero_points)
    np.testing.assert_array_equal(back.dequantize(np.float32), q.dequantize(np.float32))


def test_quantize_file_writes_zero_points_piece_by_piece(tmp_path):
    """An asymmetric format quantised from a file in pieces of a few rows: the file holds the codes,
    scales and zero points of the whole array's quantisation."""
    from neuron_kernels.io.file_jobs import quantize_file

    w = weights(40, 96, BF16, seed=5)
    whole = nk.quantize(w, "int4_group_asym", block_size=32)
    write_safetensors(tmp_path / "w.safetensors", {"w": w})
    src = str(tmp_path / "w.safetensors")
    quantize_file(src, str(tmp_path / "q.npz"), "int4_group_asym", block_size=32, chunk_bytes=96 * 2 * 3)
    back = nk.load_blocks(tmp_path / "q.npz", name="w")
    for field in ("codes", "scales", "zero_points"):
        np.testing.assert_array_equal(getattr(back, field).view(np.uint8), getattr(whole, field).view(np.uint8))


def _respoil(src, dst, change) -> None:
    """A copy of block file ``src`` with its members changed by ``change(dict of arrays)``."""
    import zipfile

    with zipfile.ZipFile(src) as z:
        members = {n.removesuffix(".npy"): np.lib.format.read_array(z.open(n)) for n in z.namelist()}
    change(members)
    np.savez(dst, **members)


def _meta(**changes):
    import json

    def change(members):
        meta = json.loads(members["meta"].tobytes())
        meta.update(changes)
        members["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("zeros"), "needs zero points"),
        (lambda m: m.update(zeros=m["zeros"].astype(np.int16)), "zero points must be int8"),
        (lambda m: m.update(zeros=m["zeros"][:-1]), "the scales' shape"),
        (lambda m: m.update(group_index=m["group_index"][:-1]), "int32 of shape"),
        (lambda m: m.update(group_index=m["group_index"] + 4), r"outside \[0, 4\)"),
        (lambda m: m.update(group_index=m["group_index"].astype(np.int64)), "int32 of shape"),
        (_meta(version=1), "is version 2, this one says 1"),
        (_meta(fmt="int4_group"), "int4_group has no zero points"),
        (_meta(version=3), "version 3 is not supported"),
    ],
    ids=["no-zeros", "zeros-int16", "zeros-shape", "gidx-short", "gidx-range", "gidx-int64", "gidx-v1", "sym-zeros",
         "v3"],
)  # fmt: skip
def test_inconsistent_block_files_of_integers_are_refused(change, message, tmp_path):
    arr, _ = act_order_array()
    nk.save_blocks(tmp_path / "a.npz", arr)
    _respoil(tmp_path / "a.npz", tmp_path / "b.npz", change)
    with pytest.raises(ValueError, match=message):
        nk.load_blocks(tmp_path / "b.npz")


def test_a_group_index_on_a_float_format_file_is_refused(tmp_path):
    q = nk.quantize(weights(8, 64, np.float32), "mxfp8_e4m3")
    nk.save_blocks(tmp_path / "a.npz", q)
    _respoil(
        tmp_path / "a.npz", tmp_path / "b.npz",
        lambda m: (m.update(group_index=np.zeros(64, np.int32)), _meta(version=2)(m)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="a group index belongs to an integer format"):
        nk.load_blocks(tmp_path / "b.npz")
