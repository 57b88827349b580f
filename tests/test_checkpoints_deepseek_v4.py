"""DeepSeek-V4's checkpoints (``quant_method: fp8`` with ``expert_dtype: fp4``, ``scale_fmt: ue8m0``):
routed experts as int8-stored FP4 pairs with e8m0 scales per 32, dense weights FP8 with e8m0 scales
per 128 x 128 block, each tensor's scale ``NAME.scale`` (vLLM's ``models/deepseek_v4``; docs/checkpoints.md
"Layouts the package reads"). The values are checked against a decoding written here from that
description (E2M1's eight magnitudes, the even element in the low nibble, ``2^(e - 127)``), on codes
and scales drawn at random."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels.checkpoints import load_checkpoint

from .checkpoint_helpers import read_safetensors, write_safetensors
from .cli_runner import run

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
CONFIG = {
    "model_type": "deepseek_v4",
    "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
}  # fmt: skip


def _fp4_values(pairs: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    codes = np.stack([pairs & 0xF, pairs >> 4], axis=-1).reshape(pairs.shape[0], -1)  # low nibble first
    values = E2M1[codes & 7] * np.where(codes & 8, -1, 1).astype(np.float32)
    return values * np.repeat(np.exp2(exponents.astype(np.float32) - 127), 32, axis=1)


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    rng = np.random.default_rng(4)
    tensors, values = {}, {}
    for w in ("w1", "w2", "w3"):
        name = f"layers.0.ffn.experts.0.{w}"
        pairs = rng.integers(0, 256, (64, 32), dtype=np.uint8)
        exponents = rng.integers(118, 130, (64, 2), dtype=np.uint8)  # within NVFP4's reach: re-laid exactly
        tensors[f"{name}.weight"], tensors[f"{name}.scale"] = pairs.view(np.int8), exponents.view(E8M0)
        values[f"{name}.weight"] = _fp4_values(pairs, exponents)
    codes = rng.integers(0, 256, (256, 128), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    exponents = rng.integers(115, 125, (2, 1), dtype=np.uint8)
    tensors["layers.0.attn.wq_a.weight"], tensors["layers.0.attn.wq_a.scale"] = codes.view(E4M3), exponents.view(E8M0)
    values["layers.0.attn.wq_a.weight"] = codes.view(E4M3).astype(np.float32) * np.repeat(
        np.exp2(exponents.astype(np.float32) - 127), 128, axis=0)  # fmt: skip
    tensors["embed.weight"] = rng.standard_normal((32, 128)).astype(ml_dtypes.bfloat16)
    d = tmp_path_factory.mktemp("v4") / "v4"
    d.mkdir()
    write_safetensors(d / "model.safetensors", tensors)
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d, values


def test_each_weight_reads_as_its_codes_times_its_scales(v4):
    d, values = v4
    got = load_checkpoint(d)
    assert {n: got[n].fmt for n in values} == {**{n: "mxfp4_e2m1" for n in values if ".experts." in n},
                                                "layers.0.attn.wq_a.weight": "fp8_block"}  # fmt: skip
    for name, want in values.items():
        np.testing.assert_array_equal(got[name].dequantize().view(np.uint32), want.view(np.uint32), err_msg=name)


def test_the_command_dequantizes_checks_and_converts_it_exactly(v4, tmp_path):
    d, values = v4
    r = run("dequantize", d, tmp_path / "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plain = read_safetensors(tmp_path / "plain" / "model.safetensors")[0]
    for name, want in values.items():
        np.testing.assert_array_equal(plain[name], want.astype(ml_dtypes.bfloat16), err_msg=name)
    assert run("check", d, cwd=tmp_path, check=False).returncode == 0
    # the experts into NVFP4 (their codes copied, scales re-laid) and the dense weight into
    # compressed-tensors' FP8 blocks (bytes copied): every value kept
    r = run("quantize", d, tmp_path / "nv", "--format", "nvfp4", "--only", "*.experts.*", "--require-exact",
            cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r2 = run("quantize", d, tmp_path / "fp8", "--format", "fp8_block", "--only", "*.attn.*", "--require-exact",
             cwd=tmp_path)  # fmt: skip
    assert r2.returncode == 0, r2.stderr
    nv, fp8 = load_checkpoint(tmp_path / "nv"), load_checkpoint(tmp_path / "fp8")
    for name, want in values.items():
        got = (nv if ".experts." in name else fp8)[name]
        assert got.fmt == ("nvfp4" if ".experts." in name else "fp8_block")
        np.testing.assert_array_equal(got.dequantize().view(np.uint32), want.view(np.uint32), err_msg=name)
