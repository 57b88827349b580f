"""MX quantise / dequantise / fake-quantise throughput, with the copy baseline and a reference peer.

The peer, ``neuron_kernels.bench.numpy_reference_quantize``, is a straightforward numpy + ml_dtypes
implementation of OCP floor scaling (what one writes without this package): amax per block,
exponent via frexp, divide, ml_dtypes astype.
GB/s = (bytes read + bytes written) / time; entries carry ``extra_info["kind"]`` for
``scripts/bench_ratios.py``. The ``*_out`` kinds write into a reused array, as the copy baseline
does; the others allocate their result (fresh pages, which the operating system zeroes first).
"""

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.bench import numpy_reference_quantize

from .conftest import SIZES, float32_input

FORMATS = list(nk.MX_FORMATS)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "kind", ["quantize", "dequantize", "dequantize_out", "fake_quantize", "fake_quantize_out", "peer"]
)
def test_mx(benchmark, kind, fmt, n):
    x = float32_input(n).reshape(-1, 1024)
    mx = nk.quantize_mx(x, fmt)
    benchmark.group = f"mx {fmt} n={n}"
    if kind == "quantize":
        benchmark(nk.quantize_mx, x, fmt)
        moved = x.nbytes + mx.nbytes
    elif kind == "dequantize":
        benchmark(nk.dequantize_mx, mx)
        moved = x.nbytes + mx.nbytes
    elif kind == "dequantize_out":  # into a reused array, as the copy baseline is
        benchmark(nk.dequantize_mx, mx, out=np.empty_like(x))
        moved = x.nbytes + mx.nbytes
    elif kind == "fake_quantize":
        benchmark(nk.fake_quantize_mx, x, fmt)
        moved = 2 * x.nbytes
    elif kind == "fake_quantize_out":
        benchmark(nk.fake_quantize_mx, x, fmt, out=np.empty_like(x))
        moved = 2 * x.nbytes
    else:
        with np.errstate(all="ignore"):
            benchmark.pedantic(numpy_reference_quantize, args=(x, fmt), rounds=2, iterations=1)
        moved = x.nbytes + mx.nbytes
    benchmark.extra_info.update(kind=f"ours_{kind}" if kind != "peer" else "peer", n=n, pair=f"mx {fmt}")
    benchmark.extra_info["bytes"] = moved
    benchmark.extra_info["gbs"] = moved / benchmark.stats.stats.median / 1e9
