"""The runtimes' own loaders on the package's checkpoints (optional: skipped with the reason when
torch, transformers and compressed-tensors are not importable).

They run in the interpreter named by ``NEURON_KERNELS_RUNTIME_PYTHON`` (a virtual environment with
``torch``, ``transformers`` and ``compressed-tensors``), or in this one if it has them:

- transformers builds a tiny Llama and saves it in bfloat16; the package quantises it to each
  compressed-tensors format; transformers (with compressed-tensors) loads the result without a
  missing or unexpected key, and its dequantised weights are the package's to within the
  runtime's bfloat16 rounding (exactly, for MX);
- a gpt-oss MXFP4 checkpoint of a tiny GptOss model: transformers' own dequantisation equals the
  package's ``dequantize`` bit for bit, and transformers loads that plain checkpoint cleanly.
"""

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import neuron_kernels as nk

from .conftest import child_env

BF16 = np.dtype(ml_dtypes.bfloat16)
RUNTIME_MODULES = ("torch", "transformers", "compressed_tensors")


def _runtime_python() -> tuple[str | None, str]:
    candidates = [os.environ.get("NEURON_KERNELS_RUNTIME_PYTHON"), sys.executable]
    for python in filter(None, candidates):
        probe = subprocess.run(
            [python, "-c", "import " + ", ".join(RUNTIME_MODULES)], capture_output=True, text=True, timeout=300
        )
        if probe.returncode == 0:
            return python, ""
    return None, (
        f"needs {', '.join(RUNTIME_MODULES)} in this interpreter or in NEURON_KERNELS_RUNTIME_PYTHON "
        "(pip install torch transformers compressed-tensors)"
    )


@pytest.fixture(scope="module")
def runtime():
    python, why = _runtime_python()
    if python is None:
        pytest.skip(why)

    def run(script: str, *args) -> str:
        r = subprocess.run(
            [python, "-c", script, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=900,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    return run


def cli(*args, cwd):
    r = subprocess.run(
        [sys.executable, "-m", "neuron_kernels", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


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
kwargs = {}
if sys.argv[3] == "compressed-tensors":
    from transformers import CompressedTensorsConfig
    kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
elif sys.argv[3] == "mxfp4":
    from transformers import Mxfp4Config
    kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, output_loading_info=True,
                                                   **kwargs)
np.savez(sys.argv[2], **{k: v.detach().float().numpy() for k, v in model.state_dict().items()})
print(json.dumps({k: sorted(map(str, v)) for k, v in info.items()}))
"""


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4_e2m1", "mxfp8_e4m3"])
def test_compressed_tensors_loads_the_package_layout(runtime, tmp_path, fmt):
    runtime(MAKE_LLAMA, tmp_path / "llama")
    cli("quantize", "llama", "q", "--format", fmt, cwd=tmp_path)
    info = json.loads(runtime(LOAD, tmp_path / "q", tmp_path / "w.npz", "compressed-tensors").splitlines()[-1])
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    loaded = np.load(tmp_path / "w.npz")
    original = nk.load_checkpoint(tmp_path / "llama")
    quantised = [n for n in original if n.endswith("_proj.weight")]
    assert len(quantised) == 7
    for name in quantised:
        want = nk.quantize(original[name], fmt).dequantize("bfloat16").astype(np.float32)
        if fmt == "nvfp4":  # the runtime divides by the global scale and rounds to bfloat16
            np.testing.assert_allclose(loaded[name], want, rtol=2**-7, atol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(loaded[name], want, err_msg=name)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        np.testing.assert_array_equal(loaded[name], original[name].astype(np.float32))


MAKE_GPT_OSS = """
import sys, torch
from transformers import GptOssConfig, GptOssForCausalLM
cfg = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                   vocab_size=128, max_position_embeddings=64, layer_types=["full_attention"])
torch.manual_seed(0)
GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""


def test_gpt_oss_mxfp4_dequantised_as_transformers_does(runtime, tmp_path):
    runtime(MAKE_GPT_OSS, tmp_path / "oss")
    # The MXFP4 checkpoint as gpt-oss ships it: experts [E, in, out] stored as [E, out, in/32, 16] blocks.
    plain = nk.load_checkpoint(tmp_path / "oss")
    stored = {}
    for name, value in plain.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            w = np.ascontiguousarray(np.swapaxes(value, 1, 2))
            q = nk.quantize(w, "mxfp4_e2m1")
            stored[f"{name}_blocks"] = q.codes.reshape(w.shape[:-1] + (w.shape[-1] // 32, 16))
            stored[f"{name}_scales"] = q.scales.view(np.uint8)
        else:
            stored[name] = value
    (tmp_path / "q").mkdir()
    save_file(stored, tmp_path / "q" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "oss" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))

    info = json.loads(runtime(LOAD, tmp_path / "q", tmp_path / "rt.npz", "mxfp4").splitlines()[-1])
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    cli("dequantize", "q", "plain", cwd=tmp_path)
    ours = nk.load_checkpoint(tmp_path / "plain")
    theirs = np.load(tmp_path / "rt.npz")
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert ours[name].shape == plain[name].shape == theirs[name].shape
        np.testing.assert_array_equal(ours[name].astype(np.float32), theirs[name], err_msg=name)
    info = json.loads(runtime(LOAD, tmp_path / "plain", tmp_path / "p.npz", "plain").splitlines()[-1])
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    assert "quantization_config" not in json.loads((tmp_path / "plain" / "config.json").read_text())
