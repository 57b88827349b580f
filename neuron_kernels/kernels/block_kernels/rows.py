"""Row kernels: blocks of ``size`` consecutive elements along the last axis of (A, L) arrays
(the fast path). A task is one (row, block) pair.

A row kernel is its task loop (:func:`_row_tasks`), which runs, for each run of up to
:data:`~.runs.CHUNK` blocks of a row, the scale loop (:func:`_row_scaler`) and then the element
loop of the run's whole blocks of 16 (:func:`~.runs.run_elements`), or of each block
(:func:`_block_quantizer`, :func:`_block_fake_quantizer`): closures made once per
specialisation, inlined into the run's loop. The kernels of the rotated input are the same, on
each run rotated into a scratch row first."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._jit import jit, u32_amax_abs, u32_and
from .. import codec as C
from .. import loaders as S
from ..hashing import random_bits
from ..loaders import SOURCE_F32  # a bare name: numba prunes branches on it
from ..nibble_kernels import nibble, nibble_pair, put_nibble
from .elements import dequantized, element_code, element_value, load_value, scaled, stream
from .hadamard import rotate_group
from .policies import GROUP, MAX_SIZE, group_scratch, grouped_scales, groups_policies
from .runs import CHUNK, RUN_BLOCK, run_dequantizer, run_elements, run_scratch
from .scales import candidate, multiplier, policy_scale, row_amax, row_errors, scale_byte
from .spec import BY_E4M3, FOUR_SIX_MAE, PLAIN, SEARCH_MSE, Element, Scale, Source, flags, source_of


@jit(inline="always")
def _decoded_amax(m, src):  # pragma: no cover - compiled
    """The float32 |pattern| of the largest magnitude code ``m`` of a vector reduction (the codes
    of 16-bit loaders are decoded once, after the reduction), the source known at run time. A
    kernel's own reduction (:func:`_row_amax`) decodes with :func:`~.elements.load_value`."""
    return m if src.kind == SOURCE_F32 else S.load(m, src.kind, src.codec)


@jit(inline="always")
def _row_scale(xr, l0, l1, base, amax, mode, policy, pts, key, src, el, sc, cands, errs):  # pragma: no cover
    """The scale byte of the block ``xr[l0:l1]``: the plain rule, or the policy's best candidate
    (``cands``, ``errs``: scratch of 5 entries)."""
    byte = scale_byte(amax, mode, pts, sc, sc.scaling)
    if not policy_scale(byte, amax, policy, pts, sc):
        return byte
    # the plain scale first; invalid candidates are evaluated with it (never strictly better)
    count = 5 if (policy == SEARCH_MSE) & (not sc.e8m0) else 2
    cands[0] = byte
    for k in range(count - 1):
        valid, cand = candidate(k, byte, policy, amax, pts, sc)
        cands[k + 1] = cand if valid else byte
    row_errors(xr, l0, l1, base, cands, count, pts, policy != FOUR_SIX_MAE, key, src, el, sc, errs)
    best, chosen = errs[0], byte
    for k in range(1, count):
        if errs[k] < best:
            best, chosen = errs[k], np.uint32(cands[k])
    return chosen


@jit(inline="always")
def _block_amax(xr, l0, l1, src):  # pragma: no cover - compiled
    """:func:`_row_amax` with the source known at run time only (one vector reduction for the
    blocks of 16, 32 or 64 of the sources that have them)."""
    n = l1 - l0
    if src.vector:
        if n == 32:
            return _decoded_amax(u32_amax_abs(xr, l0, 32), src)
        if n == 16:
            return _decoded_amax(u32_amax_abs(xr, l0, 16), src)
        if n == 64:
            return _decoded_amax(u32_amax_abs(xr, l0, 64), src)
    amax = np.uint32(0)
    for i in range(l0, l1):
        a = u32_and(S.load(xr[i], src.kind, src.codec), 0x7FFFFFFF)
        amax = a if a > amax else amax
    return amax


