"""llama.cpp itself (llama-cpp-python, built from llama.cpp's source) loads what ``neuron-kernels
quantize`` writes to GGUF and runs it: the logits of a tiny Llama quantised to NVFP4 (two levels,
NAME.scale applied by llama.cpp) and MXFP4, dense and with merged experts, are those of the same
model with the package's dequantised weights in F32, up to ggml's 8-bit rounding of the
activations in its FP4 dot products, and far from those of the unquantised model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .cli_runner import run
from .gguf_models import tiny_llama_gguf
from .helpers import runtime_missing

TOKENS = [1, 100, 200, 150, 260, 7, 42, 3]


def _llama():
    try:
        import llama_cpp
    except ImportError:
        runtime_missing("needs llama-cpp-python (pip install neuron_kernels[llama])")
    return llama_cpp


def _logits(path, tokens=TOKENS) -> np.ndarray:
    llama_cpp = _llama()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=1, logits_all=True, verbose=False)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[: len(tokens)], np.float32)
    finally:
        llm.close()


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("experts", [0, 4])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4_e2m1"])
def test_llama_cpp_runs_the_quantised_model(tmp_path, fmt, experts):
    _llama()
    tiny_llama_gguf(tmp_path / "model.gguf", dtype="BF16", experts=experts, std=0.1)
    run("quantize", "model.gguf", "q.gguf", "--format", fmt, "--no-stats", cwd=tmp_path)
    run("dequantize", "q.gguf", "fake.gguf", "--dtype", "float32", cwd=tmp_path)
    quantised, fake, original = (_logits(tmp_path / n) for n in ("q.gguf", "fake.gguf", "model.gguf"))
    assert np.isfinite(quantised).all()
    # Measured: 2% from the fake-quantised model (ggml rounds activations to 8 bits), 33-49% from
    # the original (4-bit weights of a random model).
    assert _distance(quantised, fake) < 0.05
    assert _distance(quantised, original) > 4 * _distance(quantised, fake)
    assert (quantised.argmax(1) == fake.argmax(1)).mean() >= 0.75


@pytest.mark.parametrize(
    "source, fmt",
    [("modelopt/nvfp4", "nvfp4"), ("llmcompressor/nvfp4", "nvfp4"), ("llmcompressor/mxfp4", "mxfp4_e2m1")],
)
def test_llama_cpp_runs_checkpoints_carried_over(tmp_path, source, fmt):
    """ModelOpt's and llm-compressor's checkpoints of the fixtures' tiny Llama carried into its GGUF
    file: llama.cpp runs them as it runs their dequantised weights in F32."""
    _llama()
    fixtures = Path(__file__).parent / "fixtures"
    template = fixtures / "gguf" / "llama-bf16.gguf"
    run("quantize", fixtures / source, "q.gguf", "--format", fmt, "--template", template, cwd=tmp_path)
    run("dequantize", "q.gguf", "fake.gguf", "--dtype", "float32", cwd=tmp_path)
    tokens = [1, 40, 90, 17, 120, 3, 64, 100]  # the fixtures' vocabulary has 128 tokens
    quantised, fake, original = (_logits(p, tokens) for p in (tmp_path / "q.gguf", tmp_path / "fake.gguf", template))
    assert np.isfinite(quantised).all()
    assert _distance(quantised, fake) < 0.05
    assert _distance(quantised, original) > 2 * _distance(quantised, fake)
