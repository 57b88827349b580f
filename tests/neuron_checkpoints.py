"""Small Llama checkpoints for the tests of the ``neuron`` layout and of ``--recipe neuron``."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

from .checkpoint_helpers import write_safetensors

BF16 = np.dtype(ml_dtypes.bfloat16)
#: The quantised Linear weights of :func:`bf16_model`, and the tensors it keeps plain.
PROJ = ("model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight")
PLAIN = ("model.layers.0.input_layernorm.weight", "lm_head.weight")


def write_model(folder, tensors: dict, quantization_config: dict | None = None) -> None:
    """A Llama checkpoint folder of ``tensors`` (with ``quantization_config`` in config.json if given)."""
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", tensors)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))


def bf16_model(rng, rows: int = 256, cols: int = 256) -> dict:
    """Two bfloat16 Linear weights [rows, cols] of scale 0.02, a norm and an output head."""
    w = {n: (rng.standard_normal((rows, cols)) * 0.02).astype(BF16) for n in PROJ}
    return {**w, PLAIN[0]: np.ones(cols, BF16), PLAIN[1]: rng.standard_normal((64, cols)).astype(BF16)}
