"""NVIDIA ModelOpt checkpoints in (docs/checkpoints.md "Layouts the package reads"), on fixtures
ModelOpt itself wrote (tests/fixtures/modelopt, made by scripts/make_modelopt_fixtures.py from a
tiny bfloat16 Llama with ModelOpt 0.47's NVFP4, MXFP8, FP8, FP8 per-channel and FP8 128 x 128
block (weight-only) presets):

- the package reads them, and each weight's dequantisation equals ModelOpt's own ``dequantize``
  bit for bit (in float32);
- ``dequantize`` writes a plain checkpoint without ModelOpt's configs and scales;
- ``quantize --format <the same format>`` converts to compressed-tensors by copying the bytes
  (``weight_global_scale = 1 / weight_scale_2``, the exact value kept for the package's reading);
  another format quantises the exact dequantisation;
- what the package does not read (another ``quant_algo``, another producer, another group size, a
  scale grid that does not fit) is one line and exit 2, nothing written.
"""

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints import load_checkpoint

from .checkpoint_helpers import bits, read_dir, read_safetensors, write_safetensors
from .cli_runner import run
from .command_checks import fails
from .fp8_checkpoints import MODELOPT

FIXTURES = MODELOPT
FORMATS = {"nvfp4": "nvfp4", "mxfp8": "mxfp8_e4m3"}
#: The FP8 family, read as exact float32 values: per tensor, per output row, per 128 x 128 block.
FP8_ALGOS = ("fp8", "fp8_pc_pt", "fp8_pb_wo")
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def producer_decoded(algo: str) -> dict[str, np.ndarray]:
    """ModelOpt's own dequantisation of each quantised weight (float32), by weight name."""
    return read_safetensors(FIXTURES / f"{algo}.dequantized.safetensors")[0]


def stored(folder) -> dict[str, np.ndarray]:
    return read_safetensors(Path(folder) / "model.safetensors")[0]


def unsigned_zero(a: np.ndarray) -> np.ndarray:
    """``a`` with -0.0 as +0.0: ModelOpt decodes the FP4 code 8 (-0) as +0 (its table of code
    values has 0 there), the package as -0, the code's own value; adding +0.0 makes them one."""
    return a + np.float32(0)


@pytest.mark.parametrize("algo", list(FORMATS))
def test_modelopt_checkpoints_read_as_modelopt_decodes_them(algo):
    expected = producer_decoded(algo)
    loaded = load_checkpoint(FIXTURES / algo)
    weights = {k: v for k, v in loaded.items() if isinstance(v, nk.BlockArray)}
    assert sorted(weights) == sorted(expected)
    for name, arr in weights.items():
        assert arr.fmt == FORMATS[algo]
        ours = arr.dequantize("float32")
        np.testing.assert_array_equal(bits(unsigned_zero(ours)), bits(expected[name]), err_msg=name)
        assert np.signbit(ours[ours == 0]).sum() == (algo == "nvfp4") * np.count_nonzero(arr.unpacked_codes() == 8)
    source = stored(FIXTURES / algo)
    if algo == "nvfp4":
        for name, arr in weights.items():
            assert arr.per_tensor_scale == float(source[name + "_scale_2"])
    # the tensors that are not ModelOpt's own are the file's
    plain = {k: v for k, v in loaded.items() if not isinstance(v, nk.BlockArray)}
    assert "lm_head.weight" in plain and not any(k.endswith(("_scale", "_scale_2")) for k in plain)
    for name, value in plain.items():
        np.testing.assert_array_equal(value.view(np.uint8), source[name].view(np.uint8))


