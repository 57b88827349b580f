"""Where a block-format array's codes and scales live: its layout, and how to cut it into pieces.

A layout is a block format, the array's shape and its blocks: 1-D blocks of ``block_size``
along ``axis``, or 2-D tiles of ``block_rows x block_size`` over the last two axes (then
``axis`` is the last one). Codes have the array's shape, except that 4-bit codes stored two per
byte (``packed``) halve the block axis (rounded up; element 2i in the low nibble); scales have
the array's shape with each blocked axis replaced by its number of blocks.

Kernels see an array as 3-D: (outer, length, inner) with 1-D blocks along ``length``, or (A, R,
C) with tiles over (R, C). :class:`Pieces` cuts an array into pieces that are each contiguous
in the values, the codes and the scales, so that arrays of any size are processed in bounded
memory.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..formats import BLOCK_FORMATS, BlockFormat

__all__ = ["BlockLayout", "KernelShapes", "Pieces", "Cut", "geometry", "count"]

#: The longest row the quantising row kernels see (see BlockLayout.kernel_shapes): 256 KiB of
#: float32, which a core's cache holds between a row's scale loop and its element loop (measured
#: at 64 Mi elements: a 1-D array to MXFP8 29.7 -> 27.3 ms, fake-quantised 33.2 -> 29.2 ms).
ROW_ELEMENTS = 1 << 16

#: A piece: outer rows ``[r0, r1)`` and the range ``[l0, l1)`` of the block axis (see Pieces).
Cut = tuple[int, int, int, int]


def count(dims: Any) -> int:
    """The number of elements of an array of the dimensions ``dims`` (Python ints; 1 for none)."""
    return math.prod(map(int, dims))


def geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, length, inner): the array seen as (A, L, B) with blocks along L."""
    outer = count(shape[:axis])
    inner = count(shape[axis + 1 :])
    return outer, shape[axis], inner


class KernelShapes(NamedTuple):
    """How the kernels see a block array (:meth:`BlockLayout.kernel_shapes`): ``row`` (a row kernel,
    2-D (A, L) arrays; else a tile kernel, 3-D arrays), the values', codes' and scales' shapes, and
    the number of tasks (rows of blocks, or tiles) the work is split into."""

    row: bool
    values: tuple[int, ...]
    codes: tuple[int, ...]
    scales: tuple[int, ...]
    tasks: int


