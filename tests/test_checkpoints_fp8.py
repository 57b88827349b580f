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
from .fp8_checkpoints import LLAMA, STRATEGIES, make_ct_fp8, make_fp8

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
    block_format = (
        "fp8_block" if kind == "fp8" else f"fp8_{ {'group': 'channel'}.get(options['strategy'], options['strategy']) }"
    )
    for name, value in expected.items():
        assert loaded[name].fmt == block_format, name
        assert np.array_equal(u32(loaded[name].dequantize()), u32(value)), name
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


@pytest.mark.parametrize("kind, options", [("fp8", {"block": (48, 48)}), ("ct", {"strategy": "group"})])
def test_an_fp8_checkpoint_quantises_to_nvfp4_with_the_amax_of_its_values(tmp_path, kind, options):
    """NVFP4's per-tensor scale comes from the amax of the FP8 weight's values, which the package
    takes from its codes and block scales without decoding it: the same scale, and so the same
    bytes, as quantising the decoded values in memory."""
    expected = make(kind, tmp_path / "in", options)
    run("quantize", "in", "nv", "--format", "nvfp4", "--no-fuse", cwd=tmp_path)
    out = load_checkpoint(tmp_path / "nv")
    for name, value in expected.items():
        want = nk.quantize(value, "nvfp4")
        assert out[name].per_tensor_scale == want.per_tensor_scale, name
        assert np.array_equal(out[name].codes, want.codes) and np.array_equal(out[name].scales, want.scales), name


def test_the_amax_of_fp8_codes_leaves_out_nan_codes_but_not_their_tile(tmp_path):
    """A producer may store a NaN code in a block whose scale is finite: that element is NaN, the
    rest of its block counts towards the amax (and the NaN codes of either sign, 0x7f and 0xff, are
    the largest of their kind, so they must not win the block's maximum)."""
    make_fp8(tmp_path / "in", block=(48, 48))
    tensors = read_safetensors(tmp_path / "in" / "model.safetensors")[0]
    name = "model.layers.0.mlp.up_proj.weight"
    codes = tensors[name].view(np.uint8).copy()
    tile = np.unravel_index(np.argmax(np.abs(load_checkpoint(tmp_path / "in")[name].dequantize())), codes.shape)
    codes[tile[0], (tile[1] // 48) * 48 + (tile[1] % 48 + 1) % 48] = 0x7F  # a NaN beside the amax, same tile
    codes[0, 0] = 0xFF
    tensors[name] = codes.view(tensors[name].dtype)
    write_safetensors(tmp_path / "in" / "model.safetensors", tensors)
    values = load_checkpoint(tmp_path / "in")[name].dequantize()
    assert np.isnan(values).sum() == 2
    run("quantize", "in", "nv", "--format", "nvfp4", "--no-fuse", cwd=tmp_path)
    assert load_checkpoint(tmp_path / "nv")[name].per_tensor_scale == nk.quantize(values, "nvfp4").per_tensor_scale


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


# ---- writing: the command's FP8 layouts (the runtimes' own loaders: tests/test_checkpoints_runtimes.py) ----

QKV = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]


def _ignore(*modules):
    return [a for m in modules for a in ("--ignore", m)]


@pytest.mark.parametrize("layout", ["compressed-tensors", "fp8"])
def test_fp8_tiles_that_straddle_a_fused_layer_are_refused_as_vllm_refuses_them(tmp_path, layout):
    """vLLM's ``validate_fp8_block_shape`` (vllm/model_executor/layers/quantization/utils/fp8_utils.py):
    in a merged GEMM (q/k/v, gate/up) every shard but the last must have a multiple of the tile's
    rows. The Llama's q and k have 64: refused, in one line naming the shard and the rule; with
    q/k/v kept, gate/up (128 rows) and the rest are written."""
    fails("quantize", LLAMA, "out", "--layout", layout, "--format", "fp8_block", cwd=tmp_path,
          message="model.layers.0.self_attn.q_proj.weight has 64 output rows")  # fmt: skip
    r = run("quantize", LLAMA, "out", "--layout", layout, "--format", "fp8_block", *_ignore(*QKV), cwd=tmp_path)
    assert "4 tensor(s) quantised" in r.stdout, r.stdout
    plain, written = load_checkpoint(LLAMA), load_checkpoint(tmp_path / "out")
    scales = "bfloat16" if layout == "compressed-tensors" else "float32"  # llm-compressor keeps the weight's dtype
    for name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.self_attn.o_proj.weight"):
        want = nk.quantize(plain[name], "fp8_block", scale_dtype=scales)
        assert written[name].fmt == "fp8_block" and written[name].scales.dtype == want.scales.dtype
        assert np.array_equal(written[name].codes, want.codes) and np.array_equal(written[name].scales, want.scales)
    for name in QKV:
        assert written[f"{name}.weight"].dtype == BF16


def test_fp8_layouts_convert_into_each_other_as_their_bytes(tmp_path):
    """compressed-tensors FP8_BLOCK -> fine-grained FP8 -> compressed-tensors: each weight's codes
    and scales copied (the same 128 x 128 tiles), none quantised anew; per channel to per tensor is
    quantised anew (other blocks of FP8)."""
    run("quantize", LLAMA, "ct", "--format", "fp8_block", *_ignore(*QKV), cwd=tmp_path)
    r = run("quantize", "ct", "fine", "--layout", "fp8", "--format", "fp8_block", *_ignore(*QKV), cwd=tmp_path)
    assert "bytes copied from compressed-tensors" in r.stdout and "4 converted exactly (codes copied)" in r.stdout, (
        r.stdout
    )
    r = run("quantize", "fine", "back", "--format", "fp8_block", *_ignore(*QKV), cwd=tmp_path)
    assert "bytes copied from fp8" in r.stdout, r.stdout
    ct, fine, back = (load_checkpoint(tmp_path / n) for n in ("ct", "fine", "back"))
    for name, q in ct.items():
        if isinstance(q, nk.BlockArray):
            for other in (fine[name], back[name]):
                assert other.fmt == "fp8_block" and np.array_equal(other.codes, q.codes), name
                assert other.scales.dtype == q.scales.dtype and np.array_equal(other.scales, q.scales), name
    run("quantize", LLAMA, "chan", "--format", "fp8_channel", cwd=tmp_path)
    r = run("quantize", "chan", "tens", "--format", "fp8_tensor", cwd=tmp_path)
    assert "7 tensor(s) quantised" in r.stdout and "dequantised from fp8 (float-quantized)" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "options, message",
    [
        (("--layout", "fp8", "--format", "fp8_channel"), "stores fp8_block, not fp8_channel"),
        (("--format", "fp8_block", "--block-shape", "64x64"), "tiles of 128 x 128"),
        (("--format", "fp8_channel", "--scale-mode", "reciprocal", "--scale-dtype", "bfloat16"), "reciprocal"),
        (("--format", "fp8_channel", "--four-over-six", "mse"), "float8_e4m3fn or e8m0 scales"),
        (("--format", "nvfp4", "--scale-dtype", "bfloat16"), "scale_dtype 'bfloat16' is not one of nvfp4's"),
        (
            ("--layout", "modelopt", "--format", "mxfp4_e2m1"),
            "stores fp8_channel, fp8_block, nvfp4, mxfp8_e4m3, not mxfp4_e2m1",
        ),
    ],
)
def test_fp8_options_a_layout_cannot_hold_are_refused(tmp_path, options, message):
    fails("quantize", LLAMA, "out", *options, cwd=tmp_path, message=message)
