"""DeepSeek-V4's checkpoints (``quant_method: fp8`` with ``expert_dtype: fp4``, ``scale_fmt: ue8m0``):
routed experts as int8-stored FP4 pairs with e8m0 scales per 32, dense weights FP8 with e8m0 scales
per 128 x 128 block, each tensor's scale ``NAME.scale`` (vLLM's ``models/deepseek_v4``; docs/checkpoints.md
"Layouts the package reads"). The values are checked against a decoding written from that description
(E2M1's eight magnitudes, the even element in the low nibble, ``2^(e - 127)``: tests/checkpoint_helpers.py
``make_deepseek_v4``), on codes and scales drawn at random."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels.checkpoints import load_checkpoint

from .checkpoint_helpers import make_deepseek_v4, read_safetensors
from .cli_runner import run


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    d = tmp_path_factory.mktemp("v4") / "v4"
    return d, make_deepseek_v4(d)


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


def test_the_fp4_experts_go_into_fp8_blocks_exactly(v4, tmp_path):
    """MXFP4 groups of 32 into FP8 tiles of 128 x 128 with power-of-two scales: every value kept
    where the tile's exponents fit float8_e4m3fn (they do here), so --require-exact passes."""
    d, values = v4
    # w2 alone: w1 and w3 are one fused layer in vLLM, whose 64 rows fit no 128-row tile
    r = run("quantize", d, tmp_path / "fp8", "--format", "fp8_block", "--layout", "fp8", "--only", "*.experts.*.w2",
            "--require-exact", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = load_checkpoint(tmp_path / "fp8")
    for name, want in values.items():
        if name.endswith(".w2.weight"):
            assert got[name].fmt == "fp8_block"
            np.testing.assert_array_equal(got[name].dequantize().view(np.uint32), want.view(np.uint32), err_msg=name)
