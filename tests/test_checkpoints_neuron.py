"""The ``neuron`` layout (docs/neuron.md): NxD Inference's quantized checkpoint for Trn1/Trn2.

NxD's loading rule is applied here from its source, as the Neuron SDK cannot run: a weight is
``weight.to(float32) * scale`` (``scale_dequantize`` in neuronx_distributed/quantization/
dequantize.py; the scale a float32 multiplier, [out, 1] per channel, [1] per tensor, one per
block for ``blockwise_symmetric``), and float8_e4m3fn values must lie within +-240
(``DtypeBound`` in quantization_config.py). OCP FP8 checkpoints come in through the command:
every value equals the source's ``code * scale`` but the elements the report lists, checked
against a halving reference written from the E4M3 encoding, not from the package."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.checkpoints import load_checkpoint
from neuron_kernels.checkpoints.fp8_range import HALVED, HALVED_EXACT

from .checkpoint_helpers import read_safetensors, write_safetensors
from .cli_runner import run
from .fp8_checkpoints import decode, encode, make_ct_fp8
from .neuron_checkpoints import BF16, PLAIN, PROJ, bf16_model, write_model

E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)


def halved_reference(code: int) -> tuple[int, bool]:
    """The float8_e4m3fn code of ``code``'s value halved, and whether exactly, from the encoding:
    sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals ``m * 2^-9``; 0x7f / 0xff NaN. A
    normal of exponent field e >= 2 halves by e - 1; below, the value in units of 2^-10 is halved to
    units of 2^-9 (subnormal mantissas, 8 being the smallest normal), ties to the even mantissa."""
    sign, e, m = code & 0x80, (code >> 3) & 0xF, code & 7
    if (code & 0x7F) == 0x7F:
        return code, True
    if e >= 2:
        return sign | ((e - 1) << 3) | m, True
    units = (8 + m) if e == 1 else m  # the value in 2^-10 units: 2^-6 (1 + m/8) = (8 + m) 2^-9 ... halved
    half, odd = divmod(units, 2)
    if odd:
        half += half & 1  # a tie between half and half + 1: to the even one
    return sign | (((half >> 3) & 1) << 3) | (half & 7) if half >= 8 else sign | half, not odd


def test_halving_every_code_as_the_encoding_says():
    for code in range(256):
        want, exact = halved_reference(code)
        assert (int(HALVED[code]), bool(HALVED_EXACT[code])) == (want, exact), hex(code)
    positive = np.arange(1, 127)
    assert int(HALVED_EXACT[positive].sum()) == 118
    assert float(np.nanmax(HALVED.view(ml_dtypes.float8_e4m3fn).astype(np.float32))) == 224


def fp8_model(folder, rng, subnormals: bool = True) -> dict:
    """A fine-grained FP8 checkpoint (128 x 128 blocks) whose codes reach 448 and, with
    ``subnormals``, hold every subnormal code; returns each weight's values by the layout's rule."""
    tensors, expected = {}, {}
    for name, value in bf16_model(rng).items():
        if name in PROJ:
            codes, inv = encode(value.astype(np.float32), 128, 128, np.float32)
            if subnormals:
                codes.view(np.uint8)[0, :16] = np.arange(16, dtype=np.uint8) | np.uint8(0x80) * (np.arange(16) % 2)
            else:
                small = codes.astype(np.float32) < 2.0**-5
                codes[small & (codes.astype(np.float32) != 0)] = E4M3FN.type(0.0)
            tensors[name], tensors[name + "_scale_inv"] = codes, inv
            expected[name] = decode(codes, inv, 128, 128)
        else:
            tensors[name] = value
    write_model(folder, tensors, {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": [128, 128]})  # fmt: skip
    return expected


def nxd_values(tensors: dict, module: str, settings: dict) -> np.ndarray:
    """NxD's dequantisation: the weight upcast to float32 times its scale, broadcast per channel
    ([out, 1]), per tensor ([1]) or per block of ``quantization_block_size``."""
    w, s = tensors[f"{module}.weight"].astype(np.float32), tensors[f"{module}.scale"]
    assert s.dtype == np.float32
    if settings["quantization_type"] == "blockwise_symmetric":
        bm, bn = settings["quantization_block_size"]
        assert settings["quantization_block_axis"] == [0, 1]
        assert s.shape == (w.shape[0] // bm, w.shape[1] // bn)
        s = np.repeat(np.repeat(s, bm, axis=0), bn, axis=1)
    return w * s


def read_output(folder) -> tuple[dict, dict, dict]:
    tensors, _ = read_safetensors(folder / "model.safetensors")
    settings = json.loads((folder / "neuron_quantization.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    return tensors, settings, config


def test_fp8_blocks_come_into_range_by_halving(tmp_path):
    """DeepSeek-style FP8 blocks into NxD's blockwise layout: the codes halved and the scales
    doubled, every value the source's but the subnormals the report counts, none beyond 240, the
    other tensors byte for byte."""
    expected = fp8_model(tmp_path / "fp8", np.random.default_rng(0))
    r = run("quantize", "fp8", "neuron", "--layout", "neuron", "--format", "fp8_e4m3_block", cwd=tmp_path)
    tensors, settings, config = read_output(tmp_path / "neuron")
    assert "quantization_config" not in config
    assert "the runtime's settings: neuron/neuron_quantization.json" in r.stdout
    assert settings == {
        "quantized": True, "quantization_type": "blockwise_symmetric", "quantization_dtype": "f8e4m3",
        "modules_to_not_convert": ["lm_head"], "quantization_block_size": [128, 128], "quantization_block_axis": [0, 1],
    }  # fmt: skip
    source, _ = read_safetensors(tmp_path / "fp8" / "model.safetensors")
    for name in PROJ:
        module = name.removesuffix(".weight")
        got = nxd_values(tensors, module, settings)
        assert tensors[name].dtype == E4M3FN and np.abs(tensors[name].astype(np.float32)).max() <= 240
        changed = int((got != expected[name]).sum())
        halved = np.array([halved_reference(int(c))[1] for c in range(256)])
        assert changed == int((~halved[source[name].view(np.uint8)]).sum()) > 0
        assert f"{changed} element(s) not exact" in r.stdout
    for name in PLAIN:
        assert tensors[name].tobytes() == source[name].tobytes()
    r = run("check", "neuron", cwd=tmp_path, check=False)
    assert r.returncode == 0 and "0 error(s), 0 warning(s)" in r.stdout, r.stdout
    r = run("quantize", "fp8", "exact", "--layout", "neuron", "--format", "fp8_e4m3_block", "--require-exact",
            cwd=tmp_path, check=False)  # fmt: skip
    assert r.returncode == 2 and "--require-exact refuses" in r.stderr and not (tmp_path / "exact").exists()


def test_fp8_within_range_is_copied_byte_for_byte(tmp_path):
    rng = np.random.default_rng(1)
    fp8_model(tmp_path / "fp8", rng, subnormals=False)
    source, _ = read_safetensors(tmp_path / "fp8" / "model.safetensors")
    for name in PROJ:  # every value within 240: the codes of the largest magnitudes made smaller
        codes = source[name].view(np.uint8)
        source[name] = np.where((codes & 0x7F) > 0x77, codes & 0xF7, codes).astype(np.uint8).view(E4M3FN)
    write_safetensors(tmp_path / "fp8" / "model.safetensors", source)
    r = run("quantize", "fp8", "neuron", "--layout", "neuron", "--format", "fp8_e4m3_block", "--require-exact",
            cwd=tmp_path)  # fmt: skip
    tensors, _, _ = read_output(tmp_path / "neuron")
    for name in PROJ:
        assert tensors[name].tobytes() == source[name].tobytes()
        np.testing.assert_array_equal(tensors[name.replace("weight", "scale")], source[name + "_scale_inv"])
    assert "bytes copied: every value" in r.stdout


@pytest.mark.parametrize("strategy, fmt", [("channel", "fp8_e4m3_channel"), ("tensor", "fp8_e4m3_tensor")])
def test_compressed_tensors_fp8_into_range(strategy, fmt, tmp_path):
    """compressed-tensors FP8 per channel and per tensor (bfloat16 scales, widened exactly)."""
    expected = make_ct_fp8(tmp_path / "ct", strategy)
    run("quantize", "ct", "neuron", "--layout", "neuron", "--format", fmt, cwd=tmp_path)
    tensors, settings, _ = read_output(tmp_path / "neuron")
    shape = {"channel": lambda w: (w.shape[0], 1), "tensor": lambda w: (1,)}[strategy]
    for name, values in expected.items():
        module = name.removesuffix(".weight")
        assert tensors[f"{module}.scale"].shape == shape(tensors[name])
        got = nxd_values(tensors, module, settings)
        assert np.abs(tensors[name].astype(np.float32)).max() <= 240
        assert (got != values).sum() <= (np.abs(values) < np.abs(values).max() * 2.0**-12).sum()  # subnormals only


@pytest.mark.parametrize("fmt", ["fp8_e4m3_channel", "fp8_e4m3_tensor", "int8_channel"])
def test_quantised_from_bfloat16(fmt, tmp_path):
    """From bfloat16: NxD's rule gives the package's dequantisation; FP8 within 240."""
    t = bf16_model(np.random.default_rng(2))
    write_model(tmp_path / "bf16", t)
    run("quantize", "bf16", "neuron", "--layout", "neuron", "--format", fmt, cwd=tmp_path)
    tensors, settings, _ = read_output(tmp_path / "neuron")
    assert settings["quantization_dtype"] == ("int8" if fmt.startswith("int") else "f8e4m3")
    assert settings["quantization_type"] == ("per_tensor_symmetric" if "tensor" in fmt else "per_channel_symmetric")
    loaded = load_checkpoint(tmp_path / "neuron")
    for name in PROJ:
        want = nk.quantize(t[name], fmt, scale_dtype="float32").dequantize(np.float32)
        got = nxd_values(tensors, name.removesuffix(".weight"), settings)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(loaded[name].dequantize(np.float32), want)
        if not fmt.startswith("int"):
            assert tensors[name].dtype == E4M3FN and np.abs(tensors[name].astype(np.float32)).max() <= 240
    for name in PLAIN:
        assert tensors[name].tobytes() == t[name].tobytes()


def test_nxd_inference_checkpoints_are_read(tmp_path):
    """NxDI's own output (save_quantized_state_dict: no settings file, no quantization_config):
    int8 per tensor ([1]) and per channel ([out, 1]), FP8 per channel; dequantised by its rule."""
    rng = np.random.default_rng(3)
    t = {
        PROJ[0]: rng.integers(-128, 128, (64, 32)).astype(np.int8),
        PROJ[0].replace("weight", "scale"): np.array([0.01], np.float32),
        PROJ[1]: rng.integers(-128, 128, (32, 64)).astype(np.int8),
        PROJ[1].replace("weight", "scale"): rng.uniform(0.001, 0.01, (32, 1)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": (rng.standard_normal((16, 64)) * 50).astype(E4M3FN),
        "model.layers.0.self_attn.q_proj.scale": rng.uniform(0.001, 0.01, (16, 1)).astype(np.float32),
        PLAIN[0]: np.ones(64, BF16),
    }
    write_model(tmp_path / "nxdi", t)
    r = run("dequantize", "nxdi", "plain", "--dtype", "float32", cwd=tmp_path)
    assert "3 weight(s) dequantised" in r.stdout
    plain, _ = read_safetensors(tmp_path / "plain" / "model.safetensors")
    for module in (PROJ[0], PROJ[1], "model.layers.0.self_attn.q_proj.weight"):
        base = module.removesuffix(".weight")
        np.testing.assert_array_equal(plain[module], t[module].astype(np.float32) * t[f"{base}.scale"])
    r = run("check", "nxdi", cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout


def test_the_doctor_finds_fp8_beyond_240(tmp_path):
    rng = np.random.default_rng(4)
    t = {PROJ[0]: (rng.standard_normal((16, 64)) * 100).astype(E4M3FN),
         PROJ[0].replace("weight", "scale"): np.full((16, 1), 0.01, np.float32)}  # fmt: skip
    t[PROJ[0]].view(np.uint8)[0, :3] = 0x7C  # 384
    write_model(tmp_path / "nxdi", t)
    r = run("check", "nxdi", cwd=tmp_path, check=False)
    assert r.returncode == 1
    over = int((np.abs(t[PROJ[0]].astype(np.float32)) > 240).sum())
    assert f"error: fp8-range: {PROJ[0]}: {over} FP8 value(s) beyond +-240" in r.stdout


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_the_doctor_finds_scales_stored_as_divisors(dtype, tmp_path):
    """NxD multiplies (``scale_dequantize``: weight * scale); scales written as divisors (1 / scale)
    make every value enormous, which the doctor tells from their reciprocals' plausible values; the
    same checkpoint with multipliers is clean."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((32, 64)) * 0.02).astype(np.float32)
    fmt = "int8_channel" if dtype == "int8" else "fp8_e4m3_channel"
    q = nk.quantize(w, fmt, scale_dtype="float32")
    codes = q.codes.view(np.int8) if dtype == "int8" else q.codes.view(E4M3FN)
    for name, scale in (("good", np.asarray(q.scales, np.float32)), ("bad", 1 / np.asarray(q.scales, np.float32))):
        write_model(tmp_path / name, {PROJ[0]: codes.reshape(w.shape), PROJ[0].replace("weight", "scale"): scale})
    assert "divisor-scales" not in run("check", "good", cwd=tmp_path).stdout
    r = run("check", "bad", cwd=tmp_path, check=False)
    assert r.returncode == 1 and f"error: divisor-scales: {PROJ[0]}: its largest value is" in r.stdout, r.stdout