@dataclass(frozen=True)
class BlockLayout:
    """The shape of a block-format array's codes and scales (see the module docstring)."""

    fmt: str
    shape: tuple[int, ...]
    axis: int
    block_size: int
    block_rows: int = 1
    packed: bool = False

    @property
    def format(self) -> BlockFormat:
        return BLOCK_FORMATS[self.fmt]

    @property
    def two_d(self) -> bool:
        """Whether blocks are tiles over the last two axes (``block_rows > 1``)."""
        return self.block_rows > 1

    @property
    def block_shape(self) -> tuple[int, ...]:
        return (self.block_rows, self.block_size) if self.two_d else (self.block_size,)

    @property
    def codes_shape(self) -> tuple[int, ...]:
        codes = list(self.shape)
        if self.packed:
            codes[self.axis] = (self.shape[self.axis] + 1) // 2
        return tuple(codes)

    @property
    def scales_shape(self) -> tuple[int, ...]:
        scales = list(self.shape)
        scales[self.axis] = -(-self.shape[self.axis] // self.block_size)
        if self.two_d:
            scales[-2] = -(-self.shape[-2] // self.block_rows)
        return tuple(scales)

    @property
    def size(self) -> int:
        return count(self.shape)

    def _row_split(self, length: int) -> int:
        """How many rows a row of ``length`` elements is seen as by the quantising row kernels:
        rows of up to :data:`ROW_ELEMENTS` whole blocks (and whole bytes of packed codes), so that
        a row's scale loop leaves its elements in cache for its element loop. 1 where no such
        length divides the row."""
        unit = self.block_size * (2 if self.packed and self.block_size % 2 else 1)
        if length < 2 * ROW_ELEMENTS or length % unit:
            return 1
        seg = unit << max(0, (ROW_ELEMENTS // unit).bit_length() - 1)
        while seg * 4 >= ROW_ELEMENTS:
            if length % seg == 0:
                return length // seg
            seg //= 2
        return 1

    def kernel_shapes(self, split_rows: bool = False) -> KernelShapes:
        """:func:`_kernel_shapes` of this layout (made once per layout)."""
        try:
            return _kernel_shapes(self, split_rows)
        except TypeError:  # fields that are not hashable values (a layout not yet checked)
            return _kernel_shapes.__wrapped__(self, split_rows)

    def _shapes(self, split_rows: bool) -> KernelShapes:
        """The shapes the kernels see the values, codes and scales as, and the tasks (see :class:`KernelShapes`).

        Row kernels see 2-D (A, L) arrays (1-D blocks along the last axis); tile kernels 3-D
        (A, R, C) arrays: 1-D blocks along another axis are tiles (block_size, 1) of (outer,
        length, inner), 2-D blocks tiles (block_rows, block_size) of (rest, R, C). With
        ``split_rows``, long rows are seen as several (see :meth:`_row_split`): the same blocks,
        elements, codes and scales in the same memory.
        """
        codes_len = self.codes_shape[self.axis]
        nb = self.scales_shape[self.axis]
        if self.two_d:
            a = count(self.shape[:-2])
            r, c = self.shape[-2], self.shape[-1]
            nrt = self.scales_shape[-2]
            return KernelShapes(False, (a, r, c), (a, r, codes_len), (a, nrt, nb), a * nrt)
        outer, length, inner = geometry(self.shape, self.axis)
        if inner == 1:
            k = self._row_split(length) if split_rows else 1
            return KernelShapes(
                True, (outer * k, length // k), (outer * k, codes_len // k), (outer * k, nb // k), outer * nb
            )
        return KernelShapes(False, (outer, length, inner), (outer, codes_len, inner), (outer, nb, inner), outer * nb)

    def normalised(self) -> BlockLayout:
        """The same layout with its fields as Python's own types (a file's numbers are read as numpy's)."""
        return BlockLayout(
            str(self.fmt),
            tuple(int(n) for n in self.shape),
            int(self.axis),
            int(self.block_size),
            int(self.block_rows),
            bool(self.packed),
        )

    def tile(self) -> tuple[int, int]:
        """(rows, cols) of a tile as the tile kernels see it."""
        return (self.block_rows, self.block_size) if self.two_d else (self.block_size, 1)

    def problem(self, codes: tuple[tuple[int, ...], Any], scales: tuple[tuple[int, ...], Any]) -> str | None:
        """What is inconsistent in this layout's fields and the given codes/scales (shape, dtype), or None."""
        fmt, shape, axis, size, rows, packed = (
            self.fmt,
            self.shape,
            self.axis,
            self.block_size,
            self.block_rows,
            self.packed,
        )
        if not isinstance(fmt, str) or fmt not in BLOCK_FORMATS:
            return f"unknown block format {fmt!r}; accepted: {', '.join(BLOCK_FORMATS)}"
        for name, value in (("block_size", size), ("block_rows", rows)):
            if isinstance(value, bool) or not (isinstance(value, numbers.Integral) and value >= 1):
                return f"invalid {name} {value!r}"
        if not (
            isinstance(shape, tuple)
            and shape
            and all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in shape)
        ):
            return f"invalid shape {shape!r}"
        if isinstance(axis, bool) or not (isinstance(axis, numbers.Integral) and 0 <= axis < len(shape)):
            return f"invalid axis {axis!r} for shape {shape}"
        if rows > 1 and (len(shape) < 2 or axis != len(shape) - 1):
            return f"2-D blocks ({rows} x {size}) need 2 or more axes, blocked along the last; got axis {axis}"
        if not isinstance(packed, bool) or (packed and not BLOCK_FORMATS[fmt].packable):
            return f"invalid packed flag {packed!r} for {fmt}"
        if np.dtype(codes[1]) != np.uint8 or tuple(codes[0]) != self.codes_shape:
            return f"codes must be uint8 of shape {self.codes_shape}"
        bf = self.format
        if bf.float_scales:
            if np.dtype(scales[1]).name not in bf.scale_dtypes or tuple(scales[0]) != self.scales_shape:
                return f"scales must be floats ({', '.join(bf.scale_dtypes)}) of shape {self.scales_shape}"
        elif (
            np.dtype(scales[1]).itemsize != 1
            or np.dtype(scales[1]).kind not in "uVf"
            or tuple(scales[0]) != (self.scales_shape)
        ):
            kind = "e8m0" if bf.is_mx else bf.scale
            return f"scales must be {kind} bytes of shape {self.scales_shape}"
        return None


@functools.lru_cache(maxsize=1024)
def _kernel_shapes(layout: BlockLayout, split_rows: bool) -> KernelShapes:
    return layout._shapes(split_rows)


@dataclass(frozen=True)
class Pieces:
    """How to cut an array of a layout into pieces that are each contiguous in the values, the
    codes and the scales.

    1-D blocks: the array is seen as (outer, length, inner) with blocks along ``length``; a piece
    is rows ``[r0, r1)`` of ``outer`` whole, or, when one row exceeds the budget, the range
    ``[l0, l1)`` of the block axis within one row, cut on whole blocks (and on an even element
    where FP4 codes pack two per byte). 2-D blocks: the array is seen as (A, R, C); a piece is
    whole matrices ``[a0, a1)`` of A, or, when one exceeds the budget, rows ``[r0, r1)`` of one
    matrix cut on whole tile rows (then ``r0``, ``r1`` count rows of the flattened (A * R)). Each
    piece is quantised as an array of its own (:meth:`piece_layout`), and its codes and scales are
    the matching C-order ranges of the whole array's.
    """

    layout: BlockLayout

    def _shape3(self) -> tuple[int, int, int]:
        """(outer, length, inner) of 1-D blocks; (A, R, C) of 2-D ones."""
        if self.layout.two_d:
            shape = self.layout.shape
            return count(shape[:-2]), shape[-2], shape[-1]
        return geometry(self.layout.shape, self.layout.axis)

    def _rows(self) -> tuple[int, int]:
        """(length, inner) of the rows that cuts count: (L, B) of 1-D blocks, (C, 1) of 2-D ones."""
        if self.layout.two_d:
            return self.layout.shape[-1], 1
        _, length, inner = self._shape3()
        return length, inner

    def cuts(self, budget: int) -> list[Cut]:
        """Pieces ``(r0, r1, l0, l1)`` of at most ``budget`` elements where possible (a piece is at
        least one block times ``inner``, or one row of tiles)."""
        lay = self.layout
        if lay.two_d:
            a, rows, width = self._shape3()
            matrix = rows * width
            if a == 0 or matrix == 0:
                return [(0, a * rows, 0, width)]
            if matrix <= budget:
                step = max(1, budget // matrix)
                return [(k * rows, min(k + step, a) * rows, 0, width) for k in range(0, a, step)]
            tile_rows = max(lay.block_rows, (budget // width) // lay.block_rows * lay.block_rows)
            return [
                (k * rows + r, k * rows + min(r + tile_rows, rows), 0, width)
                for k in range(a)
                for r in range(0, rows, tile_rows)
            ]
        outer, length, inner = self._shape3()
        row = length * inner
        if outer == 0 or row == 0:
            return [(0, outer, 0, length)]
        if row <= budget:
            rows = max(1, budget // row)
            return [(r, min(r + rows, outer), 0, length) for r in range(0, outer, rows)]
        align = lay.block_size * (2 if lay.packed and lay.block_size % 2 else 1)
        step = max(align, (budget // inner) // align * align)
        return [(r, r + 1, lo, min(lo + step, length)) for r in range(outer) for lo in range(0, length, step)]

    def piece_layout(self, cut: Cut) -> BlockLayout:
        """The layout of a piece as an array of its own: (rows, length, inner) blocked along axis
        1, or (matrices, rows, C) with the same tiles."""
        lay = self.layout
        r0, r1, l0, l1 = cut
        if lay.two_d:
            _, rows, width = self._shape3()
            whole = rows > 0 and r0 % rows == 0 and (r1 - r0) % rows == 0  # no rows: one empty piece
            shape = ((r1 - r0) // rows, rows, width) if whole else (1, r1 - r0, width)
            return BlockLayout(lay.fmt, shape, 2, lay.block_size, lay.block_rows, lay.packed)
        _, _, inner = self._shape3()
        return BlockLayout(lay.fmt, (r1 - r0, l1 - l0, inner), 1, lay.block_size, 1, lay.packed)

    def values(self, cut: Cut) -> tuple[int, int, tuple[int, ...]]:
        """(start, stop, shape): the piece's flat range in the array and its shape."""
        r0, r1, l0, l1 = cut
        length, inner = self._rows()
        start = (r0 * length + l0) * inner
        shape = self.piece_layout(cut).shape
        return start, start + count(shape), shape

    def codes(self, cut: Cut) -> tuple[int, int, tuple[int, ...]]:
        """(start, stop, shape) of the piece in the codes."""
        lay = self.layout
        r0, _, l0, _ = cut
        _, inner = self._rows()
        piece = self.piece_layout(cut)
        width = lay.codes_shape[lay.axis]
        lo = l0 // 2 if lay.packed else l0
        start = (r0 * width + lo) * inner
        return start, start + count(piece.codes_shape), piece.codes_shape

    def scales(self, cut: Cut) -> tuple[int, int, tuple[int, ...]]:
        """(start, stop, shape) of the piece in the scales."""
        lay = self.layout
        r0, _, l0, _ = cut
        _, rows, inner = self._shape3()
        piece = self.piece_layout(cut)
        nb = lay.scales_shape[lay.axis]
        if lay.two_d:
            nrt, rows = lay.scales_shape[-2], lay.shape[-2]
            matrix, row = divmod(r0, rows) if rows else (0, 0)  # no rows: one empty piece at 0
            start = (matrix * nrt + row // lay.block_rows) * nb
        else:
            start = (r0 * nb + l0 // lay.block_size) * inner
        return start, start + count(piece.scales_shape), piece.scales_shape
