"""Tile kernels: tiles of ``rows x cols`` over (R, C) of (A, R, C) arrays. A 1-D block along an
axis that is not the last is a tile ``(size, 1)`` of the array seen as (outer, L, inner); a 2-D
block is a tile over the last two axes. A task is one row of tiles."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._jit import f32_bits, jit, u32_and
from .. import codec as C
from ..hashing import random_bits
from ..nibble_kernels import nibble, nibble_pair, put_nibble
from .elements import dequantized, element_code, element_value, load_value, scaled, stream
from .scales import candidate, multiplier, policy_scale, scale_byte, tile_error
from .spec import BY_DIVISION, FOUR_SIX_MAE, PACK_COLS, PACK_NONE, Element, Scale, Source, flags


@jit(inline="always")
def _tile_amax(x, a, r0, r1, cols, j0, j1, amax, kind, codec):  # pragma: no cover - compiled
    """The largest |x| pattern of each tile ``[j0, j1)`` of the row of tiles ``x[a, r0:r1, :]``
    (tiles ``cols`` wide) into ``amax[j]``, the source's ``kind`` and ``codec`` compiled in where
    they are constants (the plain kernels': then the loop over a row is vectorised)."""
    width = x.shape[2]
    amax[j0:j1] = 0
    if cols == 1:
        for rr in range(r0, r1):
            xrow = x[a, rr]  # one view per row, unsigned indices: the loop is vectorised
            for cc in range(np.uint64(j0), np.uint64(j1)):
                v = u32_and(load_value(xrow[cc], kind, codec), 0x7FFFFFFF)
                amax[cc] = v if v > amax[cc] else amax[cc]
    else:
        for rr in range(r0, r1):
            for j in range(j0, j1):
                m = amax[j]
                for cc in range(j * cols, min(j * cols + cols, width)):
                    v = u32_and(load_value(x[a, rr, cc], kind, codec), 0x7FFFFFFF)
                    m = v if v > m else m
                amax[j] = m


@jit(inline="always")
def _tile_plain_scales(x, a, r0, r1, cols, j0, j1, amax, bytes_, mode, pts, kind, codec, sc):  # pragma: no cover
    """:func:`_tile_scales` of the kernels without scale policies, inlined with the source's
    ``kind`` compiled in. Float scales take a non-zero ``pts`` as the amax pattern of every tile
    (the whole matrix's, given to bands of one: :meth:`BlockJob.quantize`), not reading it."""
    given = sc.scaling >= BY_DIVISION and pts != 0
    if not given:
        _tile_amax(x, a, r0, r1, cols, j0, j1, amax, kind, codec)
    for j in range(j0, j1):
        m = f32_bits(pts) if given else amax[j]
        bytes_[j] = scale_byte(m, mode, pts, sc, sc.scaling)


@jit
def _tile_scales(
    x, a, r0, r1, cols, j0, j1, amax, bytes_, mode, policy, pts, key, idx0, src, el, sc
):  # pragma: no cover
    """Scale bytes of the tiles ``[j0, j1)`` of the row of tiles ``x[a, r0:r1, :]`` (tiles ``cols``
    wide) into ``bytes_[j]``; ``amax`` is scratch of one entry per tile."""
    width = x.shape[2]
    _tile_amax(x, a, r0, r1, cols, j0, j1, amax, src.kind, src.codec)
    for j in range(j0, j1):
        m = amax[j]
        byte = scale_byte(m, mode, pts, sc, sc.scaling)
        if policy_scale(byte, m, policy, pts, sc):
            c0, c1 = j * cols, min(j * cols + cols, width)
            squared = policy != FOUR_SIX_MAE
            best = tile_error(x, a, r0, r1, c0, c1, byte, pts, squared, key, idx0, src, el, sc)
            plain = byte
            for k in range(4):
                valid, cand = candidate(k, plain, policy, m, pts, sc)
                if valid:
                    err = tile_error(x, a, r0, r1, c0, c1, cand, pts, squared, key, idx0, src, el, sc)
                    if err < best:
                        best, byte = err, cand
        bytes_[j] = byte


#: About how many columns a tile kernel's chunk spans (see :func:`_tile_tasks`): 32 rows of them
#: in float32 are 128 KiB.
CHUNK_COLUMNS = 1024


def _tile_tasks(source: Source, el: Element, sc: Scale, quantize: bool, pack: int) -> Any:
    """The task loop of a tile kernel, ``run(x, dst, scales, nrt, nct, rows, cols, mode, policy,
    pts, key, idx0, t0, t1)`` (``nrt`` x ``nct`` tiles of ``rows`` x ``cols`` over (R, C)): for
    each row ``i`` of tiles ``x[a, r0:r1, :]`` of the tasks ``[t0, t1)``, the scale bytes of its
    tiles (:func:`_tile_scales`, or :func:`_tile_plain_scales` in kernels without scale policies),
    then each of its elements with its tile's multiplier and scale of dequantised values
    (:func:`~.scales.multiplier`; the scale is NaN in a block holding a NaN or an infinity) and its
    stochastic bits: ``quantize``, its code into ``dst`` (``pack``: ``PACK_*``) and the scale bytes
    into ``scales[a, i]``; else its dequantised value into ``dst`` (``scales`` not used). One body
    for both, the branch not taken pruned: numba's inlining of a closure per element cost a third
    more compile time."""
    kind, rmode, fixed, scaling = flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    policies = sc.policies  # constants of the closure: numba compiles only the branches taken
    nan_code = el.nan_code

    @jit(inline="always")
    def _tile_code(xrow, cc, col_mul, col_scale, base, key_lo, key_hi):  # pragma: no cover - compiled
        """The code of ``xrow[cc]`` with its column's multiplier; the NaN code under a NaN scale."""
        rnd = random_bits(key_lo, key_hi, base + np.int64(cc)) if stochastic else np.uint32(0)
        code = element_code(
            scaled(load_value(xrow[cc], kind, source.codec), col_mul[cc], scaling), rnd, el, rmode, fixed
        )
        return nan_code if col_scale[cc] != col_scale[cc] else code

    @jit
    def run(x, dst, scales, nrt, nct, rows, cols, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover
        key_lo, key_hi = stream(key)
        height, width = x.shape[1], x.shape[2]
        amax = np.empty(nct, np.uint32)
        bytes_ = np.empty(nct, np.uint32)
        col_mul = np.empty(width, np.float32)
        col_scale = np.empty(width, np.float32)
        rnd = np.uint32(0)
        span = max(2, (CHUNK_COLUMNS // cols) & ~1)  # tiles per chunk
        for t in range(t0, t1):
            a = t // nrt
            i = t - a * nrt
            r0 = i * rows
            r1 = min(r0 + rows, height)
            # Chunks of whole tiles about CHUNK_COLUMNS wide (an even number of tiles: a packed
            # pair of columns never straddles two), so that the scale loop leaves the chunk's
            # elements in cache for the element loop.
            for j0 in range(0, nct, span):
                j1 = min(j0 + span, nct)
                c0, c1 = j0 * cols, min(j1 * cols, width)
                if policies:
                    _tile_scales(x, a, r0, r1, cols, j0, j1, amax, bytes_, mode, policy, pts, key, idx0, source, el, sc)
                else:
                    _tile_plain_scales(x, a, r0, r1, cols, j0, j1, amax, bytes_, mode, pts, kind, source.codec, sc)
                for j in range(j0, j1):
                    if quantize:
                        scales[a, i, j] = bytes_[j]
                    mul, scale = multiplier(bytes_[j], pts, sc, scaling)
                    col_mul[j * cols : j * cols + cols] = mul  # slice fills: vectorised
                    col_scale[j * cols : j * cols + cols] = scale
                # One view per row and unsigned indices: the element loops are vectorised.
                u0, u1 = np.uint64(c0), np.uint64(c1)
                for rr in range(r0, r1):
                    xrow = x[a, rr]
                    base = idx0 + (a * height + rr) * width
                    if not quantize:
                        drow = dst[a, rr]
                        for cc in range(u0, u1):
                            if stochastic:
                                rnd = random_bits(key_lo, key_hi, base + np.int64(cc))
                            v = scaled(load_value(xrow[cc], kind, source.codec), col_mul[cc], scaling)
                            drow[cc] = dequantized(v, rnd, col_scale[cc], el, rmode, fixed)
                    elif pack == PACK_COLS:
                        drow = dst[a, rr]
                        for k in range(u0 >> np.uint64(1), u1 >> np.uint64(1)):
                            lo = _tile_code(xrow, k + k, col_mul, col_scale, base, key_lo, key_hi)
                            hi = _tile_code(xrow, k + k + np.uint64(1), col_mul, col_scale, base, key_lo, key_hi)
                            drow[k] = nibble_pair(lo, hi)
                        if u1 & np.uint64(1):  # the last column of an odd width
                            last = u1 - np.uint64(1)
                            code = _tile_code(xrow, last, col_mul, col_scale, base, key_lo, key_hi)
                            put_nibble(drow, last >> np.uint64(1), code, 0)
                    else:
                        high = rr & 1 if pack != PACK_NONE else 0
                        drow = dst[a, rr >> 1] if pack != PACK_NONE else dst[a, rr]
                        for cc in range(u0, u1):
                            code = _tile_code(xrow, cc, col_mul, col_scale, base, key_lo, key_hi)
                            if pack == PACK_NONE:
                                drow[cc] = code
                            else:
                                put_nibble(drow, cc, code, high)

    return run


def tile_quantize(source: Source, el: Element, sc: Scale, pack: int) -> Any:
    run = _tile_tasks(source, el, sc, True, pack)

    @jit
    def kernel(x, codes, scales, rows, cols, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover - compiled
        run(x, codes, scales, scales.shape[1], scales.shape[2], rows, cols, mode, policy, pts, key, idx0, t0, t1)

    return kernel


def tile_fake_quantize(source: Source, el: Element, sc: Scale) -> Any:
    run = _tile_tasks(source, el, sc, False, PACK_NONE)

    @jit
    def kernel(x, out, rows, cols, mode, policy, pts, key, idx0, t0, t1):  # pragma: no cover - compiled
        nrt = (x.shape[1] + rows - 1) // rows
        nct = (x.shape[2] + cols - 1) // cols
        run(x, out, None, nrt, nct, rows, cols, mode, policy, pts, key, idx0, t0, t1)

    return kernel


def tile_dequantize(el: Element, sc: Scale, pack: int) -> Any:
    scaling = sc.scaling

    @jit
    def kernel(codes, scales, out, rows, cols, pts, t0, t1):  # pragma: no cover - compiled
        height, width = out.shape[1], out.shape[2]
        nrt, nct = scales.shape[1], scales.shape[2]
        col_scale = np.empty(width, np.float32)
        for t in range(t0, t1):
            a = t // nrt
            i = t - a * nrt
            r0 = i * rows
            r1 = min(r0 + rows, height)
            for j in range(nct):
                _, scale = multiplier(np.uint32(scales[a, i, j]), pts, sc, scaling)
                for cc in range(j * cols, min(j * cols + cols, width)):
                    col_scale[cc] = scale
            for rr in range(r0, r1):
                for cc in range(width):
                    if pack == PACK_NONE:
                        code = np.uint32(codes[a, rr, cc])
                    elif pack == PACK_COLS:
                        code = nibble(codes[a, rr, cc >> 1], cc & 1)
                    else:
                        code = nibble(codes[a, rr >> 1, cc], rr & 1)
                    out[a, rr, cc] = element_value(code, col_scale[cc], el)

    return kernel
