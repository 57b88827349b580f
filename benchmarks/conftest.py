"""Shared inputs for the benchmarks (built once per size)."""

import functools
import os

import numpy as np

from neuron_kernels.tools.bench import synthetic_input

#: Sizes in elements; ``NEURON_KERNELS_BENCH_SIZES=1048576`` (comma-separated) overrides.
SIZES = [int(s) for s in os.environ.get("NEURON_KERNELS_BENCH_SIZES", f"{1 << 20},{64 << 20}").split(",")]


@functools.lru_cache(maxsize=4)
def float32_input(n: int) -> np.ndarray:
    return synthetic_input(n)
