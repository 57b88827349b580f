"""GGUF files (docs/gguf.md): ggml's FP4 blocks against gguf-py's own decoding, ``quantize`` of a
GGUF file equal to the package's in-memory quantisation bit for bit, metadata and other tensors
copied, the file read back, and bad input refused with one line and nothing written."""

from __future__ import annotations

import os
import shutil
import struct

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.blocks.array import BlockArray
from neuron_kernels.checkpoints.gguf_convert import NVFP4_SCALED, dequantize_gguf, load_gguf, quantize_gguf
from neuron_kernels.io.gguf_file import mxfp4_blocks, mxfp4_codes, nvfp4_blocks, nvfp4_codes, open_gguf

from .cli_runner import run
from .gguf_models import tiny_llama_gguf

gguf = pytest.importorskip("gguf")

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _single(ba: BlockArray) -> BlockArray:
    """``ba`` without its per-tensor scale: the values ggml's blocks hold on their own."""
    return BlockArray(ba.codes, ba.scales, ba.layout, per_tensor_scale=None)


def _reader_tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A dense tiny Llama in BF16 and a tiny Llama of merged experts in F16."""
    d = tmp_path_factory.mktemp("gguf")
    dense = tiny_llama_gguf(d / "dense.gguf", dtype="BF16")
    moe = tiny_llama_gguf(d / "moe.gguf", dtype="F16", experts=4, tied=True, seed=1)
    return d, {"dense": dense, "moe": moe}


# ---- the block layouts against gguf-py ----------------------------------------------------------


def test_mxfp4_blocks_every_code_and_scale_as_gguf_py_decodes():
    """Every code at every position of a block, with every e8m0 scale gguf-py decodes as a number:
    gguf-py's values are E2M1 x 2^(e - 127) (ml_dtypes' e8m0), and the codes come back."""
    rng = np.random.default_rng(0)
    scales = np.arange(1, 255, dtype=np.uint8)  # 0 and 1 are ggml's denormal halves, 255 NaN: below
    codes = np.stack([rng.permutation(np.tile(np.arange(16, dtype=np.uint8), 2)) for _ in scales])
    blocks = mxfp4_blocks(codes, scales)
    with np.errstate(over="ignore"):  # 6 x 2^127 is inf in float32, for both
        got = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4).reshape(codes.shape)
        want = E2M1[codes] * scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)[:, None]
    np.testing.assert_array_equal(got, want)
    back_codes, back_scales = mxfp4_codes(blocks)
    np.testing.assert_array_equal(back_codes, codes.reshape(-1))
    np.testing.assert_array_equal(back_scales, scales)


def test_nvfp4_blocks_every_code_and_scale_as_gguf_py_decodes():
    """Every code at every position of a 64-element block and every UE4M3 scale byte below 0x7f:
    gguf-py's values are E2M1 x the float8_e4m3fn scale, and the codes come back."""
    rng = np.random.default_rng(1)
    scale_bytes = np.resize(np.arange(0, 0x7F, dtype=np.uint8), 128)  # 0..0x7e, then again: 32 blocks of four
    codes = np.stack([rng.permutation(np.tile(np.arange(16, dtype=np.uint8), 4)) for _ in range(32)])
    blocks = nvfp4_blocks(codes, scale_bytes)
    got = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.NVFP4).reshape(-1, 16)
    want = E2M1[codes.reshape(-1, 16)] * scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[:, None]
    np.testing.assert_array_equal(got, want)
    back_codes, back_scales = nvfp4_codes(blocks)
    np.testing.assert_array_equal(back_codes, codes.reshape(-1))
    np.testing.assert_array_equal(back_scales, scale_bytes)


