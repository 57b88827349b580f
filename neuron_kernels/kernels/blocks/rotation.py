"""The random Hadamard rotation of 16-element groups (:func:`_rotate_group`), its kernels, and the
row kernels of the rotated input, which rotate each block into a scratch row and run the row
kernels' own per-block code on it."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..._jit import f32_bits, f32_from_bits, jit, u32_and
from .elements import _load, _stream
from .rows import _block_fake_quantizer, _block_quantizer, _policy_scratch, _row_scaler
from .spec import Element, Scale, Source, _vector_lengths, source_of


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


def _rotated_tasks(source: Source, el: Element, sc: Scale, block: Any, per_row: bool) -> Any:
    """The task loop of a row kernel of the rotated input (blocks and rows of a multiple of 16),
    ``run(x, dst, scales, size, mode, policy, pts, key, idx0, signs, t0, t1)``: each block is
    rotated into a scratch row first, which the row kernels' own scale loop (:func:`~.rows._row_scaler`)
    and ``block`` (:func:`~.rows._block_quantizer`, :func:`~.rows._block_fake_quantizer`) then
    take as a row of one block of float32 patterns (its amax one vector reduction for 16, 32 or
    64 elements); scale bytes into ``scales[r]`` (``per_row``) or the scratch row ``scales[0]``
    (as :func:`~.rows._row_tasks`)."""
    f32 = source_of("float32")
    kind = source.kind
    scales_of = _row_scaler(f32, el, sc, _vector_lengths(f32))

    @jit
    def run(x, dst, scales, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover - compiled
        key_lo, key_hi = _stream(key)
        length = x.shape[1]
        nb = scales.shape[1]
        buf = np.empty(size, np.uint32)
        t64 = np.empty(16, np.float64)
        byte = np.empty(1, np.uint32)
        scratch = _policy_scratch()
        t = t0
        while t < t1:
            r = t // nb
            xr, dr = x[r], dst[r]
            if per_row:
                sr = scales[r]
            else:
                sr = scales[0]
            for j in range(t - r * nb, min(t1 - r * nb, nb)):
                l0 = j * size
                n = min(size, length - l0)
                base = idx0 + r * length + l0
                for g in range(0, n, 16):
                    _rotate_group(xr, l0 + g, buf, g, signs, t64, kind, source.codec, False)
                scales_of(buf, np.int64(0), np.int64(1), n, base, byte, mode, policy, pts, key, scratch)
                sr[j] = byte[0]
                block(buf, np.uint64(0), np.uint64(n), dr, np.uint64(l0), base, byte[0], pts, key_lo, key_hi)
            t = (r + 1) * nb

    return run


def _row_quantize_rotated(source: Source, el: Element, sc: Scale, pack: bool) -> Any:
    """:func:`~.rows._row_quantize` of the rotated input (see :func:`_rotated_tasks`)."""
    run = _rotated_tasks(source, el, sc, _block_quantizer(source_of("float32"), el, sc, pack), True)

    @jit
    def kernel(x, codes, scales, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover
        run(x, codes, scales, size, mode, policy, pts, key, idx0, signs, t0, t1)

    return kernel


def _row_fake_quantize_rotated(source: Source, el: Element, sc: Scale) -> Any:
    """:func:`~.rows._row_fake_quantize` of the rotated input (values stay rotated)."""
    run = _rotated_tasks(source, el, sc, _block_fake_quantizer(source_of("float32"), el, sc), False)

    @jit
    def kernel(x, out, size, mode, policy, pts, key, idx0, signs, t0, t1):  # pragma: no cover - compiled
        bytes_ = np.empty((1, (x.shape[1] + size - 1) // size), np.uint32)  # one row's scale bytes
        run(x, out, bytes_, size, mode, policy, pts, key, idx0, signs, t0, t1)

    return kernel
