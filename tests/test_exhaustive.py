"""Every one of the 2^32 float32 bit patterns through every encoder (marked slow).

The oracle is ml_dtypes 0.6.0 (numpy for float16) with the default rounding, except where
casts.md deliberately differs: float8_e8m0fnu rounds ties to the even code and splits the lowest
binade at its midpoint. tfloat32 has no ml_dtypes type; its oracle is the float64 reference.
Chunks run on two threads (the casts release the GIL). Run alone with
``python -m pytest -m slow``; CI runs it with the rest.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.formats import FORMATS

from .reference import round_float32_to_mbits

CHUNK = 1 << 24
ORACLE_TARGETS = [
    n for n, f in FORMATS.items() if f.kind == "float" and n not in ("float32", "float64", "float32r", "tfloat32")
]


def _patterns(start: int) -> np.ndarray:
    return np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32)


def e8m0_expected(u: np.ndarray, ml: np.ndarray) -> np.ndarray:
    """ml_dtypes' codes with casts.md's rule in place of them on ties (to even) and on the lowest
    binade: there the expectation is the package's rule, whatever ml_dtypes does."""
    e = (u >> np.uint32(23)).astype(np.int64)  # includes the sign: negatives are >= 256
    f = u & np.uint32(0x7FFFFF)
    out = ml.copy()
    tie = (e >= 1) & (e <= 254) & (f == 0x400000)
    out[tie] = (e[tie] + (e[tie] & 1)).astype(np.uint8)  # the even neighbour of codes e, e + 1
    low = (e == 0) & (f > 0x400000)  # (2^-127, 2^-126): nearer of 0x00 / 0x01, tie to 0x00
    out[low] = (f[low] > 0x600000).astype(np.uint8)
    return out


def _check_chunk(target: str, start: int) -> str | None:
    u = _patterns(start)
    x = u.view(np.float32)
    fmt = FORMATS[target]
    ours = nk.cast(x, target).view(fmt.storage_dtype if fmt.numpy_name else np.uint32)
    with np.errstate(invalid="ignore", over="ignore"):
        if target == "tfloat32":
            ref = round_float32_to_mbits(x, 10).view(np.uint32)
        else:
            ref = x.astype(fmt.result_dtype).view(fmt.storage_dtype)
    if target == "float8_e8m0fnu":
        ref = e8m0_expected(u, ref)
    bad = np.flatnonzero(ours != ref)
    if bad.size == 0:
        return None
    i = bad[0]
    return (
        f"{target}: {bad.size} mismatches in chunk 0x{start:08x}; first: input 0x{u[i]:08x} -> "
        f"0x{int(ours[i]):x}, expected 0x{int(ref[i]):x}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("target", ORACLE_TARGETS + ["tfloat32"])
def test_every_float32_pattern(target):
    nk.cast(np.zeros(4, np.float32), target)  # compile once before the threads start
    with ThreadPoolExecutor(2) as pool:
        failures = [m for m in pool.map(lambda s: _check_chunk(target, s), range(0, 1 << 32, CHUNK)) if m]
    assert not failures, "\n".join(failures[:5])


def test_e8m0_expected_rule_on_named_values():
    # The corrections of e8m0_expected, checked on values whose codes casts.md names.
    x = np.array(
        [3.0, 6.0, 12.0, 0.75, 1.5 * 2.0**127, 1.25 * 2.0**-127, 1.5 * 2.0**-127, 1.75 * 2.0**-127], dtype=np.float32
    )
    u = x.view(np.uint32)
    ml = np.zeros_like(u, dtype=np.uint8)
    assert list(e8m0_expected(u, ml)) == [0x80, 0x82, 0x82, 0x7E, 0xFE, 0x00, 0x00, 0x01]
    assert list(nk.cast(x, "float8_e8m0fnu").view(np.uint8)) == [0x80, 0x82, 0x82, 0x7E, 0xFE, 0x00, 0x00, 0x01]
