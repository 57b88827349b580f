"""4-bit codes two per byte, compiled: element 2k in the low nibble, element 2k + 1 in the high
one (the layout of packed FP4 codes; :mod:`neuron_kernels.blocks.nibbles` is the same in numpy)."""

from __future__ import annotations

from .._jit import jit, u32_and, u32_or, u32_shl, u32_shr

__all__ = ["nibble_pair", "nibble", "put_nibble", "pack_nibbles", "unpack_nibbles"]


@jit(inline="always")
def nibble_pair(lo, hi):  # pragma: no cover - compiled
    """The byte of two 4-bit codes: ``lo`` in the low nibble, ``hi`` in the high one."""
    return u32_or(u32_and(lo, 0xF), u32_shl(u32_and(hi, 0xF), 4))


@jit(inline="always")
def nibble(byte, high):  # pragma: no cover - compiled
    """The 4-bit code in the low (``high`` 0) or the high (``high`` 1) nibble of ``byte``."""
    return u32_and(u32_shr(byte, 4 * high), 0xF)


@jit(inline="always")
def put_nibble(codes, k, code, high):  # pragma: no cover - compiled
    """Store the 4-bit code ``code`` into ``codes[k]`` (``k`` an index or a tuple of them): in the
    low nibble, clearing the high one (``high`` 0), or in the high nibble, keeping the low one
    (``high`` 1): the element of the low nibble is written first."""
    if high:
        codes[k] = u32_or(codes[k], u32_shl(u32_and(code, 0xF), 4))
    else:
        codes[k] = u32_and(code, 0xF)


@jit
def pack_nibbles(src, dst, key, start):  # pragma: no cover - compiled
    """4-bit codes (one per byte) to bytes of two; bits kept as they are (the kernel signature of
    the casts: ``key`` and ``start`` unused)."""
    for k in range(dst.size):
        dst[k] = nibble_pair(src[2 * k], src[2 * k + 1])


@jit
def unpack_nibbles(src, dst, key, start):  # pragma: no cover - compiled
    """The inverse of :func:`pack_nibbles`."""
    for k in range(src.size):
        dst[2 * k] = nibble(src[k], 0)
        dst[2 * k + 1] = nibble(src[k], 1)