@jit
def row_scales(xr, j0, j1, size, base, out, mode, policy, pts, key, src, el, sc, cands, errs):  # pragma: no cover
    """The scale bytes of blocks ``[j0, j1)`` of the row ``xr`` into ``out[j]`` (``cands``,
    ``errs``: scratch of 5 entries, see :func:`_row_scale`). A loop of its own, before the
    elements', and a function of its own: the per-block decisions (the format's constants, scale
    mode and policy, all run-time values here) cost the element loop nothing, and one compiled
    copy serves every format and kernel with scale policies of a source's row type (compiling the
    policies' evaluation into each kernel cost most of their compile time)."""
    length = xr.shape[0]
    for j in range(j0, j1):
        l0 = np.uint64(j * size)
        l1 = np.uint64(min(j * size + size, length))
        amax = _block_amax(xr, l0, l1, src)
        out[j] = _row_scale(xr, l0, l1, base, amax, mode, policy, pts, key, src, el, sc, cands, errs)


@jit(inline="always")
def _row_plain_scales(
    xr, j0, j1, size, out, mode, pts, kind, codec, sc, scaling, v16, v32, v64, amaxes
):  # pragma: no cover
    """The scale bytes of blocks ``[j0, j1)`` (at most :data:`~.runs.CHUNK`) of the row ``xr`` by
    the plain rule (kernels without scale policies), inlined into the kernel with the format's
    constants and the vector lengths (see :func:`_row_amax`, :func:`~.spec.vector_length`)
    compiled in: the shared :func:`_row_scales`, with run-time constants, cost the quantisers up
    to a fifth of their speed. For e4m3fn scales, the amaxes first (``amaxes``: scratch), then the
    bytes in a loop of their own, which vectorises across blocks (their divisions included)."""
    length = xr.shape[0]
    first = np.uint64(j0)  # unsigned indices: a signed one costs a wraparound check per lane
    for b in range(j1 - j0):
        j = first + np.uint64(b)
        l0 = np.uint64(j * size)
        l1 = np.uint64(min(j * size + size, length))
        amax = row_amax(xr, l0, l1, kind, codec, v16, v32, v64)
        if scaling != BY_E4M3:  # the e8m0 rules do not vectorise (nor need float scales, of long blocks): one loop
            out[j] = scale_byte(amax, mode, pts, sc, scaling)
        else:
            amaxes[b] = amax
    if scaling == BY_E4M3:
        for b in range(j1 - j0):
            out[first + np.uint64(b)] = scale_byte(amaxes[b], mode, pts, sc, scaling)


@jit(inline="always")
def scale_scratch():  # pragma: no cover - compiled
    """The scratch of the scale loops, made once per kernel call: that of :func:`_row_scales`
    (candidate bytes and their errors), that of the grouped loop (:func:`~.policies.grouped_scales`)
    and the amaxes of a run of the plain loop (:func:`_row_plain_scales`)."""
    return np.empty(5, np.uint32), np.empty(5, np.float64), group_scratch(), np.empty(CHUNK, np.uint32)


def _row_scaler(source: Source, el: Element, sc: Scale, vlens: tuple[int, int, int]) -> Any:
    """The scale loop of a row kernel, ``scales(xr, j0, j1, size, base, out, mode, policy, pts,
    key, scratch)``: the scale bytes of blocks ``[j0, j1)`` of the row ``xr`` into ``out[j]``.
    Kernels without scale policies use :func:`_row_plain_scales` with the vector lengths
    ``vlens`` (16, 32, 64 or 0 each) compiled in. Kernels with them evaluate whole groups of
    blocks in vector registers where :func:`~.policies.groups_policies` says so (the specialised
    binding, :func:`~.policies.grouped_scales`), and every other block by the shared
    :func:`_row_scales` (the generic one); ``scratch`` is :func:`_scale_scratch`'s."""
    kind, _, _, scaling = flags(source, el, sc)
    policies = sc.policies  # a constant of the closure: numba compiles only the branch taken
    grouped = policies and groups_policies(source, el)
    group_of = grouped_scales(source, el, sc, vlens) if grouped else None
    v16, v32, v64 = vlens

    @jit(inline="always")
    def scales(xr, j0, j1, size, base, out, mode, policy, pts, key, scratch):  # pragma: no cover - compiled
        cands, errs, group, amaxes = scratch
        if policies:
            j = j0
            if grouped:
                if (policy != PLAIN) & (size <= MAX_SIZE):
                    whole = xr.shape[0] // size  # blocks [0, whole) are whole
                    while j < min(j1, whole):
                        ng = min(GROUP, min(j1, whole) - j)
                        group_of(xr, j, ng, size, mode, policy, pts, out, group)
                        j += ng
            row_scales(xr, j, j1, size, base, out, mode, policy, pts, key, source, el, sc, cands, errs)
        else:
            _row_plain_scales(xr, j0, j1, size, out, mode, pts, kind, source.codec, sc, scaling, v16, v32, v64, amaxes)

    return scales


