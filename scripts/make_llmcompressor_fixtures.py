"""Make the llm-compressor fixtures of tests/fixtures/llmcompressor: checkpoints written by
llm-compressor itself (``model_free_ptq``, no model definition, on the CPU) from the tiny bfloat16
Llama of tests/fixtures/modelopt/bf16, for the tests to check the package's reading and its
checkpoint doctor against a producer's own output (docs/checkpoints.md "The checkpoint doctor").

llm-compressor pins its own torch and transformers, so it lives in an environment of its own::

    python -m venv /tmp/peer
    /tmp/peer/bin/pip install llmcompressor==0.14.0.1 torch==2.13.0
    /tmp/peer/bin/python scripts/make_llmcompressor_fixtures.py \\
        tests/fixtures/modelopt/bf16 tests/fixtures/llmcompressor

It writes one folder per scheme: ``nvfp4`` (NVFP4A16), ``mxfp4`` (MXFP4A16), ``mxfp8``
(MXFP8A16) and ``fp8_dynamic`` (FP8_DYNAMIC: FP8 per channel), and the integer ``w4a16``,
``w4a16_asym`` (zero points), ``w8a16``, ``w3a16`` (3-bit codes across int32 words) and ``w8a8``
(int8 per channel, dynamic activations: ``int-quantized``); the embeddings and the output head
kept, as llm-compressor's examples keep them; and ``mixed``, a checkpoint of two schemes from one
quantisation config (NVFP4A16 for the MLP, FP8_DYNAMIC for the attention), as llm-compressor
writes ``mixed-precision``.
Run again, it writes the same bytes (no calibration: weights only).
"""

from __future__ import annotations

import os
import shutil
import sys

from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from llmcompressor import model_free_ptq

#: FP8_BLOCK is left out: llm-compressor 0.14.0.1 fails on this Llama's 64-wide weights (128 x 128
#: blocks larger than the matrix; safetensors refuses the non-contiguous tensor it saves).
SCHEMES = {"nvfp4": "NVFP4A16", "mxfp4": "MXFP4A16", "mxfp8": "MXFP8A16", "fp8_dynamic": "FP8_DYNAMIC"}

#: The integer presets, groups of 32 in place of the presets' 128, which is wider than this Llama's
#: 64 columns (Kimi-K2's INT4 uses groups of 32 too); W8A8 is per channel: name -> (preset, group size or None).
INTEGER_SCHEMES = {
    "w4a16": ("W4A16", 32),
    "w4a16_asym": ("W4A16_ASYM", 32),
    "w8a16": ("W8A16", 32),
    "w3a16": ("W3A16", 32),
    "w8a8": ("W8A8", None),
}


def main(source: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for name, scheme in SCHEMES.items():
        target = os.path.join(out, name)
        shutil.rmtree(target, ignore_errors=True)
        model_free_ptq(
            model_stub=source,
            save_directory=target,
            scheme=scheme,
            ignore=["lm_head", "model.embed_tokens"],
            max_workers=1,
            device="cpu",
        )
        print(f"{target}: {scheme}")
    target = os.path.join(out, "mixed")
    shutil.rmtree(target, ignore_errors=True)
    groups = {
        "attention": preset_name_to_scheme("FP8_DYNAMIC", [r"re:.*self_attn\.(q|k|v|o)_proj$"]),
        "mlp": preset_name_to_scheme("NVFP4A16", [r"re:.*mlp\.(gate|up|down)_proj$"]),
    }
    config = QuantizationConfig(config_groups=groups, ignore=["lm_head", "model.embed_tokens"])
    model_free_ptq(model_stub=source, save_directory=target, config=config, max_workers=1, device="cpu")
    print(f"{target}: FP8_DYNAMIC attention, NVFP4A16 MLP")
    for name, (preset, group_size) in INTEGER_SCHEMES.items():
        target = os.path.join(out, name)
        shutil.rmtree(target, ignore_errors=True)
        scheme = preset_name_to_scheme(preset, ["Linear"])
        if group_size is not None:
            scheme.weights.group_size = group_size
        config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head", "model.embed_tokens"])
        model_free_ptq(model_stub=source, save_directory=target, config=config, max_workers=1, device="cpu")
        print(f"{target}: {preset}" + (f", groups of {group_size}" if group_size else ""))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
