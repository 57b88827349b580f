"""Every one of the 2^32 float32 bit patterns through every encoder (marked slow).

The oracle is ml_dtypes 0.7.0 (numpy for float16) with the default rounding, except where
docs/casts.md deliberately differs: float8_e8m0fnu rounds ties to the even code and splits the lowest
binade at its midpoint. tfloat32 has no ml_dtypes type; its oracle is the float64 reference.
The oracles are asked element by element only where their answer changes: for tfloat32 and float16,
the normal binades are [1, 2)'s codes moved (``scaled_expected``); for the others, a binade whose
code is constant is found from its ends (``constant_binades``), and in the others the oracle is
asked at the ends of ever shorter runs, and element by element only in short runs where the code
changes (``oracle_by_runs``).
This matters most for float16: numpy's cast takes 40-85 ns an element where it underflows or
overflows (it raises the FP flags one element at a time).
Chunks of 2^20 patterns (small enough for the references' float64 temporaries to stay in cache)
run on two threads (the casts release the GIL). Run alone with ``python -m pytest -m slow``; CI
runs it with the rest.
"""

import functools
import itertools
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


#: Targets whose codes in their normal binades are those of [1, 2) moved: (the code's mantissa bits,
#: the lowest and the highest biased float32 exponent of such binades).
SCALED_BINADES = {"tfloat32": (23, 1, 253), "float16": (10, 127 - 14, 127 + 15)}


def scaled_reference(target: str, x: np.ndarray) -> np.ndarray:
    """The reference codes of ``x`` for a target of :data:`SCALED_BINADES`: the float64 reference
    for tfloat32 (float32 patterns), numpy for float16."""
    if target == "tfloat32":
        return round_float32_to_mbits(x, 10).view(np.uint32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return x.astype(np.float16).view(np.uint16)


@functools.cache
def _codes_of_binade_127(target: str, offset: int) -> np.ndarray:
    """The reference's codes of the chunk at ``offset`` in the binade [1, 2)."""
    return scaled_reference(target, _patterns((127 << 23) + offset).view(np.float32))


def scaled_expected(target: str, start: int) -> np.ndarray | None:
    """The reference's codes of the chunk of patterns at ``start`` if it lies in one of the target's
    normal binades of :data:`SCALED_BINADES`, else None. There the value is 2^k times one of [1, 2)
    and rounding commutes with the exact scaling by 2^k, so the codes are those of [1, 2) moved by k
    binades (k << M), with the sign of the input (ties to even are symmetric); the carry out of the
    top binade gives the next code, which is float16's infinity. The reference answers the other
    chunks (zero and subnormals, binades that can overflow, infinities and NaN) itself."""
    mbits, lo, hi = SCALED_BINADES[target]
    sign, biased, offset = start >> 31, (start >> 23) & 0xFF, start & 0x7FFFFF
    if not lo <= biased <= hi:
        return None
    base = _codes_of_binade_127(target, offset)
    bits = 8 * base.itemsize
    move = ((biased - 127) << mbits) + (sign << (bits - 1))  # added modulo 2^bits: the sum is a code
    return base + base.dtype.type(move % (1 << bits))


#: The largest run of patterns the oracle is asked for element by element in :func:`oracle_by_runs`.
LEAF = 1 << 12
#: The widest mantissa for which :func:`oracle_by_runs` asks the oracle less than the whole chunk: a
#: chunk (an eighth of a binade) holds about 2^(M - 3) codes.
RUNS_MBITS = 4


def oracle_by_runs(target: str, x: np.ndarray) -> np.ndarray:
    """The oracle's codes of ``x``, consecutive float32 patterns of one sign (a chunk), asked element
    by element only in runs of at most :data:`LEAF` patterns where the code changes. The patterns
    that give one code form one run (rounding is monotonic in the magnitude, see
    ``constant_binades``), so where the oracle gives the same code at both ends of a run it gives it
    to every pattern between them; other runs are halved until they are short. The oracle itself
    answers every end."""
    out = np.empty(x.shape, FORMATS[target].storage_dtype)
    runs = [(0, x.size)]
    while runs:
        lo, hi = runs.pop()
        if hi - lo <= LEAF:
            out[lo:hi] = _oracle(target, x[lo:hi])
            continue
        ends = _oracle(target, x[[lo, hi - 1]])
        if ends[0] == ends[1]:
            out[lo:hi] = ends[0]
        else:
            mid = (lo + hi) // 2
            runs += [(lo, mid), (mid, hi)]
    return out


def _check_chunk(target: str, start: int) -> str | None:
    u = _patterns(start)
    x = u.view(np.float32)
    fmt = FORMATS[target]
    ours = nk.cast(x, target).view(fmt.storage_dtype if fmt.numpy_name else np.uint32)
    biased = (start >> 23) & 0xFF
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = scaled_expected(target, start) if target in SCALED_BINADES else None
        # A chunk (2^20 patterns) lies in one binade of one sign: [1, 2)'s codes moved, the oracle's
        # code of a constant binade, or the oracle asked where the code changes (element by element
        # among the NaNs, whose payloads some oracles keep).
        code = constant_binades(target)[start >> 31, biased] if target != "tfloat32" else -1
        if scaled is not None:
            ref = scaled
        elif target == "tfloat32":
            ref = scaled_reference(target, x)
        elif code >= 0:
            ref = np.full(u.shape, code, fmt.storage_dtype)
        elif (fmt.mbits <= RUNS_MBITS or target == "float16") and biased != 0xFF:
            ref = oracle_by_runs(target, x)
        else:
            ref = _oracle(target, x)
    if target == "float8_e8m0fnu" and ((start >> 23) == 0 or (start & 0x7FFFFF) == 0x400000):
        ref = e8m0_expected(u, ref)  # the chunks it changes: of binade 0, or holding a tie (at their start)
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


@pytest.mark.parametrize("target", list(SCALED_BINADES))
def test_scaled_expected_is_the_reference(target):
    # The shortcut of scaled_expected against the reference asked itself, on whole chunks: the lowest
    # and the highest of the moved binades (the carry into infinity among them), one between, the
    # first and the last chunk of each, both signs.
    _, lo, hi = SCALED_BINADES[target]
    for biased, offset, sign in itertools.product((lo, (lo + hi) // 2, hi), (0, 8 * CHUNK - CHUNK), (0, 1)):
        start = (sign << 31) | (biased << 23) | offset
        x = _patterns(start).view(np.float32)
        np.testing.assert_array_equal(scaled_expected(target, start), scaled_reference(target, x), err_msg=hex(start))
    assert scaled_expected(target, (lo - 1) << 23) is None and scaled_expected(target, (hi + 1) << 23) is None


@pytest.mark.parametrize("target", [t for t in ORACLE_TARGETS if FORMATS[t].mbits <= RUNS_MBITS] + ["float16"])
def test_oracle_by_runs_is_the_oracle(target):
    # The shortcut of oracle_by_runs against the oracle asked for every element, on whole chunks
    # where the code may change: float32 subnormals, float16's, around 1.0, the largest finite
    # values, both signs (not the NaNs: the sweep asks the oracle for each of them).
    for biased, sign in itertools.product((0, 1, 103, 110, 120, 127, 135, 142, 254), (0, 1)):
        start = (sign << 31) | (biased << 23) | (3 * CHUNK)
        x = _patterns(start).view(np.float32)
        np.testing.assert_array_equal(oracle_by_runs(target, x), _oracle(target, x), err_msg=hex(start))
