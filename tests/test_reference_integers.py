"""The integer quantisation references of ``tests/reference_integers.py`` against their producers.

compressed-tensors' quantiser, dequantiser and dense packer are checked against compressed-tensors
itself (torch); gguf's Q4_0 / Q8_0 bytes against the gguf package. The older padded CT packing, AWQ
and GPTQ have no producer here: they are checked by round trips and by words written out by hand.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from .reference_integers import (
    AWQ_ORDER,
    awq_dequantize,
    awq_pack,
    awq_unpack,
    ct_dequantize_ref,
    ct_pack_dense,
    ct_pack_padded,
    ct_pack_zero_points,
    ct_quantize_ref,
    ct_unpack_dense,
    ct_unpack_padded,
    ct_unpack_zero_points,
    dequant_q4_0,
    dequant_q8_0,
    gptq_default_g_idx,
    gptq_dequantize,
    gptq_pack,
    gptq_unpack,
    q4_0_blocks,
    q8_0_blocks,
)

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _half_integers(lo: int, hi: int, count: int) -> np.ndarray:
    """``count`` values j + 0.5 with j spread over [lo, hi)."""
    return np.linspace(lo, hi - 1, count).round() + 0.5


def _weight(
    rng: np.random.Generator, bits: int, length: int, dtype: str, rows: int = 10, cols: int = 128
) -> np.ndarray:
    """Random weight whose first ``length`` columns of rows 0-4 are special groups.

    Row 0: all zero; row 1: all positive; row 2: all negative; row 3: symmetric ties (amax is
    half the bit range, so the scale is 1 and j + 0.5 lands on .5); row 4: asymmetric ties (min
    -1.5 and max range - 1.5: scale 1, zero point qmin + 1.5 itself a tie). Rows 3 and 4 are scaled
    by 0.25 (exact), so the ties hold with a scale of 0.25.
    """
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    width = qmax - qmin
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    w[0, :length] = 0
    w[1, :length] = np.abs(w[1, :length]) + 0.01
    w[2, :length] = -np.abs(w[2, :length]) - 0.01
    w[3, :length] = np.concatenate([[width / 2], _half_integers(qmin, qmax, length - 1)]) * 0.25
    w[4, :length] = np.concatenate([[-1.5, width - 1.5], _half_integers(-2, width - 2, length - 2)]) * 0.25
    return w.astype(DTYPES[dtype])


def _torch_dtype(torch, name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _ct_args(bits: int, group_size: int | None, symmetric: bool):
    from compressed_tensors.quantization import QuantizationArgs

    if group_size is None:
        return QuantizationArgs(num_bits=bits, type="int", strategy="channel", symmetric=symmetric)
    return QuantizationArgs(num_bits=bits, type="int", strategy="group", group_size=group_size, symmetric=symmetric)


@pytest.mark.parametrize("group_size", [32, None])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ct_quantize_and_dequantize_match_compressed_tensors(rng, dtype, bits, symmetric, group_size):
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    w = _weight(rng, bits, group_size or 128, dtype)
    rows, cols = w.shape
    size = group_size or cols
    args = _ct_args(bits, group_size, symmetric)
    wt = torch.from_numpy(w.astype(np.float32)).to(_torch_dtype(torch, dtype))
    grouped = wt.reshape(rows, cols // size, size)
    scale_t, zp_t = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    q_t = quantize(wt, scale_t, zp_t, args, dtype=torch.int8)

    q, scale, zp = ct_quantize_ref(w, bits, group_size, symmetric, dtype)
    assert scale.dtype == np.dtype(DTYPES[dtype]) and scale.shape == (rows, cols // size)
    np.testing.assert_array_equal(scale.astype(np.float32), scale_t.float().numpy())
    want_zp = np.zeros(scale.shape, np.int8) if zp is None else zp
    assert zp_t.dtype == torch.int8
    np.testing.assert_array_equal(want_zp, zp_t.numpy())
    np.testing.assert_array_equal(q, q_t.numpy())
    # The special rows did land on ties: w / scale is j + 0.5 somewhere in rows 3 and 4.
    quotient = w[3:5, :size].astype(np.float32) / scale[3:5, :1].astype(np.float32)
    assert np.any(quotient - np.floor(quotient) == 0.5)

    dq_t = dequantize(x_q=q_t, scale=scale_t, zero_point=None if symmetric else zp_t, args=args)
    dq = ct_dequantize_ref(q, scale, zp, group_size)
    assert dq.dtype == np.dtype(DTYPES[dtype])
    np.testing.assert_array_equal(dq.astype(np.float32), dq_t.float().numpy())


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ct_dequantize_with_g_idx(rng, dtype):
    """CT 0.20 has no g_idx argument any more: the reference is checked against ``_dequantize`` on the
    scales gathered per column, and against the public ``dequantize`` on the columns sorted by group."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.lifecycle.forward_helpers import _dequantize

    rows, size, groups, bits = 6, 16, 4, 4
    q = rng.integers(-8, 8, (rows, size * groups)).astype(np.int8)
    scale = (rng.uniform(0.001, 0.1, (rows, groups))).astype(DTYPES[dtype])
    zp = rng.integers(-8, 8, (rows, groups)).astype(np.int8)
    g_idx = rng.permutation(np.repeat(np.arange(groups), size)).astype(np.int32)
    assert set(g_idx) == set(range(groups)) and np.any(np.diff(g_idx) < 0)

    tdt = _torch_dtype(torch, dtype)
    scale_t = torch.from_numpy(scale.astype(np.float32)).to(tdt)
    q_t, zp_t, gi = torch.from_numpy(q), torch.from_numpy(zp), torch.from_numpy(g_idx).long()
    want = _dequantize(q_t, scale_t[:, gi], zp_t[:, gi]).float().numpy()
    got = ct_dequantize_ref(q, scale, zp, size, g_idx)
    np.testing.assert_array_equal(got.astype(np.float32), want)

    order = np.argsort(g_idx, kind="stable")
    sorted_t = dequantize(x_q=q_t[:, order], scale=scale_t, zero_point=zp_t, args=_ct_args(bits, size, False))
    np.testing.assert_array_equal(got[:, order].astype(np.float32), sorted_t.float().numpy())
    np.testing.assert_array_equal(
        ct_dequantize_ref(q, scale, zp, size, gptq_default_g_idx(size * groups, size)),
        ct_dequantize_ref(q, scale, zp, size),
    )


