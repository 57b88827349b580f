"""Block formats on Dask arrays: quantise, fake-quantise, dequantise and error statistics, lazily.

Chunks along the block axis must hold whole blocks (and whole pairs of blocks where 4-bit codes of
odd-length blocks share bytes; along the second-last axis whole tile rows of 2-D tiles): an array
whose chunks do not is rechunked (:func:`~.chunks.rechunk_for`), never cut inside a block. Each
chunk is then quantised on its own, and its codes and scales are the matching chunks of the whole
array's. With stochastic rounding the axes after the blocks' are rechunked whole, and each chunk
is quantised in sub-arrays contiguous in the whole array, each with the C-order index of its first
element, so the random bits are those of the in-memory call. NVFP4's per-tensor scale from the
amax is a Dask reduction computed first (one read of the input); one more pass quantises.

:class:`LazyBlockArray` holds the codes and scales as Dask arrays; ``compute()`` gives the
:class:`~neuron_kernels.blocks.array.BlockArray` the in-memory functions give, bit for bit.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..blocks.array import BlockArray, BlockFields
from ..blocks.inputs import INPUT_DTYPES, input_format
from ..blocks.job import BlockJob, input_array
from ..blocks.layout import BlockLayout, Pieces
from ..blocks.rotation import check_length
from ..blocks.stats import ErrorStats, QuantizationStats, by_rows, row_sums
from ..dtypes import get_format
from ..errors import InvalidTypeError, InvalidValueError
from ..formats import BlockFormat, Format
from . import require
from .chunks import Chunks, block_chunks, chunk_shape, contiguous_runs, rechunk_for

__all__ = [
    "LazyBlockArray",
    "quantize_lazy",
    "fake_quantize_lazy",
    "quantization_error_lazy",
    "lazy_block_array",
    "as_dask",
]

da = require("dask.array", "a Dask array")
dask = require("dask", "a Dask array")


def as_dask(x: Any, what: str) -> Any:
    """``x`` if it is a Dask array; a TypeError naming what is accepted otherwise."""
    if not isinstance(x, da.Array):
        raise InvalidTypeError(
            f"{what} takes NumPy or Dask arrays; got a {type(x).__name__} (pass x.data or np.asarray(x))"
        )
    return x


def _source(x: Any) -> Format:
    return input_format(x.dtype)


def _first_axis(job: BlockJob, ndim: int) -> int:
    """The first axis a block spans: the block axis, or the second-last for 2-D tiles."""
    return ndim - 2 if job.block_rows > 1 else job.axis


def _aligned(x: Any, job: BlockJob) -> Any:
    """``x`` rechunked to whole blocks (see the module docstring)."""
    unit = job.block_size * (2 if job.pack and job.fmt.packable and job.block_size % 2 else 1)
    units = {job.axis: unit}
    if job.block_rows > 1:
        units[x.ndim - 2] = job.block_rows
    whole: tuple[int, ...] = ()
    if job.rounding == "stochastic":  # sub-arrays contiguous in the whole must hold whole blocks
        whole = tuple(range(_first_axis(job, x.ndim) + 1, x.ndim))
        if job.block_rows > 1:
            whole = (x.ndim - 1,)
    return rechunk_for(x, units, whole)


def _chunks_of(chunks: Chunks, lay: BlockLayout) -> tuple[Chunks, Chunks]:
    """The chunks of the codes and of the scales of values with ``chunks``."""
    codes, scales = list(chunks), list(chunks)
    axis = lay.axis
    if lay.packed:
        codes[axis] = tuple((c + 1) // 2 for c in chunks[axis])
    scales[axis] = tuple(-(-c // lay.block_size) for c in chunks[axis])
    if lay.two_d:
        scales[-2] = tuple(-(-c // lay.block_rows) for c in chunks[-2])
    return tuple(codes), tuple(scales)


def _quantize_block(
    block: np.ndarray, job: BlockJob, source: str, shape: tuple[int, ...], block_info: Any = None
) -> Any:
    """(codes, scale bytes, zero points) of one chunk (a task's result; the arrays are taken apart
    after; the zero points of the integer formats that have them, else an empty array)."""
    arr, _ = input_array(block)
    src = get_format(source)
    if job.rounding != "stochastic":
        q = job.quantize(arr, src)
        zeros = q.zero_points if q.zero_points is not None else np.empty(0, np.int8)
        return q.codes, _raw_scales(q.scales, job.fmt), zeros
    lay = job.layout(arr.shape)
    codes, scales = np.empty(lay.codes_shape, np.uint8), np.empty(lay.scales_shape, _raw_dtype(job.fmt))
    for idx, start in contiguous_runs(shape, block_info[0]["array-location"], _first_axis(job, len(shape))):
        q = replace(job, axis=job.axis - len(idx)).quantize(arr[idx], src, idx0=start)
        codes[idx], scales[idx] = q.codes, _raw_scales(q.scales, job.fmt)
    return codes, scales, np.empty(0, np.int8)  # stochastic rounding: no integer format


def _raw_dtype(fmt: BlockFormat) -> np.dtype:
    """The dtype the tasks hand scales over in: bytes (uint8), or float scales as they are stored."""
    return fmt.scale_format.result_dtype if fmt.float_scales else np.dtype(np.uint8)


def _raw_scales(scales: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    return scales if fmt.float_scales else scales.view(np.uint8)


def _fake_block(block: np.ndarray, job: BlockJob, source: str, shape: tuple[int, ...], block_info: Any = None) -> Any:
    arr, _ = input_array(block)
    src = get_format(source)
    out = np.empty(arr.shape, np.float32)
    if job.rounding != "stochastic":
        job.fake_quantize(arr, src, out)
        return out
    for idx, start in contiguous_runs(shape, block_info[0]["array-location"], _first_axis(job, len(shape))):
        replace(job, axis=job.axis - len(idx)).fake_quantize(arr[idx], src, out[idx], idx0=start)
    return out


def _amax_block(block: np.ndarray, job: BlockJob, source: str) -> np.ndarray:
    arr, _ = input_array(block)
    return np.full((1,) * arr.ndim, job.amax(arr, get_format(source)) if arr.size else 0.0, np.float64)


def _resolved(x: Any, job: BlockJob, src: Format) -> BlockJob:
    """``job`` with its per-tensor scale from the amax of ``x`` (computed now), if it needs one."""
    if not job.needs_amax:
        return job
    amaxes = x.map_blocks(
        _amax_block,
        job,
        src.name,
        chunks=tuple((1,) * len(c) for c in x.chunks),
        dtype=np.float64,
        meta=np.empty((0,) * x.ndim, np.float64),
    )
    return job.with_amax(float(amaxes.max().compute()))


def _prepared(x: Any, job: BlockJob) -> tuple[Any, BlockJob, Format]:
    src = _source(x)
    if x.ndim == 0:
        raise InvalidValueError("cannot quantise a 0-d array: blocks run along an axis")
    if job.rotation is not None:  # refused here, not in a task
        check_length(x.shape[job.axis], job.axis)
    x = _aligned(x, job)
    return x, _resolved(x, job, src), src


def quantize_lazy(x: Any, job: BlockJob) -> LazyBlockArray:
    """:meth:`BlockJob.quantize` of the Dask array ``x``, lazily (the amax, if the job needs it, now)."""
    x, job, src = _prepared(as_dask(x, "block quantisation"), job)
    lay = job.layout(x.shape)
    codes_chunks, scales_chunks = _chunks_of(x.chunks, lay)
    parts = x.map_blocks(_quantize_block, job, src.name, x.shape, dtype=object, meta=np.empty((0,) * x.ndim, object))
    meta = np.empty((0,) * x.ndim, np.uint8)
    codes = parts.map_blocks(operator.itemgetter(0), chunks=codes_chunks, dtype=np.uint8, meta=meta)
    raw = _raw_dtype(job.fmt)
    scales = parts.map_blocks(
        operator.itemgetter(1), chunks=scales_chunks, dtype=raw, meta=np.empty((0,) * x.ndim, raw)
    )
    zeros = None
    if job.fmt.zero_points:
        zeros = parts.map_blocks(
            operator.itemgetter(2), chunks=scales_chunks, dtype=np.int8, meta=np.empty((0,) * x.ndim, np.int8)
        )
    size = x.shape[job.axis]
    layout = BlockLayout(
        job.fmt.name,
        tuple(x.shape),
        job.axis,
        min(job.block_size, size) if x.size else job.block_size,
        min(job.block_rows, x.shape[-2]) if x.size and job.block_rows > 1 else job.block_rows,
        job.pack,
    )
    pts = job.per_tensor_scale if not isinstance(job.per_tensor_scale, str) else None
    return LazyBlockArray(codes, scales, layout, pts, job.rotation, x.chunks, zeros)


def fake_quantize_lazy(x: Any, job: BlockJob) -> Any:
    """:meth:`BlockJob.fake_quantize` of the Dask array ``x``: a lazy float32 Dask array."""
    x, job, src = _prepared(as_dask(x, "block quantisation"), job)
    return x.map_blocks(_fake_block, job, src.name, x.shape, dtype=np.float32, meta=np.empty((0,) * x.ndim, np.float32))


def _part(
    q: LazyBlockArray, codes: np.ndarray, scales: np.ndarray, shape: tuple[int, ...], zeros: Any = None
) -> BlockArray:
    """The block array of one chunk of ``q`` (``zeros``: its zero points, for the formats with them)."""
    return BlockArray(
        np.ascontiguousarray(codes),
        np.ascontiguousarray(scales)
        if q.format.float_scales
        else np.ascontiguousarray(scales).view(np.uint8).view(q.format.scale_format.dtype),
        replace(q.layout, shape=shape),
        per_tensor_scale=q.per_tensor_scale,
        rotation=q.rotation,
        zero_points=None if zeros is None else np.ascontiguousarray(zeros, np.int8),
        group_index=q.group_index,
    )


def _dequantize_block(
    codes: np.ndarray, scales: np.ndarray, q: LazyBlockArray, dtype: str, unrotate: bool, block_id: Any = None
) -> np.ndarray:
    return _part(q, codes, scales, chunk_shape(q.chunks, block_id)).dequantize(dtype, unrotate=unrotate)


def _dequantize_zeros_block(
    codes: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray,
    q: LazyBlockArray,
    dtype: str,
    unrotate: bool,
    block_id: Any = None,
) -> np.ndarray:
    part = _part(q, codes, scales, chunk_shape(q.chunks, block_id), zeros)
    return part.dequantize(dtype, unrotate=unrotate)


@dataclass(frozen=True, eq=False)
class LazyBlockArray(BlockFields):
    """A block-quantised Dask array: the codes and scale bytes as Dask arrays, chunked like the
    values (``chunks``), and the layout, per-tensor scale and rotation of a
    :class:`~neuron_kernels.blocks.array.BlockArray` (:class:`~neuron_kernels.blocks.array.BlockFields`).

    ``compute()`` gives the BlockArray (the in-memory ``quantize``'s, bit for bit);
    ``dequantize()`` a lazy Dask array of the values; ``persist()`` keeps the codes and scales
    in the cluster's memory. ``scales`` are the raw bytes (uint8): e8m0 for MX, float8_e4m3fn
    codes for NVFP4.
    """

    codes: Any
    scales: Any
    layout: BlockLayout
    per_tensor_scale: float | None
    rotation: tuple[int, ...] | None
    chunks: Chunks
    #: The zero points (int8, chunked like the scales) of the integer formats that have them.
    zero_points: Any = None
    #: Act-order's group of each column (int32, in memory: every chunk holds whole rows), or None.
    group_index: np.ndarray | None = None

    @property
    def spec(self) -> LazyBlockArray:
        """The same fields without the Dask arrays: what the tasks of one chunk carry."""
        return replace(self, codes=None, scales=None, zero_points=None)

    def __repr__(self) -> str:
        return (
            f"LazyBlockArray({self._repr_head()}, chunks={tuple(c[0] if c else 0 for c in self.chunks)}, "
            f"npartitions={self.codes.npartitions})"
        )

    def compute(self, **kwargs: Any) -> BlockArray:
        """The block array in memory (``kwargs`` go to ``dask.compute``: ``scheduler=`` ...)."""
        if self.zero_points is None:
            codes, scales = dask.compute(self.codes, self.scales, **kwargs)
            return _part(self, codes, scales, self.shape)
        codes, scales, zeros = dask.compute(self.codes, self.scales, self.zero_points, **kwargs)
        return _part(self, codes, scales, self.shape, zeros)

    def persist(self, **kwargs: Any) -> LazyBlockArray:
        """The same array with its codes and scales (and zero points) computed and kept by the scheduler."""
        if self.zero_points is None:
            codes, scales = dask.persist(self.codes, self.scales, **kwargs)
            return replace(self, codes=codes, scales=scales)
        codes, scales, zeros = dask.persist(self.codes, self.scales, self.zero_points, **kwargs)
        return replace(self, codes=codes, scales=scales, zero_points=zeros)

    def dequantize(self, dtype: Any = np.float32, *, unrotate: bool = False) -> Any:
        """The values as a lazy Dask array of ``dtype``, chunked like the quantised values (see
        :meth:`BlockArray.dequantize <neuron_kernels.blocks.array.BlockArray.dequantize>`)."""
        out = get_format(dtype)
        if out.name not in INPUT_DTYPES:
            raise InvalidTypeError(f"dequantisation writes float32, float64, float16 or bfloat16; got {out.name}")
        if not isinstance(unrotate, (bool, np.bool_)):
            raise InvalidTypeError(f"unrotate must be True or False, got {unrotate!r}")
        if unrotate and self.rotation is None:
            raise InvalidValueError("unrotate=True needs an array quantised with a rotation (rht=); this one has none")
        arrays = (self.codes, self.scales) if self.zero_points is None else (self.codes, self.scales, self.zero_points)
        return da.map_blocks(
            _dequantize_block if self.zero_points is None else _dequantize_zeros_block,
            *arrays,
            self.spec,
            out.name,
            bool(unrotate),
            chunks=self.chunks,
            dtype=out.result_dtype,
            meta=np.empty((0,) * len(self.shape), out.result_dtype),
        )


def _row_sums_block(
    x: np.ndarray, codes: np.ndarray, scales: np.ndarray, q: LazyBlockArray, block_id: Any = None
) -> Any:
    arr, _ = input_array(x)
    sums = row_sums(arr, _part(q, codes, scales, arr.shape))
    return sums.reshape(arr.shape[:-1] + (sums.shape[1],))


def _piece_totals(
    x: np.ndarray,
    codes: np.ndarray,
    scales: np.ndarray,
    q: LazyBlockArray,
    shape: tuple[int, ...],
    cshape: tuple[int, ...],
    sshape: tuple[int, ...],
    axis: int,
    zeros: Any = None,
) -> np.ndarray:
    """The error sums of one piece of :class:`~..blocks.layout.Pieces` (flat ranges of the values,
    codes and scale bytes, and zero points where the format has them), as the in-memory statistics
    compute that piece."""
    arr, _ = input_array(np.ascontiguousarray(x).reshape(shape))
    part = replace(q, layout=replace(q.layout, axis=axis, shape=shape))
    zp = None if zeros is None else np.asarray(zeros).reshape(sshape)
    stats = ErrorStats()
    stats._add(arr, _part(part, np.asarray(codes).reshape(cshape), np.asarray(scales).reshape(sshape), shape, zp))
    return stats.totals()


def _whole_stats(
    x: np.ndarray, codes: np.ndarray, scales: np.ndarray, zeros: Any, q: LazyBlockArray
) -> QuantizationStats:
    arr, _ = input_array(np.ascontiguousarray(x))
    stats = ErrorStats()
    stats.add(arr, _part(q, codes, scales, q.shape, zeros))
    return stats.result()


def _from_rows(sums: np.ndarray) -> QuantizationStats:
    stats = ErrorStats()
    if sums.size:
        stats.add_row_sums(sums.reshape(-1, sums.shape[-1]))
    return stats.result()


def _from_totals(*totals: np.ndarray) -> QuantizationStats:
    stats = ErrorStats()
    for row in totals:
        stats.add_totals(row)
    return stats.result()


def lazy_block_array(q: BlockArray, chunks: Any = "auto") -> LazyBlockArray:
    """The block array ``q`` (in memory) as a :class:`LazyBlockArray` whose values are chunked like
    ``chunks`` (Dask's chunks of an array of ``q.shape``), rounded to whole blocks."""
    values = da.empty(q.shape, np.float32, chunks=chunks).chunks
    unit = q.block_size * (2 if q.packed and q.block_size % 2 else 1)
    units = {q.axis: unit, **({len(q.shape) - 2: q.block_rows} if q.block_rows > 1 else {})}
    values = block_chunks(values, q.shape, units)
    if q.group_index is not None:  # a column's group is anywhere in its row: chunks of whole rows
        values = values[:-1] + ((q.shape[-1],),)
    codes_chunks, scales_chunks = _chunks_of(values, q.layout)
    zeros = None if q.zero_points is None else da.from_array(q.zero_points, chunks=scales_chunks)
    return LazyBlockArray(
        da.from_array(q.codes, chunks=codes_chunks),
        da.from_array(_raw_scales(q.scales, q.format), chunks=scales_chunks),
        q.layout,
        q.per_tensor_scale,
        q.rotation,
        values,
        zeros,
        q.group_index,
    )


def quantization_error_lazy(x: Any, q: Any) -> Any:
    """The error statistics of ``q`` (a :class:`LazyBlockArray` or a BlockArray) as a quantisation
    of ``x`` (a Dask or NumPy array), as a ``dask.delayed`` object: ``.compute()`` gives the
    :class:`~neuron_kernels.blocks.stats.QuantizationStats`.

    The in-memory statistics bit for bit: blocks along the last axis without a rotation (the
    in-memory per-row pass) from per-row sums, each row in one chunk (the last axis is rechunked
    whole), folded in row order; other layouts from the in-memory pass's pieces (about a million
    elements each, one task each), folded in the same order.
    """
    if isinstance(q, BlockArray):
        q = lazy_block_array(q, x.chunks if isinstance(x, da.Array) else "auto")
    if not isinstance(q, LazyBlockArray):
        raise InvalidTypeError(f"quantization_error takes a BlockArray (a block-format array), got {type(q).__name__}")
    if tuple(x.shape) != q.shape:
        raise InvalidValueError(f"x has shape {tuple(x.shape)} but the block array has shape {q.shape}")
    _source(x)
    x = da.asarray(x).rechunk(q.chunks)
    codes, scales = q.codes, q.scales
    if q.group_index is not None:  # as the in-memory statistics: the whole array at once
        return dask.delayed(_whole_stats)(x, codes, scales, q.zero_points, q.spec)
    if by_rows(q):
        from ..kernels.block_kernels import N_SUMS  # the error sums of a row, as the kernels store them

        last = x.ndim - 1
        if len(q.chunks[last]) > 1:
            x, codes, scales = (a.rechunk({last: a.shape[last]}) for a in (x, codes, scales))
            q = replace(q, codes=codes, scales=scales, chunks=x.chunks)
        sums = da.map_blocks(
            _row_sums_block,
            x,
            codes,
            scales,
            q.spec,
            chunks=x.chunks[:-1] + ((N_SUMS,),),
            dtype=np.float64,
            meta=np.empty((0,) * x.ndim, np.float64),
        )
        return dask.delayed(_from_rows)(sums)
    # Other layouts: the pieces of the in-memory pass (about a million elements each, contiguous
    # in the values, codes and scales), each one task, folded in the same order.
    pieces = Pieces(q.layout)
    flat_x, flat_codes, flat_scales = (a.reshape(-1) for a in (x, codes, scales))
    flat_zeros = None if q.zero_points is None else q.zero_points.reshape(-1)
    totals = []
    for cut in pieces.cuts(1 << 20):
        start, stop, shape = pieces.values(cut)
        (c0, c1, cshape), (s0, s1, sshape) = pieces.codes(cut), pieces.scales(cut)
        totals.append(
            dask.delayed(_piece_totals)(
                flat_x[start:stop],
                flat_codes[c0:c1],
                flat_scales[s0:s1],
                q.spec,
                shape,
                cshape,
                sshape,
                pieces.piece_layout(cut).axis,
                None if flat_zeros is None else flat_zeros[s0:s1],
            )
        )
    return dask.delayed(_from_totals)(*totals)