# ---- quantize ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, fmt, options",
    [
        ("dense", "nvfp4", {}),
        ("dense", "mxfp4_e2m1", {}),
        ("moe", "nvfp4", {"four_over_six": "mse"}),
        ("moe", "mxfp4_e2m1", {"rounding": "stochastic", "seed": 3}),
        ("dense", "nvfp4", {"per_tensor_scale": None, "scale_search": "mse"}),
    ],
)
def test_quantize_equals_the_package_bit_for_bit(models, tmp_path, model, fmt, options):
    """Every FP4 tensor gguf-py decodes equals the package's quantisation of the same values with
    the same options (ggml's blocks, one per-tensor scale per matrix in NAME.scale); every other
    tensor is byte-equal to the source and the metadata is the source's but for the file type."""
    d, values = models
    src, dst = d / f"{model}.gguf", tmp_path / "out.gguf"
    reports = quantize_gguf(src, dst, fmt, chunk_bytes=1 << 16, **options)
    before, after = _reader_tensors(src), _reader_tensors(dst)
    two_level = options.get("per_tensor_scale", "amax") is not None
    ggml = "NVFP4" if fmt == "nvfp4" else "MXFP4"
    quantised = {r.name for r in reports if r.action == "quantised"}
    assert quantised and all(after[n].tensor_type.name == ggml for n in quantised)
    for name, t in before.items():
        if name not in quantised:
            assert after[name].tensor_type == t.tensor_type and after[name].data.tobytes() == t.data.tobytes(), name
            continue
        x = values[model][name]
        matrices = x.reshape((-1,) + x.shape[-2:])
        decoded = gguf.quants.dequantize(after[name].data, after[name].tensor_type).reshape(matrices.shape)
        scale = after.get(name[: -len("weight")] + "scale")
        assert (scale is not None) == (two_level and fmt == "nvfp4"), name
        for m, matrix in enumerate(matrices):
            opts = dict(options)
            if opts.get("rounding") == "stochastic":  # the random bits of a matrix's elements: their index in x
                whole = nk.quantize(x, fmt, **opts)
                np.testing.assert_array_equal(decoded.reshape(x.shape), nk.dequantize(whole), err_msg=name)
                break
            ba = nk.quantize(matrix, fmt, **opts)
            np.testing.assert_array_equal(decoded[m], nk.dequantize(_single(ba)), err_msg=name)
            if scale is not None:
                assert scale.data.reshape(-1)[m] == np.float32(ba.per_tensor_scale), name
    src_fields, dst_fields = gguf.GGUFReader(str(src)).fields, gguf.GGUFReader(str(dst)).fields
    assert list(src_fields) == list(dst_fields)
    for key, field in src_fields.items():
        if not key.startswith("GGUF.") and key != "general.file_type":
            assert dst_fields[key].contents() == field.contents(), key
    assert dst_fields["general.file_type"].contents() == (39 if fmt == "nvfp4" else 38)


def test_which_tensors_are_quantised(models, tmp_path):
    """llama-quantize's rules: norms, routers and 1-D tensors kept; the output layer (the token
    embedding of a tied model) kept; NVFP4 with two levels only where llama.cpp reads NAME.scale."""
    d, _ = models
    dense = {r.name: r for r in quantize_gguf(d / "dense.gguf", tmp_path / "a.gguf", "nvfp4")}
    assert dense["output.weight"].action == "kept" and "output layer" in dense["output.weight"].reason
    assert dense["token_embd.weight"].action == "kept" and "per-tensor scale" in dense["token_embd.weight"].reason
    assert dense["blk.0.attn_norm.weight"].action == "kept"
    assert all(r.action == "quantised" for n, r in dense.items() if NVFP4_SCALED.fullmatch(n))
    single = {r.name: r for r in quantize_gguf(d / "dense.gguf", tmp_path / "b.gguf", "nvfp4", per_tensor_scale=None)}
    assert single["token_embd.weight"].action == "quantised"
    assert "blk.0.attn_q.scale" not in _reader_tensors(tmp_path / "b.gguf")
    moe = {r.name: r for r in quantize_gguf(d / "moe.gguf", tmp_path / "c.gguf", "mxfp4_e2m1")}
    assert moe["token_embd.weight"].action == "kept" and "output layer" in moe["token_embd.weight"].reason
    assert moe["blk.0.ffn_gate_inp.weight"].action == "kept"
    assert moe["blk.0.ffn_up_exps.weight"].action == "quantised"


def test_pieces_do_not_change_the_bytes(models, tmp_path):
    """Small pieces (a few blocks) and one piece per tensor write the same file."""
    d, _ = models
    for chunk in (1 << 10, 64 << 20):
        quantize_gguf(
            d / "moe.gguf", tmp_path / f"{chunk}.gguf", "nvfp4", chunk_bytes=chunk, rounding="stochastic", seed=1
        )
    assert (tmp_path / f"{1 << 10}.gguf").read_bytes() == (tmp_path / f"{64 << 20}.gguf").read_bytes()


# ---- reading back ----------------------------------------------------------------------------------------


def test_load_and_dequantize_read_back_the_package_values(models, tmp_path):
    """load_gguf gives the block arrays written (per-expert scales as one array per expert), and
    dequantize writes their values as F32 with NAME.scale folded in and dropped."""
    d, values = models
    q, dq = tmp_path / "q.gguf", tmp_path / "dq.gguf"
    quantize_gguf(d / "moe.gguf", q, "nvfp4")
    loaded = load_gguf(q)
    assert not any(n.endswith(".scale") for n in loaded)
    x = values["moe"]["blk.0.attn_q.weight"]
    np.testing.assert_array_equal(loaded["blk.0.attn_q.weight"].dequantize(), nk.dequantize(nk.quantize(x, "nvfp4")))
    experts = loaded["blk.1.ffn_down_exps.weight"]
    e = values["moe"]["blk.1.ffn_down_exps.weight"]
    assert isinstance(experts, list) and len(experts) == e.shape[0]
    for m, ba in enumerate(experts):
        np.testing.assert_array_equal(ba.dequantize(), nk.dequantize(nk.quantize(e[m], "nvfp4")))
    reports = dequantize_gguf(q, dq)
    assert sum(r.action == "dequantised" for r in reports) == sum(
        isinstance(v, (BlockArray, list)) for v in loaded.values()
    )
    out = _reader_tensors(dq)
    assert not any(n.endswith(".scale") for n in out)
    got = out["blk.1.ffn_down_exps.weight"]
    assert got.tensor_type.name == "F32"
    want = np.stack([ba.dequantize() for ba in experts])
    np.testing.assert_array_equal(got.data.reshape(want.shape), want)
    assert gguf.GGUFReader(str(dq)).fields["general.file_type"].contents() == 0


