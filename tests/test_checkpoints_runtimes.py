"""The runtimes' own loaders on what the command writes (docs/checkpoints.md). They need torch,
transformers and compressed-tensors (the ``runtimes`` extra): without them they skip with the
reason, and fail where ``NEURON_KERNELS_REQUIRE_RUNTIMES`` is set (CI installs them).

They run in the interpreter named by ``NEURON_KERNELS_RUNTIME_PYTHON`` (a virtual environment with
``torch``, ``transformers`` and ``compressed-tensors``), or in this one if it has them:

- transformers builds a tiny Llama and saves it in bfloat16; the command quantises it to each
  compressed-tensors format; transformers (with compressed-tensors) loads the result without a
  missing, unexpected or mismatched key, and its dequantised weights are the package's (with the
  shared per-tensor scale of q/k/v and gate/up) to within the runtime's bfloat16 rounding
  (exactly, for MX); so does ModelOpt's NVFP4 checkpoint converted by the command (ModelOpt's own
  values, tests/fixtures/modelopt), and the Llama's state dict quantised by
  ``quantize_state_dict`` and saved with its config (the command's weights); transformers' own
  FP8 decoders read compressed-tensors FP8 and fine-grained FP8 checkpoints as the package does;
- transformers builds a tiny gpt-oss; the command writes gpt-oss's MXFP4 layout; transformers
  (``Mxfp4Config(dequantize=True)``) loads it cleanly, its experts the package's bit for bit; the
  command dequantises it back to a checkpoint transformers loads cleanly, every tensor the
  original's name, shape and dtype; the dense Llama is refused by the gpt-oss layout.
"""

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints import fused_groups

from .checkpoint_helpers import read_safetensors, write_safetensors
from .cli_runner import run
from .fp8_checkpoints import MODELOPT, make_ct_fp8, make_fp8

BF16 = np.dtype(ml_dtypes.bfloat16)
MAKE_LLAMA = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
torch.manual_seed(0)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""

LOAD = """
import sys, json, numpy as np, torch
from transformers import AutoModelForCausalLM
args = sys.argv[1:]
for checkpoint, out, kind in zip(args[0::3], args[1::3], args[2::3]):  # several in one process
    kwargs = {}
    if kind == "compressed-tensors":
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    elif kind == "compressed-tensors-modules":  # compressed-tensors' own route: each module's group applied
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig()
    elif kind == "fp8":  # fine-grained FP8: transformers dequantises it on a CPU
        from transformers import FineGrainedFP8Config
        kwargs["quantization_config"] = FineGrainedFP8Config(dequantize=True)
    elif kind == "mxfp4":
        from transformers import Mxfp4Config
        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    model, info = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16, output_loading_info=True,
                                                       **kwargs)
    if kind == "compressed-tensors-modules":
        model.hf_quantizer.compressor.decompress_model(model)
    np.savez(out, **{k: v.detach().float().numpy() for k, v in model.state_dict().items()})
    print(json.dumps({k: sorted(map(str, v)) for k, v in info.items()}))
"""

CT_FORMATS = ["nvfp4", "mxfp4_e2m1", "mxfp8_e4m3"]

#: An llm-compressor recipe of two groups (its QuantizationModifier's config_groups), as users write them.
MIXED_RECIPE = """
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: ["lm_head"]
      config_groups:
        attention:
          targets: ["re:.*self_attn.*"]
          weights: {num_bits: 8, type: float, symmetric: true, strategy: channel, dynamic: false}
          input_activations: {num_bits: 8, type: float, symmetric: true, strategy: token, dynamic: true}
        mlp:
          targets: ["re:.*mlp.*"]
          weights: {num_bits: 4, type: float, symmetric: true, strategy: group, group_size: 32,
                    scale_dtype: torch.uint8}
"""


@pytest.fixture(scope="module")
def llama(runtime, tmp_path_factory):
    """A tiny Llama saved by transformers in bfloat16."""
    d = tmp_path_factory.mktemp("llama")
    runtime(MAKE_LLAMA, d / "llama")
    return d


