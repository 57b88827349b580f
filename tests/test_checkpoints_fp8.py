"""The FP8 checkpoint layouts the package reads (docs/checkpoints.md "Layouts the package reads"):
fine-grained FP8 (``quant_method: fp8``, ``weight_scale_inv`` per block, DeepSeek and Qwen3-FP8)
and compressed-tensors ``float-quantized`` (tensor, channel, block and group strategies).

The checkpoints are made here from the tiny bfloat16 Llama of tests/fixtures/modelopt by encoders
written from the producers' formulas (transformers' FP8 quantiser; compressed-tensors' observer),
with float32, bfloat16 and float16 scales and partial edge blocks; the expected values come from a
decoder written from the layout's definition (each code times its block's scale), not from the
package. Bad input is one line and exit 2, nothing written."""

import json
import shutil

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints import load_checkpoint

from .checkpoint_helpers import read_dir, read_safetensors, write_safetensors
from .cli_runner import run
from .command_checks import fails
from .fp8_checkpoints import STRATEGIES, make_ct_fp8, make_fp8

BF16 = np.dtype(ml_dtypes.bfloat16)


def u32(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


CASES = [
    ("fp8", {"block": (128, 128), "scale_dtype": np.float32}),  # DeepSeek: 64-row weights are one partial block
    ("fp8", {"block": (48, 48), "scale_dtype": BF16}),  # partial blocks both ways; Qwen's bfloat16 scales
    ("fp8", {"block": (128, 128), "scale_dtype": np.float16}),
    *[("ct", {"strategy": s}) for s in STRATEGIES],
    ("ct", {"strategy": "block", "scale_dtype": np.dtype(np.float32)}),
]


def make(kind, folder, options):
    return make_fp8(folder, **options) if kind == "fp8" else make_ct_fp8(folder, **options)


@pytest.mark.parametrize("kind, options", CASES, ids=[f"{k}-{'-'.join(map(str, o.values()))}" for k, o in CASES])
def test_fp8_checkpoints_read_exactly(tmp_path, kind, options):
    expected = make(kind, tmp_path / "in", options)
    loaded = load_checkpoint(tmp_path / "in")
    for name, value in expected.items():
        assert np.array_equal(u32(loaded[name]), u32(value)), name
    r = run("dequantize", "in", "out", cwd=tmp_path)  # bfloat16 by default
    assert "7 weight(s) dequantised" in r.stdout
    out = read_dir(tmp_path / "out")[0]
    assert not any(k.endswith(("_scale", "_scale_inv")) for k in out)
    for name, value in expected.items():
        assert out[name].dtype == BF16 and np.array_equal(out[name].view(np.uint16), value.astype(BF16).view(np.uint16))
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())


def test_an_fp8_checkpoint_quantises_to_another_format_without_a_plain_copy(tmp_path):
    expected = make_fp8(tmp_path / "in", block=(48, 48))
    r = run("quantize", "in", "mx", "--format", "mxfp4_e2m1", cwd=tmp_path)
    assert "7 tensor(s) quantised" in r.stdout and "dequantised from fp8 (48x48 blocks)" in r.stdout
    out = load_checkpoint(tmp_path / "mx")
    for name, value in expected.items():
        want = nk.quantize(value, "mxfp4_e2m1")
        assert np.array_equal(out[name].codes, want.codes) and np.array_equal(out[name].scales, want.scales), name


@pytest.mark.parametrize(
    "config_extra, edit, message",
    [
        ({"weight_block_size": None}, None, "needs weight_block_size"),
        ({"weight_block_size": [128]}, None, "needs weight_block_size"),
        (None, lambda t, n: t.update({n + "_scale_inv": t[n + "_scale_inv"][:, :0]}), "does not fit the weight"),
        (None, lambda t, n: t.update({n + "_scale_inv": t[n + "_scale_inv"].astype(np.int32)}), "bfloat16 or float16"),
        (None, lambda t, n: t.update({"extra.weight": t[n]}), "belongs to no FP8 weight"),
        (None, lambda t, n: t.update({n: t[n].astype(np.float32)}), "must be float8_e4m3fn"),
    ],
)  # fmt: skip
def test_bad_fp8_checkpoints_are_refused(tmp_path, config_extra, edit, message):
    make_fp8(tmp_path / "in", config_extra=config_extra)
    if edit is not None:
        tensors = read_safetensors(tmp_path / "in" / "model.safetensors")[0]
        edit(tensors, "model.layers.0.self_attn.q_proj.weight")
        write_safetensors(tmp_path / "in" / "model.safetensors", tensors)
    for command in (("dequantize", "in", "out"), ("quantize", "in", "out", "--format", "nvfp4")):
        fails(*command, cwd=tmp_path, message=message)


def test_bad_float_quantized_configs_are_refused(tmp_path):
    make_ct_fp8(tmp_path / "in", "block")
    config = json.loads((tmp_path / "in" / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "token"
    (tmp_path / "in" / "config.json").write_text(json.dumps(config))
    fails("dequantize", "in", "out", cwd=tmp_path, message="float-quantized strategy 'token'")
    shutil.rmtree(tmp_path / "in")
    make_ct_fp8(tmp_path / "in", "channel")
    tensors = read_safetensors(tmp_path / "in" / "model.safetensors")[0]
    name = "model.layers.0.mlp.up_proj.weight_scale"
    tensors[name] = tensors[name][:-1]
    write_safetensors(tmp_path / "in" / "model.safetensors", tensors)
    fails("dequantize", "in", "out", cwd=tmp_path, message="does not fit the weight")
