"""Make the ModelOpt fixtures of tests/fixtures/modelopt (docs/checkpoints.md "Layouts the
package reads"): checkpoints written by NVIDIA ModelOpt itself, and ModelOpt's own dequantisation
of each quantised weight, for the tests to compare the package's reading with.

ModelOpt's quantisers run on the CPU. In a virtual environment beside the runtimes' (torch CPU,
transformers)::

    python -m venv --system-site-packages /tmp/mo
    /tmp/mo/bin/pip install --no-deps nvidia-modelopt==0.47.0 omegaconf pulp
    /tmp/mo/bin/python scripts/make_modelopt_fixtures.py tests/fixtures/modelopt

It writes ``bf16/`` (a tiny Llama saved by transformers in bfloat16, the source), and for each of
``nvfp4``, ``mxfp8``, ``fp8`` (per tensor), ``fp8_pc_pt`` (per channel) and ``fp8_pb_wo`` (per
128 x 128 block, weight only, from a wider Llama made the same way): ``<algo>/`` (the checkpoint
``export_hf_checkpoint`` writes after ``mtq.quantize`` with the algorithm's default config,
calibrated on two random sequences) and
``<algo>.dequantized.safetensors`` (each quantised weight as ModelOpt's ``dequantize`` gives it, in
float32). Run again, it writes the same bytes (fixed seeds; one thread)."""

from __future__ import annotations

import os
import shutil
import sys

import modelopt.torch.quantization as mtq
import torch
from modelopt.torch.export import export_hf_checkpoint
from modelopt.torch.quantization.qtensor import FP8QTensor, MXFP8QTensor, NVFP4QTensor
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

ALGORITHMS = {
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "mxfp8": "MXFP8_DEFAULT_CFG",
    "fp8": "FP8_DEFAULT_CFG",
    "fp8_pc_pt": "FP8_PER_CHANNEL_PER_TOKEN_CFG",
    "fp8_pb_wo": "FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG",
}


#: The per-block FP8 preset's blocks are 128 x 128: its source is wider, with partial edge blocks
#: (192 = 1.5 blocks, 320 = 2.5), so that its scales form a grid; the others take the 64-wide Llama.
WIDE = {"fp8_pb_wo": (192, 320)}


def tiny_llama(hidden: int = 64, intermediate: int = 128) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(torch.bfloat16)


def modelopt_dequantized(folder: str, algo: str) -> dict[str, torch.Tensor]:
    """Each quantised weight of the checkpoint, dequantised by ModelOpt's own QTensor classes."""
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for name, scale in tensors.items():
        if not name.endswith(".weight_scale"):
            continue
        base = name[: -len("_scale")]
        codes = tensors[base]
        if algo == "nvfp4":
            shape = torch.Size((*codes.shape[:-1], codes.shape[-1] * 2))
            q = NVFP4QTensor(shape, torch.bfloat16, codes)
            kwargs = {"scale": scale, "double_scale": tensors[f"{base}_scale_2"], "block_sizes": {-1: 16}}
        elif algo == "mxfp8":
            q = MXFP8QTensor(codes.shape, torch.bfloat16, codes)
            kwargs = {"scale": scale}
        else:
            q = FP8QTensor(codes.shape, torch.bfloat16, codes)
            if algo == "fp8_pc_pt":  # one scale per output row: [out] against the rows
                kwargs = {"scale": scale.unsqueeze(-1)}
            elif algo == "fp8_pb_wo":  # exported [out/128, 1, in/128, 1]; dequantize takes the 2-D grid
                kwargs = {"scale": scale.reshape(scale.shape[0], scale.shape[2]), "block_sizes": {-1: 128, -2: 128}}
            else:
                kwargs = {"scale": scale}
        out[base] = q.dequantize(dtype=torch.float32, **kwargs).contiguous()
    return out


def main(dest: str) -> None:
    torch.set_num_threads(1)
    os.makedirs(dest, exist_ok=True)
    source = os.path.join(dest, "bf16")
    shutil.rmtree(source, ignore_errors=True)
    tiny_llama().save_pretrained(source)
    for algo, preset in ALGORITHMS.items():
        if algo in WIDE:
            model = tiny_llama(*WIDE[algo])
        else:
            model = LlamaForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
        torch.manual_seed(1)
        ids = torch.randint(0, model.config.vocab_size, (2, 16))
        mtq.quantize(model, getattr(mtq, preset), lambda m, ids=ids: m(ids))
        folder = os.path.join(dest, algo)
        shutil.rmtree(folder, ignore_errors=True)
        export_hf_checkpoint(model, export_dir=folder)
        os.remove(os.path.join(folder, "generation_config.json"))
        save_file(modelopt_dequantized(folder, algo), os.path.join(dest, f"{algo}.dequantized.safetensors"))
        print(f"{folder}: {sorted(os.listdir(folder))}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures", "modelopt"))
