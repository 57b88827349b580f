"""Chunks of Dask arrays as the kernels need them.

- Block alignment (:func:`block_chunks`): along a block axis every chunk but the last must hold
  whole blocks (whole pairs of blocks where 4-bit codes of odd-length blocks share bytes), so that
  each chunk is quantised on its own and its codes and scales are those of the whole array;
  :func:`rechunk_for` rechunks an array whose chunks are not, never splitting a block.
- C-order offsets (:func:`contiguous_runs`): stochastic rounding draws an element's bits from its
  index in the whole array in C order. The elements of a chunk of a multi-dimensional array are
  not contiguous in that order: the chunk is cut into sub-arrays that are (``chunk[i0, ..., ik-1]``,
  each holding whole trailing axes), and each is processed with the index of its first element,
  as the pieces of a file are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import InvalidValueError

__all__ = ["aligned", "block_chunks", "rechunk_for", "contiguous_runs", "chunk_shape"]

Chunks = tuple[tuple[int, ...], ...]


def aligned(sizes: tuple[int, ...], unit: int) -> bool:
    """Whether every chunk size but the last is a multiple of ``unit``."""
    return all(c % unit == 0 for c in sizes[:-1])


def _regular(length: int, typical: int, unit: int) -> tuple[int, ...]:
    """Chunks of ``length`` of about ``typical`` elements, each a multiple of ``unit`` but the last."""
    step = max(unit, round(typical / unit) * unit)
    if length == 0:
        return (0,)
    return tuple(min(step, length - a) for a in range(0, length, step))


def block_chunks(chunks: Chunks, shape: tuple[int, ...], units: dict[int, int], whole: tuple[int, ...] = ()) -> Chunks:
    """``chunks`` with the axes of ``units`` (axis -> unit) made multiples of their unit, where they
    are not, at about their present size; the axes of ``whole`` in one chunk each."""
    out = list(chunks)
    for axis, unit in units.items():
        if not aligned(chunks[axis], unit):
            out[axis] = _regular(shape[axis], max(chunks[axis]), unit)
    for axis in whole:
        out[axis] = (shape[axis],)
    return tuple(out)


def rechunk_for(x: Any, units: dict[int, int], whole: tuple[int, ...] = ()) -> Any:
    """The Dask array ``x`` rechunked as :func:`block_chunks` says (``x`` itself if it already is)."""
    chunks = block_chunks(x.chunks, x.shape, units, whole)
    return x if chunks == x.chunks else x.rechunk(chunks)


def chunk_shape(chunks: Chunks, block_id: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of chunk ``block_id`` of an array with ``chunks``."""
    return tuple(c[i] for c, i in zip(chunks, block_id))


def contiguous_runs(
    shape: tuple[int, ...], location: list[tuple[int, int]], first: int | None = None
) -> Iterator[tuple[tuple[int, ...], int]]:
    """The sub-arrays of a chunk that are contiguous in the C order of the whole array: (index of the
    sub-array in the chunk, C-order index of its first element in the whole), in order.

    ``shape`` is the whole array's, ``location`` the chunk's ``[(start, stop), ...]`` per axis. A
    sub-array is ``chunk[i0, ..., ik-1]``, where every axis after ``k`` spans the whole array (one
    sub-array, ``()``, when the chunk is contiguous itself). ``first``: the sub-arrays must keep
    the axes from ``first`` on (the blocks' axes): a ValueError if the chunk does not allow it.
    """
    n = len(shape)
    partial = [j for j in range(n) if tuple(location[j]) != (0, shape[j])]
    k = partial[-1] if partial else 0
    if first is not None and k > first:
        raise InvalidValueError(
            f"chunks along axis {k} split the rows of the blocks of axis {first}"
        )  # pragma: no cover
    strides = [int(np.prod(shape[j + 1 :], dtype=np.int64)) for j in range(n)]
    base = sum(location[j][0] * strides[j] for j in range(n))
    extents = [location[j][1] - location[j][0] for j in range(k)]
    for idx in np.ndindex(*extents):
        yield tuple(int(i) for i in idx), base + sum(int(i) * strides[j] for j, i in enumerate(idx))
