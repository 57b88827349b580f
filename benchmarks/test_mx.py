"""Block-format (MX, NVFP4) quantise / dequantise / fake-quantise throughput, with the copy baseline
and the peers in the same run.

The cases are ``neuron_kernels.tools.bench.BLOCK_CASES``: every MX format (floor scale), NVFP4 with its
per-tensor scale from the amax or given, its four-over-six and MSE-search policies and the random
Hadamard rotation. The peers, ``numpy_reference_quantize`` / ``numpy_reference_nvfp4``, are
straightforward numpy + ml_dtypes implementations (what one writes without this package); torchao's
CPU quantisers are a further peer when torch and torchao are installed (skipped otherwise).
GB/s = (bytes read + bytes written) / time; entries carry ``extra_info["kind"]`` for
``scripts/bench_ratios.py``. The ``*_out`` kinds write into a reused array, as the copy baseline
does; the others allocate their result (fresh pages, which the operating system zeroes first).
"""

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.tools.bench import (
    BLOCK_CASES,
    GIVEN,
    SOURCE,
    numpy_reference_nvfp4,
    numpy_reference_quantize,
    torchao_peer,
)

from .conftest import SIZES, float32_input


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("label, fmt, options", BLOCK_CASES, ids=[c[0].replace(" ", "-") for c in BLOCK_CASES])
@pytest.mark.parametrize(
    "kind", ["quantize", "dequantize", "dequantize_out", "fake_quantize", "fake_quantize_out", "peer", "torchao"]
)
def test_block(benchmark, kind, label, fmt, options, n):
    x = float32_input(n).reshape(-1, 1024)
    options = dict(options)
    if SOURCE in options:
        x = nk.cast(x, options.pop(SOURCE))
    if options.get("per_tensor_scale") == GIVEN:
        options = {**options, "per_tensor_scale": nk.quantize(x, fmt).per_tensor_scale}
    q = nk.quantize(x, fmt, **options)
    benchmark.group = f"mx {label} n={n}"
    if kind == "quantize":
        benchmark(nk.quantize, x, fmt, **options)
        moved = x.nbytes + q.nbytes
    elif kind == "dequantize":
        benchmark(nk.dequantize, q)
        moved = x.nbytes + q.nbytes
    elif kind == "dequantize_out":  # into a reused array, as the copy baseline is
        benchmark(nk.dequantize, q, out=np.empty(x.shape, np.float32))
        moved = x.nbytes + q.nbytes
    elif kind == "fake_quantize":
        benchmark(nk.fake_quantize, x, fmt, **options)
        moved = x.nbytes + 4 * x.size
    elif kind == "fake_quantize_out":
        benchmark(nk.fake_quantize, x, fmt, out=np.empty(x.shape, np.float32), **options)
        moved = x.nbytes + 4 * x.size
    elif kind == "peer":
        with np.errstate(all="ignore"):
            if fmt == "nvfp4":
                benchmark.pedantic(numpy_reference_nvfp4, args=(x, q.per_tensor_scale), rounds=2, iterations=1)
            else:
                benchmark.pedantic(numpy_reference_quantize, args=(x, fmt), rounds=2, iterations=1)
        moved = x.nbytes + q.nbytes
    else:
        peer = torchao_peer(fmt, options) if x.dtype == np.float32 else None
        if peer is None:
            pytest.skip("torch and torchao are not installed, or torchao has no such quantiser")
        benchmark.pedantic(peer, args=(x,), rounds=2, iterations=1)
        moved = x.nbytes + q.nbytes
    benchmark.extra_info.update(
        kind=f"ours_{kind}" if kind not in ("peer", "torchao") else kind, n=n, pair=f"mx {label}"
    )
    benchmark.extra_info["bytes"] = moved
    benchmark.extra_info["gbs"] = moved / benchmark.stats.stats.median / 1e9
