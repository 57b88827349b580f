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
