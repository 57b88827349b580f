"""Files in pieces: quantise, dequantise and cast arrays of any size in bounded memory.

An array is processed in pieces of about ``chunk_bytes`` (:class:`neuron_kernels.mx.Pieces`: whole
rows of the array seen as (outer, block axis, inner), or whole blocks within one row), each read
through :mod:`neuron_kernels.files` and written as soon as it is computed, so that peak memory is
a few pieces whatever the file size. The results equal the in-memory functions' bit for bit,
stochastic rounding included: its random bits are keyed on each element's index in the whole
array.

``progress(nbytes)`` is called after each piece with the input bytes it consumed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.lib.format as npformat

from .files import ArrayEntry, FileFormatError, NpyWriter, NpzWriter, open_arrays, write_safetensors
from .formats import Format, get_format
from .mx import ErrorStats, MXArray, MXJob, Pieces, QuantizationError, _input_array, mx_job
from .mxfile import MXFileWriter, StoredMX, read_mx_file

__all__ = ["select_arrays", "quantize_file", "dequantize_file", "cast_file", "error_table", "stored_dtype", "Progress"]

Progress = Callable[[int], None]
_FLOATS = ("float32", "float16", "bfloat16", "float64")


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
    if entry.dtype.name not in _FLOATS:
        raise FileFormatError(
            f"{entry.where}: dtype {entry.dtype} is not a float array; float32, float16, "
            f"bfloat16 and float64 arrays can be quantised"
        )
    if not entry.shape:
        raise FileFormatError(f"{entry.where}: a 0-d array cannot be MX-quantised (blocks run along an axis)")


def _quantized_pieces(entry: ArrayEntry, job: MXJob, chunk_bytes: int) -> Iterator[tuple[np.ndarray, MXArray]]:
    """(input piece, its quantisation) over ``entry``, in C order; ``job`` is for the whole array."""
    pieces = Pieces.of(entry.shape, job.axis, job.block_size, job.pack)
    piece_job = dataclasses.replace(job, axis=1)  # pieces are (rows, block axis, inner)
    for cut in pieces.cuts(_budget(chunk_bytes, entry.dtype.itemsize)):
        start, stop, shape = pieces.values(cut)
        arr, src = _input_array(entry.read_flat(start, stop).reshape(shape))
        yield arr, piece_job.quantize(arr, src, idx0=start)


def quantize_file(
    src: str,
    dst: str,
    fmt: str,
    *,
    name: str | None = None,
    chunk_bytes: int = 256 << 20,
    progress: Progress = _no_progress,
    **options: Any,
) -> dict[str, QuantizationError]:
    """Quantise every array of ``src`` (or the one called ``name``) into the MX file ``dst``
    (already a temporary path: see :func:`neuron_kernels.files.atomic_output`).

    ``options`` are those of :func:`neuron_kernels.quantize_mx`. Returns the error statistics
    of each array. A ``.npy`` input gives a single-array MX file; ``.npz`` and ``.safetensors``
    inputs keep their array names.
    """
    entries = select_arrays(open_arrays(src), name)
    for entry in entries:  # every array is checked before anything is written
        _check_quantizable(entry)
    jobs = [mx_job(fmt, len(e.shape), **options) for e in entries]
    named = not src.lower().endswith(".npy")
    stats: dict[str, QuantizationError] = {}
    with MXFileWriter(dst) as writer:
        for entry, job in zip(entries, jobs):
            acc = ErrorStats()
            with writer.array(
                entry.name if named else None, job.fmt.name, job.block_size, job.axis, entry.shape, job.pack
            ) as out:
                for arr, mx in _quantized_pieces(entry, job, chunk_bytes):
                    out.write(mx.codes, mx.scales)
                    acc.add(arr, mx)
                    progress(arr.size * entry.dtype.itemsize)
            stats[entry.label] = acc.result()
    return stats


def _output_kind(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".npy", ".npz", ".safetensors"):
        raise FileFormatError(
            f"{path}: unsupported output file type {suffix or '(none)'!r}; use one of .npy, .npz, .safetensors"
        )
    return suffix


def _one_output(kind: str, dst: str, count: int) -> None:
    if kind == ".npy" and count != 1:
        raise FileFormatError(
            f"{dst}: a .npy file holds one array and there are {count}; write .npz or "
            f".safetensors, or pick one array by name"
        )


def stored_dtype(dtype: Any, path: str) -> np.dtype:
    """The dtype an array of ``dtype`` is written with to ``path``: .npy/.npz cannot describe the
    ml_dtypes types (bfloat16, FP8, ...), which are stored there as their unsigned-integer codes."""
    dtype = np.dtype(dtype)
    if _output_kind(path) == ".safetensors":
        return dtype
    try:
        if npformat.descr_to_dtype(npformat.dtype_to_descr(dtype)) == dtype:
            return dtype
    except (TypeError, ValueError):
        pass
    return np.dtype(f"u{dtype.itemsize}")


_Item = tuple[str, tuple[int, ...], np.dtype, Callable[[], Iterator[np.ndarray]]]


def _write_arrays(dst: str, kind: str, items: list[_Item]) -> None:
    """Write arrays produced piece by piece. ``items``: (name, shape, dtype, pieces) where
    ``pieces()`` yields consecutive C-order pieces of the array (any shapes)."""
    if kind == ".npy":
        ((_, shape, dtype, pieces),) = items
        with NpyWriter(dst, shape, dtype) as w:
            for piece in pieces():
                w.write(piece)
    elif kind == ".npz":
        with NpzWriter(dst) as z:
            for name, shape, dtype, pieces in items:
                with z.member(name, shape, dtype) as m:
                    for piece in pieces():
                        m.write(piece)
    else:  # the safetensors package writes whole arrays
        write_safetensors(
            dst,
            {
                name: np.concatenate([p.reshape(-1) for p in pieces()]).reshape(shape)
                for name, shape, dtype, pieces in items
            },
        )


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
    """Dequantise the MX file ``src`` (every array, or ``name``) into ``dst`` (.npy/.npz/.safetensors;
    a temporary path, called ``shown`` in messages). Returns the names written."""
    kind = _output_kind(shown or dst)
    stored = read_mx_file(src)
    if name is not None:
        if name not in stored:
            raise FileFormatError(
                f"{src} has no MX array named {name!r}; it has {', '.join(sorted(str(k) for k in stored))}"
            )
        stored = {name: stored[name]}
    _one_output(kind, shown or dst, len(stored))
    out_fmt = get_format(dtype)
    out_dtype = stored_dtype(out_fmt.result_dtype, shown or dst)

    def pieces(s: StoredMX) -> Callable[[], Iterator[np.ndarray]]:
        def run() -> Iterator[np.ndarray]:
            layout = Pieces.of(s.shape, s.axis, s.block_size, s.packed)
            for cut in layout.cuts(_budget(chunk_bytes, 4)):
                (c0, c1, cshape), (s0, s1, sshape) = layout.codes(cut), layout.scales(cut)
                part = MXArray.from_parts(
                    s.codes.read_flat(c0, c1).reshape(cshape),
                    s.scales.read_flat(s0, s1).reshape(sshape),
                    s.fmt,
                    s.block_size,
                    1,
                    layout.values(cut)[2],
                    s.packed,
                    s.path,
                )
                values = part.dequantize(out_fmt.name)
                progress(part.codes.nbytes + part.scales.nbytes)
                yield _stored_as(values, out_dtype)

        return run

    items = [(str(k) if k is not None else "array", s.shape, out_dtype, pieces(s)) for k, s in stored.items()]
    _write_arrays(dst, kind, items)
    return [i[0] for i in items]


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
    from .casting import _options, _out_shape, _run_cast
    from .registry import lookup_cast

    kind = _output_kind(shown or dst)
    entries = select_arrays(open_arrays(src), name)
    _one_output(kind, shown or dst, len(entries))
    target_fmt = get_format(target)
    options = _options(rounding, saturate, seed)
    sources: dict[str, Format] = {}
    for e in entries:  # every array is checked before anything is written
        try:
            sources[e.label] = get_format(e.dtype)
        except TypeError:
            raise FileFormatError(f"{e.where}: dtype {e.dtype} cannot be cast") from None
        lookup_cast(sources[e.label].name, target_fmt.name).check_options(options)
        _out_shape(e.shape, sources[e.label], target_fmt)
    out_dtype = stored_dtype(target_fmt.result_dtype, shown or dst)

    def pieces(e: ArrayEntry) -> Callable[[], Iterator[np.ndarray]]:
        def run() -> Iterator[np.ndarray]:
            source = sources[e.label]
            step = max(4, _budget(chunk_bytes, e.dtype.itemsize) // 4 * 4)  # whole *_x4 groups
            for start in range(0, max(e.size, 1), step):
                piece = e.read_flat(start, min(start + step, e.size))
                out = _run_cast(piece, source, target_fmt, options, None, index0=start * source.lanes)
                progress(piece.nbytes)
                yield _stored_as(out, out_dtype)

        return run

    items = [(e.label, _out_shape(e.shape, sources[e.label], target_fmt), out_dtype, pieces(e)) for e in entries]
    _write_arrays(dst, kind, items)
    return [i[0] for i in items]


def error_table(
    src: str,
    *,
    name: str | None = None,
    formats: list[str] | None = None,
    scale_modes: list[str] | None = None,
    block_size: int = 32,
    axis: int = -1,
    chunk_bytes: int = 256 << 20,
    progress: Progress = _no_progress,
) -> list[tuple[str, str, str, QuantizationError]]:
    """For each array of ``src``, every MX format x scale mode: (array, format, scale mode, stats),
    best SQNR first within each array."""
    from .mx import MX_FORMATS, SCALE_MODES

    entries = select_arrays(open_arrays(src), name)
    formats = list(MX_FORMATS) if formats is None else formats
    scale_modes = list(SCALE_MODES) if scale_modes is None else scale_modes
    rows = []
    for entry in entries:
        _check_quantizable(entry)
        jobs = {
            (f, m): mx_job(f, len(entry.shape), block_size=block_size, axis=axis, scale_mode=m)
            for f in formats
            for m in scale_modes
        }
        stats = {key: ErrorStats() for key in jobs}
        # One read of each piece serves every job: cut where every job can (FP4's byte pairs too).
        first = next(iter(jobs.values()))
        cut_job = dataclasses.replace(first, pack=any(j.pack for j in jobs.values()))
        layout = Pieces.of(entry.shape, cut_job.axis, cut_job.block_size, cut_job.pack)
        for cut in layout.cuts(_budget(chunk_bytes, entry.dtype.itemsize)):
            start, stop, shape = layout.values(cut)
            arr, src_fmt = _input_array(entry.read_flat(start, stop).reshape(shape))
            for key, job in jobs.items():
                stats[key].add(arr, dataclasses.replace(job, axis=1).quantize(arr, src_fmt, idx0=start))
            progress(arr.size * entry.dtype.itemsize)
        found = [(entry.label, f, m, stats[(f, m)].result()) for f, m in jobs]
        rows.extend(sorted(found, key=lambda r: -r[3].sqnr_db))
    return rows
