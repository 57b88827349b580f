"""The element loops of the row kernels over whole runs of blocks (the specialised binding of the
element loop): for blocks of the format's own length, a compile-time constant.

The per-block loops of :mod:`.rows` run a block's elements under its one multiplier: 16 or 32
iterations of a run-time count, too few for LLVM's vectoriser, which then runs them one by one.
Here the multipliers of up to ``CHUNK`` blocks are spread
over their elements first (``muls[i]``: element ``i``'s), and one loop then encodes every element
of those blocks: a long loop of the same arithmetic, in vector registers. Every element is
computed by the same helpers from the same multiplier as in the per-block loops, so the codes
are the same bits; blocks whose scale is the NaN byte then get the NaN code, as there."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._jit import jit, u32_and
from .. import codec as C
from ..hashing import random_bits
from ..nibbles import nibble_pair
from .elements import _code, _load, _scaled
from .scales import _multiplier
from .spec import Element, Scale, Source, _flags

#: Blocks whose elements one pass of the element loop covers (their multipliers stay in L1).
CHUNK = 64
#: The block length whose kernels take this loop (see :func:`~.rows._row_quantize`).
FLAT_BLOCK = 16


@jit(inline="always")
def flat_scratch(vlen):  # pragma: no cover - compiled
    """The multipliers and scales of ``CHUNK`` blocks of ``vlen`` elements, per element."""
    n = max(vlen, 1) * CHUNK
    return np.empty(n, np.float32), np.empty(n, np.float32)


def _spread(sc: Scale, vlen: int, with_steps: bool) -> Any:
    """``spread(sr, j, jn, pts, muls, steps)``: the multiplier (and, ``with_steps``, the scale) of
    blocks ``[j, jn)`` (bytes ``sr``) into each of their ``vlen`` elements' entries of ``muls``
    (and ``steps``)."""
    e8m0 = sc.e8m0

    @jit(inline="always")
    def spread(sr, j, jn, pts, muls, steps):  # pragma: no cover - compiled
        m, s = muls.reshape(CHUNK, vlen), steps.reshape(CHUNK, vlen)
        for b in range(jn - j):
            mul, step = _multiplier(np.uint32(sr[j + b]), pts, sc, e8m0)
            m[b, :] = mul  # a slice: numba's fill loop is vectorised, an element loop of vlen stores was not
            if with_steps:
                s[b, :] = step

    return spread


def flat_quantizer(source: Source, el: Element, sc: Scale, pack: bool, vlen: int) -> Any:
    """``elements(xr, cr, sr, j0, j1, base, pts, key_lo, key_hi, muls, steps)``: the codes of the
    elements of blocks ``[j0, j1)`` of the row ``xr`` (blocks of ``vlen``) under their scale bytes
    ``sr`` into the row ``cr`` (``pack``: two per byte, element 2i in the low nibble), element
    ``l`` rounded with the stochastic bits of index ``base + l``: what
    :func:`~.rows._block_quantizer` writes block by block."""
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    nan_code, nan_byte = el.nan_code, sc.nan_byte
    spread = _spread(sc, vlen, False)

    @jit(inline="always")
    def code_of(xr, muls, i, m, base, key_lo, key_hi):  # pragma: no cover - compiled
        rnd = random_bits(key_lo, key_hi, base + np.int64(i)) if stochastic else np.uint32(0)
        return _code(_scaled(_load(xr[i], kind, source.codec), muls[m], e8m0), rnd, el, rmode, fixed)

    @jit(inline="always")
    def elements(xr, cr, sr, j0, j1, base, pts, key_lo, key_hi, muls, steps):  # pragma: no cover - compiled
        length = xr.shape[0]
        j = j0
        while j < j1:
            jn = min(j1, j + CHUNK)
            spread(sr, j, jn, pts, muls, steps)
            l0 = np.uint64(j * vlen)
            n = np.uint64(min(jn * vlen, length)) - l0
            if pack:
                h0 = l0 >> np.uint64(1)
                for h in range(n >> np.uint64(1)):
                    i = l0 + h + h
                    lo = code_of(xr, muls, i, h + h, base, key_lo, key_hi)
                    hi = code_of(xr, muls, i + np.uint64(1), h + h + np.uint64(1), base, key_lo, key_hi)
                    cr[h0 + h] = nibble_pair(lo, hi)
                if n & np.uint64(1):  # the row's last element, alone in its byte's low nibble
                    last = n - np.uint64(1)
                    code = code_of(xr, muls, l0 + last, last, base, key_lo, key_hi)
                    cr[h0 + (n >> np.uint64(1))] = u32_and(code, 0xF)
            else:
                for k in range(n):
                    cr[l0 + k] = code_of(xr, muls, l0 + k, k, base, key_lo, key_hi)
            for b in range(j, jn):  # blocks holding a NaN or an infinity
                if np.uint32(sr[b]) == np.uint32(nan_byte):
                    e0, e1 = b * vlen, min(b * vlen + vlen, length)
                    if pack:
                        for h in range(e0 >> 1, (e1 + 1) >> 1):
                            cr[h] = nan_code
                    else:
                        for e in range(e0, e1):
                            cr[e] = nan_code
            j = jn

    return elements
