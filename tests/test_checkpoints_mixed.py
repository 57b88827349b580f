"""Checkpoints of several schemes: a compressed-tensors ``mixed-precision`` checkpoint read module
by module, each module in the format of the group compressed-tensors gives it (docs/checkpoints.md
"Several schemes in one checkpoint")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from neuron_kernels.checkpoints import load_checkpoint
from neuron_kernels.io.arrays import FileFormatError, open_arrays
from neuron_kernels.io.safetensors import SafetensorsWriter, TensorSpec, read_safetensors_header

from .cli_runner import run

TINY_LLAMA = Path(__file__).parent / "fixtures" / "modelopt" / "bf16"


def _one(tmp: Path, fmt: str, only: str) -> Path:
    out = tmp / fmt
    r = run("quantize", TINY_LLAMA, out, "--format", fmt, "--only", only, "--no-stats", cwd=tmp)
    assert r.returncode == 0, r.stderr
    return out


def load_file(path: str) -> dict[str, np.ndarray]:
    return {e.name: e.read_flat(0, int(np.prod(e.shape))).reshape(e.shape) for e in open_arrays(path)}


def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str]) -> None:
    with SafetensorsWriter(path, [TensorSpec(k, v.dtype, v.shape) for k, v in tensors.items()], metadata) as w:
        for k, v in tensors.items():
            with w.tensor(k) as t:
                t.write(np.ascontiguousarray(v).reshape(-1))


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