@pytest.fixture(scope="module")
def ct_loaded(runtime, llama):
    """The Llama quantised by the command to each compressed-tensors format, then loaded by
    transformers (all three in one process): format -> (loading info, the loaded weights)."""
    args = []
    for fmt in CT_FORMATS:
        run("quantize", "llama", fmt, "--format", fmt, cwd=llama)
        args += [llama / fmt, llama / f"{fmt}.npz", "compressed-tensors"]
    # ModelOpt's NVFP4 checkpoint (tests/fixtures/modelopt), converted by the command (bytes copied)
    run("quantize", MODELOPT / "nvfp4", "modelopt-nvfp4", "--format", "nvfp4", cwd=llama)
    args += [llama / "modelopt-nvfp4", llama / "modelopt-nvfp4.npz", "compressed-tensors"]
    # the Llama's state dict quantised in memory (quantize_state_dict) and saved as save_file would
    tensors = read_safetensors(llama / "llama" / "model.safetensors")[0]
    config = json.loads((llama / "llama" / "config.json").read_text())
    quantised, qc = nk.quantize_state_dict(tensors, "nvfp4", config=config)  # its modules from the config
    (llama / "state-dict-nvfp4").mkdir()
    write_safetensors(llama / "state-dict-nvfp4" / "model.safetensors", quantised)
    (llama / "state-dict-nvfp4" / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    args += [llama / "state-dict-nvfp4", llama / "state-dict-nvfp4.npz", "compressed-tensors"]
    # FP8 layouts the package reads (tests/test_checkpoints_fp8.py's encoders): compressed-tensors
    # float-quantized (block strategy, bfloat16 scales) and fine-grained FP8 (128 x 128 blocks)
    fp8_expected = {"ct-fp8": make_ct_fp8(llama / "ct-fp8", "block"), "fine-fp8": make_fp8(llama / "fine-fp8")}
    args += [llama / "ct-fp8", llama / "ct-fp8.npz", "compressed-tensors"]
    args += [llama / "fine-fp8", llama / "fine-fp8.npz", "fp8"]
    # the shipped checkpoints' mistake (a per-tensor scale per fused shard, k_proj 8x its siblings),
    # repaired by `check --repair` (tests/test_checkpoints_doctor.py)
    shutil.copytree(llama / "llama", llama / "llama-k8")
    k = "model.layers.0.self_attn.k_proj.weight"
    write_safetensors(
        llama / "llama-k8" / "model.safetensors", {**tensors, k: (tensors[k].astype(np.float32) * 8).astype(BF16)}
    )
    run("quantize", "llama-k8", "nofuse-nvfp4", "--format", "nvfp4", "--no-fuse", cwd=llama)
    assert run("check", "nofuse-nvfp4", "--repair", "repaired-nvfp4", cwd=llama, check=False).returncode == 1
    args += [llama / "repaired-nvfp4", llama / "repaired-nvfp4.npz", "compressed-tensors"]
    # mixed precision, written by the command: NVFP4 beside FP8 attention (--scheme), MXFP4 MLP beside
    # FP8 attention (an llm-compressor recipe file)
    run("quantize", "llama", "mixed-scheme", "--format", "nvfp4", "--scheme", "*.self_attn.*=fp8_channel", cwd=llama)
    (llama / "recipe.yaml").write_text(MIXED_RECIPE)
    run("quantize", "llama", "mixed-recipe", "--recipe-file", "recipe.yaml", cwd=llama)
    # (transformers' dequantize=True reads every dense module with one group's scheme: the modules' route)
    args += [llama / "mixed-scheme", llama / "mixed-scheme.npz", "compressed-tensors-modules"]
    args += [llama / "mixed-recipe", llama / "mixed-recipe.npz", "compressed-tensors-modules"]
    names = [*CT_FORMATS, "modelopt-nvfp4", "state-dict-nvfp4", "ct-fp8", "fine-fp8", "repaired-nvfp4"]
    names += ["mixed-scheme", "mixed-recipe"]
    infos = [json.loads(line) for line in runtime(LOAD, *args).splitlines()[-len(names) :]]
    loaded = {name: (info, np.load(llama / f"{name}.npz")) for name, info in zip(names, infos)}
    loaded["fp8-expected"] = fp8_expected
    return loaded


@pytest.mark.parametrize("fmt", CT_FORMATS)
def test_compressed_tensors_loads_the_package_layout(ct_loaded, llama, fmt):
    info, loaded = ct_loaded[fmt]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    original = nk.load_checkpoint(llama / "llama")
    quantised = [n for n in original if n.endswith("_proj.weight")]
    assert len(quantised) == 7
    fused = fused_groups(quantised) if fmt == "nvfp4" else {}  # q/k/v and gate/up share a per-tensor scale
    assert len(set(fused.values())) == (2 if fmt == "nvfp4" else 0)
    for name in quantised:
        options = {}
        if name in fused:
            options["per_tensor_scale"] = nk.shared_per_tensor_scale([original[n] for n in fused[name]])
        want = nk.quantize(original[name], fmt, **options).dequantize("bfloat16").astype(np.float32)
        if fmt == "nvfp4":  # the runtime divides by the global scale and rounds to bfloat16
            np.testing.assert_allclose(loaded[name], want, rtol=2**-7, atol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(loaded[name], want, err_msg=name)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        np.testing.assert_array_equal(loaded[name], original[name].astype(np.float32))


@pytest.mark.parametrize(
    "name, formats",
    [("mixed-scheme", {"mlp": "nvfp4", "self_attn": "fp8_channel"}),
     ("mixed-recipe", {"mlp": "mxfp4_e2m1", "self_attn": "fp8_channel"})],
)  # fmt: skip
def test_compressed_tensors_loads_a_mixed_precision_checkpoint(ct_loaded, llama, name, formats):
    """Several schemes in one checkpoint (``--scheme``; an llm-compressor recipe file): transformers
    loads it with no missing, unexpected or mismatched key, each weight the package's quantisation of
    the original in its module's format (FP8 scales in the weight's dtype; NVFP4's gate/up sharing a
    per-tensor scale), to within the runtime's bfloat16 rounding where it divides by a global scale;
    the config's groups each say their format."""
    info, loaded = ct_loaded[name]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    qc = json.loads((llama / name / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision" and all(g["format"] for g in qc["config_groups"].values())
    original = nk.load_checkpoint(llama / "llama")
    quantised = [n for n in original if n.endswith("_proj.weight")]
    fused = fused_groups([n for n in quantised if ".mlp." in n])
    for n in quantised:
        fmt = formats[n.split(".")[3]]
        options = {"scale_dtype": "bfloat16"} if fmt == "fp8_channel" else {}
        if fmt == "nvfp4" and n in fused:
            options["per_tensor_scale"] = nk.shared_per_tensor_scale([original[m] for m in fused[n]])
        want = nk.quantize(original[n], fmt, **options).dequantize("bfloat16").astype(np.float32)
        if fmt == "nvfp4":
            np.testing.assert_allclose(loaded[n], want, rtol=2**-7, atol=0, err_msg=n)
        else:
            np.testing.assert_array_equal(loaded[n], want, err_msg=n)
    for n in ("model.embed_tokens.weight", "lm_head.weight"):
        np.testing.assert_array_equal(loaded[n], original[n].astype(np.float32))


def test_compressed_tensors_loads_a_converted_modelopt_checkpoint(ct_loaded):
    """ModelOpt NVFP4 -> compressed-tensors (the command): transformers loads it with no missing,
    unexpected or mismatched key, each weight ModelOpt's own dequantisation to within the runtime's
    bfloat16 rounding (it divides by ``weight_global_scale = 1 / weight_scale_2``)."""
    info, loaded = ct_loaded["modelopt-nvfp4"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    decoded = read_safetensors(MODELOPT / "nvfp4.dequantized.safetensors")[0]
    assert len(decoded) == 7
    for name, value in decoded.items():
        np.testing.assert_allclose(loaded[name], value, rtol=2**-7, atol=0, err_msg=name)
    source = read_safetensors(MODELOPT / "nvfp4" / "model.safetensors")[0]
    np.testing.assert_array_equal(loaded["lm_head.weight"], source["lm_head.weight"].astype(np.float32))


def test_compressed_tensors_loads_a_quantised_state_dict(ct_loaded):
    """``quantize_state_dict`` of the Llama's weights, saved with its config: transformers loads it
    with no missing, unexpected or mismatched key, the same weights as the command's checkpoint."""
    info, loaded = ct_loaded["state-dict-nvfp4"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    _, command = ct_loaded["nvfp4"]
    assert sorted(loaded) == sorted(command)
    for name in command:
        np.testing.assert_array_equal(loaded[name], command[name], err_msg=name)


def test_compressed_tensors_loads_a_repaired_checkpoint(ct_loaded, llama):
    """A checkpoint whose fused shards had scales of their own, repaired by ``check --repair``:
    transformers loads it with no missing, unexpected or mismatched key, each weight the
    package's dequantisation of the repaired file (to the runtime's bfloat16 rounding), and q/k/v
    now share one global scale."""
    info, loaded = ct_loaded["repaired-nvfp4"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    tensors = read_safetensors(llama / "repaired-nvfp4" / "model.safetensors")[0]
    qkv = {float(tensors[f"model.layers.0.self_attn.{p}_proj.weight_global_scale"][0]) for p in "qkv"}
    assert len(qkv) == 1
    repaired = nk.load_checkpoint(llama / "repaired-nvfp4")
    for name, q in repaired.items():
        if name.endswith("_proj.weight"):
            want = q.dequantize("bfloat16").astype(np.float32)
            np.testing.assert_allclose(loaded[name], want, rtol=2**-7, atol=0, err_msg=name)


@pytest.mark.parametrize("name", ["ct-fp8", "fine-fp8"])
def test_the_producers_decoders_read_fp8_checkpoints_as_the_package_does(ct_loaded, llama, name):
    """transformers' own FP8 decoders (compressed-tensors' decompression; its fine-grained FP8
    dequantisation, which it applies on a CPU) give the package's values, rounded to bfloat16 (the
    product of an FP8 code and its block's scale is exact in float32, so one rounding either way):
    a check of the package's reading against the producers' code. Both load with no missing,
    unexpected or mismatched key."""
    info, loaded = ct_loaded[name]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    ours = nk.load_checkpoint(llama / name)
    for weight, value in ct_loaded["fp8-expected"][name].items():
        values = ours[weight].dequantize()
        assert np.array_equal(values, value), weight
        np.testing.assert_array_equal(loaded[weight], values.astype(BF16).astype(np.float32), err_msg=weight)


# A Llama whose attention fits 128 x 128 tiles (q 256 rows, k and v 128) and whose MLP does not
# (320): gate/up are one fused layer whose first shard vLLM refuses in partial tiles, down_proj has
# 320 columns (a partial tile per row of tiles).
MAKE_LLAMA_320 = MAKE_LLAMA.replace("hidden_size=64, intermediate_size=128", "hidden_size=256, intermediate_size=320")
MLP = ("--ignore", "model.layers.0.mlp.gate_proj", "--ignore", "model.layers.0.mlp.up_proj")
#: (output folder, command options, loader kind) of each FP8 checkpoint the command writes
FP8_WRITTEN = {
    "ct-fp8_block": (("--format", "fp8_block", *MLP), "compressed-tensors"),
    "ct-fp8_channel": (("--format", "fp8_channel"), "compressed-tensors"),
    "ct-fp8_tensor": (("--format", "fp8_tensor"), "compressed-tensors"),
    "ct-fp8_channel-f32": (("--format", "fp8_channel", "--scale-dtype", "float32"), "compressed-tensors"),
    "fp8-block": (("--layout", "fp8", "--format", "fp8_block", *MLP, "--ignore", "model.layers.0.mlp.down_proj"),
                  "fp8"),
    "fp8-reciprocal": (("--layout", "fp8", "--format", "fp8_block", "--scale-mode", "reciprocal", *MLP,
                        "--ignore", "model.layers.0.mlp.down_proj"), "fp8"),
}  # fmt: skip


@pytest.fixture(scope="module")
def fp8_loaded(runtime, tmp_path_factory):
    """The 320 Llama written by the command in each FP8 layout and loaded by transformers (one
    process): name -> (the command's output, loading info, loaded weights)."""
    d = tmp_path_factory.mktemp("fp8")
    runtime(MAKE_LLAMA_320, d / "llama")
    args, outputs = [], {}
    for name, (options, kind) in FP8_WRITTEN.items():
        outputs[name] = run("quantize", "llama", name, *options, cwd=d).stdout
        args += [d / name, d / f"{name}.npz", kind]
    infos = [json.loads(line) for line in runtime(LOAD, *args).splitlines()[-len(FP8_WRITTEN) :]]
    loaded = {n: (outputs[n], info, np.load(d / f"{n}.npz")) for n, info in zip(FP8_WRITTEN, infos)}
    return d, loaded


@pytest.mark.parametrize("name", list(FP8_WRITTEN))
def test_transformers_loads_the_fp8_layouts_the_command_writes(fp8_loaded, name):
    """compressed-tensors float-quantized (each strategy; scales in the weight's dtype by default,
    as llm-compressor writes them, or float32) and fine-grained FP8 (DeepSeek's division by
    ``amax / 448``, or transformers' own reciprocal rule): no missing, unexpected or mismatched key,
    each quantised weight the package's quantisation of the original, rounded to bfloat16 once (the
    product of an FP8 code and its scale is exact in float32), every other tensor as it was."""
    d, loaded = fp8_loaded
    out, info, weights = loaded[name]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    options, kind = FP8_WRITTEN[name]
    fmt = options[options.index("--format") + 1]
    scale_dtype = options[options.index("--scale-dtype") + 1] if "--scale-dtype" in options else None
    mode = options[options.index("--scale-mode") + 1] if "--scale-mode" in options else "divide"
    if scale_dtype is None:  # compressed-tensors keeps the weight's dtype, fine-grained FP8 float32
        scale_dtype = "bfloat16" if kind == "compressed-tensors" else "float32"
    original = nk.load_checkpoint(d / "llama")
    written = nk.load_checkpoint(d / name)
    quantised = {n for n, v in written.items() if isinstance(v, nk.BlockArray)}
    ignored = {f"{options[i + 1]}.weight" for i, o in enumerate(options) if o == "--ignore"}
    assert quantised == {n for n in original if n.endswith("_proj.weight")} - ignored
    for n in quantised:
        q = nk.quantize(original[n], fmt, scale_mode=mode, scale_dtype=scale_dtype)
        assert written[n].fmt == fmt and written[n].scales.dtype == q.scales.dtype, n
        assert np.array_equal(written[n].codes, q.codes) and np.array_equal(written[n].scales, q.scales), n
        np.testing.assert_array_equal(weights[n], q.dequantize("bfloat16").astype(np.float32), err_msg=n)
    for n in original:
        if n not in quantised:
            np.testing.assert_array_equal(weights[n], original[n].astype(np.float32), err_msg=n)
    if name == "ct-fp8_block":  # down_proj's 320 columns: partial tiles, which compressed-tensors reads
        assert written["model.layers.0.mlp.down_proj.weight"].scales.shape == (2, 3)


#: (output folder, command options) of each integer checkpoint the command writes (compressed-tensors
#: pack-quantized), on the 256 x 320 Llama: groups of 32 and 64 (320 columns are whole groups of
#: both, not of 128), per channel, with zero points, 8 and 3 bits.
INT_WRITTEN = {
    "int4-g32": ("--format", "int4_group", "--block-size", "32", "--recipe", "llm-compressor"),
    "int4-g64-asym": ("--format", "int4_group_asym", "--block-size", "64"),
    "int4-channel": ("--format", "int4_channel"),
    "int8-g32": ("--format", "int8_group", "--block-size", "32"),
    "int3-g32-asym": ("--format", "int3_group_asym", "--block-size", "32"),
}


@pytest.fixture(scope="module")
def int_loaded(runtime, tmp_path_factory):
    """The 320 Llama written by the command in each integer scheme and loaded by transformers with
    compressed-tensors (one process): name -> (loading info, loaded weights)."""
    d = tmp_path_factory.mktemp("int")
    runtime(MAKE_LLAMA_320, d / "llama")
    args = []
    for name, options in INT_WRITTEN.items():
        run("quantize", "llama", name, *options, cwd=d)
        args += [d / name, d / f"{name}.npz", "compressed-tensors"]
    run("quantize", "llama", "mixed-int", *MIXED_INT, cwd=d)  # each module's group applied
    args += [d / "mixed-int", d / "mixed-int.npz", "compressed-tensors-modules"]
    names = [*INT_WRITTEN, "mixed-int"]
    infos = [json.loads(line) for line in runtime(LOAD, *args).splitlines()[-len(names) :]]
    return d, {n: (info, np.load(d / f"{n}.npz")) for n, info in zip(names, infos)}


#: Integers in groups of 32 for the MLP beside FP8 attention: ``mixed-precision`` (symmetric: the
#: compressed route transformers loads it by misreads zero points, see the xfail below).
MIXED_INT = ("--format", "fp8_channel", "--scheme", "*.mlp.*=int4_group,block_size=32")


def test_transformers_compressed_route_refuses_zero_points_and_the_summary_says_so(int_loaded, runtime):
    """transformers' bug (neuron_kernels/checkpoints/runtimes.py ZERO_POINT_BUG): its compressed route
    allocates pack-quantized zero points unpacked and refuses llm-compressor's own W4A16_ASYM; the
    command's summary says so for a checkpoint with zero points. A strict xfail: a release that reads
    them is noticed."""
    d, _ = int_loaded
    out = run("quantize", "llama", "asym-note", "--format", "int4_group_asym", "--block-size", "32", cwd=d).stdout
    assert "run_compressed=False" in out, out
    fixture = Path(__file__).parent / "fixtures" / "llmcompressor" / "w4a16_asym"
    try:
        runtime(LOAD, fixture, d / "asym.npz", "compressed-tensors-modules")
    except AssertionError as exc:
        assert "weight_zero_point" in str(exc) and "mismatch" in str(exc).lower(), str(exc)[-800:]
        pytest.xfail("transformers' compressed route refuses packed zero points (its bug, known through 5.25)")
    pytest.fail("transformers now loads packed zero points on its compressed route: drop ZERO_POINT_BUG")


def test_transformers_loads_an_integer_and_fp8_mixed_precision_checkpoint(int_loaded):
    """A compressed-tensors ``mixed-precision`` checkpoint of integer and FP8 groups (its integer
    group saying its own group size): transformers with compressed-tensors loads it with no missing,
    unexpected or mismatched key, each weight the package's quantisation in its module's format."""
    d, loaded = int_loaded
    info, weights = loaded["mixed-int"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    qc = json.loads((d / "mixed-int" / "config.json").read_text())["quantization_config"]
    sizes = {g["format"]: g["weights"]["group_size"] for g in qc["config_groups"].values()}
    assert qc["format"] == "mixed-precision" and sizes == {"pack-quantized": 32, "float-quantized": None}
    original = nk.load_checkpoint(d / "llama")
    for n in original:
        if not n.endswith("_proj.weight"):
            np.testing.assert_array_equal(weights[n], original[n].astype(np.float32), err_msg=n)
            continue
        fmt, size = ("int4_group", 32) if ".mlp." in n else ("fp8_channel", None)
        q = nk.quantize(original[n], fmt, block_size=size, scale_dtype="bfloat16")
        np.testing.assert_array_equal(weights[n], q.dequantize("bfloat16").astype(np.float32), err_msg=n)


@pytest.mark.parametrize("name", list(INT_WRITTEN))
def test_transformers_loads_the_integer_checkpoints_the_command_writes(int_loaded, name):
    """compressed-tensors pack-quantized as the command writes it: transformers loads it with no
    missing, unexpected or mismatched key, and its decompression gives each weight the package's
    dequantisation (in the scales' dtype, bfloat16) bit for bit; every other tensor as it was."""
    d, loaded = int_loaded
    info, weights = loaded[name]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    options = INT_WRITTEN[name]
    fmt = options[options.index("--format") + 1]
    size = int(options[options.index("--block-size") + 1]) if "--block-size" in options else None
    original = nk.load_checkpoint(d / "llama")
    written = nk.load_checkpoint(d / name)
    quantised = {n for n, v in written.items() if isinstance(v, nk.BlockArray)}
    assert quantised == {n for n in original if n.endswith("_proj.weight")}
    for n in quantised:
        q = nk.quantize(original[n], fmt, block_size=size, scale_dtype="bfloat16")
        assert written[n].fmt == fmt, n
        assert np.array_equal(written[n].integer_codes(), q.integer_codes()), n
        assert np.array_equal(written[n].scales, q.scales), n
        np.testing.assert_array_equal(weights[n], q.dequantize("bfloat16").astype(np.float32), err_msg=n)
    for n in original:
        if n not in quantised:
            np.testing.assert_array_equal(weights[n], original[n].astype(np.float32), err_msg=n)


def test_transformers_refuses_fine_grained_fp8_in_partial_tiles_and_the_summary_says_so(fp8_loaded, runtime):
    """transformers' bug (neuron_kernels/checkpoints/runtimes.py): it derives the block from the
    scale grid, so down_proj's 320 columns in tiles of 128 are refused (vLLM, which allocates the
    grid with a ceiling, loads them); the command writes them, as DeepSeek's checkpoints hold
    them, and its summary names the weight. A strict xfail: a release that reads them is noticed."""
    d, _ = fp8_loaded
    out = run("quantize", "llama", "fp8-partial", "--layout", "fp8", "--format", "fp8_block", *MLP, cwd=d).stdout
    assert "refuses fine-grained FP8 weights" in out and "model.layers.0.mlp.down_proj.weight" in out, out
    try:
        runtime(LOAD, d / "fp8-partial", d / "fp8-partial.npz", "fp8")
    except AssertionError as exc:
        assert "conversion" in str(exc).lower() or "divisible" in str(exc).lower(), str(exc)[-500:]
        pytest.xfail("transformers refuses fine-grained FP8 weights in partial tiles (its bug, known through 5.25)")
    pytest.fail("transformers now loads fine-grained FP8 in partial tiles: drop the note in runtimes.py")


MAKE_GPT_OSS = """
import sys, torch
from transformers import GptOssConfig, GptOssForCausalLM
cfg = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                   vocab_size=128, max_position_embeddings=64, layer_types=["full_attention"])
torch.manual_seed(0)
GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""


def test_gpt_oss_through_the_command_loads_in_transformers(runtime, tmp_path):
    """bfloat16 gpt-oss -> ``quantize --layout mxfp4`` -> transformers loads it with no missing,
    unexpected or mismatched key, its dequantised experts the package's bit for bit ->
    ``dequantize`` -> transformers loads the plain checkpoint, every tensor as in the original."""
    runtime(MAKE_GPT_OSS, tmp_path / "oss")
    out = run("quantize", "oss", "q", "--layout", "mxfp4", "--format", "mxfp4_e2m1", cwd=tmp_path).stdout
    plain = nk.load_checkpoint(tmp_path / "oss")
    experts = sorted(n for n in plain if n.endswith(("experts.gate_up_proj", "experts.down_proj")))
    assert len(experts) == 2 and all(n in out for n in experts)
    stored = nk.load_checkpoint(tmp_path / "q")
    assert {n for n, v in stored.items() if isinstance(v, nk.BlockArray)} == set(experts)
    for name, value in plain.items():  # everything but the experts as gpt-oss keeps it: the same bytes
        if name not in experts:
            assert stored[name].dtype == value.dtype and stored[name].shape == value.shape, name
            np.testing.assert_array_equal(stored[name].view(np.uint8), value.view(np.uint8), err_msg=name)
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                   "lm_head"],
    }  # fmt: skip

    info = json.loads(runtime(LOAD, tmp_path / "q", tmp_path / "rt.npz", "mxfp4").splitlines()[-1])
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    theirs = np.load(tmp_path / "rt.npz")
    for name in experts:
        w = np.ascontiguousarray(np.swapaxes(plain[name], 1, 2))  # gpt-oss blocks run along `in`
        want = np.swapaxes(nk.quantize(w, "mxfp4_e2m1").dequantize("bfloat16"), 1, 2).astype(np.float32)
        assert theirs[name].shape == plain[name].shape
        np.testing.assert_array_equal(theirs[name], want, err_msg=name)
        np.testing.assert_array_equal(
            theirs[name], np.swapaxes(stored[name].dequantize("bfloat16"), 1, 2).astype(np.float32), err_msg=name
        )

    run("dequantize", "q", "plain", cwd=tmp_path)
    back = nk.load_checkpoint(tmp_path / "plain")
    assert set(back) == set(plain)
    for name, value in plain.items():
        assert (back[name].dtype, back[name].shape) == (value.dtype, value.shape), name
    for name in experts:
        np.testing.assert_array_equal(back[name].astype(np.float32), theirs[name], err_msg=name)
    info = json.loads(runtime(LOAD, tmp_path / "plain", tmp_path / "p.npz", "plain").splitlines()[-1])
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    assert "quantization_config" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_a_dense_llama_is_refused_by_the_gpt_oss_layout(llama, tmp_path):
    (tmp_path / "llama").symlink_to(llama / "llama")
    r = run("quantize", "llama", "q", "--layout", "mxfp4", "--format", "mxfp4_e2m1", cwd=tmp_path, check=False)
    assert r.returncode == 2 and r.stdout == "", r
    assert len(r.stderr.strip().splitlines()) == 1 and "--layout compressed-tensors" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"] and not (llama / "q").exists()
