"""Files in pieces: quantise, dequantise and cast arrays of any size in bounded memory.

Each array is processed in ranges of its first axis (:func:`neuron_kernels.mx.row_ranges`: whole
MX blocks when the first axis is the block axis), read through :mod:`neuron_kernels.files` and
written as they are produced, so that peak memory is a few pieces whatever the file size. The
results equal the in-memory functions' bit for bit (stochastic rounding included: its random bits
are keyed on each element's index in the whole array).

``progress(nbytes)`` is called after each piece with the input bytes it consumed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .files import ArrayEntry, FileFormatError, NpyWriter, NpzWriter, open_arrays, write_safetensors
from .mx import ErrorStats, MXArray, QuantizationError, _input_array, mx_job, mx_row_slices, row_ranges
from .mxfile import MXFileWriter, StoredMX, read_mx_file

__all__ = ["select_arrays", "quantize_file", "dequantize_file", "cast_file", "error_table", "Progress"]

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


def _float_input(entry: ArrayEntry, rows: np.ndarray) -> np.ndarray:
    try:
        arr, _ = _input_array(rows)
    except TypeError:
        raise FileFormatError(f"{entry.where}: dtype {entry.dtype} is not a float array; "
                              f"float32, float16, bfloat16 and float64 arrays can be quantised") from None
    return arr


def quantize_file(src: str, dst: str, fmt: str, *, name: str | None = None, chunk_bytes: int = 256 << 20,
                  progress: Progress = _no_progress, **options: Any) -> dict[str, QuantizationError]:
    """Quantise every array of ``src`` (or the one called ``name``) into the MX file ``dst``
    (already a temporary path: see :func:`neuron_kernels.files.atomic_output`).

    ``options`` are those of :func:`neuron_kernels.quantize_mx`. Returns the error statistics
    of each array. A ``.npy`` input gives a single-array MX file; ``.npz`` and ``.safetensors``
    inputs keep their array names.
    """
    entries = select_arrays(open_arrays(src), name)
    for entry in entries:  # every array is checked before anything is written
        if entry.dtype.name not in ("float32", "float16", "bfloat16", "float64"):
            _float_input(entry, np.empty(0, entry.dtype))
        if not entry.shape:
            raise FileFormatError(f"{entry.where}: a 0-d array cannot be MX-quantised (blocks run along "
                                  f"an axis)")
    jobs = [mx_job(fmt, len(e.shape), **options) for e in entries]
    named = not src.lower().endswith(".npy")
    stats: dict[str, QuantizationError] = {}
    with MXFileWriter(dst) as writer:
        for entry, job in zip(entries, jobs):
            acc = ErrorStats()
            with writer.array(entry.name if named else None, job.fmt.name, job.block_size, job.axis, entry.shape,
                              job.pack) as rows:
                per_row = int(np.prod(entry.shape[1:], dtype=np.int64))
                for lo, hi in row_ranges(entry.shape, job.axis, job.block_size, job.pack,
                                         _budget(chunk_bytes, entry.dtype.itemsize)):
                    piece = entry.read(lo, hi)
                    arr = _float_input(entry, piece)
                    mx = job.quantize(arr, _source_format(arr), idx0=lo * per_row)
                    rows.write(mx.codes, mx.scales)
                    acc.add(arr, mx)
                    progress(piece.nbytes)
                    del piece, arr, mx
            stats[entry.label] = acc.result()
    return stats


def _source_format(arr: np.ndarray) -> Any:
    from .formats import get_format

    return get_format(arr.dtype)


def _output_kind(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".npy", ".npz", ".safetensors"):
        raise FileFormatError(f"{path}: unsupported output file type {suffix or '(none)'!r}; "
                              f"use one of .npy, .npz, .safetensors")
    return suffix


def _write_arrays(dst: str, kind: str, items: list[tuple[str, tuple[int, ...], np.dtype, Any]]) -> None:
    """Write arrays produced piece by piece. ``items``: (name, shape, dtype, pieces) where
    ``pieces()`` yields the C-order row ranges of the array in order."""
    if kind == ".npy":
        (_, shape, dtype, pieces), = items
        with NpyWriter(dst, shape, dtype) as w:
            for rows in pieces():
                w.write(rows)
    elif kind == ".npz":
        with NpzWriter(dst) as z:
            for name, shape, dtype, pieces in items:
                with z.member(name, shape, dtype) as m:
                    for rows in pieces():
                        m.write(rows if rows.ndim else rows.reshape(1))
    else:  # the safetensors package writes whole arrays
        write_safetensors(dst, {name: np.concatenate(list(pieces())) if shape else next(iter(pieces()))
                                for name, shape, dtype, pieces in items})


def _storable(dtype: np.dtype, kind: str) -> np.dtype:
    """The dtype an array of ``dtype`` is stored with: .npy/.npz have no ml_dtypes types, so
    those are stored as their unsigned-integer codes."""
    if kind != ".safetensors" and dtype.kind == "V":
        return np.dtype(f"u{dtype.itemsize}")
    return dtype


def _one_output(kind: str, dst: str, count: int) -> None:
    if kind == ".npy" and count != 1:
        raise FileFormatError(f"{dst}: a .npy file holds one array and there are {count}; write .npz or "
                              f".safetensors, or pick one array by name")


def dequantize_file(src: str, dst: str, *, dtype: Any = "float32", name: str | None = None,
                    chunk_bytes: int = 256 << 20, progress: Progress = _no_progress, shown: str | None = None
                    ) -> list[str]:
    """Dequantise the MX file ``src`` (every array, or ``name``) into ``dst`` (.npy/.npz/.safetensors;
    a temporary path, called ``shown`` in messages). Returns the names written."""
    kind = _output_kind(shown or dst)
    stored = read_mx_file(src)
    if name is not None:
        if name not in stored:
            raise FileFormatError(f"{src} has no MX array named {name!r}; it has "
                                  f"{', '.join(sorted(str(k) for k in stored))}")
        stored = {name: stored[name]}
    _one_output(kind, shown or dst, len(stored))
    from .formats import get_format

    out_fmt = get_format(dtype)
    out_dtype = _storable(np.dtype(out_fmt.result_dtype), kind)

    def pieces(s: StoredMX) -> Any:
        def run() -> Any:
            for lo, hi in row_ranges(s.shape, s.axis, s.block_size, s.packed, _budget(chunk_bytes, 4)):
                codes, scales = mx_row_slices(s.axis, s.block_size, s.packed, lo, hi)
                part = MXArray.from_parts(s.codes.read(codes.start, codes.stop),
                                          s.scales.read(scales.start, scales.stop), s.fmt, s.block_size, s.axis,
                                          (hi - lo,) + s.shape[1:], s.packed, s.path)
                values = part.dequantize(out_fmt.name)
                progress(part.codes.nbytes + part.scales.nbytes)
                yield values.view(out_dtype) if values.dtype != out_dtype else values
        return run

    items = [(str(k) if k is not None else "array", s.shape, out_dtype, pieces(s)) for k, s in stored.items()]
    _write_arrays(dst, kind, items)
    return [i[0] for i in items]


def cast_file(src: str, dst: str, target: Any, *, name: str | None = None, rounding: str = "nearest_even",
              saturate: bool = False, seed: int | None = None, chunk_bytes: int = 256 << 20,
              progress: Progress = _no_progress, shown: str | None = None) -> list[str]:
    """Cast every array of ``src`` (or ``name``) to ``target`` into ``dst`` (a temporary path, called
    ``shown`` in messages), equal to :func:`neuron_kernels.cast` of each whole array (stochastic
    bits included)."""
    from .casting import _options, _out_shape, _run_cast
    from .formats import get_format
    from .registry import lookup_cast

    kind = _output_kind(shown or dst)
    entries = select_arrays(open_arrays(src), name)
    _one_output(kind, shown or dst, len(entries))
    target_fmt = get_format(target)
    options = _options(rounding, saturate, seed)
    sources = {}
    for e in entries:  # every array is checked before anything is written
        try:
            sources[e.label] = get_format(e.dtype)
        except TypeError:
            raise FileFormatError(f"{e.where}: dtype {e.dtype} cannot be cast") from None
        lookup_cast(sources[e.label].name, target_fmt.name).check_options(options)
    out_dtype = _storable(np.dtype(target_fmt.result_dtype), kind)

    def pieces(e: ArrayEntry) -> Any:
        def run() -> Any:
            per_row = int(np.prod(e.shape[1:], dtype=np.int64)) * sources[e.label].lanes
            ranges = row_ranges(e.shape, -1, 1, False, _budget(chunk_bytes, e.dtype.itemsize)) if e.shape else [(0, 1)]
            for lo, hi in ranges:
                piece = e.read(lo, hi)
                out = _run_cast(piece, sources[e.label], target_fmt, options, None, index0=lo * per_row)
                progress(piece.nbytes)
                yield out.view(out_dtype) if out.dtype != out_dtype else out
        return run

    items = [(e.label, _out_shape(e.shape, sources[e.label], target_fmt), out_dtype, pieces(e)) for e in entries]
    _write_arrays(dst, kind, items)
    return [i[0] for i in items]


def error_table(src: str, *, name: str | None = None, formats: list[str] | None = None,
                scale_modes: list[str] | None = None, block_size: int = 32, axis: int = -1,
                chunk_bytes: int = 256 << 20, progress: Progress = _no_progress
                ) -> list[tuple[str, str, str, QuantizationError]]:
    """For each array of ``src``, every MX format x scale mode: (array, format, scale mode, stats),
    best SQNR first within each array."""
    from .mx import MX_FORMATS, SCALE_MODES

    entries = select_arrays(open_arrays(src), name)
    formats = list(MX_FORMATS) if formats is None else formats
    scale_modes = list(SCALE_MODES) if scale_modes is None else scale_modes
    rows = []
    for entry in entries:
        if not entry.shape:
            raise FileFormatError(f"{entry.where}: a 0-d array cannot be MX-quantised")
        jobs = {(f, m): mx_job(f, len(entry.shape), block_size=block_size, axis=axis, scale_mode=m)
                for f in formats for m in scale_modes}
        stats = {key: ErrorStats() for key in jobs}
        job0 = next(iter(jobs.values()))
        align_pack = any(j.pack for j in jobs.values())
        for lo, hi in row_ranges(entry.shape, job0.axis, job0.block_size, align_pack,
                                 _budget(chunk_bytes, entry.dtype.itemsize)):
            piece = entry.read(lo, hi)
            arr = _float_input(entry, piece)
            for key, job in jobs.items():
                stats[key].add(arr, job.quantize(arr, _source_format(arr)))
            progress(piece.nbytes)
        found = [(entry.label, f, m, stats[(f, m)].result()) for f, m in jobs]
        rows.extend(sorted(found, key=lambda r: -r[3].sqnr_db))
    return rows
