"""Quantised checkpoints carried into GGUF without re-quantising (docs/gguf.md "Carried over without
loss"): ModelOpt's NVFP4 export carried by the command is, tensor for tensor, the file llama.cpp's
own converter makes of it (tests/fixtures/gguf, scripts/make_gguf_fixtures.py); llm-compressor's
NVFP4 and MXFP4 checkpoints, which that converter refuses, carried with their codes and scales
byte for byte; a weight that does not match the template is refused, never guessed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints.gguf_carry import carry_into_gguf
from neuron_kernels.io.gguf_file import open_gguf

from .cli_runner import run

gguf = pytest.importorskip("gguf")

FIXTURES = Path(__file__).parent / "fixtures"
TEMPLATE = FIXTURES / "gguf" / "llama-bf16.gguf"
LLM_COMPRESSOR = FIXTURES / "llmcompressor"
#: The rotary projections, whose rows llama.cpp's converter reorders (its ``permute``).
ROTARY = {"blk.0.attn_q.weight": "q_proj", "blk.0.attn_k.weight": "k_proj"}
HF_NAMES = {
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
    "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
    "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
    "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
    "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
    "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
}


def _tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def test_modelopt_nvfp4_as_llama_cpp_converts_it(tmp_path):
    """Every tensor (weights, .scale, .input_scale, the template's others) byte-equal to llama.cpp's
    converter's output, the same set of tensors, and the file type NVFP4."""
    out = run(
        "quantize", FIXTURES / "modelopt" / "nvfp4", "carried.gguf", "--format", "nvfp4", "--template", TEMPLATE,
        cwd=tmp_path,
    ).stdout  # fmt: skip
    assert "7 weight(s) carried" in out and "rotary order" in out
    ours, theirs = _tensors(tmp_path / "carried.gguf"), _tensors(FIXTURES / "gguf" / "modelopt-nvfp4.gguf")
    assert set(ours) == set(theirs)
    for name, t in theirs.items():
        assert ours[name].tensor_type == t.tensor_type and ours[name].data.tobytes() == t.data.tobytes(), name
    assert open_gguf(tmp_path / "carried.gguf").value("general.file_type") == 39


@pytest.mark.parametrize("scheme, fmt", [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4_e2m1")])
def test_llm_compressor_payload_carried_byte_for_byte(tmp_path, scheme, fmt):
    """The codes and block scales of each weight are the checkpoint's own (the rotary rows
    reordered as llama.cpp's converter orders them), NVFP4's .scale the reciprocal of its global
    scale in float32, and the values those the package reads from the checkpoint."""
    source = LLM_COMPRESSOR / scheme
    reports = carry_into_gguf(source, TEMPLATE, tmp_path / "c.gguf", fmt)
    assert sorted(r.name for r in reports if r.action == "converted") == sorted(HF_NAMES)
    stored = nk.load_checkpoint(source)
    carried = nk.load_checkpoint(tmp_path / "c.gguf")
    heads = open_gguf(TEMPLATE).value("llama.attention.head_count")
    for name, hf in HF_NAMES.items():
        want, got = stored[hf], carried[name]
        codes, scales = want.unpacked_codes(), want.scales.view(np.uint8)
        if name in ROTARY:  # llama.cpp's permute: each head's two halves interleaved
            rows = np.arange(codes.shape[0]).reshape(heads, 2, -1).swapaxes(1, 2).reshape(-1)
            codes, scales = codes[rows], scales[rows]
        np.testing.assert_array_equal(got.unpacked_codes(), codes, err_msg=name)
        np.testing.assert_array_equal(got.scales.view(np.uint8), scales, err_msg=name)
        assert got.per_tensor_scale == want.per_tensor_scale, name  # NVFP4: 1 / weight_global_scale in float32
        values = want.dequantize()
        np.testing.assert_array_equal(got.dequantize(), values[rows] if name in ROTARY else values, err_msg=name)
    template = _tensors(TEMPLATE)
    for name, t in _tensors(tmp_path / "c.gguf").items():
        if name not in HF_NAMES and not name.endswith("scale"):
            assert t.data.tobytes() == template[name].data.tobytes(), name


def test_weights_of_other_formats_are_reported_and_the_template_kept(tmp_path):
    reports = carry_into_gguf(LLM_COMPRESSOR / "mxfp8", TEMPLATE, tmp_path / "c.gguf")
    kept = [r for r in reports if r.action == "kept" and "not carried" in r.reason]
    assert len(kept) == len(HF_NAMES) and not any(r.action == "converted" for r in reports)
    assert _tensors(tmp_path / "c.gguf")["blk.0.ffn_up.weight"].tensor_type.name == "BF16"


def _template_with(tmp_path, name, change) -> Path:
    """A copy of the template with the data of one tensor changed in place."""
    path = tmp_path / "template.gguf"
    shutil.copy(TEMPLATE, path)
    t = open_gguf(path).tensors[name]
    data = bytearray(path.read_bytes())
    data[t.offset : t.offset + t.nbytes] = change(bytes(data[t.offset : t.offset + t.nbytes]), t)
    path.write_bytes(bytes(data))
    return path


def test_a_weight_that_does_not_match_the_template_is_refused(tmp_path):
    """The template's v projection with its rows in another order: in no known order do the
    checkpoint's values match it, so the command refuses (one line, exit 2, nothing written)."""

    def shuffle_rows(raw: bytes, t) -> bytes:
        rows = np.frombuffer(raw, np.uint8).reshape(t.shape[0], -1)
        return rows[np.random.default_rng(0).permutation(t.shape[0])].tobytes()

    template = _template_with(tmp_path, "blk.0.attn_v.weight", shuffle_rows)
    r = run(
        "quantize", LLM_COMPRESSOR / "nvfp4", "c.gguf", "--format", "nvfp4", "--template", template,
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and "does not match the template's blk.0.attn_v.weight" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and sorted(os.listdir(tmp_path)) == ["template.gguf"]


def test_usage(tmp_path):
    r = run("quantize", LLM_COMPRESSOR / "nvfp4", "c.gguf", "--format", "nvfp4", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "--template MODEL.gguf" in r.stderr
    r = run(
        "quantize", FIXTURES / "modelopt" / "bf16", "c.gguf", "--format", "nvfp4", "--template", TEMPLATE,
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and "holds no quantised weight" in r.stderr
    assert os.listdir(tmp_path) == []


def test_experts_stacked_as_llama_cpp_stacks_them(tmp_path):
    """A Mixtral's per-expert NVFP4 weights (written by the package in compressed-tensors) carried
    into the converter's GGUF file of the same model: each layer's experts stacked into
    ffn_*_exps in expert order, their codes and scales byte for byte, one .scale per expert."""
    run("quantize", FIXTURES / "gguf" / "mixtral-bf16", "ct", "--format", "nvfp4", cwd=tmp_path)
    reports = carry_into_gguf(tmp_path / "ct", FIXTURES / "gguf" / "mixtral-bf16.gguf", tmp_path / "c.gguf")
    stacked = {r.name: r for r in reports if "experts stacked" in r.reason}
    assert set(stacked) == {f"blk.0.ffn_{p}_exps.weight" for p in ("gate", "up", "down")}
    stored = nk.load_checkpoint(tmp_path / "ct")
    carried = nk.load_checkpoint(tmp_path / "c.gguf")
    for name, proj in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
        experts = carried[f"blk.0.ffn_{name}_exps.weight"]
        for e, got in enumerate(experts):
            want = stored[f"model.layers.0.block_sparse_moe.experts.{e}.{proj}.weight"]
            np.testing.assert_array_equal(got.unpacked_codes(), want.unpacked_codes())
            np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
            assert got.per_tensor_scale == want.per_tensor_scale
    scales = _tensors(tmp_path / "c.gguf")["blk.0.ffn_up_exps.scale"]
    assert scales.data.shape == (4,) and len(set(scales.data.tolist())) == 4  # one per expert


#: llm-compressor's integer checkpoints and the ggml block type each goes into exactly.
INTEGER_EXACT = {"w4a16": ("Q4_0", 2), "w3a16": ("Q4_0", 2), "w8a16": ("Q8_0", 7), "w8a8": ("Q8_0", 7)}


@pytest.mark.parametrize("scheme", list(INTEGER_EXACT))
def test_integer_checkpoints_carried_into_ggml_blocks_exactly(tmp_path, scheme):
    """Symmetric int4 / int3 in groups of 32 as Q4_0, int8 (groups of 32, or per channel) as Q8_0:
    each tensor's blocks are those the reference builds from the source's codes and scales (the
    rotary projections' rows in llama.cpp's order), under --require-exact."""
    from .reference_integers import q4_0_blocks, q8_0_blocks

    ggml_type, file_type = INTEGER_EXACT[scheme]
    out = run(
        "quantize", LLM_COMPRESSOR / scheme, "carried.gguf", "--template", TEMPLATE, "--require-exact", cwd=tmp_path
    ).stdout  # fmt: skip
    assert "7 weight(s) carried" in out and out.count("codes and scales carried exactly") == 7, out
    source = nk.load_checkpoint(LLM_COMPRESSOR / scheme)
    ours = _tensors(tmp_path / "carried.gguf")
    template = _tensors(TEMPLATE)
    heads = {"blk.0.attn_q.weight": 2, "blk.0.attn_k.weight": 2}
    for name, hf in HF_NAMES.items():
        q = source[hf]
        codes, cols = q.integer_codes(), q.shape[1]
        d = np.repeat(q.scales.astype(np.float16), min(q.block_size, cols) // 32, axis=1)
        if name in heads:  # llama.cpp's permute: each head's two halves interleaved
            order = np.arange(q.shape[0]).reshape(heads[name], 2, -1).swapaxes(1, 2).reshape(-1)
            codes, d = codes[order], d[order]
        build = q4_0_blocks if ggml_type == "Q4_0" else q8_0_blocks
        assert ours[name].tensor_type.name == ggml_type, name
        assert ours[name].data.tobytes() == build(codes, d), name
    for name, t in template.items():
        if name not in HF_NAMES:
            assert ours[name].data.tobytes() == t.data.tobytes(), name
    assert open_gguf(tmp_path / "carried.gguf").value("general.file_type") == file_type


def test_integer_zero_points_go_into_q4_1_with_their_error_said(tmp_path):
    """W4A16 with zero points as Q4_1 (``q * d + m``): ggml's decoding of each block is the
    weight's ``(q - z) * s`` up to the float16 rounding of ``m = -z * s``, which the summary
    reports; --require-exact refuses it, in one line, writing nothing."""
    out = run("quantize", LLM_COMPRESSOR / "w4a16_asym", "q41.gguf", "--template", TEMPLATE, cwd=tmp_path).stdout
    assert out.count("as Q4_1: not exact") == 7 and "max abs error" in out, out
    source = nk.load_checkpoint(LLM_COMPRESSOR / "w4a16_asym")
    reader = _tensors(tmp_path / "q41.gguf")
    q = source["model.layers.0.mlp.down_proj.weight"]
    t = reader["blk.0.ffn_down.weight"]
    assert t.tensor_type.name == "Q4_1"
    values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(q.shape)
    group = np.arange(q.shape[1]) // q.block_size
    exact = (q.integer_codes() - q.zero_points[:, group].astype(np.float64)) * q.scales.astype(np.float64)[:, group]
    scale = q.scales.astype(np.float64)[:, group]
    assert np.all(np.abs(values - exact) <= scale * 16 * 2.0**-11 + 1e-12)  # m's float16 rounding, at most
    r = run(
        "quantize", LLM_COMPRESSOR / "w4a16_asym", "exact.gguf", "--template", TEMPLATE, "--require-exact",
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--require-exact" in r.stderr, r.stderr
    assert not (tmp_path / "exact.gguf").exists()


def test_integer_weights_ggml_cannot_hold_are_kept_and_said(tmp_path):
    """Groups that are no whole ggml blocks (16 columns), 8-bit codes with zero points: the
    template's tensor kept, the reason in the summary."""
    run("quantize", FIXTURES / "modelopt" / "bf16", "g16", "--format", "int4_group", "--block-size", "16", cwd=tmp_path)
    run("quantize", FIXTURES / "modelopt" / "bf16", "a8", "--format", "int8_group_asym", "--block-size", "32",
        cwd=tmp_path)  # fmt: skip
    for folder, why in (("g16", "no whole ggml blocks of 32"), ("a8", "no block of 8-bit codes with zero points")):
        out = run("quantize", folder, "kept.gguf", "--template", TEMPLATE, "--force", cwd=tmp_path).stdout
        assert "0 weight(s) carried" in out and out.count(why) == 7, out
