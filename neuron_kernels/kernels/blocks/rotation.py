"""The random Hadamard rotation of 16-element groups (:func:`_rotate_group`), its kernels, and the
row kernels of the rotated input."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..._jit import f32_bits, f32_from_bits, jit, u32_and
from .. import codec as C
from ..codec import SOURCE_F32  # a bare name: numba prunes branches on it
from .elements import _code, _dequantized, _load, _nibble_pair, _scaled, _stream
from .rows import _row_amax, _row_scale
from .scales import _multiplier
from .spec import Element, Scale, Source, _flags, _vector_lengths, source_of


@jit(inline="always")
def _rotate_group(src_row, start, dst, off, signs, t, kind, codec, inverse):  # pragma: no cover - compiled
    """Rotate the 16 values ``src_row[start:start + 16]`` into the float32 patterns
    ``dst[off:off + 16]``: forward ``(x * signs) @ H16 / 4``, inverse ``(y @ H16 / 4) * signs``.

    In float64 (``t`` is scratch of 16): the signs multiply first (forward) and exactly; the fast
    Walsh-Hadamard butterfly runs in stages h = 1, 2, 4, 8, each pair (j, j + h) with
    ``j & h == 0`` in increasing j becoming (a + b, a - b); then each value is multiplied by 0.25
    (and by its sign, inverse) and rounded once to float32."""
    for k in range(16):
        v = np.float64(f32_from_bits(_load(src_row[start + k], kind, codec)))
        t[k] = v if inverse else v * signs[k]
    for stage in range(4):  # constant trip counts and no branches: straight-line code
        h = 1 << stage
        for pair in range(8):  # the pairs (j, j + h) with j & h == 0, in increasing j
            j = (pair >> stage << (stage + 1)) | (pair & (h - 1))
            a = t[j]
            b = t[j + h]
            t[j] = a + b
            t[j + h] = a - b
    for k in range(16):
        v = t[k] * 0.25
        dst[off + k] = f32_bits(np.float32(v * signs[k] if inverse else v))


@cache
def rotate_kernel(source: str) -> Any:
    """Kernel ``(x, out, signs, inverse, t0, t1)``: the rotation (or its inverse) of every
    16-element group of the rows of (A, L) ``x`` (L a multiple of 16) into the float32 patterns
    ``out`` (uint32, the same shape; it may be ``x`` itself for a float32 ``x``). A task is a group."""
    src = source_of(source)
    kind = src.kind

    @jit
    def kernel(x, out, signs, inverse, t0, t1):  # pragma: no cover - compiled
        t = np.empty(16, np.float64)
        ng = x.shape[1] // 16
        for task in range(t0, t1):
            r = task // ng
            g = (task - r * ng) * 16
            _rotate_group(x[r], g, out[r], g, signs, t, kind, src.codec, inverse)

    return kernel


@cache
def rotated_amax_kernel(source: str) -> Any:
    """Kernel ``(x, out, signs, chunk, t0, t1)``: ``out[task]`` = the largest finite |y| pattern of
    the rotation y of groups ``[task * chunk, (task + 1) * chunk)`` of (A, L) ``x``."""
    src = source_of(source)
    kind = src.kind

    @jit
    def kernel(x, out, signs, chunk, t0, t1):  # pragma: no cover - compiled
        t = np.empty(16, np.float64)
        buf = np.empty(16, np.uint32)
        ng = x.shape[1] // 16
        for task in range(t0, t1):
            m = np.uint32(0)
            for group in range(task * chunk, min(task * chunk + chunk, x.shape[0] * ng)):
                r = group // ng
                _rotate_group(x[r], (group - r * ng) * 16, buf, 0, signs, t, kind, src.codec, False)
                for k in range(16):
                    v = u32_and(buf[k], 0x7FFFFFFF)
                    m = v if (v > m) & (v < np.uint32(0x7F800000)) else m
            out[task] = m

    return kernel


def _row_quantize_rotated(source: Source, el: Element, sc: Scale, pack: bool) -> Any:
    """:func:`_row_quantize` of the rotated input (blocks and rows of a multiple of 16): each block
    is rotated into a scratch row first."""
    f32 = source_of("float32")
    stochastic = el.mode == C.STOCHASTIC
    V16, V32, V64 = _vector_lengths(f32)  # noqa: N806 - compile-time constants
    nan_code = el.nan_code
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)

    @jit
    def kernel(x, codes, scales, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = scales.shape[1]
        buf = np.empty(size, np.uint32)
        t64 = np.empty(16, np.float64)
        cands = np.empty(5, np.uint32)
        errs = np.empty(5, np.float64)
        rnd = np.uint32(0)
        rnd_hi = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, cr, sr = x[r], codes[r], scales[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = j * size
                n = min(size, length - l0)
                base = idx0 + r * length + l0
                for g in range(0, n, 16):
                    _rotate_group(xr, l0 + g, buf, g, signs, t64, kind, source.codec, False)
                amax = _row_amax(buf, np.uint64(0), np.uint64(n), SOURCE_F32, f32.codec, V16, V32, V64)
                byte = _row_scale(
                    buf, np.uint64(0), np.uint64(n), base, amax, mode, policy, pts, key, f32, el, sc, cands, errs
                )
                sr[j] = byte
                mul, _ = _multiplier(byte, pts, sc, e8m0)
                nan_block = amax >= np.uint32(0x7F800000)
                if pack:
                    for k in range(n // 2):
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + 2 * k)
                            rnd_hi = C.random_bits(key_lo, key_hi, base + 2 * k + 1)
                        lo = _code(_scaled(buf[2 * k], mul, e8m0), rnd, el, rmode, fixed)
                        hi = _code(_scaled(buf[2 * k + 1], mul, e8m0), rnd_hi, el, rmode, fixed)
                        cr[l0 // 2 + k] = nan_code if nan_block else _nibble_pair(lo, hi)
                else:
                    for i in range(n):
                        if stochastic:
                            rnd = C.random_bits(key_lo, key_hi, base + i)
                        code = _code(_scaled(buf[i], mul, e8m0), rnd, el, rmode, fixed)
                        cr[l0 + i] = nan_code if nan_block else code
            t = (r + 1) * nb

    return kernel


def _row_fake_quantize_rotated(source: Source, el: Element, sc: Scale) -> Any:
    """:func:`_row_fake_quantize` of the rotated input (values stay rotated)."""
    f32 = source_of("float32")
    stochastic = el.mode == C.STOCHASTIC
    V16, V32, V64 = _vector_lengths(f32)  # noqa: N806 - compile-time constants
    kind, rmode, fixed, e8m0 = _flags(source, el, sc)

    @jit
    def kernel(x, out, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = (length + size - 1) // size
        buf = np.empty(size, np.uint32)
        t64 = np.empty(16, np.float64)
        cands = np.empty(5, np.uint32)
        errs = np.empty(5, np.float64)
        rnd = np.uint32(0)
        t = t0
        while t < t1:
            r = t // nb
            xr, orow = x[r], out[r]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = j * size
                n = min(size, length - l0)
                base = idx0 + r * length + l0
                for g in range(0, n, 16):
                    _rotate_group(xr, l0 + g, buf, g, signs, t64, kind, source.codec, False)
                amax = _row_amax(buf, np.uint64(0), np.uint64(n), SOURCE_F32, f32.codec, V16, V32, V64)
                byte = _row_scale(
                    buf, np.uint64(0), np.uint64(n), base, amax, mode, policy, pts, key, f32, el, sc, cands, errs
                )
                mul, scale = _multiplier(byte, pts, sc, e8m0)
                for i in range(n):
                    if stochastic:
                        rnd = C.random_bits(key_lo, key_hi, base + i)
                    orow[l0 + i] = _dequantized(_scaled(buf[i], mul, e8m0), rnd, scale, el, rmode, fixed)
            t = (r + 1) * nb

    return kernel
