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
(MXFP8A16) and ``fp8_dynamic`` (FP8_DYNAMIC: FP8 per channel), the embeddings and the output
head kept, as llm-compressor's examples keep them.
Run again, it writes the same bytes (no calibration: weights only).
"""

from __future__ import annotations

import os
import shutil
import sys

from llmcompressor import model_free_ptq

#: FP8_BLOCK is left out: llm-compressor 0.14.0.1 fails on this Llama's 64-wide weights (128 x 128
#: blocks larger than the matrix; safetensors refuses the non-contiguous tensor it saves).
SCHEMES = {"nvfp4": "NVFP4A16", "mxfp4": "MXFP4A16", "mxfp8": "MXFP8A16", "fp8_dynamic": "FP8_DYNAMIC"}


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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