def test_the_doctor_notes_ocp_fp8_that_nxd_would_load_beyond_240(tmp_path):
    """NxDI renames ``*.weight_scale`` to ``*.scale`` when it loads a checkpoint (get_state_dict in
    models/application_base.py), so a compressed-tensors FP8 checkpoint loads as its own; the
    doctor notes the weights whose values exceed 240, and nothing once they are brought into range."""
    make_ct_fp8(tmp_path / "ct", "channel")
    r = run("check", "ct", cwd=tmp_path, check=False)
    assert r.returncode == 0 and "note: neuron-fp8-range: 7 FP8 weight(s) hold values beyond +-240" in r.stdout
    run("quantize", "ct", "neuron", "--layout", "neuron", "--format", "fp8_e4m3_channel", cwd=tmp_path)
    assert "neuron-fp8-range" not in run("check", "neuron", cwd=tmp_path).stdout
    tensors, _ = read_safetensors(tmp_path / "ct" / "model.safetensors")
    for name in [n for n in tensors if n.endswith("_proj.weight")]:  # every value within 240: no note
        codes = tensors[name].view(np.uint8)
        tensors[name] = np.where((codes & 0x7F) > 0x77, codes & 0xF7, codes).astype(np.uint8).view(E4M3FN)
    write_safetensors(tmp_path / "ct" / "model.safetensors", tensors)
    assert "neuron-fp8-range" not in run("check", "ct", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("--format", "fp8_channel"), "choose fp8_e4m3_channel"),
        (("--format", "fp8_e4m3_block"), "not whole 128x128 blocks"),
        (("--format", "nvfp4"), "not nvfp4"),
    ],
)
def test_what_nxd_cannot_load_is_refused(args, message, tmp_path):
    write_model(tmp_path / "bf16", bf16_model(np.random.default_rng(5), 192, 256))
    r = run("quantize", "bf16", "out", "--layout", "neuron", *args, cwd=tmp_path, check=False)
    assert r.returncode == 2 and message in r.stderr and not (tmp_path / "out").exists(), r.stderr


