"""Every one of the 2^32 float32 bit patterns through every encoder (marked slow).

The oracle is ml_dtypes 0.7.0 (numpy for float16) with the default rounding, except where
docs/casts.md deliberately differs: float8_e8m0fnu rounds ties to the even code and splits the lowest
binade at its midpoint. tfloat32 has no ml_dtypes type; its oracle is the float64 reference (asked for
[1, 2), the binades that can underflow or overflow and the specials; the other normal binades are [1, 2)
scaled). The oracles are asked element by element only where their answer is not constant over the
binade (``constant_binades``).
numpy's float16 cast takes 40-85 ns an element where it underflows or overflows (it raises the
FP flags one element at a time), so there numpy answers only within a binade of float16's range
and the values far outside it are held to the obvious answer (see ``float16_expected``).
Chunks of 2^20 patterns (small enough for the references' float64 temporaries to stay in cache)
run on two threads (the casts release the GIL). Run alone with ``python -m pytest -m slow``; CI
runs it with the rest.
"""

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.formats import FORMATS

from .reference import round_float32_to_mbits

CHUNK = 1 << 20
_OFFSETS = np.arange(CHUNK, dtype=np.uint32)
ORACLE_TARGETS = [
    n for n, f in FORMATS.items() if f.kind == "float" and n not in ("float32", "float64", "float32r", "tfloat32")
]


def _patterns(start: int) -> np.ndarray:
    return _OFFSETS + np.uint32(start)