def _block_quantizer(source: Source, el: Element, sc: Scale, pack: bool) -> Any:
    """The element loop of a quantising row kernel, ``block(xs, l0, l1, cr, c0, i0, byte, pts,
    key_lo, key_hi)``: the codes of the elements ``xs[l0:l1]`` under the scale ``byte`` into
    ``cr`` from position ``c0`` (``pack``: two per byte, position ``p`` in the low (even ``p``) or
    high nibble of ``cr[p / 2]``), element ``l0 + k`` rounded with the stochastic bits of index
    ``i0 + k``; every code is the NaN code in a block whose scale is the NaN byte. The plain row
    kernel runs it on the blocks of a row in place, the rotated one on each block rotated into
    a scratch row."""
    kind, rmode, fixed, scaling = flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC
    nan_code = el.nan_code

    @jit(inline="always")
    def block(xs, l0, l1, cr, c0, i0, byte, pts, key_lo, key_hi):  # pragma: no cover - compiled
        mul, _ = multiplier(byte, pts, sc, scaling)
        nan_block = byte == np.uint32(sc.nan_byte)
        n = l1 - l0
        rnd = np.uint32(0)
        rnd_hi = np.uint32(0)
        if not pack:
            for k in range(n):
                if stochastic:
                    rnd = random_bits(key_lo, key_hi, i0 + np.int64(k))
                code = element_code(
                    scaled(load_value(xs[l0 + k], kind, source.codec), mul, scaling), rnd, el, rmode, fixed
                )
                cr[c0 + k] = nan_code if nan_block else code
        elif (c0 & 1) == 0 and (n & 1) == 0:
            h0 = c0 >> np.uint64(1)
            for k in range(n >> np.uint64(1)):
                lo_i = l0 + k + k
                if stochastic:
                    rnd = random_bits(key_lo, key_hi, i0 + np.int64(k + k))
                    rnd_hi = random_bits(key_lo, key_hi, i0 + np.int64(k + k) + 1)
                lo = element_code(scaled(load_value(xs[lo_i], kind, source.codec), mul, scaling), rnd, el, rmode, fixed)
                hi_u = load_value(xs[lo_i + np.uint64(1)], kind, source.codec)
                hi = element_code(scaled(hi_u, mul, scaling), rnd_hi, el, rmode, fixed)
                cr[h0 + k] = nan_code if nan_block else nibble_pair(lo, hi)
        else:
            for k in range(n):
                if stochastic:
                    rnd = random_bits(key_lo, key_hi, i0 + np.int64(k))
                code = element_code(
                    scaled(load_value(xs[l0 + k], kind, source.codec), mul, scaling), rnd, el, rmode, fixed
                )
                pos = c0 + k
                put_nibble(cr, pos >> np.uint64(1), nan_code if nan_block else code, pos & np.uint64(1))

    return block


