"""4-bit codes two per byte, in numpy: element 2i in the low nibble, element 2i + 1 in the high
one, an odd tail padded with a zero nibble (the layout of packed FP4 codes; the kernels write it
with their own compiled helpers)."""

from __future__ import annotations

import numpy as np

__all__ = ["pack", "unpack"]


def pack(codes: np.ndarray, axis: int) -> np.ndarray:
    """4-bit codes (one per byte) two per byte along ``axis``: ``ceil(n / 2)`` bytes for ``n`` codes."""
    moved = np.moveaxis(codes, axis, -1)
    n = moved.shape[-1]
    out = np.zeros(moved.shape[:-1] + ((n + 1) // 2,), np.uint8)
    out[...] = moved[..., 0::2] & 0xF
    out[..., : n // 2] |= (moved[..., 1::2] & 0xF) << 4
    return np.moveaxis(out, -1, axis)


def unpack(packed: np.ndarray, n: int, axis: int) -> np.ndarray:
    """The inverse of :func:`pack`: one code per byte, ``n`` of them along ``axis`` (C-contiguous)."""
    moved = np.moveaxis(packed, axis, -1)
    out = np.empty(moved.shape[:-1] + (2 * moved.shape[-1],), np.uint8)
    out[..., 0::2] = moved & 0xF
    out[..., 1::2] = moved >> 4
    return np.ascontiguousarray(np.moveaxis(out[..., :n], -1, axis))