TRN3_RECIPE = """
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      targets: [Linear]
      scheme: MXFP8
      ignore: [lm_head]
"""

MXFP4_MXFP8_RECIPE = """
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: [lm_head]
      config_groups:
        group_0:
          targets: [Linear]
          weights: {num_bits: 4, type: float, symmetric: true, strategy: group, group_size: 32, dynamic: false,
                    scale_dtype: torch.uint8}
          input_activations: {num_bits: 8, type: float, symmetric: true, strategy: group, group_size: 32,
                              dynamic: true, scale_dtype: torch.uint8}
"""


@pytest.mark.parametrize(
    "recipe, fmt",
    [(TRN3_RECIPE, "mxfp8-quantized"), (MXFP4_MXFP8_RECIPE, "mxfp4-pack-quantized")],
    ids=["trn3-mxfp8", "mxfp4-weights-mxfp8-activations"],
)
def test_trn3_mx_checkpoints_as_compressed_tensors_defines_them(recipe, fmt, tmp_path):
    """The Neuron docs' Trn3 recipe (llm-compressor's ``QuantizationModifier(targets="Linear",
    scheme="MXFP8", ignore=[...])``, aws-neuron-sdk vllm-neuron/docs/tutorials/tutorial-qwen3-vl-32b.md)
    and MXFP4 weights with dynamic MXFP8 activations (llm-compressor's GLM example, #3048): the
    config the command writes, read by compressed-tensors itself, is its preset field for field
    (observers aside: they are the producer's, not the checkpoint's), and the tensors are the
    layout's (``weight`` float8_e4m3fn or packed ``weight_packed``, ``weight_scale`` uint8 per 32)."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    write_model(tmp_path / "bf16", bf16_model(np.random.default_rng(6)))
    (tmp_path / "recipe.yaml").write_text(recipe)
    run("quantize", "bf16", "out", "--recipe-file", "recipe.yaml", cwd=tmp_path)
    config = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    qc = ct.QuantizationConfig.model_validate(config)
    assert qc.format == fmt and qc.ignore == ["lm_head"]
    (group,) = qc.config_groups.values()
    want = ct.preset_name_to_scheme("MXFP8" if fmt == "mxfp8-quantized" else "MXFP4A16", ["Linear"])
    if fmt != "mxfp8-quantized":  # MXFP4 weights, MXFP8's activations
        want.input_activations = ct.preset_name_to_scheme("MXFP8", ["Linear"]).input_activations
    skip = {"observer", "observer_kwargs"}
    assert group.targets == want.targets
    for part in ("weights", "input_activations"):
        assert getattr(group, part).model_dump(exclude=skip) == getattr(want, part).model_dump(exclude=skip), part
    tensors, _ = read_safetensors(tmp_path / "out" / "model.safetensors")
    for name in PROJ:
        base = name.removesuffix(".weight")
        codes = tensors[name] if fmt == "mxfp8-quantized" else tensors[f"{base}.weight_packed"]
        assert codes.dtype == (E4M3FN if fmt == "mxfp8-quantized" else np.uint8)
        assert tensors[f"{base}.weight_scale"].dtype == np.uint8 and tensors[f"{base}.weight_scale"].shape == (256, 8)
