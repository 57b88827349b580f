"""Throughput of every compiled cast, with the copy baseline and the peer in the same run.

    python -m pytest benchmarks --benchmark-json=bench.json
    python scripts/bench_ratios.py bench.json

GB/s = (bytes read + bytes written) / time, recorded in ``extra_info["gbs"]`` of every entry.
Entries per (size): ``copy`` (np.copyto float32, preallocated). Per (pair, size): ``ours``
(cast, allocating), ``ours_out`` (cast with out=), ``peer`` (ml_dtypes astype, or the numpy
implementation where ml_dtypes lacks the target); a few pairs again under stochastic rounding
(no peer: none rounds stochastically).
"""

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.tools.bench import STOCHASTIC_PAIRS, default_pairs, peer_of

from .conftest import SIZES, float32_input

PAIRS = default_pairs()


def _record(benchmark, nbytes):
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["gbs"] = nbytes / benchmark.stats.stats.median / 1e9


def _source(source, n):
    x = float32_input(n)
    return x if source == "float32" else nk.cast(x, source)


@pytest.mark.parametrize("n", SIZES)
def test_copy_baseline(benchmark, n):
    x = float32_input(n)
    y = np.empty_like(x)
    benchmark.group = f"copy n={n}"
    benchmark.extra_info.update(kind="copy", n=n)
    benchmark(np.copyto, y, x)
    _record(benchmark, 2 * x.nbytes)


@pytest.mark.parametrize("n", SIZES)
def test_copy_into_fresh_array(benchmark, n):
    """``x.copy()``: the ceiling of any call that returns a fresh array (its pages are zeroed first)."""
    x = float32_input(n)
    benchmark.group = f"copy n={n}"
    benchmark.extra_info.update(kind="copy_fresh", n=n)
    benchmark(x.copy)
    _record(benchmark, 2 * x.nbytes)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["ours", "ours_out", "peer"])
@pytest.mark.parametrize("source, target", PAIRS)
def test_cast(benchmark, source, target, kind, n):
    x = _source(source, n)
    out = nk.cast(x, target)
    benchmark.group = f"{source}->{target} n={n}"
    benchmark.extra_info.update(kind=kind, n=n, pair=f"{source}->{target}")
    if kind == "ours":
        benchmark(nk.cast, x, target)
    elif kind == "ours_out":
        benchmark(nk.cast, x, target, out=out)
    else:
        name, fn = peer_of(source, target)
        benchmark.extra_info["peer"] = name
        benchmark(fn, x)
    _record(benchmark, x.nbytes + out.nbytes)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["ours", "ours_out"])
@pytest.mark.parametrize("source, target", STOCHASTIC_PAIRS)
def test_cast_stochastic(benchmark, source, target, kind, n):
    """Stochastic rounding (seed 0): the random bits are a hash per element; the ceiling is the same."""
    x = _source(source, n)
    out = nk.cast(x, target, rounding="stochastic", seed=0)
    pair = f"{source}->{target} (stochastic)"
    benchmark.group = f"{pair} n={n}"
    benchmark.extra_info.update(kind=kind, n=n, pair=pair)
    if kind == "ours":
        benchmark(nk.cast, x, target, rounding="stochastic", seed=0)
    else:
        benchmark(nk.cast, x, target, rounding="stochastic", seed=0, out=out)
    _record(benchmark, x.nbytes + out.nbytes)


def test_small_cast_call(benchmark):
    """The whole call for 16 elements (target: <= 30 microseconds median)."""
    x = np.linspace(-4, 4, 16, dtype=np.float32)
    benchmark.group = "16 elements"
    benchmark.extra_info.update(kind="small", n=16)
    benchmark(nk.cast, x, "bfloat16")
