"""Arrays of more than 2^31 elements: no 32-bit index may overflow (marked slow).

A cast and an MX quantisation of 2^31 + 1000 bfloat16 values (4 GiB in, 2 GiB out), with
stochastic rounding, whose random bits hash each element's 64-bit index: the elements near the
end are checked against the references, so a wrapped index would show. Needs about 7 GiB of
free memory; skipped (with the reason) where there is less. Run alone with
``python -m pytest -m slow tests/test_large.py``.
"""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk

from .reference import random_bits
from .reference_casts import encode_ref
from .reference_mx import quantize_mx_ref

N = (1 << 31) + 1000
TAIL = 4096  # checked elements at the end, from index 2^31 - 3096 on
NEEDED_GIB = 7


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        return int(info["MemAvailable"].split()[0]) / (1 << 20)
    except (OSError, KeyError, ValueError):
        return 0.0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_available_gib() < NEEDED_GIB, reason=f"needs {NEEDED_GIB} GiB of free memory"),
]


@pytest.fixture(scope="module")
def big() -> np.ndarray:
    x = np.empty(N, ml_dtypes.bfloat16)
    x[:] = 1.5
    tail = np.random.default_rng(3).standard_normal(TAIL).astype(np.float32) * np.float32(40.0)
    x[-TAIL:] = tail.astype(ml_dtypes.bfloat16)
    x[-7] = np.nan
    return x


def test_cast_past_2_to_31(big):
    seed = 12345
    out = nk.cast(big, "float8_e4m3fn", rounding="stochastic", seed=seed)
    tail = big[-TAIL:].astype(np.float32)
    want = encode_ref(tail, "float8_e4m3fn", "stochastic", rand=random_bits(seed, TAIL, N - TAIL))
    np.testing.assert_array_equal(out[-TAIL:].view(np.uint8), want)  # the tail crosses index 2^31


def test_quantize_past_2_to_31(big):
    seed = 777
    mx = nk.quantize_mx(big, "mxfp4_e2m1", rounding="stochastic", seed=seed, pack=False)
    first = -(-(N - TAIL) // 32) * 32  # the first whole block inside the tail
    tail = big[first:].astype(np.float32)
    codes, scales = quantize_mx_ref(
        tail, "mxfp4_e2m1", 32, "floor", "stochastic", rand=random_bits(seed, tail.size, first)
    )
    np.testing.assert_array_equal(mx.codes[first:], codes)
    np.testing.assert_array_equal(mx.scales.view(np.uint8)[first // 32 :], scales)
    assert mx.scales.view(np.uint8)[-1] == 0xFF  # the last block holds a NaN
