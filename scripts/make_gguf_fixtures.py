"""Make the GGUF fixtures of tests/fixtures/gguf with llama.cpp's own converter
(``convert_hf_to_gguf.py``): the tiny bfloat16 Llama of tests/fixtures/modelopt/bf16 as a BF16
GGUF file (``llama-bf16.gguf``, the template the tests carry quantised checkpoints into),
ModelOpt's NVFP4 export of the same model (tests/fixtures/modelopt/nvfp4) as llama.cpp converts it
(``modelopt-nvfp4.gguf``, the peer of the package's carry-over; docs/gguf.md), and a tiny
Mixtral of four experts (``mixtral-bf16/``, random weights made by transformers, seed 0, once:
kept as a fixture) as a BF16 GGUF file (``mixtral-bf16.gguf``, its experts stacked by the
converter).

The converter needs a tokenizer, which the fixtures do not hold: a Llama-style one of the model's
128 tokens (``<unk>``, ``<s>``, ``</s>`` and 125 byte tokens) is written beside a copy of each
folder first. It needs torch, transformers and sentencepiece, and the gguf-py of its own checkout::

    pip install sentencepiece
    python scripts/make_gguf_fixtures.py LLAMA_CPP_DIR tests/fixtures/gguf

``LLAMA_CPP_DIR``: a llama.cpp source tree (the fixtures were made with the one llama-cpp-python
0.3.36 vendors, llama.cpp 0c1e570). Run again, it writes the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "llama-bf16.gguf": ("modelopt/bf16", ["--outtype", "bf16"]),
    "modelopt-nvfp4.gguf": ("modelopt/nvfp4", []),
    "mixtral-bf16.gguf": ("gguf/mixtral-bf16", ["--outtype", "bf16"]),
}


def make_mixtral(folder: Path) -> None:
    """A tiny Mixtral (hidden 64, four experts of 128, one layer, 128 tokens) in bfloat16."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    MixtralForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


def write_tokenizer(folder: Path) -> None:
    """A Llama-style tokenizer (BPE with byte fallback) of 128 tokens, as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(125)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def main(argv: list[str]) -> int:
    llama_cpp, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "mixtral-bf16").exists():
        make_mixtral(out / "mixtral-bf16")
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, (source, options) in SOURCES.items():
            folder = Path(tmp) / source.replace("/", "-")
            shutil.copytree(ROOT / "tests" / "fixtures" / source, folder)
            write_tokenizer(folder)
            command = [
                sys.executable,
                str(llama_cpp / "convert_hf_to_gguf.py"),
                str(folder),
                "--outfile",
                str(out / name),
            ]
            subprocess.run(command + options, check=True, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
