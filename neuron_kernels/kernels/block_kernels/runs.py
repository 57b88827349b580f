"""The element loops of the row kernels over runs of whole blocks of :data:`RUN_BLOCK` elements
(NVFP4's; the specialised binding of its element loops): quantise, fake-quantise and dequantise.

The per-block loops of :mod:`.rows` run a block's elements with a run-time trip count: 16 or 32
iterations, which LLVM's vectoriser leaves scalar. Here the block length is a constant of the
closure, so that a block's loop is unrolled and vectorised whole (one or two vector registers a
block), and the multipliers of a run's blocks are computed first, in a loop of their own, which
vectorises across blocks. 4-bit codes are encoded one per byte into a scratch run, then paired by
a loop that reads them as 16-bit words (little-endian: element ``2i`` is the low byte, so the low
nibble), a contiguous load and a narrowing store, where pairing codes in the encoding loop (reads
two apart) stayed scalar; the dequantiser does the reverse. Every element is computed by the same
helpers from the same multiplier as in the per-block loops, so the codes and values are the same
bits; the codes of a block whose scale is the NaN byte are then the NaN code, as there.

Measured on one core, 1 Mi float32 elements in cache (NVFP4, per-tensor scale given): the scale
loop with its divisions vectorised across blocks and these element loops took 0.9 cycles an
element, against 2.5 for a scale loop block by block and multipliers spread per element.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..._jit import jit, u32_and, u32_or, u32_shl, u32_shr
from .. import codec as C
from ..hashing import random_bits
from .elements import dequantized, element_code, element_value, load_value, scaled
from .scales import multiplier
from .spec import Element, Scale, Source, flags

#: The most blocks of one run: their multipliers and a packed run's codes stay in L1.
CHUNK = 64
#: The block length whose kernels take these loops (NVFP4's). For MX's blocks of 32 the unrolled
#: loops measured no faster once memory is the limit (64 Mi float32 elements, two threads,
#: alternating runs: MXFP8 quantise 13.2 against 13.0 ms, fake-quantise 16.4 against 16.9) and
#: doubled the kernels' compile time, so they keep the per-block loops of :mod:`.rows`.
RUN_BLOCK = 16

# The 4-bit code pairs are read and written as 16-bit words, low byte first.
assert sys.byteorder == "little", "packed 4-bit codes are paired as little-endian 16-bit words"


@jit(inline="always")
def run_scratch(vlen):  # pragma: no cover - compiled
    """The scratch of one kernel call: the multipliers and scales of a run's blocks, and a run's
    4-bit codes one per byte (as 16-bit words)."""
    return np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32), np.empty(max(vlen, 2) * CHUNK // 2, np.uint16)


@jit(inline="always")
def pair_bytes(w):  # pragma: no cover - compiled
    """The packed byte of two codes held one per byte in the 16-bit word ``w`` (low byte first)."""
    w = np.uint32(w)
    return u32_or(u32_and(w, 0xF), u32_and(u32_shr(w, 4), 0xF0))


@jit(inline="always")
def _unpair_byte(b):  # pragma: no cover - compiled
    """The 16-bit word of the two codes of the packed byte ``b``, one per byte (low nibble first)."""
    b = np.uint32(b)
    return np.uint16(u32_or(u32_and(b, 0xF), u32_shl(u32_and(b, 0xF0), 4)))


def _multipliers(sc: Scale) -> Any:
    scaling = sc.scaling

    @jit(inline="always")
    def multipliers(sr, j0, n, pts, muls, steps):  # pragma: no cover - compiled
        """The multipliers and scales (:func:`~.scales.multiplier`) of blocks ``[j0, j0 + n)``."""
        first = np.uint64(j0)  # unsigned indices: a signed one costs a wraparound check per lane
        for b in range(n):
            mul, step = multiplier(np.uint32(sr[first + np.uint64(b)]), pts, sc, scaling)
            muls[b] = mul
            steps[b] = step

    return multipliers


def run_elements(source: Source, el: Element, sc: Scale, vlen: int, pack: bool, fake: bool) -> Any:
    """``elements(xr, dr, sr, j0, j1, base, pts, key_lo, key_hi, scratch)``: for the whole blocks
    ``[j0, j1)`` (at most :data:`CHUNK`) of ``vlen`` elements of the row ``xr``, under their
    scale bytes ``sr``, the codes into the row ``dr`` (``pack``: two per byte, element ``2i`` in
    the low nibble) or, ``fake``, the dequantised values into the float32 row ``dr``; element
    ``l`` rounded with the stochastic bits of index ``base + l``; ``scratch``:
    :func:`run_scratch`'s. What :func:`~.rows._block_quantizer` and
    :func:`~.rows._block_fake_quantizer` write block by block."""
    kind, rmode, fixed, scaling = flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    nan_code, nan_byte = el.nan_code, sc.nan_byte
    half = vlen // 2
    multipliers = _multipliers(sc)
    codec = source.codec

    @jit(inline="always")
    def elements(xr, dr, sr, j0, j1, base, pts, key_lo, key_hi, scratch):  # pragma: no cover - compiled
        muls, steps, words = scratch
        one_per_byte = words.view(np.uint8)
        n = j1 - j0
        multipliers(sr, j0, n, pts, muls, steps)
        rnd = np.uint32(0)
        for b in range(n):
            mul, step = muls[b], steps[b]
            o = np.uint64(b * vlen)
            l0 = np.uint64(j0 * vlen) + o
            for k in range(vlen):  # a constant trip count: unrolled and vectorised
                i = l0 + np.uint64(k)
                if stochastic:
                    rnd = random_bits(key_lo, key_hi, base + np.int64(i))
                v = scaled(load_value(xr[i], kind, codec), mul, scaling)
                if fake:
                    dr[i] = dequantized(v, rnd, step, el, rmode, fixed)
                elif pack:
                    one_per_byte[o + np.uint64(k)] = element_code(v, rnd, el, rmode, fixed)
                else:
                    dr[i] = element_code(v, rnd, el, rmode, fixed)
        if not fake:
            if pack:
                h0 = np.uint64(j0 * half)
                for h in range(n * half):
                    dr[h0 + np.uint64(h)] = pair_bytes(words[h])
            for b in range(n):  # blocks holding a NaN or an infinity
                if np.uint32(sr[j0 + b]) == np.uint32(nan_byte):
                    if pack:
                        dr[(j0 + b) * half : (j0 + b + 1) * half] = nan_code | (nan_code << 4)
                    else:
                        dr[(j0 + b) * vlen : (j0 + b + 1) * vlen] = nan_code

    return elements


def run_dequantizer(el: Element, sc: Scale, vlen: int, pack: bool) -> Any:
    """``values(cr, sr, orow, j0, j1, pts, scratch)``: the dequantised values of the whole blocks
    ``[j0, j1)`` (at most :data:`CHUNK`) of ``vlen`` codes of the row ``cr`` (``pack``: two per
    byte) under their scale bytes ``sr`` into the float32 row ``orow``."""
    half = vlen // 2
    multipliers = _multipliers(sc)

    @jit(inline="always")
    def values(cr, sr, orow, j0, j1, pts, scratch):  # pragma: no cover - compiled
        muls, steps, words = scratch
        one_per_byte = words.view(np.uint8)
        n = j1 - j0
        multipliers(sr, j0, n, pts, muls, steps)
        if pack:
            h0 = np.uint64(j0 * half)
            for h in range(n * half):
                words[h] = _unpair_byte(cr[h0 + np.uint64(h)])
        for b in range(n):
            step = steps[b]
            o = np.uint64(b * vlen)
            l0 = np.uint64(j0 * vlen) + o
            for k in range(vlen):  # a constant trip count: unrolled and vectorised
                code = np.uint32(one_per_byte[o + np.uint64(k)]) if pack else np.uint32(cr[l0 + np.uint64(k)])
                orow[l0 + np.uint64(k)] = element_value(code, step, el)

    return values