@pytest.mark.parametrize("algo", FP8_ALGOS)
def test_modelopt_fp8_checkpoints_read_as_modelopt_decodes_them(algo):
    expected = producer_decoded(algo)
    source = stored(FIXTURES / algo)
    assert sorted(k for k, v in source.items() if v.dtype == E4M3) == sorted(expected)
    scales = {source[k + "_scale"].shape for k in expected}
    if algo == "fp8":
        assert scales == {()}
    elif algo == "fp8_pc_pt":
        assert all(source[k + "_scale"].shape == source[k].shape[:1] for k in expected)
    else:  # 4-D, one scale per 128 x 128 block, partial edge blocks included (192 and 320 wide)
        grids = {k: tuple(-(-n // 128) for n in source[k].shape) for k in expected}
        assert all(source[k + "_scale"].shape == (grids[k][0], 1, grids[k][1], 1) for k in expected)
        assert {(2, 2), (3, 2), (2, 3)} == set(grids.values())
    loaded = load_checkpoint(FIXTURES / algo)
    assert not any(k.endswith("_scale") for k in loaded)
    block_format = {"fp8": "fp8_tensor", "fp8_pc_pt": "fp8_channel", "fp8_pb_wo": "fp8_block"}[algo]
    for name, value in expected.items():
        assert isinstance(loaded[name], nk.BlockArray) and loaded[name].fmt == block_format, name
        np.testing.assert_array_equal(bits(loaded[name].dequantize()), bits(value), err_msg=name)
    for name, value in loaded.items():
        if name not in expected:
            np.testing.assert_array_equal(value.view(np.uint8), source[name].view(np.uint8))


@pytest.mark.parametrize("algo", [*FORMATS, *FP8_ALGOS])
def test_dequantize_writes_the_plain_checkpoint(algo, tmp_path):
    shutil.copytree(FIXTURES / algo, tmp_path / "in")
    r = run("dequantize", "in", "out", "--dtype", "float32", cwd=tmp_path)
    assert "weight(s) dequantised" in r.stdout
    out = read_dir(tmp_path / "out")[0]
    expected = producer_decoded(algo)
    source = stored(tmp_path / "in")
    assert set(out) == {k for k in source if not k.endswith(("weight_scale", "weight_scale_2", "input_scale"))}
    for name, value in expected.items():
        ours = unsigned_zero(out[name]) if algo == "nvfp4" else out[name]
        np.testing.assert_array_equal(bits(ours), bits(value), err_msg=name)
    assert not (tmp_path / "out" / "hf_quant_config.json").exists()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config
    assert ("input_scale dropped" in r.stdout) == any(k.endswith("input_scale") for k in source)
    assert algo not in ("nvfp4", "fp8") or "input_scale dropped" in r.stdout


def test_modelopt_nvfp4_converts_to_compressed_tensors_byte_for_byte(tmp_path):
    r = run("quantize", FIXTURES / "nvfp4", "ct", "--format", "nvfp4", cwd=tmp_path)
    assert "7 converted exactly (codes copied)" in r.stdout and "input_scale dropped" in r.stdout
    src = stored(FIXTURES / "nvfp4")
    out = read_dir(tmp_path / "ct")[0]
    for name in producer_decoded("nvfp4"):
        base = name[: -len(".weight")]
        np.testing.assert_array_equal(out[f"{base}.weight_packed"], src[name])
        np.testing.assert_array_equal(out[f"{base}.weight_scale"].view(np.uint8), src[f"{name}_scale"].view(np.uint8))
        # compressed-tensors keeps the reciprocal: one float32 division (docs/checkpoints.md)
        assert out[f"{base}.weight_global_scale"].tolist() == [np.float32(1) / src[f"{name}_scale_2"]]
    assert not any(k.endswith(("input_scale", "weight_scale_2")) for k in out)
    assert not (tmp_path / "ct" / "hf_quant_config.json").exists()
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    # read back by the package: ModelOpt's own per-tensor scale, ModelOpt's own values
    expected = producer_decoded("nvfp4")
    for name, arr in load_checkpoint(tmp_path / "ct").items():
        if isinstance(arr, nk.BlockArray):
            assert arr.per_tensor_scale == float(src[name + "_scale_2"])
            ours = unsigned_zero(arr.dequantize("float32"))
            np.testing.assert_array_equal(bits(ours), bits(expected[name]), err_msg=name)


def test_modelopt_mxfp8_converts_to_compressed_tensors_byte_for_byte(tmp_path):
    run("quantize", FIXTURES / "mxfp8", "ct", "--format", "mxfp8_e4m3", cwd=tmp_path)
    src = stored(FIXTURES / "mxfp8")
    out = read_dir(tmp_path / "ct")[0]
    for name in producer_decoded("mxfp8"):
        base = name[: -len(".weight")]
        np.testing.assert_array_equal(out[name].view(np.uint8), src[name].view(np.uint8))
        np.testing.assert_array_equal(out[f"{base}.weight_scale"], src[f"{name}_scale"])


def test_another_format_quantises_the_exact_dequantisation(tmp_path):
    r = run("quantize", FIXTURES / "nvfp4", "mx", "--format", "mxfp4_e2m1", cwd=tmp_path)
    assert "7 tensor(s) quantised" in r.stdout and "dequantised from nvfp4" in r.stdout
    out = load_checkpoint(tmp_path / "mx")
    source = load_checkpoint(FIXTURES / "nvfp4")  # its dequantisation: ModelOpt's (the test above)
    for name in producer_decoded("nvfp4"):
        want = nk.quantize(source[name].dequantize("float32"), "mxfp4_e2m1")
        np.testing.assert_array_equal(out[name].codes, want.codes, err_msg=name)
        np.testing.assert_array_equal(out[name].scales, want.scales, err_msg=name)


def test_an_fp8_block_checkpoint_quantises_to_nvfp4_from_its_exact_values(tmp_path):
    r = run("quantize", FIXTURES / "fp8_pb_wo", "nv", "--format", "nvfp4", cwd=tmp_path)
    assert "7 tensor(s) quantised" in r.stdout and "dequantised from ModelOpt FP8_PB_WO" in r.stdout
    out = load_checkpoint(tmp_path / "nv")
    exact = producer_decoded("fp8_pb_wo")
    # fused layers share one per-tensor scale, from the amax of the group (docs/checkpoints.md)
    groups = [("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",)]
    names = {p: n for n in exact for g in groups for p in g if f".{p}." in n}
    for group in groups:
        pts = nk.quantize(np.concatenate([exact[names[p]] for p in group]), "nvfp4").per_tensor_scale
        for p in group:
            name = names[p]
            want = nk.quantize(exact[name], "nvfp4", per_tensor_scale=pts)
            assert out[name].per_tensor_scale == pts, name
            np.testing.assert_array_equal(out[name].codes, want.codes, err_msg=name)
            np.testing.assert_array_equal(out[name].scales, want.scales, err_msg=name)


def test_options_that_would_change_copied_bytes_are_refused(tmp_path):
    fails(
        "quantize", FIXTURES / "nvfp4", "out", "--format", "nvfp4", "--scale-mode", "nearest",
        cwd=tmp_path, message="already nvfp4",
    )  # fmt: skip


def _variant(tmp_path, algo="nvfp4", hf=None, tensors=None):
    """A copy of a fixture with its hf_quant_config.json and tensors edited."""
    folder = tmp_path / "in"
    shutil.copytree(FIXTURES / algo, folder)
    if hf is not None:
        config = json.loads((folder / "hf_quant_config.json").read_text())
        hf(config)
        (folder / "hf_quant_config.json").write_text(json.dumps(config))
    if tensors is not None:
        t = stored(folder)
        tensors(t)
        write_safetensors(folder / "model.safetensors", t)
    return folder


Q_PROJ = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "hf, tensors, message",
    [
        (lambda c: c["quantization"].update(quant_algo="NVFP4_AWQ"), None, "quant_algo 'NVFP4_AWQ' is not one"),
        (lambda c: c["quantization"].update(quant_algo="MIXED_PRECISION"), None, "without a quantized_layers object"),
        (lambda c: c["quantization"].update(group_size=32), None, "group_size 32"),
        (lambda c: c.update(producer={"name": "someone"}), None, "not written by ModelOpt"),
        (None, lambda t: t.update({f"{Q_PROJ}.weight_scale": t[f"{Q_PROJ}.weight_scale"][:, :2]}), "block scales"),
        (None, lambda t: t.update({f"{Q_PROJ}.weight_scale_2": np.float32(-1.0).reshape(())}), "not a positive"),
        (None, lambda t: t.pop(f"{Q_PROJ}.weight_scale_2"), "has no model.layers.0.self_attn.q_proj.weight_scale_2"),
        (None, lambda t: t.update({"extra.pre_quant_scale": np.ones(4, np.float32)}), "belongs to no quantised"),
    ],
)
def test_what_the_package_does_not_read_is_refused(tmp_path, hf, tensors, message):
    folder = _variant(tmp_path, hf=hf, tensors=tensors)
    for command in (("dequantize", folder, "out"), ("quantize", folder, "out", "--format", "mxfp4_e2m1")):
        fails(*command, cwd=tmp_path, message=message)


PB_SCALE = f"{Q_PROJ}.weight_scale"


@pytest.mark.parametrize(
    "tensors, message",
    [
        (lambda t: t.update({PB_SCALE: np.ones((2, 1, 1, 1), np.float32)}), "does not fit the weight"),
        (lambda t: t.update({PB_SCALE: t[PB_SCALE].astype(np.float16)}), "must be float32"),
        (lambda t: t.update({"extra.weight": t[f"{Q_PROJ}.weight"]}), "extra.weight (float8_e4m3fn) belongs to no"),
    ],
)
def test_fp8_checkpoints_the_package_does_not_read_are_refused(tmp_path, tensors, message):
    folder = _variant(tmp_path, algo="fp8_pb_wo", tensors=tensors)
    for command in (("dequantize", folder, "out"), ("quantize", folder, "out", "--format", "mxfp4_e2m1")):
        fails(*command, cwd=tmp_path, message=message)


def test_quantised_tensors_without_a_config_are_refused(tmp_path):
    """The ModelOpt tensors with no config that names the layout: not quantised again and relabelled."""
    folder = _variant(tmp_path)
    (folder / "hf_quant_config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(config))
    fails("quantize", folder, "out", "--format", "nvfp4", cwd=tmp_path, message="a tensor of a quantised layout")


def test_a_quantize_that_would_quantise_nothing_is_refused(tmp_path):
    fails(
        "quantize", FIXTURES / "bf16", "out", "--format", "nvfp4", "--only", "nothing.matches",
        cwd=tmp_path, message="no tensor to quantise",
    )  # fmt: skip


def test_compressed_tensors_w4a4_is_read_its_activation_scales_dropped(tmp_path):
    """A compressed-tensors NVFP4 checkpoint with activations (W4A4: ``input_global_scale`` per
    module, ``input_activations`` in the config, as llm-compressor's NVFP4 preset writes) is read:
    its weights are those of the weight-only checkpoint, the activations' scales dropped and said."""
    run("quantize", FIXTURES / "nvfp4", "w4a16", "--format", "nvfp4", cwd=tmp_path)
    shutil.copytree(tmp_path / "w4a16", tmp_path / "w4a4")
    tensors, metadata = read_safetensors(tmp_path / "w4a4" / "model.safetensors")
    source = stored(FIXTURES / "nvfp4")
    for name in producer_decoded("nvfp4"):
        base = name[: -len(".weight")]
        tensors[f"{base}.input_global_scale"] = (np.float32(1) / source[f"{base}.input_scale"]).reshape(1)
    write_safetensors(tmp_path / "w4a4" / "model.safetensors", tensors, metadata)
    config = json.loads((tmp_path / "w4a4" / "config.json").read_text())
    group = config["quantization_config"]["config_groups"]["group_0"]
    group["input_activations"] = {**group["weights"], "dynamic": "local", "observer": "static_minmax"}
    (tmp_path / "w4a4" / "config.json").write_text(json.dumps(config))
    r = run("dequantize", "w4a4", "plain", "--dtype", "float32", cwd=tmp_path)
    assert "input_global_scale dropped" in r.stdout
    run("dequantize", "w4a16", "plain16", "--dtype", "float32", cwd=tmp_path)
    assert read_dir(tmp_path / "plain")[0].keys() == read_dir(tmp_path / "plain16")[0].keys()
    for name, value in read_dir(tmp_path / "plain16")[0].items():
        assert read_dir(tmp_path / "plain")[0][name].tobytes() == value.tobytes(), name
    r = run("quantize", "w4a4", "again", "--format", "nvfp4", cwd=tmp_path)
    assert "input_global_scale dropped" in r.stdout