def test_ct_quantize_checks_its_arguments():
    w = np.zeros((2, 64), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="scale_dtype"):
        ct_quantize_ref(w, 4, 32, True, "float32")
    with pytest.raises(ValueError, match="multiple"):
        ct_quantize_ref(w, 4, 48, True, "bfloat16")
    q, scale, zp = ct_quantize_ref(w, 4, 32, False, ml_dtypes.bfloat16)
    assert not q.any() and not zp.any()
    assert np.all(scale.astype(np.float32) == 2.0**-7)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("shape", [(5, 37), (3, 1), (4, 64)])
def test_ct_dense_packing_matches_compressed_tensors(rng, bits, shape):
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    off = 1 << (bits - 1)
    q = rng.integers(-off, off, shape).astype(np.int8)
    q[0, 0], q[-1, -1] = -off, off - 1
    q_t = torch.from_numpy(q)
    packed = ct_pack_dense(q, bits)
    assert packed.dtype == np.int32 and packed.shape == (shape[0], -(-shape[1] * bits // 32))
    np.testing.assert_array_equal(packed, pack_to_int32(q_t, bits).numpy())
    np.testing.assert_array_equal(ct_unpack_dense(packed, bits, shape[1]), q)
    np.testing.assert_array_equal(
        ct_unpack_dense(packed, bits, shape[1]), unpack_from_int32(torch.from_numpy(packed), bits, shape).numpy()
    )

    along0 = ct_pack_zero_points(q, bits)
    np.testing.assert_array_equal(along0, pack_to_int32(q_t, bits, packed_dim=0).numpy())
    np.testing.assert_array_equal(ct_unpack_zero_points(along0, bits, shape[0]), q)
    back = unpack_from_int32(torch.from_numpy(along0), bits, shape, packed_dim=0).numpy()
    np.testing.assert_array_equal(back, q)

    # Arbitrary words (bits past the last element set too) read the same as CT reads them.
    words = rng.integers(-(2**31), 2**31, packed.shape).astype(np.int32)
    np.testing.assert_array_equal(
        ct_unpack_dense(words, bits, shape[1]), unpack_from_int32(torch.from_numpy(words), bits, shape).numpy()
    )


def test_ct_dense_packing_by_hand():
    # Eleven 3-bit codes of 3 (unsigned 7): 33 one bits, the eleventh code split over two words.
    packed = ct_pack_dense(np.full((1, 11), 3, np.int8), 3)
    assert packed.view(np.uint32).tolist() == [[0xFFFFFFFF, 0x00000001]]


# Per bit width: signed codes and the padded words written out by hand (uint32).
PADDED_BY_HAND = {
    1: ([0] * 32 + [-1, 0], [0xFFFFFFFF, 0x00000002]),
    2: ([-2, -1, 0, 1] * 4 + [1], [0xE4E4E4E4, 0x00000003]),
    3: ([3] * 10 + [-4, -3], [0x3FFFFFFF, 0x00000008]),
    4: (list(range(-8, 8)) + [0], [0x76543210, 0xFEDCBA98, 0x00000008]),
    5: ([15] * 6 + [-16, 0], [0x3FFFFFFF, 0x00000200]),
    6: ([1, 2, 3, 4, 5, 6], [0x259238A1, 0x00000026]),
    7: ([-64, 63, 0, -1, 5], [0x07F03F80, 0x00000045]),
    8: ([-128, 127, 0, -1, 1], [0x7F80FF00, 0x00000081]),
}


@pytest.mark.parametrize("bits", sorted(PADDED_BY_HAND))
def test_ct_padded_packing(rng, bits):
    codes, words = PADDED_BY_HAND[bits]
    q = np.array([codes], np.int8)
    packed = ct_pack_padded(q, bits)
    assert packed.dtype == np.int32
    assert packed.view(np.uint32).tolist() == [words]
    np.testing.assert_array_equal(ct_unpack_padded(packed, bits, len(codes)), q)

    off = 1 << (bits - 1)
    for cols in (1, 31, 33, 70):
        q = rng.integers(-off, off, (3, cols)).astype(np.int8)
        packed = ct_pack_padded(q, bits)
        assert packed.shape == (3, -(-cols // (32 // bits)))
        np.testing.assert_array_equal(ct_unpack_padded(packed, bits, cols), q)
        unused = 32 - (32 // bits) * bits
        if unused:
            assert not np.any(packed.view(np.uint32) >> np.uint32(32 - unused))


def test_packing_refuses_out_of_range_codes():
    with pytest.raises(ValueError):
        ct_pack_dense(np.array([[8]], np.int8), 4)
    with pytest.raises(ValueError):
        ct_pack_padded(np.array([[-3]], np.int8), 2)
    with pytest.raises(TypeError):
        ct_pack_dense(np.array([[0.0]]), 4)


def test_awq_nibble_order_by_hand():
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    q = np.arange(8, dtype=np.uint8)[None, :]
    qweight, qzeros, _ = awq_pack(q, q, np.ones((1, 8), np.float16))
    assert qweight.view(np.uint32).tolist() == [[0x75316420]]
    assert qzeros.view(np.uint32).tolist() == [[0x75316420]]


def test_awq_round_trip_and_dequantize(rng):
    in_f, out_f, size = 64, 32, 16
    q = rng.integers(0, 16, (in_f, out_f)).astype(np.uint8)
    z = rng.integers(0, 16, (in_f // size, out_f)).astype(np.uint8)
    z[0, :2] = (0, 15)
    s = rng.uniform(-0.05, 0.05, z.shape).astype(np.float16)
    qweight, qzeros, scales = awq_pack(q, z, s)
    assert qweight.shape == (in_f, out_f // 8) and qzeros.shape == (in_f // size, out_f // 8)
    assert qweight.dtype == qzeros.dtype == np.int32 and scales.dtype == np.float16
    q2, z2 = awq_unpack(qweight, qzeros)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(z2, z)
    w = awq_dequantize(qweight, qzeros, scales, size)
    assert w.shape == (out_f, in_f) and w.dtype == np.float16
    # numpy's float16 arithmetic rounds each operation once: the formula written vectorised.
    zs, ss = np.repeat(z, size, 0).astype(np.float16), np.repeat(s, size, 0)
    want = (q.astype(np.float16) - zs) * ss
    np.testing.assert_array_equal(w.view(np.uint16), want.T.view(np.uint16))


def test_gptq_words_by_hand():
    # 3 bits, 32 input rows: code 10 (5 = 0b101) and code 21 (6 = 0b110) each straddle two words.
    u = np.zeros((32, 1), np.int64)
    u[10, 0], u[21, 0] = 5, 6
    qweight, _, _, _ = gptq_pack(u, np.ones((1, 1), np.int64), np.ones((1, 1)), np.zeros(32), 3, "gptq_v2")
    assert qweight.view(np.uint32)[:, 0].tolist() == [0x40000000, 0x00000001, 0x00000003]
    # 4 bits: eight consecutive input rows in one word, no reordering (unlike AWQ).
    u = np.arange(8)[:, None]
    qweight, _, _, _ = gptq_pack(u, np.ones((1, 1), np.int64), np.ones((1, 1)), np.zeros(8), 4, "gptq_v2")
    assert qweight.view(np.uint32).tolist() == [[0x76543210]]
    # v1 stores zero - 1: true zeros of 0 become all-ones fields, 1 becomes 0.
    _, qzeros, _, _ = gptq_pack(
        np.zeros((8, 8), np.int64), np.zeros((1, 8), np.int64), np.ones((1, 8)), np.zeros(8), 4, "gptq"
    )
    assert qzeros.view(np.uint32).tolist() == [[0xFFFFFFFF]]
    _, qzeros, _, _ = gptq_pack(
        np.zeros((8, 8), np.int64), np.ones((1, 8), np.int64), np.ones((1, 8)), np.zeros(8), 4, "gptq"
    )
    assert qzeros.view(np.uint32).tolist() == [[0]]


@pytest.mark.parametrize("version", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_round_trip_and_dequantize(rng, bits, version, desc_act):
    in_f, out_f, size = 64, 40, 16
    groups = in_f // size
    top = (1 << bits) - 1
    q = rng.integers(0, top + 1, (in_f, out_f))
    z = rng.integers(0, top + 1, (groups, out_f))
    z[0, :2] = (0, top)
    s = rng.uniform(0.001, 0.05, (groups, out_f)).astype(np.float16)
    g_idx = gptq_default_g_idx(in_f, size)
    if desc_act:
        g_idx = rng.permutation(g_idx)
    qweight, qzeros, scales, gi = gptq_pack(q, z, s, g_idx, bits, version)
    assert qweight.shape == (in_f * bits // 32, out_f) and qweight.dtype == np.int32
    assert qzeros.shape == (groups, -(-out_f * bits // 32)) and qzeros.dtype == np.int32
    assert gi.dtype == np.int32 and scales.dtype == np.float16

    q2, z2 = gptq_unpack(qweight, qzeros, in_f, out_f, bits, version)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(z2, z)
    # What the words hold: v1 stores (z - 1) mod 2^b, read back by the v2 rule.
    _, stored = gptq_unpack(qweight, qzeros, in_f, out_f, bits, "gptq_v2")
    np.testing.assert_array_equal(stored, (z - 1) & top if version == "gptq" else z)
    # The packed words are the dense little-endian stream along in (per output column) of every b,
    # i.e. CT's dense packing of the offset codes, transposed.
    off = 1 << (bits - 1)
    np.testing.assert_array_equal(qweight, ct_pack_dense((q - off).astype(np.int8).T, bits).T)
    np.testing.assert_array_equal(qzeros, ct_pack_dense((stored - off).astype(np.int8), bits))

    w = gptq_dequantize(qweight, qzeros, scales, gi, bits, version)
    assert w.shape == (out_f, in_f) and w.dtype == np.float16
    want = s[g_idx] * (q.astype(np.float16) - z[g_idx].astype(np.float16))
    np.testing.assert_array_equal(w.view(np.uint16), want.T.view(np.uint16))


def _ggml_reference_codes(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """gguf.quants' own quantisation rule (ggml-quants.c), to rebuild its blocks from codes."""
    blocks = x.reshape(-1, 32)
    if kind == "Q4_0":
        peak = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[:, None], -1)
        d = peak / np.float32(-8)
        inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
        u = np.trunc(blocks * inv + np.float32(8.5)).astype(np.int64).clip(0, 15)
        return (u - 8).reshape(x.shape), d[:, 0].astype(np.float16)
    d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    a = np.abs(blocks * inv)
    r = np.floor(a) + (a - np.floor(a) >= 0.5)
    return (np.sign(blocks) * r).astype(np.int64).reshape(x.shape), d[:, 0].astype(np.float16)


def test_ggml_round_trip(rng):
    rows, cols = 3, 64
    q4 = rng.integers(-8, 8, (rows, cols)).astype(np.int8)
    q8 = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
    d = rng.uniform(-0.1, 0.1, (rows, cols // 32)).astype(np.float16)
    raw4, raw8 = q4_0_blocks(q4, d), q8_0_blocks(q8, d)
    assert len(raw4) == rows * cols // 32 * 18 and len(raw8) == rows * cols // 32 * 34
    dd = np.repeat(d.astype(np.float32), 32, 1)
    np.testing.assert_array_equal(dequant_q4_0(raw4, rows * cols).reshape(rows, cols), q4 * dd)
    np.testing.assert_array_equal(dequant_q8_0(raw8, rows * cols).reshape(rows, cols), q8 * dd)
    # Block layout by hand: d first (little-endian), then byte j = (q[j] + 8) | (q[j + 16] + 8) << 4.
    one = np.array([[-8] * 16 + [7] * 16], np.int8)
    assert q4_0_blocks(one, np.array([[1.0]], np.float16)) == b"\x00\x3c" + b"\xf0" * 16
    assert q8_0_blocks(one, np.array([[-2.0]], np.float16)) == b"\x00\xc0" + b"\xf8" * 16 + b"\x07" * 16


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_ggml_matches_gguf(rng, kind):
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = getattr(GGMLQuantizationType, kind)
    encode, decode = (q4_0_blocks, dequant_q4_0) if kind == "Q4_0" else (q8_0_blocks, dequant_q8_0)
    rows, cols = 4, 96
    x = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    x[1, :32] = 0  # an all-zero block
    theirs = quantize(x, qtype)
    q, d = _ggml_reference_codes(x, kind)
    assert encode(q, d) == theirs.tobytes()
    np.testing.assert_array_equal(decode(theirs, rows * cols).reshape(rows, cols), dequantize(theirs, qtype))

    lo, hi = (-8, 8) if kind == "Q4_0" else (-128, 128)
    q = rng.integers(lo, hi, (rows, cols)).astype(np.int8)
    d = rng.uniform(-1, 1, (rows, cols // 32)).astype(np.float16)
    raw = np.frombuffer(encode(q, d), np.uint8).reshape(rows, -1)
    np.testing.assert_array_equal(dequantize(raw, qtype), decode(raw, rows * cols).reshape(rows, cols))
    assert gguf.quants.quant_shape_from_byte_shape(raw.shape, qtype) == (rows, cols)
