"""The gpt-oss layout (``--layout mxfp4``, docs/checkpoints.md): a bfloat16 gpt-oss checkpoint, named
and shaped as transformers saves ``GptOssForCausalLM``, quantised through the command.

Only the experts' stacked ``gate_up_proj`` / ``down_proj`` ([E, in, out]) become
``NAME_blocks`` [E, out, in/32, 16] and ``NAME_scales`` [E, out, in/32]; everything else keeps its
bytes. The expected values come from the layout's description (``decode_gptoss`` of
``tests/checkpoint_helpers.py``, written from the E2M1 table and the nibble order), not from the
package. What the layout cannot express so that transformers loads it is refused before anything
is written; a checkpoint that is not what its config promises is refused when read. transformers
itself loads the command's output in ``tests/test_checkpoints_runtimes.py``.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import neuron_kernels as nk
from neuron_kernels.checkpoints import GPTOSS_NOT_CONVERTED, expert_decision
from neuron_kernels.io.arrays import FileFormatError

from .checkpoint_helpers import BF16, bits, decode_gptoss, read_dir
from .cli_runner import run

E, HIDDEN, INTER, HEADS, HEAD_DIM = 4, 64, 96, 2, 32
GPTOSS = ("--layout", "mxfp4", "--format", "mxfp4_e2m1")
EXPERTS = ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj")


def gptoss_tensors(rng) -> dict[str, np.ndarray]:
    """The tensors of a one-layer GptOssForCausalLM in bfloat16, with its names and shapes."""

    def w(*shape):
        return (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 3, shape[:-1] + (1,)))).astype(BF16)

    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": w(128, HIDDEN),
        p + "input_layernorm.weight": w(HIDDEN),
        p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.q_proj.bias": w(HEADS * HEAD_DIM),
        p + "self_attn.k_proj.weight": w(HEAD_DIM, HIDDEN),
        p + "self_attn.k_proj.bias": w(HEAD_DIM),
        p + "self_attn.v_proj.weight": w(HEAD_DIM, HIDDEN),
        p + "self_attn.v_proj.bias": w(HEAD_DIM),
        p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
        p + "self_attn.o_proj.bias": w(HIDDEN),
        p + "self_attn.sinks": w(HEADS),
        p + "post_attention_layernorm.weight": w(HIDDEN),
        p + "mlp.router.weight": w(E, HIDDEN),
        p + "mlp.router.bias": w(E),
        p + "mlp.experts.gate_up_proj": w(E, HIDDEN, 2 * INTER),  # [E, in, out]
        p + "mlp.experts.gate_up_proj_bias": w(E, 2 * INTER),
        p + "mlp.experts.down_proj": w(E, INTER, HIDDEN),
        p + "mlp.experts.down_proj_bias": w(E, HIDDEN),
        "model.norm.weight": w(HIDDEN),
        "lm_head.weight": w(128, HIDDEN),
    }


def write_checkpoint(path, tensors, config) -> None:
    path.mkdir()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    d = tmp_path_factory.mktemp("oss")
    t = gptoss_tensors(np.random.default_rng(7))
    write_checkpoint(d / "oss", t, {"model_type": "gpt_oss", "hidden_size": HIDDEN})
    r = run("quantize", "oss", "q", *GPTOSS, cwd=d)
    return d, t, r.stdout


def test_experts_only_in_blocks_as_gpt_oss_ships_them(oss):
    d, t, stdout = oss
    got, _ = read_dir(d / "q")
    want = {n for n in t if n not in EXPERTS} | {f"{n}_{part}" for n in EXPERTS for part in ("blocks", "scales")}
    assert set(got) == want
    for name, x in t.items():
        if name in EXPERTS:
            continue
        assert got[name].dtype == x.dtype and got[name].shape == x.shape, name
        np.testing.assert_array_equal(bits(got[name]), bits(x), err_msg=name)  # kept bit for bit
        assert name in stdout
    for name in EXPERTS:
        _, inn, out = t[name].shape
        blocks, scales = got[f"{name}_blocks"], got[f"{name}_scales"]
        assert (blocks.dtype, blocks.shape) == (np.uint8, (E, out, inn // 32, 16))
        assert (scales.dtype, scales.shape) == (np.uint8, (E, out, inn // 32))
        # the description's value of each element: FP4 code * 2^(scale - 127), blocks along `in`
        values = np.swapaxes(decode_gptoss(blocks, scales), 1, 2)  # back to [E, in, out]
        q = nk.quantize(np.ascontiguousarray(np.swapaxes(t[name], 1, 2)), "mxfp4_e2m1")
        np.testing.assert_array_equal(blocks.reshape(q.codes.shape), q.codes)
        np.testing.assert_array_equal(scales, q.scales.view(np.uint8))
        np.testing.assert_array_equal(bits(values), bits(np.swapaxes(q.dequantize(), 1, 2)))
        assert name in stdout and f"{nk.quantization_error(np.swapaxes(t[name], 1, 2), q).sqnr_db:.2f}" in stdout
    config = json.loads((d / "q" / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "mxfp4",
        "modules_to_not_convert": list(GPTOSS_NOT_CONVERTED),
    }
    assert config["hidden_size"] == HIDDEN


def test_dequantised_back_as_the_model_holds_it(oss):
    d, t, _ = oss
    run("dequantize", "q", "back", cwd=d)
    got, _ = read_dir(d / "back")
    assert set(got) == set(t)
    for name, x in t.items():
        assert (got[name].dtype, got[name].shape) == (x.dtype, x.shape), name
        if name not in EXPERTS:
            np.testing.assert_array_equal(bits(got[name]), bits(x), err_msg=name)
    stored, _ = read_dir(d / "q")
    for name in EXPERTS:
        want = np.swapaxes(decode_gptoss(stored[f"{name}_blocks"], stored[f"{name}_scales"]), 1, 2).astype(BF16)
        np.testing.assert_array_equal(bits(got[name]), bits(want), err_msg=name)
    assert "quantization_config" not in json.loads((d / "back" / "config.json").read_text())


def test_load_checkpoint_gives_the_experts_as_stored(oss):
    d, t, _ = oss
    loaded = nk.load_checkpoint(d / "q")
    for name in EXPERTS:
        block = loaded[name]
        assert isinstance(block, nk.BlockArray) and block.shape == np.swapaxes(t[name], 1, 2).shape
    assert not isinstance(loaded["model.layers.0.self_attn.q_proj.weight"], nk.BlockArray)


def refused(tmp_path, *args, message):
    r = run("quantize", *args, cwd=tmp_path, check=False)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    return r


def test_a_dense_model_is_refused_naming_the_layout_that_fits(tmp_path):
    rng = np.random.default_rng(1)
    dense = {k: v for k, v in gptoss_tensors(rng).items() if ".experts." not in k}
    dense["model.layers.0.mlp.gate_proj.weight"] = rng.standard_normal((INTER, HIDDEN)).astype(BF16)
    write_checkpoint(tmp_path / "llama", dense, {"model_type": "llama"})
    refused(tmp_path, "llama", "q", *GPTOSS, message="--layout compressed-tensors")
    (tmp_path / "llama" / "config.json").write_text("{}")  # no model_type: still nothing to hold
    refused(tmp_path, "llama", "q", *GPTOSS, message="no gpt-oss expert")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]
    # experts of another model type are not read into gpt-oss's experts by transformers either
    write_checkpoint(tmp_path / "other", gptoss_tensors(rng), {"model_type": "llama4"})
    refused(tmp_path, "other", "q", *GPTOSS, message="not 'llama4'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama", "other"]


def test_an_experts_module_is_quantised_whole_or_kept_whole(tmp_path, oss):
    d, _, _ = oss
    half = ("--ignore", "*.gate_up_proj")
    refused(d, "oss", "half", *GPTOSS, *half, message="whole")
    assert not (d / "half").exists()
    # The whole module kept: nothing to quantise is left, which is refused too.
    whole = ("--ignore", "model.layers.0.mlp.experts.*")
    refused(d, "oss", "whole", *GPTOSS, *whole, message="no gpt-oss expert")


def test_expert_decision():
    b = 32
    assert expert_decision(EXPERTS[0], BF16, (E, 64, 192), b) is None
    assert expert_decision("model.layers.3.mlp.experts.down_proj", np.float32, (E, 96, 64), b) is None
    assert "gpt-oss keeps it" in expert_decision("model.layers.0.self_attn.q_proj.weight", BF16, (64, 64), b)
    assert "gpt-oss keeps it" in expert_decision("model.layers.0.mlp.experts.gate_up_proj_bias", BF16, (E, 64), b)
    assert "2-D" in expert_decision(EXPERTS[0], BF16, (64, 64), b)
    assert "not a float" in expert_decision(EXPERTS[0], np.uint8, (E, 64, 64), b)
    assert "input axis 40" in expert_decision(EXPERTS[0], BF16, (E, 40, 64), b)
    assert expert_decision(EXPERTS[0], BF16, (E, 64, 64), b, ignore=("*.experts.*",)) == "--ignore *.experts.*"


def read_refused(path, message):
    with pytest.raises(FileFormatError, match=message):
        nk.load_checkpoint(path)
    r = run("dequantize", path.name, path.name + ".out", cwd=path.parent, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert not (path.parent / (path.name + ".out")).exists()


def test_a_checkpoint_that_is_not_what_its_config_promises_is_refused(tmp_path, oss):
    d, _, _ = oss
    stored, _ = read_dir(d / "q")
    config = json.loads((d / "q" / "config.json").read_text())
    # a dense weight in blocks: transformers would report it unexpected and initialise q_proj at random
    q = nk.quantize(stored["model.layers.0.self_attn.q_proj.weight"], "mxfp4_e2m1")
    dense = dict(stored)
    del dense["model.layers.0.self_attn.q_proj.weight"]
    dense["model.layers.0.self_attn.q_proj.weight_blocks"] = q.codes.reshape(64, 2, 16)
    dense["model.layers.0.self_attn.q_proj.weight_scales"] = q.scales.view(np.uint8)
    write_checkpoint(tmp_path / "dense", dense, config)
    read_refused(tmp_path / "dense", "q_proj.weight_blocks is not an expert parameter")
    # experts promised in MXFP4 but stored plain
    plain = {k: v for k, v in stored.items() if not k.startswith(EXPERTS[1])}
    plain[EXPERTS[1]] = np.zeros((E, INTER, HIDDEN), BF16)
    write_checkpoint(tmp_path / "plain", plain, config)
    read_refused(tmp_path / "plain", "promises model.layers.0.mlp.experts.down_proj in MXFP4")
    # ...unless its module is in modules_to_not_convert
    config["quantization_config"]["modules_to_not_convert"].append("model.layers.*.mlp.experts")
    (tmp_path / "plain" / "config.json").write_text(json.dumps(config))
    assert nk.load_checkpoint(tmp_path / "plain")[EXPERTS[1]].dtype == BF16