def _block_fake_quantizer(source: Source, el: Element, sc: Scale) -> Any:
    """The element loop of a fake-quantising row kernel, ``block(xs, l0, l1, out, o0, i0, byte,
    pts, key_lo, key_hi)``: the dequantised values of the elements ``xs[l0:l1]`` under the scale
    ``byte`` into ``out`` from position ``o0``, element ``l0 + k`` rounded with the stochastic
    bits of index ``i0 + k`` (see :func:`_block_quantizer`)."""
    kind, rmode, fixed, scaling = flags(source, el, sc)
    stochastic = el.mode == C.STOCHASTIC

    @jit(inline="always")
    def block(xs, l0, l1, out, o0, i0, byte, pts, key_lo, key_hi):  # pragma: no cover - compiled
        mul, scale = multiplier(byte, pts, sc, scaling)
        rnd = np.uint32(0)
        for k in range(l1 - l0):
            if stochastic:
                rnd = random_bits(key_lo, key_hi, i0 + np.int64(k))
            v = scaled(load_value(xs[l0 + k], kind, source.codec), mul, scaling)
            out[o0 + k] = dequantized(v, rnd, scale, el, rmode, fixed)

    return block


def _row_tasks(
    source: Source, el: Element, sc: Scale, vlen: int, block: Any, runs: Any, per_row: bool, rotate: bool
) -> Any:
    """The task loop of a row kernel, ``run(x, dst, scales, size, mode, policy, pts, key, idx0,
    signs, t0, t1)``: for the tasks ``[t0, t1)`` of (A, L) ``x``, run by run of up to
    :data:`~.runs.CHUNK` blocks of a row, the scale bytes of the run (:func:`_row_scaler`) into
    ``scales[r]`` (``per_row``; else into the scratch row ``scales[0]``), then the elements into
    ``dst[r]``: the run's whole blocks by ``runs`` (:func:`~.runs.run_elements`, or None) where
    blocks have the kernel's own length ``vlen``, every other block by ``block`` (:func:`_block_quantizer`,
    :func:`_block_fake_quantizer`). ``rotate``: the kernel of the rotated input (blocks and rows
    of a multiple of 16; ``signs``: the rotation's 16 signs, float64; unused otherwise): each
    run's groups of 16 are rotated into a scratch row first (:func:`~.hadamard.rotate_group`),
    which the scale and element loops then read as float32 patterns (``block`` and ``runs`` made
    for a float32 source)."""
    read = source_of("float32") if rotate else source  # what the scale and element loops read
    scales_of = _row_scaler(read, el, sc, (0, vlen, 0))
    has_runs = runs is not None
    kind, codec = source.kind, source.codec

    @jit(inline="always")
    def source_row(xr, jc, je, size, rotated, signs, t64):  # pragma: no cover - compiled
        """What the loops of blocks ``[jc, je)`` read: the row ``xr``, or those blocks of it rotated
        into the scratch row ``rotated`` (``rotate``)."""
        if rotate:
            length = xr.shape[0]
            for g in range(jc * size, min(je * size, length), 16):
                rotate_group(xr, g, rotated, g, signs, t64, kind, codec, False)
            return rotated
        return xr

    @jit  # a callee of its own: inlined, it compiled a third slower
    def chunk(xr, dr, sr, jc, je, base, options, space):  # pragma: no cover - compiled
        """Blocks ``[jc, je)`` of the row ``xr``: their scale bytes, then their elements."""
        size, whole, mode, policy, pts, key, key_lo, key_hi = options
        scratch, run_space = space
        scales_of(xr, jc, je, size, base, sr, mode, policy, pts, key, scratch)
        jw = jc
        if has_runs and size == vlen:
            jw = max(jc, min(je, whole))
            runs(xr, dr, sr, jc, jw, base, pts, key_lo, key_hi, run_space)
        length = xr.shape[0]
        for j in range(jw, je):
            l0 = np.uint64(j * size)
            l1 = np.uint64(min(j * size + size, length))
            block(xr, l0, l1, dr, l0, base + np.int64(l0), np.uint32(sr[j]), pts, key_lo, key_hi)

    @jit  # the kernel itself (or its one callee): inlining it as well cost a third more compile time
    def run(x, dst, scales, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = stream(key)
        length = x.shape[1]
        nb = scales.shape[1]
        whole = length // size  # blocks [0, whole) of a row are whole
        options = (size, whole, mode, policy, pts, key, key_lo, key_hi)
        space = (scale_scratch(), run_scratch(vlen))
        rotated = np.empty(length if rotate else 0, np.uint32)
        t64 = np.empty(16, np.float64)
        t = t0
        while t < t1:
            r = t // nb
            xr, dr = x[r], dst[r]  # one view per row, unsigned indices below
            if per_row:
                sr = scales[r]
            else:
                sr = scales[0]
            base = idx0 + r * length
            j0, j1 = t - r * nb, min(t1 - r * nb, nb)
            for jc in range(j0, j1, CHUNK):
                je = min(j1, jc + CHUNK)
                chunk(source_row(xr, jc, je, size, rotated, signs, t64), dr, sr, jc, je, base, options, space)
            t = (r + 1) * nb

    return run


def row_quantize(source: Source, el: Element, sc: Scale, pack: bool, vlen: int, rotate: bool = False) -> Any:
    """Row kernel ``(x, codes, scales, size, mode, policy, pts, key, idx0, signs, t0, t1)`` (``signs``:
    the rotation's, ``rotate``; else empty)."""
    read = source_of("float32") if rotate else source
    runs = run_elements(read, el, sc, vlen, pack, False) if vlen == RUN_BLOCK else None
    return _row_tasks(source, el, sc, vlen, _block_quantizer(read, el, sc, pack), runs, True, rotate)


def row_fake_quantize(source: Source, el: Element, sc: Scale, vlen: int, rotate: bool = False) -> Any:
    """Row kernel ``(x, out, size, mode, policy, pts, key, idx0, signs, t0, t1)`` (``signs``: the
    rotation's, ``rotate``, whose values stay rotated; else empty)."""
    read = source_of("float32") if rotate else source
    runs = run_elements(read, el, sc, vlen, False, True) if vlen == RUN_BLOCK else None
    run = _row_tasks(source, el, sc, vlen, _block_fake_quantizer(read, el, sc), runs, False, rotate)

    @jit
    def kernel(x, out, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover - compiled
        bytes_ = np.empty((1, (x.shape[1] + size - 1) // size), np.uint32)  # one row's scale bytes
        run(x, out, bytes_, size, mode, policy, pts, key, idx0, signs, t0, t1)

    return kernel


def row_dequantize(el: Element, sc: Scale, packed: bool, vlen: int) -> Any:
    """Row kernel ``(codes, scales, out, size, pts, t0, t1)``: runs of whole blocks of ``vlen``
    (the format's own length) by :func:`~.runs.run_dequantizer`, every other block one by one."""
    scaling = sc.scaling
    has_runs = vlen == RUN_BLOCK
    values = run_dequantizer(el, sc, vlen, packed)

    @jit
    def kernel(codes, scales, out, size, pts, t0, t1):  # pragma: no cover - compiled
        length = out.shape[1]
        nb = scales.shape[1]
        whole = length // size
        run_space = run_scratch(vlen)
        t = t0
        while t < t1:
            r = t // nb
            cr, sr, orow = codes[r], scales[r], out[r]
            j0, j1 = t - r * nb, min(t1 - r * nb, nb)
            for jc in range(j0, j1, CHUNK):
                je = min(j1, jc + CHUNK)
                jw = jc
                if has_runs and size == vlen:
                    jw = max(jc, min(je, whole))
                    values(cr, sr, orow, jc, jw, pts, run_space)
                for j in range(jw, je):
                    l0 = np.uint64(j * size)
                    l1 = np.uint64(min(j * size + size, length))
                    _, scale = multiplier(np.uint32(sr[j]), pts, sc, scaling)
                    if packed and (l0 & 1) == 0 and ((l1 - l0) & 1) == 0:
                        for k in range(l0 >> np.uint64(1), l1 >> np.uint64(1)):
                            pair = np.uint32(cr[k])
                            orow[k + k] = element_value(nibble(pair, 0), scale, el)
                            orow[k + k + np.uint64(1)] = element_value(nibble(pair, 1), scale, el)
                    elif packed:
                        for pos in range(l0, l1):
                            orow[pos] = element_value(nibble(cr[pos >> np.uint64(1)], pos & 1), scale, el)
                    else:
                        for pos in range(l0, l1):
                            orow[pos] = element_value(np.uint32(cr[pos]), scale, el)
            t = (r + 1) * nb

    return kernel
