"""ModelOpt FP8 written by the command (docs/checkpoints.md "ModelOpt FP8"): ``fp8_channel`` as
``FP8_PER_CHANNEL_PER_TOKEN`` and ``fp8_block`` as ``FP8_PB_WO``, loaded by vLLM's rules.

vLLM needs a GPU, so its loading rule is applied here, written from its source
(``vllm/model_executor/layers/quantization/modelopt.py``, with ``utils/quant_utils.py``'s
``is_layer_skipped`` and ``model_loader/weight_utils.py``'s ``get_quant_config``):

- the quantization config is config.json's ``quantization_config`` (``hf_quant_config.json`` only
  where config.json has none); ``ModelOptQuantConfigBase.from_config`` reads either form,
  upper-cases ``quant_algo`` and accepts FP8, FP8_PER_CHANNEL_PER_TOKEN and FP8_PB_WO among others;
- ``is_layer_excluded``: a Linear is left plain when its name (or, for a fused layer, every
  shard's, all alike or it raises) is in ``exclude_modules``, when an entry is a substring of its
  name, or when it matches an entry as an ``fnmatch`` wildcard;
- a quantised Linear has exactly ``weight`` float8_e4m3fn [out, in] and ``weight_scale`` float32:
  [out] for FP8_PER_CHANNEL_PER_TOKEN (``ModelOptFp8PcPtLinearMethod``), [out / 128, 1, in / 128,
  1] with out and in multiples of 128 for FP8_PB_WO (``ModelOptFp8PbWoLinearMethod``); a plain one
  ``weight`` in the model's dtype; any other tensor of a module is a key vLLM has no parameter for.

The checkpoints are Llama-shaped ones made here with numpy (widths of 256 and 384, so that 128 x 128
tiles fit), read by the package's table of architectures (no transformers needed)."""

import json

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints.folder import open_checkpoint
from neuron_kernels.checkpoints.layouts import LAYOUTS
from neuron_kernels.io.arrays import FileFormatError

from .checkpoint_helpers import read_dir, write_safetensors
from .cli_runner import run
from .command_checks import fails
from .modelopt_rules import ALGO, BF16, F8, make_llama, vllm_config, vllm_load


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("fmt", list(ALGO))
def test_vllm_loads_the_modelopt_fp8_the_command_writes(tmp_path, fmt):
    """Every Linear but lm_head quantised, vLLM's values the package's quantisation exactly (a
    code times a float32 scale is exact in float32), lm_head plain, no missing or unexpected key."""
    dense = make_llama(tmp_path / "llama")
    r = run("quantize", "llama", "out", "--layout", "modelopt", "--format", fmt, cwd=tmp_path)
    assert "14 tensor(s) quantised" in r.stdout
    assert vllm_config(tmp_path / "out") == (ALGO[fmt], ["lm_head"])
    loaded = vllm_load(tmp_path / "out", dense)
    for module, values in loaded.items():
        want = dense[f"{module}.weight"]
        if module != "lm_head":
            want = nk.quantize(want, fmt).dequantize()
        assert np.array_equal(bits(values), bits(want)), module


def test_compressed_tensors_fp8_with_bfloat16_scales_converts_to_modelopt_float32_scales(tmp_path):
    """llm-compressor's bfloat16 scales widened to ModelOpt's float32 exactly; codes copied."""
    dense = make_llama(tmp_path / "llama")
    run("quantize", "llama", "ct", "--format", "fp8_channel", cwd=tmp_path)  # scales in the weight's bfloat16
    r = run("quantize", "ct", "mo", "--layout", "modelopt", "--format", "fp8_channel", cwd=tmp_path)
    assert "14 converted exactly (codes copied)" in r.stdout
    loaded = vllm_load(tmp_path / "mo", dense)
    for module, values in loaded.items():
        if module != "lm_head":
            want = nk.quantize(dense[f"{module}.weight"], "fp8_channel", scale_dtype="bfloat16").dequantize()
            assert np.array_equal(bits(values), bits(want)), module