def test_load_decodes_other_block_types_with_gguf_py(tmp_path):
    """A Q8_0 tensor (written by gguf-py's own quantiser) loads as gguf-py decodes it; a tensor type
    gguf-py cannot decode is copied by dequantize."""
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "q8.gguf"), "llama")
    q8 = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("a.weight", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded = load_gguf(tmp_path / "q8.gguf")
    np.testing.assert_array_equal(loaded["a.weight"], gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
    dequantize_gguf(tmp_path / "q8.gguf", tmp_path / "f.gguf")
    np.testing.assert_array_equal(_reader_tensors(tmp_path / "f.gguf")["a.weight"].data, loaded["a.weight"])


# ---- the command and bad input ----------------------------------------------------------------------------


def test_command_quantize_and_dequantize(models, tmp_path):
    d, _ = models
    out = run("quantize", d / "dense.gguf", "q.gguf", "--format", "nvfp4", "--no-stats", cwd=tmp_path).stdout
    assert "GGUF NVFP4" in out and "+ .scale" in out
    assert open_gguf(tmp_path / "q.gguf").tensors["blk.0.attn_q.weight"].type == "NVFP4"
    run("dequantize", "q.gguf", "b.gguf", "--dtype", "bfloat16", cwd=tmp_path)
    assert open_gguf(tmp_path / "b.gguf").tensors["blk.0.attn_q.weight"].type == "BF16"


def _bad(tmp_path, path, *args):
    """Run the command expecting bad input: one line on stderr, status 2, nothing written."""
    before = set(os.listdir(tmp_path))
    r = run("quantize", path, "out.gguf", "--format", "nvfp4", *args, cwd=tmp_path, check=False)
    code, err = r.returncode, r.stderr
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("neuron-kernels quantize: error: "), err
    assert set(os.listdir(tmp_path)) == before
    return err


def test_bad_input_one_line_and_nothing_written(models, tmp_path):
    d, _ = models
    tiny_llama_gguf(tmp_path / "odd.gguf", n_embd=96, n_ff=160, n_head=4)  # rows of 96: not whole 64s
    assert "not whole NVFP4 blocks of 64" in _bad(tmp_path, tmp_path / "odd.gguf")
    data = bytearray((d / "dense.gguf").read_bytes())
    (tmp_path / "v9.gguf").write_bytes(data[:4] + struct.pack("<I", 9) + data[8:])
    assert "GGUF version 9" in _bad(tmp_path, tmp_path / "v9.gguf")
    (tmp_path / "short.gguf").write_bytes(data[: len(data) // 2])
    assert "truncated" in _bad(tmp_path, tmp_path / "short.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:200])
    assert "truncated or corrupt" in _bad(tmp_path, tmp_path / "head.gguf")
    # the type field of the first tensor (after its name, dimension count and dimensions)
    name = b"token_embd.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8
    assert struct.unpack("<I", data[at : at + 4])[0] == 30  # BF16
    (tmp_path / "type.gguf").write_bytes(data[:at] + struct.pack("<I", 250) + data[at + 4 :])
    assert "unknown ggml tensor type" in _bad(tmp_path, tmp_path / "type.gguf")
    (tmp_path / "npy.gguf").write_bytes(b"\x93NUMPY" + bytes(100))
    assert "not a GGUF file" in _bad(tmp_path, tmp_path / "npy.gguf")
    shutil.copy(d / "dense.gguf", tmp_path / "in.gguf")
    assert "rht" in _bad(tmp_path, tmp_path / "in.gguf", "--rht")
    assert "block_size" in _bad(tmp_path, tmp_path / "in.gguf", "--block-size", "32")
    assert "--layout" in _bad(tmp_path, tmp_path / "in.gguf", "--layout", "compressed-tensors")
    r = run("quantize", "in.gguf", "out", "--format", "nvfp4", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "must both end in .gguf" in r.stderr
    r = run("quantize", "in.gguf", "o.gguf", "--format", "mxfp8_e4m3", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "mxfp4_e2m1 and nvfp4" in r.stderr