def float16_expected(u: np.ndarray, x: np.ndarray) -> np.ndarray:
    """numpy's float16 codes of float32 patterns ``u`` (values ``x``) where |x| lies in
    [2^-26, 2^17) or is inf or NaN; beyond them the answer needs no oracle: |x| >= 2^17 is past
    float16's overflow threshold (65520) and gives infinity, |x| < 2^-26 is below half the
    smallest subnormal (2^-24) and gives zero, each with the input's sign."""
    biased = (u >> np.uint32(23)) & np.uint32(0xFF)
    sign = (u >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
    out = np.where(biased >= 127 + 17, sign | np.uint16(0x7C00), sign)
    asked = ((biased >= 127 - 26) & (biased < 127 + 17)) | (biased == 0xFF)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        out[asked] = x[asked].astype(np.float16).view(np.uint16)
    return out


def e8m0_expected(u: np.ndarray, ml: np.ndarray) -> np.ndarray:
    """ml_dtypes' codes with the rule of docs/casts.md in place of them on ties (to even) and on the lowest
    binade: there the expectation is the package's rule, whatever ml_dtypes does."""
    e = (u >> np.uint32(23)).astype(np.int64)  # includes the sign: negatives are >= 256
    f = u & np.uint32(0x7FFFFF)
    out = ml.copy()
    tie = (e >= 1) & (e <= 254) & (f == 0x400000)
    out[tie] = (e[tie] + (e[tie] & 1)).astype(np.uint8)  # the even neighbour of codes e, e + 1
    low = (e == 0) & (f > 0x400000)  # (2^-127, 2^-126): nearer of 0x00 / 0x01, tie to 0x00
    out[low] = (f[low] > 0x600000).astype(np.uint8)
    return out


def _oracle(target: str, x: np.ndarray) -> np.ndarray:
    fmt = FORMATS[target]
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(fmt.result_dtype).view(fmt.storage_dtype)


@functools.cache
def constant_binades(target: str) -> np.ndarray:
    """Per sign and biased float32 exponent (2 x 256), the code that the oracle gives every pattern of
    that binade where that code is the same for a whole run of binades from the bottom (0 up to
    tiny values) or up to the top (huge values up to the largest finite float32), else -1: there the
    oracle is asked element by element.

    A rounding cast is monotonic in the magnitude for each sign (its codes, as unsigned numbers of
    one sign, never decrease as |x| grows, NaN code included): where the oracle gives the same code
    for the first and the last pattern of a run of binades, it gives that code for every pattern
    between them. The oracle itself answers for both ends."""
    out = np.full((2, 256), -1, np.int64)
    for sign in (0, 1):
        s = np.uint32(sign << 31)
        starts = (np.arange(256, dtype=np.uint32) << np.uint32(23)) | s
        ends = starts | np.uint32(0x7FFFFF)
        first, last = _oracle(target, starts.view(np.float32)), _oracle(target, ends.view(np.float32))
        k = 0  # binades [0, k) from the bottom
        while k < 255 and last[k] == first[0]:
            k += 1
        out[sign, :k] = first[0]
        k = 254  # binades [k, 254] up to the largest finite float32
        while k > 0 and first[k] == last[254]:
            k -= 1
        out[sign, k + 1 : 255] = last[254]
    return out


@functools.cache
def _tfloat32_of_binade_127(offset: int) -> np.ndarray:
    """The reference's tfloat32 patterns of the chunk at ``offset`` in the binade [1, 2), minus 1.0's
    pattern (int64; 2^23 where the rounding carries into the next binade)."""
    u = _patterns((127 << 23) + offset)
    return round_float32_to_mbits(u.view(np.float32), 10).view(np.uint32).astype(np.int64) - (127 << 23)


def tfloat32_expected(start: int) -> np.ndarray:
    """The reference's tfloat32 patterns of the chunk of patterns at ``start``. In the normal binades
    below the top one (biased exponents 1 to 253) the value is 2^k times one of [1, 2) and rounding
    commutes with the exact scaling by 2^k, so those chunks are the ones of [1, 2) moved by k binades,
    with the sign of the input (ties to even are symmetric); the reference answers the others (zero
    and subnormals, the top binade that can overflow, infinities and NaN) itself."""
    sign, biased, offset = start >> 31, (start >> 23) & 0xFF, start & 0x7FFFFF
    if not 1 <= biased <= 253:
        return round_float32_to_mbits(_patterns(start).view(np.float32), 10).view(np.uint32)
    moved = _tfloat32_of_binade_127(offset) + ((biased << 23) | (sign << 31))
    return moved.astype(np.uint32)


def _check_chunk(target: str, start: int) -> str | None:
    u = _patterns(start)
    x = u.view(np.float32)
    fmt = FORMATS[target]
    ours = nk.cast(x, target).view(fmt.storage_dtype if fmt.numpy_name else np.uint32)
    with np.errstate(invalid="ignore", over="ignore"):
        if target == "tfloat32":
            ref = tfloat32_expected(start)
        elif target == "float16":
            ref = float16_expected(u, x)
        else:
            # A chunk (2^20 patterns) lies in one binade of one sign: the oracle's code of a constant
            # binade, or the oracle asked for each element.
            code = constant_binades(target)[start >> 31, (start >> 23) & 0xFF]
            ref = np.full(u.shape, code, fmt.storage_dtype) if code >= 0 else _oracle(target, x)
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
    # The corrections of e8m0_expected, checked on values whose codes docs/casts.md names.
    x = np.array(
        [3.0, 6.0, 12.0, 0.75, 1.5 * 2.0**127, 1.25 * 2.0**-127, 1.5 * 2.0**-127, 1.75 * 2.0**-127], dtype=np.float32
    )
    u = x.view(np.uint32)
    ml = np.zeros_like(u, dtype=np.uint8)
    assert list(e8m0_expected(u, ml)) == [0x80, 0x82, 0x82, 0x7E, 0xFE, 0x00, 0x00, 0x01]
    assert list(nk.cast(x, "float8_e8m0fnu").view(np.uint8)) == [0x80, 0x82, 0x82, 0x7E, 0xFE, 0x00, 0x00, 0x01]


def test_float16_expected_is_numpy_everywhere():
    # The shortcut of float16_expected against numpy's cast itself, on patterns of every exponent
    # and both signs: the binade boundaries and a random sample of each.
    rng = np.random.default_rng(16)
    exps = np.arange(512, dtype=np.uint32) << np.uint32(23)
    mantissas = np.concatenate([[0, 1, 0x400000, 0x7FFFFF], rng.integers(0, 1 << 23, 60)]).astype(np.uint32)
    u = (exps[:, None] | mantissas[None, :]).ravel()
    x = u.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        numpy_codes = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(float16_expected(u, x), numpy_codes)
