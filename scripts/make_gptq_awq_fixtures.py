"""Make the producer fixtures of tests/fixtures/gptq/ and tests/fixtures/awq/ with the producers' own code.

Not run by the tests (they read the folders it wrote). The producers need torch and are not the
package's dependencies; install them apart, without their dependencies (which would change the
environment's torch and transformers), and run this with them on the path::

    pip install --no-deps --target /tmp/producers auto-gptq==0.7.1 autoawq==0.2.9
    PYTHONPATH=/tmp/producers python scripts/make_gptq_awq_fixtures.py

GPTQ: AutoGPTQ 0.7.1's GPTQ algorithm (``auto_gptq.quantization.gptq.GPTQ.fasterquant``, on a
Hessian of random inputs) and its packer (``auto_gptq.nn_modules.qlinear.qlinear_cuda.QuantLinear
.pack``, the checkpoint format "gptq", v1), and its own CPU dequantisation (``QuantLinear.forward``'s
torch path applied to the identity) as ``NAME.expected.safetensors`` beside the folder. AWQ: AutoAWQ
0.2.9's zero-point quantiser (``AwqQuantizer.pseudo_quantize_tensor``) and GEMM packer
(``WQLinear_GEMM.from_linear``), and its ``dequantize_gemm`` as ``NAME.expected.safetensors``.

The packages' ``__init__`` files import what this environment lacks (datasets, an older
transformers), so the modules are loaded from their folders without them, and
``torch.cuda.synchronize``, which fasterquant calls, is made a no-op. Weights are float16 draws from
a fixed seed. AutoGPTQ's v1 packer corrupts a true zero point of 0 (it stores -1 unmasked), which
random weights in these groups never give: checked.
"""

from __future__ import annotations

import json
import os
import sys
import types

import torch
from safetensors.numpy import save_file

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures")
HERE = os.path.join(FIXTURES, "gptq")
AWQ_HERE = os.path.join(FIXTURES, "awq")
MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")
SHAPES = {MODULES[0]: (64, 128), MODULES[1]: (64, 96)}  # [out, in]


def _bare_package(name: str) -> None:
    """Make ``name`` importable as a package without running its ``__init__``."""
    root = next(p for p in sys.path if p and os.path.isdir(os.path.join(p, *name.split("."))))
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(root, *name.split("."))]
    sys.modules[name] = module


def _config(folder: str, qc: dict, extra: dict) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float16",
              "quantization_config": qc}  # fmt: skip
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    for name, content in extra.items():
        with open(os.path.join(folder, name), "w") as fh:
            json.dump(content, fh, indent=2)


def make_gptq(name: str, bits: int, group_size: int, desc_act: bool, sym: bool, seed: int) -> None:
    for p in ("auto_gptq", "auto_gptq.quantization", "auto_gptq.nn_modules", "auto_gptq.nn_modules.qlinear"):
        _bare_package(p)
    from auto_gptq.nn_modules.qlinear.qlinear_cuda import QuantLinear
    from auto_gptq.quantization.gptq import GPTQ

    torch.cuda.synchronize = lambda *args: None  # fasterquant times itself with it; nothing to wait for on CPU
    torch.manual_seed(seed)
    tensors, expected = {}, {}
    for module in MODULES:
        out, cols = SHAPES[module]
        linear = torch.nn.Linear(cols, out, bias=False)
        linear.weight.data = (torch.randn(out, cols) * 0.05).half().float()
        gptq = GPTQ(linear)
        gptq.quantizer.configure(bits, perchannel=True, sym=sym, mse=False)
        gptq.add_batch(torch.randn(256, cols), None)
        scale, zero, g_idx = gptq.fasterquant(group_size=group_size, actorder=desc_act)
        assert (zero > 0).all(), "a true zero point of 0, which AutoGPTQ's v1 packer corrupts"
        quant = QuantLinear(bits, group_size, cols, out, False)
        linear.half()
        quant.pack(linear, scale, zero, g_idx)
        for part in ("qweight", "qzeros", "scales", "g_idx"):
            tensors[f"{module}.{part}"] = getattr(quant, part).numpy()
        with torch.no_grad():  # the producer's own CPU dequantisation: the identity through forward
            expected[f"{module}.weight"] = quant(torch.eye(cols, dtype=torch.float16)).T.contiguous().numpy()
    folder = os.path.join(HERE, name)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    save_file(expected, f"{folder}.expected.safetensors", metadata={"format": "pt"})
    # AutoGPTQ's BaseQuantizeConfig.to_dict, as it writes quantize_config.json and config.json's entry
    qc = {"bits": bits, "group_size": group_size, "damp_percent": 0.01, "desc_act": desc_act, "static_groups": False,
          "sym": sym, "true_sequential": True, "model_name_or_path": None, "model_file_base_name": None,
          "is_marlin_format": False, "quant_method": "gptq"}  # fmt: skip
    _config(folder, qc, {"quantize_config.json": qc})


def make_awq(name: str, group_size: int, seed: int) -> None:
    sys.modules.setdefault("datasets", types.SimpleNamespace(load_dataset=None))
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.quantize.quantizer import AwqQuantizer
    from awq.utils.packing_utils import dequantize_gemm

    torch.manual_seed(seed)
    settings = types.SimpleNamespace(w_bit=4, group_size=group_size, zero_point=True)
    tensors, expected = {}, {}
    for module in MODULES:
        out, cols = SHAPES[module]
        linear = torch.nn.Linear(cols, out, bias=False).half()
        linear.weight.data = (torch.randn(out, cols) * 0.05).half()
        linear.weight.data, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(settings, linear.weight.data)
        quant = WQLinear_GEMM.from_linear(linear, 4, group_size, scales=scales.t().contiguous(),
                                          zeros=zeros.t().contiguous())  # fmt: skip
        for part in ("qweight", "qzeros", "scales"):
            tensors[f"{module}.{part}"] = getattr(quant, part).numpy()
        w_t = dequantize_gemm(quant.qweight, quant.qzeros, quant.scales, 4, group_size)
        expected[f"{module}.weight"] = w_t.T.contiguous().numpy()
    folder = os.path.join(AWQ_HERE, name)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    save_file(expected, f"{folder}.expected.safetensors", metadata={"format": "pt"})
    # AutoAWQ's AwqConfig.to_transformers_dict (config.json's entry) and its own quant_config.json
    qc = {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
          "modules_to_not_convert": None}  # fmt: skip
    quant_config = {"zero_point": True, "q_group_size": group_size, "w_bit": 4, "version": "GEMM",
                    "modules_to_not_convert": None}  # fmt: skip
    _config(folder, qc, {"quant_config.json": quant_config})


if __name__ == "__main__":
    make_gptq("autogptq_int4_actorder", bits=4, group_size=32, desc_act=True, sym=False, seed=1)
    make_gptq("autogptq_int3", bits=3, group_size=32, desc_act=False, sym=True, seed=2)
    make_awq("autoawq_gemm_int4", group_size=32, seed=3)
