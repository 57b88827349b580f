"""Checkpoints of several schemes: a compressed-tensors ``mixed-precision`` checkpoint read module
by module, each module in the format of the group compressed-tensors gives it (docs/checkpoints.md
"Several schemes in one checkpoint")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from neuron_kernels import quantize
from neuron_kernels.checkpoints import load_checkpoint
from neuron_kernels.checkpoints.targets import Refused, ct_group, vllm_group
from neuron_kernels.io.arrays import FileFormatError
from neuron_kernels.io.safetensors import read_safetensors_header

from .checkpoint_helpers import read_safetensors, write_safetensors
from .cli_runner import run

TINY_LLAMA = Path(__file__).parent / "fixtures" / "modelopt" / "bf16"


def _one(tmp: Path, fmt: str, only: str) -> Path:
    out = tmp / fmt
    r = run("quantize", TINY_LLAMA, out, "--format", fmt, "--only", only, "--no-stats", cwd=tmp)
    assert r.returncode == 0, r.stderr
    return out


def load_file(path: str) -> dict[str, np.ndarray]:
    return read_safetensors(path)[0]


def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str]) -> None:
    write_safetensors(path, tensors, metadata)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """NVFP4 MLP beside FP8 (per channel) attention, as compressed-tensors writes such a checkpoint:
    a group per scheme with its own ``format``, top-level ``format: mixed-precision``. Made from two
    checkpoints of one scheme each, written by the command and each loaded by transformers in the
    architecture matrix; each module of the mixed one must read as it does in its own."""
    tmp = tmp_path_factory.mktemp("mixed")
    nvfp4, fp8 = _one(tmp, "nvfp4", "*.mlp.*"), _one(tmp, "fp8_channel", "*.self_attn.*")
    out = tmp / "mixed"
    shutil.copytree(nvfp4, out)
    tensors = {
        **{k: v for k, v in load_file(str(nvfp4 / "model.safetensors")).items() if ".self_attn." not in k},
        **{k: v for k, v in load_file(str(fp8 / "model.safetensors")).items() if ".self_attn." in k},
    }
    _, metadata, _ = read_safetensors_header(str(nvfp4 / "model.safetensors"))
    save_file(tensors, str(out / "model.safetensors"), metadata)  # the exact per-tensor scales too
    config = _config(nvfp4)
    qn, qf = config["quantization_config"], _config(fp8)["quantization_config"]
    attn, mlp = qf["config_groups"]["group_0"], qn["config_groups"]["group_0"]
    attn["format"] = "float-quantized"  # as compressed-tensors writes every group of a mixed checkpoint
    attn["targets"], mlp["targets"] = [r"re:.*self_attn\.(q|k|v|o)_proj$"], [r"re:.*mlp\.(gate|up|down)_proj$"]
    ignore = [m for m in qn["ignore"] if m in qf["ignore"]]  # kept by both: neither scheme quantises it
    qn.update(format="mixed-precision", config_groups={"group_0": attn, "group_1": mlp}, ignore=ignore)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out, nvfp4, fp8


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        return
    assert a.layout == b.layout and a.per_tensor_scale == b.per_tensor_scale
    np.testing.assert_array_equal(a.dequantize().view(np.uint32), b.dequantize().view(np.uint32))


def test_each_module_reads_in_its_groups_format(mixed):
    out, nvfp4, fp8 = mixed
    got, by_nvfp4, by_fp8 = load_checkpoint(out), load_checkpoint(nvfp4), load_checkpoint(fp8)
    assert set(got) == set(by_nvfp4)
    formats = {}
    for name, value in got.items():
        _same(value, (by_fp8 if ".self_attn." in name else by_nvfp4)[name])
        if not isinstance(value, np.ndarray):
            formats[name.split(".")[4]] = value.fmt
    attention = {p: "fp8_channel" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    assert formats == {**attention, "gate_proj": "nvfp4", "up_proj": "nvfp4", "down_proj": "nvfp4"}


def test_the_command_dequantizes_checks_and_converts_it(mixed, tmp_path):
    out, nvfp4, fp8 = mixed
    r = run("dequantize", out, tmp_path / "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plain, by_nvfp4, by_fp8 = load_checkpoint(tmp_path / "plain"), load_checkpoint(nvfp4), load_checkpoint(fp8)
    quantised = 0
    for name, value in plain.items():
        source = (by_fp8 if ".self_attn." in name else by_nvfp4)[name]
        if not isinstance(source, np.ndarray):
            quantised += 1
            source = source.dequantize().astype(value.dtype)  # bfloat16, rounded to nearest even
        np.testing.assert_array_equal(value.view(np.uint8), source.view(np.uint8))
    assert quantised == 7
    r = run("check", out, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("quantize", out, tmp_path / "mx", "--format", "mxfp8_e4m3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_a_scale_no_group_quantises_is_refused(mixed, tmp_path):
    out, _, _ = mixed
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    config = _config(bad)
    config["quantization_config"]["config_groups"]["group_0"]["targets"] = [r"re:.*self_attn\.(q|k|v)_proj$"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileFormatError, match=r"o_proj.weight_scale is stored, but no config group quantises"):
        load_checkpoint(bad)


def test_compressed_tensors_precedence_exact_then_regex_then_class(mixed, tmp_path):
    """A module matched by several groups takes compressed-tensors' choice: an exact name before a
    regular expression before a class name, whatever the groups' order."""
    out, _, _ = mixed
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    config = _config(moved)
    groups = config["quantization_config"]["config_groups"]
    attn, mlp = groups["group_0"], groups["group_1"]
    # The MLP group first, claiming every Linear; attention by exact names (and a regex for the rest).
    attn["targets"] = sorted({k.rsplit(".", 1)[0] for k in load_checkpoint(out) if ".self_attn." in k})
    mlp["targets"] = ["Linear", r"re:.*mlp\..*"]
    config["quantization_config"]["config_groups"] = {"group_0": mlp, "group_1": attn}
    (moved / "config.json").write_text(json.dumps(config))
    got = load_checkpoint(moved)
    assert {v.fmt for k, v in got.items() if ".self_attn." in k and not isinstance(v, np.ndarray)} == {"fp8_channel"}


