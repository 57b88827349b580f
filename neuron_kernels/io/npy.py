"""``.npy`` files: the header, an array read in pieces through memory maps, and written piece by
piece in C order (:class:`NpyWriter`; :class:`RowSink` also writes each member of a ``.npz``)."""

from __future__ import annotations

import os
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npformat

from ..errors import InvalidValueError
from .arrays import ArrayEntry, ArrayFileKind, FileFormatError, OutArray, mapped, register_file_kind

__all__ = ["NpyWriter", "RowSink", "npy_entry", "read_npy_header", "write_npy_header"]


def read_npy_header(fh: BinaryIO, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npformat.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(fh)
        else:
            raise InvalidValueError(f"unsupported .npy version {version}")
    except ValueError as exc:
        raise FileFormatError(f"{where}: not a valid .npy array ({exc})") from None
    if dtype.hasobject:
        raise FileFormatError(f"{where}: holds Python objects, which are never loaded")
    return tuple(int(n) for n in shape), bool(fortran), dtype


def npy_entry(path: str, name: str | None, start: int, end: int) -> ArrayEntry:
    """The .npy array stored in ``path`` at bytes ``[start, end)`` (a whole file or a stored member)."""
    where = path if name is None else f"{path}[{name}]"
    with open(path, "rb") as fh:
        fh.seek(start)
        shape, fortran, dtype = read_npy_header(fh, where)
        data = fh.tell()
    count = int(np.prod(shape, dtype=np.int64))
    if data + count * dtype.itemsize > end:
        raise FileFormatError(
            f"{where}: truncated ({end - data} bytes of data, {count * dtype.itemsize} expected "
            f"for shape {shape} {dtype})"
        )
    cache: list[np.ndarray] = []

    def read(start: int, stop: int) -> np.ndarray:
        if fortran:  # rare: C-order pieces are strided in the file; read it once, whole
            if not cache:
                f_order = mapped(path, dtype, data, count).reshape(shape[::-1]).T
                cache.append(np.ascontiguousarray(f_order).reshape(-1))
            return cache[0][start:stop]
        return mapped(path, dtype, data + start * dtype.itemsize, stop - start)

    return ArrayEntry(path, name, shape, dtype, read, None if fortran else data)


def write_npy_header(fh: BinaryIO, shape: tuple[int, ...], dtype: np.dtype) -> None:
    header = {"descr": npformat.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    try:
        npformat.write_array_header_1_0(fh, header)
    except ValueError:  # a header too long for version 1.0
        npformat.write_array_header_2_0(fh, header)


class RowSink:
    """The elements of a C-order array appended in order to a binary stream, with a count check."""

    def __init__(self, fh: BinaryIO, shape: tuple[int, ...], dtype: Any, where: str) -> None:
        self.fh, self.shape, self.dtype, self.where = fh, tuple(shape), np.dtype(dtype), where
        self.expected = int(np.prod(shape, dtype=np.int64))
        self.written = 0
        write_npy_header(fh, self.shape, self.dtype)

    def write(self, values: np.ndarray) -> None:
        """The next ``values.size`` elements (C order), whatever ``values``' shape."""
        if values.dtype != self.dtype:
            raise InvalidValueError(f"{self.where}: {values.dtype} elements written to a {self.dtype} array")
        values = np.ascontiguousarray(values)
        self.fh.write(memoryview(values.reshape(-1).view(np.uint8)))
        self.written += values.size

    def write_bytes(self, raw: bytes) -> None:
        """Raw element bytes, in order (whole elements)."""
        self.fh.write(raw)
        self.written += len(raw) // self.dtype.itemsize

    def finish(self) -> None:
        if self.written != self.expected:
            raise InvalidValueError(f"{self.where}: {self.written} elements written, {self.expected} expected")


class NpyWriter:
    """A ``.npy`` file written piece by piece in C order (``with NpyWriter(p, shape, dtype) as w``)."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype: Any) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 - closed in __exit__
        self._sink = RowSink(self._fh, shape, dtype, path)

    def write(self, rows: np.ndarray) -> None:
        self._sink.write(rows)

    def __enter__(self) -> NpyWriter:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        try:
            if kind is None:
                self._sink.finish()
        finally:
            self._fh.close()


def _write_npy(path: str, items: list[OutArray]) -> None:
    (item,) = items
    with NpyWriter(path, item.shape, item.dtype) as w:
        for piece in item.pieces():
            w.write(piece)


def _npy_file(path: str) -> list[ArrayEntry]:
    return [npy_entry(path, None, 0, os.path.getsize(path))]


register_file_kind(ArrayFileKind("npy", ".npy", _npy_file, _write_npy, one_array=True))