def test_modelopt_fp8_reads_back_and_converts_as_its_bytes(tmp_path):
    """The package reads its own ModelOpt output as the block arrays it wrote, and converts it to
    compressed-tensors and back by copying bytes (the same blocks, float32 scales)."""
    dense = make_llama(tmp_path / "llama")
    run("quantize", "llama", "mo", "--layout", "modelopt", "--format", "fp8_block", cwd=tmp_path)
    written = nk.load_checkpoint(tmp_path / "mo")
    for name, v in written.items():
        if isinstance(v, nk.BlockArray):
            q = nk.quantize(dense[name], "fp8_block")
            assert v.fmt == "fp8_block" and np.array_equal(v.codes, q.codes) and np.array_equal(v.scales, q.scales)
    r = run("quantize", "mo", "ct", "--format", "fp8_block", cwd=tmp_path)
    assert "14 converted exactly (codes copied)" in r.stdout
    r = run("quantize", "ct", "back", "--layout", "modelopt", "--format", "fp8_block", cwd=tmp_path)
    assert "14 converted exactly (codes copied)" in r.stdout
    assert read_dir(tmp_path / "back")[0].keys() == read_dir(tmp_path / "mo")[0].keys()
    for name, value in read_dir(tmp_path / "mo")[0].items():
        assert read_dir(tmp_path / "back")[0][name].tobytes() == value.tobytes(), name


def test_an_ignored_fused_layer_is_excluded_whole(tmp_path):
    """--ignore of every shard of q/k/v: vLLM's fused qkv_proj is excluded (its shards agree);
    one shard alone is refused before anything is written (vLLM would raise on load)."""
    dense = make_llama(tmp_path / "llama")
    qkv = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    run("quantize", "llama", "out", "--layout", "modelopt", "--format", "fp8_channel",
        *[a for m in qkv for a in ("--ignore", m)], cwd=tmp_path)  # fmt: skip
    loaded = vllm_load(tmp_path / "out", dense)
    for m in qkv:
        assert np.array_equal(bits(loaded[m]), bits(dense[f"{m}.weight"])), m
    fails("quantize", "llama", "one", "--layout", "modelopt", "--format", "fp8_channel", "--ignore", qkv[0],
          cwd=tmp_path, message="one fused layer")  # fmt: skip


def make_mixtral(folder, experts=2):
    """A Mixtral checkpoint in bfloat16: attention, a router and ``experts`` experts per layer."""
    rng = np.random.default_rng(1)
    h, f = 128, 256
    shapes = {"model.embed_tokens.weight": (256, h), "model.norm.weight": (h,), "lm_head.weight": (256, h)}
    p = "model.layers.0"
    shapes |= {f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,)}
    shapes |= {f"{p}.self_attn.{n}_proj.weight": (h, h) for n in "qkvo"}
    shapes[f"{p}.block_sparse_moe.gate.weight"] = (experts, h)
    for e in range(experts):
        shapes |= {f"{p}.block_sparse_moe.experts.{e}.{w}.weight": s for w, s in (("w1", (f, h)), ("w3", (f, h)),
                                                                                   ("w2", (h, f)))}  # fmt: skip
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {n: (rng.standard_normal(s) * 0.02).astype(BF16)
                                                      for n, s in shapes.items()})  # fmt: skip
    config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": h,
              "intermediate_size": f, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
              "num_local_experts": experts, "num_experts_per_tok": 1, "vocab_size": 256,
              "tie_word_embeddings": False}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "make, options, message",
    [
        (make_llama, ("--format", "fp8_tensor"), "calibrated activation scales"),
        (make_llama, ("--format", "fp8_channel", "--scale-dtype", "bfloat16"), "float32 FP8 scales"),
        (lambda d: make_llama(d, intermediate=320), ("--format", "fp8_block"), "multiples of 128 x 128"),
        (make_mixtral, ("--format", "fp8_channel"), "MoE expert weight(s)"),
    ],
    ids=["per-tensor", "bf16-scales", "partial-tiles", "moe-experts"],
)
def test_what_vllm_would_not_load_is_refused(tmp_path, make, options, message):
    make(tmp_path / "in")
    fails("quantize", "in", "out", "--layout", "modelopt", *options, cwd=tmp_path, message=message)


