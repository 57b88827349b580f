"""Every one of the 2^32 float32 bit patterns through the compiled encoders (marked slow).

Run alone with ``python -m pytest -m slow``; CI runs it with the rest.
"""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk

from .reference import round_float32_to_mbits

CHUNK = 1 << 24


def _chunks():
    step = np.arange(CHUNK, dtype=np.uint32)
    for start in range(0, 1 << 32, CHUNK):
        yield (step + np.uint32(start)).view(np.float32)


def _first_mismatch(x, ours, ref):
    bad = np.flatnonzero(ours != ref)
    if bad.size == 0:
        return None
    i = bad[0]
    return f"{bad.size} mismatches; first: input 0x{x.view(np.uint32)[i]:08x} -> 0x{ours[i]:x}, expected 0x{ref[i]:x}"


@pytest.mark.slow
def test_float32_to_bfloat16_all_patterns():
    bf16 = np.dtype(ml_dtypes.bfloat16)
    out = np.empty(CHUNK, bf16)
    for x in _chunks():
        nk.cast(x, bf16, out=out)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = x.astype(bf16)
        msg = _first_mismatch(x, out.view(np.uint16), ref.view(np.uint16))
        assert msg is None, msg


@pytest.mark.slow
def test_float32_to_tfloat32_all_patterns():
    out = np.empty(CHUNK, np.float32)
    for x in _chunks():
        nk.cast(x, "tfloat32", out=out)
        ref = round_float32_to_mbits(x, 10)
        msg = _first_mismatch(x, out.view(np.uint32), ref.view(np.uint32))
        assert msg is None, msg
