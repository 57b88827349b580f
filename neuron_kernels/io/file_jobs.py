"""Files in pieces: quantise, dequantise and cast arrays of any size in bounded memory.

An array is processed in pieces of about ``chunk_bytes`` (:class:`neuron_kernels.blocks.layout.Pieces`: whole
rows of the array seen as (outer, block axis, inner), or whole blocks within one row), each read
through :mod:`neuron_kernels.io.arrays` and written as soon as it is computed, so that peak memory is
a few pieces whatever the file size. The results equal the in-memory functions' bit for bit,
stochastic rounding included: its random bits are keyed on each element's index in the whole
array.

``progress(nbytes)`` is called after each piece with the input bytes it consumed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..blocks.array import BlockArray
from ..blocks.inputs import input_array
from ..blocks.job import BlockJob, tensor_amax
from ..blocks.layout import BlockLayout, Pieces
from ..blocks.scheme import DEFAULT, block_job
from ..blocks.stats import ErrorStats, QuantizationStats
from ..dtypes import get_format
from ..errors import InvalidValueError
from ..formats import BLOCK_FORMATS, INPUT_DTYPES
from .arrays import ArrayEntry, FileFormatError, OutArray, array_file_kind, open_arrays
from .blockfile import BlockFileWriter, StoredBlocks, read_block_file

__all__ = [
    "select_arrays",
    "quantize_file",
    "dequantize_file",
    "cast_file",
    "error_table",
    "stored_dtype",
    "quantized_pieces",
    "decoded_pieces",
    "resolved_job",
    "Progress",
]

Progress = Callable[[int], None]


def _no_progress(_: int) -> None:
    pass


def select_arrays(entries: list[ArrayEntry], name: str | None) -> list[ArrayEntry]:
    """``entries``, or the one called ``name`` (a FileFormatError lists the names otherwise)."""
    if name is None:
        return entries
    chosen = [e for e in entries if e.name == name or (e.name is None and name == e.label)]
    if not chosen:
        names = ", ".join(e.label for e in entries)
        raise FileFormatError(f"{entries[0].path} has no array named {name!r}; it has {names}")
    return chosen


def _budget(chunk_bytes: int, itemsize: int) -> int:
    """Elements per piece: the input piece plus its outputs stay near ``chunk_bytes``."""
    return max(1, chunk_bytes // (itemsize + 4))


def _check_quantizable(entry: ArrayEntry) -> None:
    if entry.dtype.name not in INPUT_DTYPES:
        raise FileFormatError(
            f"{entry.where}: dtype {entry.dtype} is not a float array; float32, float16, "
            f"bfloat16 and float64 arrays can be quantised"
        )
    if not entry.shape:
        raise FileFormatError(f"{entry.where}: a 0-d array cannot be block-quantised (blocks run along an axis)")


def _input_pieces(entry: ArrayEntry, pieces: Pieces, chunk_bytes: int) -> Iterator[tuple[int, int, np.ndarray, Any]]:
    """(cut index, start, piece, its dtype row) of ``entry`` in C order, cut as ``pieces`` says."""
    for k, cut in enumerate(pieces.cuts(_budget(chunk_bytes, entry.dtype.itemsize))):
        start, stop, shape = pieces.values(cut)
        arr, src = input_array(entry.read_flat(start, stop).reshape(shape))
        yield k, start, arr, src


def entry_amax(entry: ArrayEntry, job: BlockJob, chunk_bytes: int) -> float:
    """The finite amax of ``entry`` as ``job`` quantises it, in one pass of pieces (or from what
    the entry knows of it: a stored weight's codes and scales, unless the job rotates)."""
    if entry.finite_amax is not None and job.rotation is None:
        return entry.finite_amax()
    amax = 0.0
    pieces = Pieces(job.layout(entry.shape))
    cuts = pieces.cuts(_budget(chunk_bytes, entry.dtype.itemsize))
    for k, _, arr, src in _input_pieces(entry, pieces, chunk_bytes):
        amax = max(amax, dataclasses.replace(job, axis=pieces.piece_layout(cuts[k]).axis).amax(arr, src))
    return amax


def resolved_job(entry: ArrayEntry, job: BlockJob, chunk_bytes: int) -> BlockJob:
    """``job`` with its per-tensor scale, from a first pass over ``entry`` if it needs the amax."""
    return job.with_amax(entry_amax(entry, job, chunk_bytes)) if job.needs_amax else job


class _Spares:
    """The block arrays of the last two pieces, whose codes and scales the next piece of the same
    shape is quantised into (``quantize(..., out=)``): fresh pages for every piece would cost the
    operating system's zeroing each time. Two, because a consumer may still hold one piece (its
    statistics on another thread) while the next is quantised."""

    def __init__(self) -> None:
        self._recent: list[BlockArray] = []

    def quantize(self, job: BlockJob, arr: np.ndarray, src: Any, idx0: int) -> BlockArray:
        spare = self._recent[0] if len(self._recent) == 2 and self._recent[0].shape == arr.shape else None
        q = job.quantize(arr, src, idx0=idx0, out=spare)
        self._recent = [*self._recent[-1:], q]
        return q


def quantized_pieces(
    entry: ArrayEntry, job: BlockJob, chunk_bytes: int, first: int = 0
) -> Iterator[tuple[np.ndarray, BlockArray]]:
    """(input piece, its quantisation) over ``entry``, in C order; ``job`` is for the whole array
    (its per-tensor scale resolved); ``first``: the C-order index of ``entry``'s first element in
    a larger array it is part of (stochastic rounding depends on it). A piece's codes and scales
    are valid until two more pieces are asked for (they live in buffers reused from piece to
    piece, see :class:`_Spares`)."""
    pieces = Pieces(job.layout(entry.shape))
    cuts = pieces.cuts(_budget(chunk_bytes, entry.dtype.itemsize))
    spares = _Spares()
    for k, start, arr, src in _input_pieces(entry, pieces, chunk_bytes):
        piece_job = dataclasses.replace(job, axis=pieces.piece_layout(cuts[k]).axis)
        yield arr, spares.quantize(piece_job, arr, src, first + start)


def transposed_pieces(entry: ArrayEntry, job: BlockJob) -> Iterator[tuple[np.ndarray, BlockArray]]:
    """(input matrix, its quantisation) for each [in, out] matrix of the [..., in, out] ``entry``
    transposed to [out, in] (blocks along ``in``), in order: what quantising the whole array
    with its last two axes swapped gives, one matrix in memory at a time. ``job`` is for the whole
    array (its per-tensor scale resolved). A matrix's codes and scales are valid until two more
    are asked for (see :func:`quantized_pieces`)."""
    rows, cols = entry.shape[-2], entry.shape[-1]
    per = rows * cols
    matrix_job = dataclasses.replace(job, axis=1)
    spares = _Spares()
    for m in range(entry.size // per if per else 0):
        arr, src = input_array(np.ascontiguousarray(entry.read_flat(m * per, (m + 1) * per).reshape(rows, cols).T))
        yield arr, spares.quantize(matrix_job, arr, src, m * per)


def quantize_file(
    src: str,
    dst: str,
    fmt: str,
    *,
    name: str | None = None,
    chunk_bytes: int = 256 << 20,
    progress: Progress = _no_progress,
    **options: Any,
) -> dict[str, QuantizationStats]:
    """Quantise every array of ``src`` (or the one called ``name``) into the block file ``dst``
    (already a temporary path: see :func:`neuron_kernels.io.outputs.atomic_output`).

    ``options`` are those of :func:`neuron_kernels.quantize`. Returns the error statistics of
    each array. A ``.npy`` input gives a single-array file; ``.npz`` and ``.safetensors`` inputs
    keep their array names. NVFP4 with the per-tensor scale from the amax reads each array twice.
    """
    entries = select_arrays(open_arrays(src), name)
    for entry in entries:  # every array is checked before anything is written
        _check_quantizable(entry)
    jobs = [block_job(fmt, len(e.shape), **options) for e in entries]
    named = not array_file_kind(src).one_array
    stats: dict[str, QuantizationStats] = {}
    with BlockFileWriter(dst) as writer:
        for entry, job in zip(entries, jobs):
            job = resolved_job(entry, job, chunk_bytes)
            acc = ErrorStats()
            pts = job.per_tensor_scale if isinstance(job.per_tensor_scale, float) else None
            with writer.array(
                entry.name if named else None, job.layout(entry.shape), pts, job.rotation, job.fmt.scale
            ) as out:
                for arr, mx in quantized_pieces(entry, job, chunk_bytes):
                    out.write(mx.codes, mx.scales, mx.zero_points)
                    acc.add(arr, mx)
                    progress(arr.size * entry.dtype.itemsize)
            stats[entry.label] = acc.result()
    return stats


def decoded_pieces(
    codes: ArrayEntry,
    scales: ArrayEntry,
    layout: BlockLayout,
    per_tensor_scale: float | None,
    rotation: tuple[int, ...] | None,
    dtype: str,
    chunk_bytes: int,
    scale_dtype: str | None = None,
    zeros: ArrayEntry | None = None,
    group_index: np.ndarray | None = None,
) -> Iterator[tuple[np.ndarray, int]]:
    """(values, bytes of codes and scales read) of a stored block array, piece by piece in C
    order: ``codes`` and ``scales`` hold its codes and scale bytes in C order (any shapes;
    ``scale_dtype``: the dtype of float scales stored as the unsigned integers of their bits);
    ``zeros`` the zero points of an integer format with them (the scales' shape), ``group_index``
    act-order's group of each column (then every piece is whole rows).

    The values of a piece are valid until the next piece is asked for: they live in buffers
    reused from piece to piece (fresh pages would cost the operating system's zeroing each time)."""
    from ..casting import cast

    pieces = Pieces(layout)
    buffers: dict[str, np.ndarray] = {}

    def buffer(kind: str, dt: Any, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64))
        if kind not in buffers or buffers[kind].size < n:
            buffers[kind] = np.empty(n, dt)
        return buffers[kind][:n].reshape(shape)

    narrow = dtype in ("float16", "bfloat16")
    budget = _budget(chunk_bytes, 4)
    if group_index is not None:  # a piece of whole rows: each column's group is anywhere in its row
        budget = max(budget, layout.shape[-1])
    for cut in pieces.cuts(budget):
        (c0, c1, _), (s0, s1, _) = pieces.codes(cut), pieces.scales(cut)
        piece = pieces.piece_layout(cut)
        if group_index is not None:  # (rows, columns), as the group index is one per column
            piece = dataclasses.replace(piece, shape=piece.shape[:2])
        sshape = piece.scales_shape
        part = BlockArray.from_parts(
            np.asarray(codes.read_flat(c0, c1)).reshape(piece.codes_shape),
            _scale_view(np.asarray(scales.read_flat(s0, s1)).reshape(sshape), scale_dtype),
            piece,
            codes.where,
            per_tensor_scale=per_tensor_scale,
            rotation=rotation,
            zero_points=None if zeros is None else np.asarray(zeros.read_flat(s0, s1)).reshape(sshape),
            group_index=group_index,
        )
        used = part.codes.nbytes + part.scales.nbytes + (0 if part.zero_points is None else part.zero_points.nbytes)
        if dtype == "float32" or narrow:
            values = part.dequantize(np.float32, out=buffer("float32", np.float32, part.shape))
            if narrow:
                values = cast(values, dtype, out=buffer(dtype, get_format(dtype).result_dtype, part.shape))
            yield values, used
        else:
            yield part.dequantize(dtype), used


def _scale_view(raw: np.ndarray, scale_dtype: str | None) -> np.ndarray:
    return raw if scale_dtype is None else raw.view(get_format(scale_dtype).result_dtype)


def stored_dtype(dtype: Any, path: str) -> np.dtype:
    """The dtype an array of ``dtype`` is written with to ``path`` (see
    :meth:`neuron_kernels.io.arrays.ArrayFileKind.stored_dtype`)."""
    return array_file_kind(path, "output").stored_dtype(dtype)


def _stored_as(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return values.view(dtype) if values.dtype != dtype else values


def dequantize_file(
    src: str,
    dst: str,
    *,
    dtype: Any = "float32",
    name: str | None = None,
    chunk_bytes: int = 256 << 20,
    progress: Progress = _no_progress,
    shown: str | None = None,
) -> list[str]:
    """Dequantise the block file ``src`` (every array, or ``name``) into ``dst`` (.npy/.npz/.safetensors;
    a temporary path, called ``shown`` in messages). Returns the names written."""
    kind = array_file_kind(shown or dst, "output")
    stored = read_block_file(src)
    if name is not None:
        if name not in stored:
            raise FileFormatError(
                f"{src} has no block array named {name!r}; it has {', '.join(sorted(str(k) for k in stored))}"
            )
        stored = {name: stored[name]}
    kind.check_count(shown or dst, len(stored))
    out_fmt = get_format(dtype)
    out_dtype = kind.stored_dtype(out_fmt.result_dtype)

    def pieces(s: StoredBlocks) -> Callable[[], Iterator[np.ndarray]]:
        def run() -> Iterator[np.ndarray]:
            for values, used in decoded_pieces(
                s.codes,
                s.scales,
                s.layout,
                s.per_tensor_scale,
                s.rotation,
                out_fmt.name,
                chunk_bytes,
                s.scale_dtype,
                s.zeros,
                s.group_index,
            ):
                progress(used)
                yield _stored_as(values, out_dtype)

        return run

    items = [OutArray(str(k) if k is not None else "array", s.shape, out_dtype, pieces(s)) for k, s in stored.items()]
    kind.write(dst, items)
    return [i.name for i in items]


def cast_file(
    src: str,
    dst: str,
    target: Any,
    *,
    name: str | None = None,
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int | None = None,
    chunk_bytes: int = 256 << 20,
    progress: Progress = _no_progress,
    shown: str | None = None,
) -> list[str]:
    """Cast every array of ``src`` (or ``name``) to ``target`` into ``dst`` (a temporary path, called
    ``shown`` in messages), equal to :func:`neuron_kernels.cast` of each whole array (stochastic
    bits included)."""
    from ..casting import CastPlan, cast_options

    kind = array_file_kind(shown or dst, "output")
    entries = select_arrays(open_arrays(src), name)
    kind.check_count(shown or dst, len(entries))
    target_fmt = get_format(target)
    options = cast_options(rounding, saturate, seed)
    plans: dict[str, CastPlan] = {}
    for e in entries:  # every array is checked before anything is written
        try:
            source = get_format(e.dtype)
        except TypeError:
            raise FileFormatError(f"{e.where}: dtype {e.dtype} cannot be cast") from None
        plans[e.label] = CastPlan.make(source, target_fmt, options)
        plans[e.label].out_shape(e.shape)
    out_dtype = kind.stored_dtype(target_fmt.result_dtype)

    def pieces(e: ArrayEntry) -> Callable[[], Iterator[np.ndarray]]:
        def run() -> Iterator[np.ndarray]:
            plan = plans[e.label]
            step = max(4, _budget(chunk_bytes, e.dtype.itemsize) // 4 * 4)  # whole *_x4 groups
            for start in range(0, max(e.size, 1), step):
                piece = e.read_flat(start, min(start + step, e.size))
                out = plan.run(piece, index0=start * plan.source.lanes)
                progress(piece.nbytes)
                yield _stored_as(out, out_dtype)

        return run

    items = [OutArray(e.label, plans[e.label].out_shape(e.shape), out_dtype, pieces(e)) for e in entries]
    kind.write(dst, items)
    return [i.name for i in items]


#: The scale policies the error table compares, by name: the options of :func:`neuron_kernels.quantize`.
POLICIES: dict[str, dict[str, str]] = {
    "plain": {},
    "mse": {"scale_search": "mse"},
    "4/6-mae": {"four_over_six": "mae"},
    "4/6-mse": {"four_over_six": "mse"},
}


def _applies(policy: str, fmt: str) -> bool:
    """Whether a policy applies to a format (four-over-six: float8_e4m3fn scales only; none to
    float scales)."""
    bf = BLOCK_FORMATS[fmt]
    if bf.float_scales:
        return not POLICIES[policy]
    return "four_over_six" not in POLICIES[policy] or not bf.is_mx


def error_table(
    src: str,
    *,
    name: str | None = None,
    formats: list[str] | None = None,
    scale_modes: list[str] | None = None,
    policies: list[str] | None = None,
    block_size: int | None = None,
    axis: int = -1,
    chunk_bytes: int = 256 << 20,
    progress: Progress = _no_progress,
) -> list[tuple[str, str, str, str, QuantizationStats]]:
    """For each array of ``src``, every block format x scale mode x policy that applies: (array,
    format, scale mode, policy, stats), best SQNR first within each array. ``block_size``:
    the formats' own when None. NVFP4 uses the per-tensor scale from the amax (one more read)."""
    entries = select_arrays(open_arrays(src), name)
    formats = list(BLOCK_FORMATS) if formats is None else formats
    policies = list(POLICIES) if policies is None else policies
    for p in policies:
        if p not in POLICIES:
            raise InvalidValueError(f"unknown policy {p!r}; accepted: {', '.join(POLICIES)}")
    rows = []
    for entry in entries:
        _check_quantizable(entry)
        jobs = {
            (f, m, p): block_job(
                f,
                len(entry.shape),
                block_size=DEFAULT if block_size is None else block_size,
                axis=axis,
                scale_mode=m,
                pack=False,
                **POLICIES[p],
            )
            for f in formats
            for m in block_job(f, len(entry.shape)).fmt.scale_modes
            if scale_modes is None or m in scale_modes
            for p in policies
            if _applies(p, f)
        }
        if not jobs:
            raise InvalidValueError("no format takes the scale modes and policies asked for")
        stats: dict[tuple[str, str, str], ErrorStats] = {}
        # One read of each piece serves every job of 1-D blocks, another every job of 2-D tiles
        # (pieces of whole rows of tiles); only the first read counts towards the progress.
        rows_jobs = {k: j for k, j in jobs.items() if j.block_rows == 1}
        tile_jobs = {k: j for k, j in jobs.items() if j.block_rows > 1}
        for group, counted in ((rows_jobs, True), (tile_jobs, not rows_jobs)):
            if group:
                stats.update(_table_stats(entry, group, chunk_bytes, progress if counted else _no_progress))
        found = [(entry.label, f, m, p, stats[(f, m, p)].result()) for f, m, p in jobs]
        rows.extend(sorted(found, key=lambda r: -r[4].sqnr_db))
    return rows


def _table_stats(
    entry: ArrayEntry, jobs: dict[tuple[str, str, str], BlockJob], chunk_bytes: int, progress: Progress
) -> dict[tuple[str, str, str], ErrorStats]:
    """The error statistics of every job of ``jobs`` on ``entry`` (all of 1-D blocks, or all of 2-D
    tiles), from one read of its pieces, cut on blocks (rows of tiles) of every job's length."""
    first = next(iter(jobs.values()))
    shape = entry.shape
    sizes = [min(j.block_size, shape[first.axis]) for j in jobs.values()]
    cut_layout = dataclasses.replace(first.layout(shape), block_size=int(np.lcm.reduce(sizes)))
    if first.block_rows > 1:
        tile_rows = [min(j.block_rows, shape[-2]) for j in jobs.values()]
        cut_layout = dataclasses.replace(cut_layout, block_rows=max(2, int(np.lcm.reduce(tile_rows))))
    pieces = Pieces(cut_layout)
    cuts = pieces.cuts(_budget(chunk_bytes, entry.dtype.itemsize))
    if any(j.needs_amax for j in jobs.values()):  # no job of the table rotates: one amax serves all
        amax = 0.0
        for _, _, arr, src_fmt in _input_pieces(entry, pieces, chunk_bytes):
            amax = max(amax, tensor_amax(arr, src_fmt))
        jobs = {k: j.with_amax(amax) if j.needs_amax else j for k, j in jobs.items()}
    stats = {key: ErrorStats() for key in jobs}
    for k, start, arr, src_fmt in _input_pieces(entry, pieces, chunk_bytes):
        piece_axis = pieces.piece_layout(cuts[k]).axis
        for key, job in jobs.items():
            piece_job = dataclasses.replace(job, axis=piece_axis)
            sums = piece_job.error_sums(arr, src_fmt)  # one pass, no codes written, where it can
            if sums is not None:
                stats[key].add_row_sums(sums)
            else:
                stats[key].add(arr, piece_job.quantize(arr, src_fmt, idx0=start))
        progress(arr.size * entry.dtype.itemsize)
    return stats