def test_moe_with_its_experts_kept_plain_is_written(tmp_path):
    """--ignore the experts: the attention quantised, experts and router plain and excluded."""
    make_mixtral(tmp_path / "in")
    run("quantize", "in", "out", "--layout", "modelopt", "--format", "fp8_channel",
        "--ignore", "*.block_sparse_moe.experts.*", cwd=tmp_path)  # fmt: skip
    _, exclude = vllm_config(tmp_path / "out")
    assert "model.layers.0.block_sparse_moe.gate" in exclude
    tensors = read_dir(tmp_path / "out")[0]
    assert tensors["model.layers.0.block_sparse_moe.experts.1.w2.weight"].dtype == BF16
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == F8


def test_a_plain_module_whose_name_is_in_a_quantised_ones_is_refused(tmp_path):
    """vLLM's substring rule would load the quantised module plain: refused by name."""
    make_llama(tmp_path / "llama")
    ckpt = open_checkpoint(str(tmp_path / "llama"))
    quantised = {f"model.layers.0.mlp.{p}_proj.weight": (384, 256) for p in ("gate", "up")}
    with pytest.raises(FileFormatError, match="model.layers.0.mlp.gate_proj is quantised but vLLM would load it"):
        LAYOUTS["modelopt"].fits(ckpt, quantised, "fp8_channel", ignored=("model.layers.0.mlp.gate",))


@pytest.mark.parametrize(
    "options, formats",
    [
        (("--format", "nvfp4"), {"mlp": "nvfp4", "self_attn": "nvfp4"}),
        (("--format", "mxfp8_e4m3"), {"mlp": "mxfp8_e4m3", "self_attn": "mxfp8_e4m3"}),
        (("--format", "nvfp4", "--scheme", "*.self_attn.*=mxfp8_e4m3"), {"mlp": "nvfp4", "self_attn": "mxfp8_e4m3"}),
    ],
)
def test_vllm_loads_the_modelopt_nvfp4_mxfp8_and_mixed_precision_the_command_writes(tmp_path, options, formats):
    """ModelOpt's W4A16_NVFP4 and MXFP8 (no calibration: weights only, or activations quantised as vLLM
    runs) and MIXED_PRECISION of the two, in both of ModelOpt's forms: vLLM's rule resolves each Linear
    to its module's quant_algo and reads the package's quantisation of it (NVFP4's fused shards under
    one per-tensor scale), lm_head plain, no missing or unexpected key."""
    dense = make_llama(tmp_path / "llama")
    r = run("quantize", "llama", "out", "--layout", "modelopt", *options, cwd=tmp_path)
    assert "14 tensor(s) quantised" in r.stdout, r.stdout
    loaded = vllm_load(tmp_path / "out", dense)
    fused = nk.checkpoints.fused_groups([f"{m}.weight" for m in loaded if m != "lm_head"])
    for module, values in loaded.items():
        want = dense[f"{module}.weight"]
        if module != "lm_head":
            fmt = formats[module.split(".")[3]]
            extra = {}
            if fmt == "nvfp4" and f"{module}.weight" in fused:
                extra["per_tensor_scale"] = nk.shared_per_tensor_scale([dense[n] for n in fused[f"{module}.weight"]])
            want = nk.quantize(want, fmt, **extra).dequantize()
            if fmt == "nvfp4":  # three float32 factors, multiplied in another order: within an ulp
                np.testing.assert_allclose(values, want, rtol=2**-23, atol=0, err_msg=module)
                continue
        assert np.array_equal(bits(values), bits(want)), module
    back = nk.load_checkpoint(tmp_path / "out")
    assert {back[f"{m}.weight"].fmt for m in loaded if m != "lm_head"} == set(formats.values())
    assert run("check", "out", cwd=tmp_path, check=False).returncode == 0
