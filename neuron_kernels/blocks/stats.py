"""Error statistics of a block quantisation: what users of a dequantisation simulation look at to
choose a format, a scale mode and a policy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError
from ..registry import block_kernels
from .array import BlockArray
from .inputs import input_array
from .layout import BlockLayout, Pieces
from .rotation import rotate_array

__all__ = ["QuantizationStats", "ErrorStats", "quantization_error", "row_sums", "by_rows"]


@dataclass(frozen=True)
class QuantizationStats:
    """What a quantisation did to an array, computed in float64 over the finite inputs of the
    blocks with a finite scale (a block holding a NaN or an infinity dequantises to NaN as a
    whole: its elements are left out).

    ``sqnr_db``: 10 log10(sum x^2 / sum (x - dq)^2) (inf when exact); ``mse``; ``max_abs_error``;
    ``max_rel_error`` (over non-zero inputs); ``saturated``: fraction of elements whose magnitude
    exceeded the largest element times their block's scale; ``flushed``: fraction of non-zero
    inputs that dequantise to zero.
    """

    sqnr_db: float
    mse: float
    max_abs_error: float
    max_rel_error: float
    saturated: float
    flushed: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class ErrorStats:
    """Running sums of :class:`QuantizationStats`, fed piece by piece (:meth:`add`), so that the
    statistics of an array of any size take memory for one piece only."""

    def __init__(self) -> None:
        self.count = 0
        self.signal = 0.0
        self.noise = 0.0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.saturated = 0
        self.flushed = 0
        self._buffers: dict[str, np.ndarray] = {}

    def _buffer(self, name: str, size: int, dtype: Any, fill: int | None = None) -> np.ndarray:
        """A 1-D array of ``size`` elements reused from piece to piece (fresh pages cost the
        operating system's zeroing on every piece otherwise)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < size or buf.dtype != np.dtype(dtype):
            buf = np.empty(max(size, 1 << 20), dtype) if fill is None else np.full(max(size, 1 << 20), fill, dtype)
            self._buffers[name] = buf
        return buf[:size]

    def add(self, x: np.ndarray, q: BlockArray) -> None:
        """Fold in ``x`` (float32/16/bfloat16/64, C-contiguous, of ``q``'s shape) and its
        quantisation ``q``. Blocks along the last axis (without a rotation) go through one
        compiled pass that dequantises on the way, row by row on every thread; other layouts in
        pieces of about a million elements (their float64 temporaries are ~60 bytes an element)."""
        if by_rows(q):
            self._add_rows(x, q)
            return
        if q.group_index is not None:  # act-order columns: a piece cut along them has no index of its own
            self._add(x, q)
            return
        pieces = Pieces(q.layout)
        flat = x.reshape(-1)
        codes, scales = q.codes.reshape(-1), q.scales.reshape(-1)
        for cut in pieces.cuts(1 << 20):
            start, stop, shape = pieces.values(cut)
            (c0, c1, cshape), (s0, s1, sshape) = pieces.codes(cut), pieces.scales(cut)
            lay = pieces.piece_layout(cut)
            part = BlockArray(
                codes[c0:c1].reshape(cshape),
                scales[s0:s1].reshape(sshape),
                BlockLayout(q.fmt, shape, lay.axis, q.block_size, q.block_rows, q.packed),
                per_tensor_scale=q.per_tensor_scale,
                rotation=q.rotation,
                zero_points=None if q.zero_points is None else q.zero_points.reshape(-1)[s0:s1].reshape(sshape),
            )
            self._add(flat[start:stop].reshape(shape), part)

    def _add_rows(self, x: np.ndarray, q: BlockArray) -> None:
        if x.size:
            self.add_row_sums(row_sums(x, q))

    def add_row_sums(self, sums: np.ndarray) -> None:
        """Fold in per-row sums (rows, N_SUMS) of the error kernels (:func:`row_sums`), in row order
        (the same sums in the same order give the same statistics, however the rows were computed)."""
        self._fold(
            int(sums[:, 0].sum()),
            float(np.add.reduce(sums[:, 1])),
            float(np.add.reduce(sums[:, 2])),
            float(sums[:, 3].max(initial=0.0)),
            float(sums[:, 4].max(initial=0.0)),
            int(sums[:, 5].sum()),
            int(sums[:, 6].sum()),
        )

    def totals(self) -> np.ndarray:
        """(count, signal, noise, max_abs, max_rel, saturated, flushed) as float64."""
        return np.array(
            [self.count, self.signal, self.noise, self.max_abs, self.max_rel, self.saturated, self.flushed], np.float64
        )

    def add_totals(self, totals: np.ndarray) -> None:
        """Fold in the :meth:`totals` of another accumulator."""
        c, sig, noise, max_abs, max_rel, sat, fl = (float(v) for v in totals)
        self._fold(int(c), sig, noise, max_abs, max_rel, int(sat), int(fl))

    def _fold(self, count: int, signal: float, noise: float, max_abs: float, max_rel: float, sat: int, fl: int) -> None:
        self.count += count
        self.signal += signal
        self.noise += noise
        self.max_abs = max(self.max_abs, max_abs)
        self.max_rel = max(self.max_rel, max_rel)
        self.saturated += sat
        self.flushed += fl

    def _add(self, x: np.ndarray, q: BlockArray) -> None:
        if x.size == 0:
            return
        xv = self._buffer("x", x.size, np.float64)
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a NaN, flagging "invalid"
            np.copyto(xv, x.reshape(-1), casting="unsafe")  # exact: every input dtype widens exactly
        rotated = q.rotation is not None
        dq = q.dequantize(np.float32, unrotate=rotated, out=self._buffer("dq", x.size, np.float32).reshape(x.shape))
        dq = dq.reshape(-1)
        lim = self._largest(q, x.shape)
        xs = rotate_array(x, input_array(x)[1].name, q.axis, q.rotation or ()).reshape(-1) if rotated else xv
        self._fold(*block_kernels().error_fold(xv, dq, xs, lim))

    def _largest(self, q: BlockArray, shape: tuple[int, ...]) -> np.ndarray:
        """The largest magnitude each element's block holds: the largest element code dequantised
        with its scale (integers: the larger of the lowest and highest code's, zero points taken
        in), to compare with the values as quantised (rotated, with a rotation)."""
        element = q.format.element_format
        tops = [element.max_code] if not q.format.integer else [int(element.max), int(element.lowest)]
        lim: np.ndarray | None = None
        for i, top in enumerate(tops):
            top &= (1 << element.bits) - 1
            code = top | top << 4 if q.packed else top
            full = self._buffer(f"full{code}", q.codes.size, np.uint8, code)
            values = q.with_codes(full.reshape(q.codes.shape)).dequantize(
                np.float32, out=self._buffer(f"lim{i}", q.size, np.float32).reshape(shape)
            )
            values = np.abs(values, out=values).reshape(-1)
            lim = values if lim is None else np.maximum(lim, values, out=lim)  # type: ignore[assignment, unused-ignore]
        assert lim is not None
        return lim

    def result(self) -> QuantizationStats:
        n = max(self.count, 1)
        if self.noise == 0:
            sqnr = float("inf")
        else:
            # a difference of logarithms: the ratio of sums of squares can leave float64's range
            # (an infinite error where a dequantised value overflows float32 gives -inf)
            sqnr = 10 * (math.log10(self.signal) - math.log10(self.noise)) if self.signal > 0 else float("-inf")
        return QuantizationStats(
            sqnr_db=sqnr,
            mse=self.noise / n,
            max_abs_error=self.max_abs,
            max_rel_error=self.max_rel,
            saturated=self.saturated / n,
            flushed=self.flushed / n,
        )


def row_sums(x: np.ndarray, q: BlockArray) -> np.ndarray:
    """Per-row error sums (rows, N_SUMS) of ``x`` (C-contiguous) and ``q``, blocked along the last
    axis without a rotation: one compiled pass per row that dequantises on the way, rows on every
    thread."""
    sums: np.ndarray = block_kernels().row_error_sums(x, input_array(x)[1].name, q)
    return sums


def by_rows(q: Any) -> bool:
    """Whether the statistics of ``q`` (a block array, in memory or lazy) are folded from per-row
    sums (:func:`row_sums`): blocks along the last axis, no rotation, float elements."""
    return q.layout.kernel_shapes().row and q.rotation is None and not q.format.integer


def quantization_error(x: Any, q: BlockArray) -> QuantizationStats:
    """Error statistics of ``q`` as a quantisation of ``x`` (see :class:`QuantizationStats`).

    For an array quantised with a rotation (``rht=``), ``x`` is compared with the dequantised
    values rotated back (the error of the whole round trip)."""
    if not isinstance(q, BlockArray):
        raise InvalidTypeError(f"quantization_error takes a BlockArray (a block-format array), got {type(q).__name__}")
    arr, _ = input_array(x)
    if arr.shape != q.shape:
        raise InvalidValueError(f"x has shape {arr.shape} but the block array has shape {q.shape}")
    stats = ErrorStats()
    stats.add(arr, q)
    return stats.result()