@pytest.fixture(scope="module")
def with_kv_scales(tmp_path_factory):
    """The command's FP8 checkpoint with the KV-cache scales llm-compressor's FP8 KV-cache recipes
    add (``self_attn.k_scale`` / ``v_scale``, one float32 each) and their ``kv_cache_scheme``."""
    tmp = tmp_path_factory.mktemp("kv")
    out = _one(tmp, "fp8_channel", "*.self_attn.*")
    path = str(out / "model.safetensors")
    _, metadata, _ = read_safetensors_header(path)
    tensors = {k: np.array(v) for k, v in load_file(path).items()}  # copies: the file is rewritten
    scales = {"model.layers.0.self_attn.k_scale": 0.0123, "model.layers.0.self_attn.v_scale": 0.0456}
    tensors.update({k: np.array(v, np.float32).reshape(()) for k, v in scales.items()})
    save_file(tensors, path + ".new", metadata)
    Path(path + ".new").replace(path)
    config = _config(out)
    kv = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
    config["quantization_config"]["kv_cache_scheme"] = kv
    (out / "config.json").write_text(json.dumps(config))
    return out, scales


def test_kv_cache_scales_are_read_checked_and_carried(with_kv_scales, tmp_path):
    out, scales = with_kv_scales
    got = load_checkpoint(out)
    assert {k: got[k].item() for k in scales} == {k: float(np.float32(v)) for k, v in scales.items()}
    r = run("check", out, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("quantize", out, tmp_path / "nv", "--format", "nvfp4", "--no-stats", cwd=tmp_path)
    converted = load_checkpoint(tmp_path / "nv")
    for name in scales:  # carried bit for bit, and declared as vLLM reads them
        np.testing.assert_array_equal(converted[name].view(np.uint32), got[name].view(np.uint32))
    kv = _config(tmp_path / "nv")["quantization_config"]["kv_cache_scheme"]
    assert kv == {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
    assert run("check", tmp_path / "nv", cwd=tmp_path, check=False).returncode == 0


def test_a_plain_checkpoint_drops_the_kv_cache_scales_and_says_so(with_kv_scales, tmp_path):
    out, scales = with_kv_scales
    r = run("dequantize", out, tmp_path / "plain", cwd=tmp_path)
    for name in scales:
        assert f"{name} (float32, ()) dropped: a KV-cache scale" in r.stdout
    assert not set(scales) & set(load_checkpoint(tmp_path / "plain"))


# ---- writing several schemes -------------------------------------------------------------------------

ATTENTION_FP8 = ("--format", "nvfp4", "--scheme", "*.self_attn.*=fp8_channel")


def test_the_command_writes_one_scheme_per_module(tmp_path):
    """``--scheme`` beside ``--format``: each weight in its module's format, the same codes and scales
    as the one-format checkpoints give it; a group per format, each with its own ``format`` and
    targets naming its modules alone; the doctor finds nothing; the summary says the formats."""
    r = run("quantize", TINY_LLAMA, tmp_path / "out", *ATTENTION_FP8, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "nvfp4 (3), fp8_channel (4): 7 tensor(s)" in r.stdout.splitlines()[0]
    assert "dequantize=True" in r.stdout  # transformers' dequantising loader reads one group: said
    got = load_checkpoint(tmp_path / "out")
    by_nvfp4 = load_checkpoint(_one(tmp_path, "nvfp4", "*.mlp.*"))
    by_fp8 = load_checkpoint(_one(tmp_path, "fp8_channel", "*.self_attn.*"))
    for name, value in got.items():
        _same(value, (by_fp8 if ".self_attn." in name else by_nvfp4)[name])
    qc = _config(tmp_path / "out")["quantization_config"]
    assert qc["format"] == "mixed-precision"
    formats = {g["format"]: g["targets"] for g in qc["config_groups"].values()}
    assert formats == {
        "nvfp4-pack-quantized": [rf"re:model\.layers\.\d+\.mlp\.{p}_proj$" for p in ("down", "gate", "up")],
        "float-quantized": [rf"re:model\.layers\.\d+\.self_attn\.{p}_proj$" for p in "koqv"],
    }
    assert run("check", tmp_path / "out", cwd=tmp_path, check=False).returncode == 0


def test_a_recipe_file_reads_as_llm_compressor_writes_it(tmp_path):
    """A recipe of llm-compressor's shape (stages, a QuantizationModifier, config_groups with its
    targets and ignore) and the same groups as JSON give the checkpoint ``--scheme`` gives."""
    recipe = {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {
        "ignore": ["lm_head"],
        "config_groups": {
            "attention": {"targets": ["re:.*self_attn.*"], "weights": {
                "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}},
            "mlp": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}},
        },
    }}}}  # fmt: skip
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    r = run("quantize", TINY_LLAMA, tmp_path / "recipe", "--recipe-file", "recipe.json", "--no-stats", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run("quantize", TINY_LLAMA, tmp_path / "scheme", *ATTENTION_FP8, "--no-stats", cwd=tmp_path)
    a, b = load_checkpoint(tmp_path / "recipe"), load_checkpoint(tmp_path / "scheme")
    assert set(a) == set(b)
    for name in a:
        _same(a[name], b[name])
    groups = _config(tmp_path / "recipe")["quantization_config"]["config_groups"]
    attention = next(g for g in groups.values() if g["format"] == "float-quantized")
    assert attention["input_activations"] == recipe["quant_stage"]["quant_modifiers"]["QuantizationModifier"][
        "config_groups"]["attention"]["input_activations"]  # fmt: skip


@pytest.mark.parametrize(
    "options, message",
    [
        (("--format", "nvfp4", "--scheme", "*.self_attn.q_proj=fp8_channel"),
         "one fused layer in the runtimes, which need one scheme for all its shards"),
        (("--format", "fp8_block", "--scheme", "*.self_attn.*=fp8_block,scale_dtype=bfloat16", "--layout", "fp8"),
         "the fp8 layout holds one scheme per checkpoint"),
        (("--format", "nvfp4", "--scheme", "*.self_attn.*=fp8_channel", "--layout", "modelopt"),
         "would load fp8_channel (FP8_PER_CHANNEL_PER_TOKEN) unquantised"),
        (("--scheme", "*.mlp.*"), "give PATTERN=FORMAT"),
        (("--scheme", "*.mlp.*=nvfp5"), "'nvfp5' is not a block format"),
        (("--scheme", "*.mlp.*=nvfp4,colour=red"), "'colour=red' is not option=value"),
        (("--scheme", "*.mlp.*=nvfp4,scale_dtype=bfloat16"), "--scheme '*.mlp.*=nvfp4,scale_dtype=bfloat16': "),
        ((), "--format is required"),
        (("--scheme", "*.mlp.*=nvfp4", "--recipe-file", "r.yaml"), "not both"),
    ],
)  # fmt: skip
def test_schemes_that_cannot_be_written_are_refused_in_one_line(tmp_path, options, message):
    r = run("quantize", TINY_LLAMA, tmp_path / "out", *options, cwd=tmp_path, check=False)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "recipe, message",
    [
        ("scheme: NVFP4\ntargets: [Linear]\n", "needs calibration data (NVFP4A16 quantises the weights only)"),
        ("scheme: FP8\n", "static per-tensor activation scales"),
        ("scheme: W8A8\n", "int8 activations"),
        ("scheme: W4A16_AWQ\n", "not one this package writes"),
        ("scheme: FP8_DYNAMIC\nkv_cache_scheme: {num_bits: 8, type: float}\n", "kv_cache_scheme needs calibration"),
        ("config_groups:\n  g: {targets: [Linear], weights: {num_bits: 4, type: int, strategy: group, "
         "group_size: 128, actorder: group}}\n", "not a scheme this package writes"),
        ("config_groups:\n  g: {targets: [Linear], weights: {num_bits: 4, type: int, strategy: group, "
         "group_size: 32}, input_activations: {num_bits: 8, type: int, strategy: token, dynamic: true}}\n",
         "activations of integer weights"),
        ("scheme: W4A16\n", "whole groups of 128"),
        ("config_groups:\n  g: {targets: [Linear], weights: {num_bits: 8, type: float, strategy: channel}, "
         "input_activations: {num_bits: 8, type: float, strategy: tensor, dynamic: false}}\n", "static scales"),
        ("stages: [1, 2]\n", "no config_groups or scheme found"),
        ("scheme: [unclosed\n", "not YAML"),
    ],
)  # fmt: skip
def test_recipes_that_need_calibration_or_other_formats_are_refused(tmp_path, recipe, message):
    (tmp_path / "r.yaml").write_text(recipe)
    r = run("quantize", TINY_LLAMA, tmp_path / "out", "--recipe-file", "r.yaml", cwd=tmp_path, check=False)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


INTEGER_RECIPE = """
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: [lm_head]
      config_groups:
        mlp:
          targets: ["re:.*mlp.*"]
          weights: {num_bits: 4, type: int, symmetric: false, strategy: group, group_size: 32}
        attention:
          targets: ["re:.*self_attn.*"]
          weights: {num_bits: 8, type: int, symmetric: true, strategy: channel}
"""


def test_a_recipe_of_integer_groups_is_written_with_each_groups_size(tmp_path):
    """An llm-compressor recipe of integer groups (W4A16_ASYM in groups of 32, int8 per channel):
    each module quantised in its group's format and group size, the config's groups saying them."""
    (tmp_path / "r.yaml").write_text(INTEGER_RECIPE)
    run("quantize", TINY_LLAMA, tmp_path / "out", "--recipe-file", "r.yaml", cwd=tmp_path)
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    groups = {g["weights"]["num_bits"]: g["weights"] for g in qc["config_groups"].values()}
    assert groups[4]["group_size"] == 32 and groups[4]["symmetric"] is False and groups[4]["strategy"] == "group"
    assert groups[8]["strategy"] == "channel" and groups[8]["group_size"] is None
    original, got = load_checkpoint(TINY_LLAMA), load_checkpoint(tmp_path / "out")
    for name, q in got.items():
        if not name.endswith("_proj.weight"):
            continue
        fmt, size = ("int4_group_asym", 32) if ".mlp." in name else ("int8_channel", None)
        want = quantize(original[name], fmt, block_size=size, scale_dtype="bfloat16")
        assert q.fmt == fmt and np.array_equal(q.integer_codes(), want.integer_codes()), name
        assert np.array_equal(q.scales, want.scales), name


def test_a_scheme_takes_its_own_options_and_an_unchanged_module_is_copied(tmp_path, mixed):
    """``--scheme PATTERN=FORMAT,option=value``: the option applies to that group's weights; converting
    the mixed checkpoint with its attention's scheme unchanged copies those weights' bytes."""
    r = run("quantize", TINY_LLAMA, tmp_path / "f32", "--format", "nvfp4", "--scheme",
            "*.self_attn.*=fp8_channel,scale_dtype=float32", "--no-stats", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = load_checkpoint(tmp_path / "f32")
    assert got["model.layers.0.self_attn.q_proj.weight"].scales.dtype == np.float32
    out, _, _ = mixed
    r = run("quantize", out, tmp_path / "mx", "--format", "mxfp8_e4m3", "--scheme", "*.self_attn.*=fp8_channel",
            cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("bytes copied from compressed-tensors") == 4
    before, after = load_checkpoint(out), load_checkpoint(tmp_path / "mx")
    for name in before:
        if ".self_attn." in name and name.endswith("_proj.weight"):
            _same(before[name], after[name])
        elif name.endswith("_proj.weight"):
            assert after[name].fmt == "mxfp8_e4m3"


# ---- the doctor on schemes ----------------------------------------------------------------------------


def test_the_doctor_names_a_module_the_two_runtimes_read_differently(mixed, tmp_path):
    """ROCmFPX #79's mistake: the FP8 group (first in the config) also claims down_proj, which the
    NVFP4 group's expression matches too. compressed-tensors takes the expressions in string order
    (``re:.*mlp.*`` first: NVFP4, as stored); vLLM takes the first target in config order (FP8)."""
    out, _, _ = mixed
    bad = tmp_path / "overlap"
    shutil.copytree(out, bad)
    config = _config(bad)
    groups = config["quantization_config"]["config_groups"]
    groups["group_0"]["targets"] = [r"re:.*self_attn.*", r"re:.*mlp\.down_proj"]
    groups["group_1"]["targets"] = [r"re:.*mlp.*"]
    (bad / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(bad)["model.layers.0.mlp.down_proj.weight"].fmt == "nvfp4"  # compressed-tensors' group
    r = run("check", bad, "--json", cwd=tmp_path, check=False)
    assert r.returncode == 1
    order = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "scheme-order"]
    assert [f["tensors"] for f in order] == [["model.layers.0.mlp.down_proj.weight"]]
    assert "group 'group_1'" in order[0]["message"] and "vLLM group 'group_0'" in order[0]["message"]


def test_the_doctor_finds_unused_targets_and_scales_that_cannot_be_right(with_kv_scales, tmp_path):
    out, scales = with_kv_scales
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    config = _config(bad)
    config["quantization_config"]["config_groups"]["group_0"]["targets"] += ["model.layers.7.self_attn.q_proj"]
    config["quantization_config"]["ignore"] += ["model.layers.9.mlp.up_proj"]
    (bad / "config.json").write_text(json.dumps(config))
    path = str(bad / "model.safetensors")
    _, metadata, _ = read_safetensors_header(path)
    tensors = {k: np.array(v) for k, v in load_file(path).items()}
    tensors["model.layers.0.self_attn.k_scale"] = np.array(-0.5, np.float32)
    save_file(tensors, path + ".new", metadata)
    Path(path + ".new").replace(path)
    r = run("check", bad, "--json", cwd=tmp_path, check=False)
    found = {(f["severity"], f["kind"]): f["message"] for f in json.loads(r.stdout)["findings"]}
    assert "model.layers.7.self_attn.q_proj" in found["warning", "scheme-unused"]
    assert "'model.layers.9.mlp.up_proj' names no module" in found["note", "scheme-unused"]
    assert "a scale of -0.5" in found["error", "kv-scale"]
    tensors["model.layers.0.self_attn.k_scale"] = tensors["model.layers.0.self_attn.v_scale"] = np.array(1, np.float32)
    save_file(tensors, path + ".new", metadata)
    Path(path + ".new").replace(path)
    r = run("check", bad, "--json", cwd=tmp_path, check=False)
    found = {(f["severity"], f["kind"]): f["message"] for f in json.loads(r.stdout)["findings"]}
    assert "all 2 KV-cache and activation scales are exactly 1.0" in found["warning", "kv-scale"]


# ---- matching as each runtime matches (neuron_kernels/checkpoints/targets.py) ---------------------------
# Expected groups worked out by hand from the two runtimes' rules: compressed-tensors 0.20.1
# (utils/match.py: exact names, then re: in string order, then class names; a target in two groups
# is the later's) and vLLM (compressed_tensors/utils.py find_matched_target: first target in config
# order by name, then by class name contained, then a fused layer's shards; should_ignore_layer).

QKV = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj")


def test_overlapping_expressions_the_two_orders_differ():
    groups = [(r"re:.*self_attn.*", r"re:.*mlp\.down_proj"), (r"re:.*mlp.*",)]
    down = "model.layers.0.mlp.down_proj"
    assert ct_group((down,), groups, []) == 1  # "re:.*mlp.*" < "re:.*mlp\.down_proj" as strings
    assert vllm_group(down, groups, []) == 0  # the first group's target comes first in config order
    assert ct_group(("model.layers.0.mlp.up_proj",), groups, []) == vllm_group("model.layers.0.mlp.up_proj",
                                                                                groups, []) == 1  # fmt: skip


def test_a_class_target_takes_a_fused_layer_in_vllm_before_its_shards_names():
    groups = [("Linear",), QKV]
    for shard in QKV:
        assert ct_group((shard,), groups, []) == 1  # exact names before class names
        assert vllm_group(shard, groups, [], QKV, "model.layers.0.self_attn.qkv_proj") == 0  # QKVParallelLinear
    assert vllm_group(QKV[0], [QKV], [], QKV, "model.layers.0.self_attn.qkv_proj") == 0  # by every shard's name


def test_vllm_refuses_a_fused_layer_ignored_in_part_and_an_moe_of_two_schemes():
    with pytest.raises(Refused, match="ignored in part"):
        vllm_group(QKV[0], [("Linear",)], [QKV[0]], QKV, "model.layers.0.self_attn.qkv_proj")
    assert vllm_group(QKV[0], [("Linear",)], list(QKV), QKV, "model.layers.0.self_attn.qkv_proj") is None
    probes = tuple(f"model.layers.0.mlp.experts.0.{p}_proj" for p in ("gate", "up", "down"))
    expert = "model.layers.0.mlp.experts.5.gate_proj"
    assert vllm_group(expert, [("Linear",)], [], moe_probes=probes) == 0  # FusedMoE added beside Linear
    with pytest.raises(Refused, match="fused MoE"):
        vllm_group(expert, [("Linear",), (r"re:.*down_proj$",)], [], moe_probes=probes)


def test_schemes_that_change_from_layer_to_layer_keep_the_layers_number(tmp_path):
    """Layer 0 in FP8, layer 1's down_proj in MXFP8, the rest NVFP4: a module's name with every number
    as ``\\d+`` would name modules of two schemes, so the layer's own number is kept; every module reads
    back in its scheme and the doctor finds nothing."""
    tensors = load_file(str(TINY_LLAMA / "model.safetensors"))
    tensors.update({k.replace(".layers.0.", ".layers.1."): v for k, v in tensors.items() if ".layers.0." in k})
    (tmp_path / "two").mkdir()
    save_file(tensors, str(tmp_path / "two" / "model.safetensors"), {"format": "pt"})
    (tmp_path / "two" / "config.json").write_text(json.dumps({**_config(TINY_LLAMA), "num_hidden_layers": 2}))
    r = run("quantize", "two", "out", "--format", "nvfp4", "--scheme", "model.layers.0.*=fp8_channel",
            "--scheme", "*.layers.1.mlp.down_proj=mxfp8_e4m3", "--no-stats", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    groups = {
        g["format"]: g["targets"] for g in _config(tmp_path / "out")["quantization_config"]["config_groups"].values()
    }
    assert groups["mxfp8-quantized"] == [r"re:model\.layers\.1\.mlp\.down_proj$"]
    assert r"re:model\.layers\.0\.self_attn\.q_proj$" in groups["float-quantized"]
    for name, value in load_checkpoint(tmp_path / "out").items():
        if name.endswith("_proj.weight"):
            want = "fp8_channel" if ".layers.0." in name else "mxfp8_e4m3" if "1.mlp.down" in name else "nvfp4"
            assert value.fmt == want, name
    assert run("check", "out", cwd=tmp_path, check=False).returncode == 0


# ---- KV-cache scales travel ------------------------------------------------------------------------


def _vllm_kv_name(name: str) -> str | None:
    """vLLM's ``maybe_remap_kv_scale_name`` (vllm/model_executor/model_loader/weight_utils.py) for a
    Llama's parameters: ModelOpt's ``.self_attn.{k,v}_proj.{k,v}_scale`` and the default
    ``.{q,k,v}_scale`` both become the attention layer's ``.self_attn.attn.{q,k,v}_scale``; any
    other name vLLM has no parameter for is dropped (None)."""
    import re

    hit = re.fullmatch(r"(.*\.self_attn)\.([kv])_proj\.\2_scale", name)
    if hit:
        return f"{hit[1]}.attn.{hit[2]}_scale"
    hit = re.fullmatch(r"(.*\.self_attn)\.([qkv])_scale", name)
    return f"{hit[1]}.attn.{hit[2]}_scale" if hit else None


def test_kv_cache_scales_travel_into_modelopt_and_back(with_kv_scales, tmp_path):
    """compressed-tensors' ``self_attn.k_scale`` becomes ModelOpt's ``self_attn.k_proj.k_scale`` (the
    same multiplier) with ``kv_cache_quant_algo: FP8``, and back; each lands on the parameter vLLM
    loads it into; the values are carried bit for bit."""
    out, scales = with_kv_scales
    r = run("quantize", out, tmp_path / "mo", "--layout", "modelopt", "--format", "fp8_channel", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    mo = load_checkpoint(tmp_path / "mo")
    moved = {k: k.replace("self_attn.k_scale", "self_attn.k_proj.k_scale").replace(
        "self_attn.v_scale", "self_attn.v_proj.v_scale") for k in scales}  # fmt: skip
    for name, there in moved.items():
        assert mo[there].view(np.uint32) == np.float32(scales[name]).view(np.uint32), there
        assert _vllm_kv_name(there) == _vllm_kv_name(name) is not None
    hf = json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert run("check", tmp_path / "mo", cwd=tmp_path, check=False).returncode == 0
    r = run("quantize", tmp_path / "mo", tmp_path / "ct", "--format", "fp8_channel", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    back = load_checkpoint(tmp_path / "ct")
    for name in scales:
        assert back[name].view(np.uint32) == np.float32(scales[name]).view(np.uint32), name
    assert _config(tmp_path / "ct")["quantization_config"]["kv_cache_scheme"]["strategy"] == "tensor"


def test_a_layout_with_no_place_for_kv_scales_drops_each_and_says_so(with_kv_scales, tmp_path):
    out, scales = with_kv_scales
    r = run("quantize", out, tmp_path / "out.npz", "--layout", "npz", "--format", "nvfp4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for name in scales:
        assert f"dropped: {name} (float32, ()): a KV-cache scale the npz layout has no place for" in r.stdout


# ---- ModelOpt MIXED_PRECISION ------------------------------------------------------------------------

MODELOPT = TINY_LLAMA.parent


@pytest.fixture(scope="module", params=["hf_quant_config", "config.json"])
def modelopt_mixed(request, tmp_path_factory):
    """ModelOpt's own NVFP4 MLP (tests/fixtures/modelopt/nvfp4) beside its own FP8 per-channel
    attention (fp8_pc_pt), as ModelOpt writes MIXED_PRECISION: ``quantized_layers`` per module in
    hf_quant_config.json, or (its config.json form) in config.json's quantization_config."""
    tmp = tmp_path_factory.mktemp("mo-mixed")
    out = tmp / "mixed"
    shutil.copytree(MODELOPT / "nvfp4", out)
    nv, pc = load_file(str(MODELOPT / "nvfp4" / "model.safetensors")), load_file(str(MODELOPT / "fp8_pc_pt" /
                                                                                   "model.safetensors"))  # fmt: skip
    tensors = {**{k: v for k, v in nv.items() if ".self_attn." not in k},
               **{k: v for k, v in pc.items() if ".self_attn." in k}}  # fmt: skip
    save_file(tensors, str(out / "model.safetensors"), {"format": "pt"})
    modules = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".weight_scale")})
    layers = {m: {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"} if ".self_attn." in m
              else {"quant_algo": "NVFP4", "group_size": 16} for m in modules}  # fmt: skip
    quant = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"],
             "quantized_layers": layers}  # fmt: skip
    if request.param == "hf_quant_config":
        (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant}))
    else:
        (out / "hf_quant_config.json").unlink()
        config = _config(out)
        config["quantization_config"] = {"quant_method": "modelopt", "ignore": ["lm_head"], **quant}
        (out / "config.json").write_text(json.dumps(config))
    return out


def test_modelopt_mixed_precision_reads_each_module_as_modelopt_dequantises_it(modelopt_mixed, tmp_path):
    """Each module in the format quantized_layers gives it, its values ModelOpt's own dequantisation
    (the fixtures' .dequantized files, made by ModelOpt); the command dequantises it and converts it
    into compressed-tensors mixed-precision, each module's bytes copied."""
    got = load_checkpoint(modelopt_mixed)
    refs = {**load_file(str(MODELOPT / "nvfp4.dequantized.safetensors"))}
    refs.update({k: v for k, v in load_file(str(MODELOPT / "fp8_pc_pt.dequantized.safetensors")).items()
                 if ".self_attn." in k})  # fmt: skip
    formats = {}
    for name, ref in refs.items():
        formats[name.split(".")[4]] = got[name].fmt
        np.testing.assert_allclose(got[name].dequantize(), ref.astype(np.float32), rtol=2**-7, atol=0, err_msg=name)
    assert formats == {**dict.fromkeys(("q_proj", "k_proj", "v_proj", "o_proj"), "fp8_channel"),
                       **dict.fromkeys(("gate_proj", "up_proj", "down_proj"), "nvfp4")}  # fmt: skip
    assert run("dequantize", modelopt_mixed, tmp_path / "plain", cwd=tmp_path).returncode == 0
    r = run("quantize", modelopt_mixed, tmp_path / "ct", "--format", "nvfp4", "--scheme", "*.self_attn.*=fp8_channel",
            cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("bytes copied from modelopt") == 7
    assert _config(tmp_path / "ct")["quantization_config"]["format"] == "mixed-precision"


def test_modelopt_mixed_precision_refuses_what_it_cannot_place(modelopt_mixed, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(modelopt_mixed, bad)
    where = bad / "hf_quant_config.json"
    document = json.loads(where.read_text()) if where.exists() else _config(bad)
    quant = document.get("quantization") or document["quantization_config"]
    quant["quantized_layers"].pop("model.layers.0.mlp.down_proj")
    quant["quantized_layers"]["model.layers.0.mlp.up_proj"] = {"quant_algo": "W4A16_AWQ", "group_size": 128}
    (where if where.exists() else bad / "config.json").write_text(json.dumps(document))
    r = run("dequantize", bad, tmp_path / "a", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "'W4A16_AWQ' is not one this package reads" in r.stderr, r.stderr
    quant["quantized_layers"]["model.layers.0.mlp.up_proj"] = {"quant_algo": "NVFP4", "group_size": 16}
    (where if where.exists() else bad / "config.json").write_text(json.dumps(document))
    r = run("dequantize", bad, tmp_path / "b", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "quantized_layers has no entry for model.layers.0.mlp.down_proj" in r.stderr


def test_the_doctor_warns_of_a_kv_scale_under_no_attention(with_kv_scales, tmp_path):
    """A KV-cache scale stored on the decoder layer instead of its attention: vLLM's remapping finds no
    parameter for it and drops it; the doctor says so."""
    out, _ = with_kv_scales
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    path = str(bad / "model.safetensors")
    _, metadata, _ = read_safetensors_header(path)
    tensors = {k: np.array(v) for k, v in load_file(path).items()}
    tensors["model.layers.0.k_scale"] = tensors.pop("model.layers.0.self_attn.k_scale")
    save_file(tensors, path + ".new", metadata)
    Path(path + ".new").replace(path)
    r = run("check", bad, "--json", cwd=tmp_path, check=False)
    found = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "kv-scale"]
    assert [f["tensors"] for f in found] == [["model.layers.0.k_scale"]], found


# ---- llm-compressor's own mixed checkpoint --------------------------------------------------------------

LLMC_MIXED = TINY_LLAMA.parent.parent / "llmcompressor" / "mixed"


def _raw(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {k: (v.dtype.name, v.shape, v.tobytes()) for k, v in read_safetensors(path)[0].items()}


@pytest.mark.parametrize("how", ["--scheme", "--recipe-file"])
def test_llm_compressors_mixed_checkpoint_byte_for_byte(tmp_path, how):
    """llm-compressor 0.14's own mixed-precision output (FP8_DYNAMIC attention, NVFP4A16 MLP, one
    model_free_ptq config: scripts/make_llmcompressor_fixtures.py) is what the command writes with
    --recipe llm-compressor, every tensor byte for byte, whether the schemes are given as --scheme or
    as that checkpoint's own quantization_config read as a recipe file; both read to the same schemes."""
    if how == "--scheme":
        schemes = ("--format", "nvfp4", "--scheme", "*.self_attn.*=fp8_channel")
    else:
        (tmp_path / "recipe.json").write_text(json.dumps(_config(LLMC_MIXED)["quantization_config"]))
        schemes = ("--recipe-file", "recipe.json")
    r = run("quantize", TINY_LLAMA, tmp_path / "out", *schemes, "--recipe", "llm-compressor", "--ignore", "lm_head",
            "--ignore", "model.embed_tokens", "--quiet", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    want, got = _raw(LLMC_MIXED / "model.safetensors"), _raw(tmp_path / "out" / "model.safetensors")
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    theirs, ours = load_checkpoint(LLMC_MIXED), load_checkpoint(tmp_path / "out")
    assert {k: getattr(v, "fmt", None) for k, v in theirs.items()} == {
        k: getattr(v, "fmt", None) for k, v in ours.items()
    }
    assert run("check", LLMC_MIXED, cwd=tmp_path, check=False).returncode == 0


def test_the_doctor_names_modelopt_mixed_layers_vllm_loads_unquantised(modelopt_mixed, tmp_path):
    """FP8_PER_CHANNEL_PER_TOKEN in quantized_layers: the package reads it, but vLLM's
    ModelOptMixedPrecisionConfig runs a Linear with FP8, NVFP4, W4A16_NVFP4 and MXFP8 only and loads
    the others' codes as plain weights; ``check`` names each such module."""
    r = run("check", modelopt_mixed, "--json", cwd=tmp_path, check=False)
    assert r.returncode == 1
    assert {f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] != "note"} == {"scheme-vllm"}
    found = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "scheme-vllm"]
    assert sorted(t for f in found for t in f["tensors"]) == sorted(
        f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"
    )


@pytest.mark.parametrize(
    "content, message",
    [(b"\xff\xfe scheme: NVFP4A16", "not UTF-8 text"), (b"[" * 100_000, "nested too deeply"),
     (b"a: 1\n" * (4 << 20), "larger than 16 MiB")],
)  # fmt: skip
def test_a_recipe_file_of_stranger_bytes_is_refused_in_one_line(tmp_path, content, message):
    """Bytes that are no text, YAML nested past the parser's recursion (fuzz findings), an oversized file."""
    (tmp_path / "r.yaml").write_bytes(content)
    r = run("quantize", TINY_LLAMA, tmp_path / "out", "--recipe-file", "r.yaml", cwd=tmp_path, check=False)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_state_dict_takes_several_schemes_as_the_command_does(tmp_path):
    """``quantize_state_dict(..., schemes={pattern: format})`` gives the tensors and the config groups
    ``quantize --scheme`` writes, byte for byte."""
    import neuron_kernels as nk

    run("quantize", TINY_LLAMA, tmp_path / "out", *ATTENTION_FP8, "--no-stats", cwd=tmp_path)
    tensors = read_safetensors(TINY_LLAMA / "model.safetensors")[0]
    out, qc = nk.quantize_state_dict(tensors, "nvfp4", config=_config(TINY_LLAMA),
                                     schemes={"*.self_attn.*": "fp8_channel"})  # fmt: skip
    want = read_safetensors(tmp_path / "out" / "model.safetensors")[0]
    assert sorted(out) == sorted(want)
    for name, value in want.items():
        assert out[name].dtype == value.dtype and out[name].tobytes() == value.tobytes(), name
    assert qc["config_groups"] == _config(tmp_path / "out")["quantization_config"]["config_groups"]
    with pytest.raises(nk.errors.InvalidValueError, match="schemes="):
        nk.quantize_state_dict(tensors, None, config=_config(TINY_LLAMA))


def test_the_doctor_names_fused_shards_stored_in_two_formats(mixed, tmp_path):
    """q_proj stored NVFP4 beside FP8 k_proj and v_proj (its group says so, so compressed-tensors reads
    each as stored): vLLM runs q/k/v as one layer of one scheme and refuses it; ``check`` names the three."""
    out, _, _ = mixed
    nvfp4 = _one(tmp_path, "nvfp4", "*.self_attn.*")
    bad = tmp_path / "split"
    shutil.copytree(out, bad)
    q = "model.layers.0.self_attn.q_proj"
    tensors = {k: v for k, v in load_file(str(out / "model.safetensors")).items() if not k.startswith(q + ".")}
    tensors.update({k: v for k, v in load_file(str(nvfp4 / "model.safetensors")).items() if k.startswith(q + ".")})
    save_file(tensors, str(bad / "model.safetensors"), {"format": "pt"})
    config = _config(bad)
    groups = config["quantization_config"]["config_groups"]
    groups["group_0"]["targets"] = [r"re:.*self_attn\.(k|v|o)_proj$"]
    groups["group_1"]["targets"] = [r"re:.*mlp\.(gate|up|down)_proj$", q]
    (bad / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(bad)[f"{q}.weight"].fmt == "nvfp4"
    r = run("check", bad, "--json", cwd=tmp_path, check=False)
    fused = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "scheme-fused"]
    assert [sorted(f["tensors"]) for f in fused] == [sorted(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")]
    assert fused[0]["severity"] == "error"
