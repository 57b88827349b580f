"""``.npy`` files: the header, an array read in pieces through memory maps, and written piece by
piece in C order (:class:`NpyWriter`; :class:`RowSink` also writes each member of a ``.npz``)."""

from __future__ import annotations

import ast
import math
import os
import struct
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npformat

from ..errors import InvalidValueError
from .arrays import ArrayEntry, ArrayFileKind, FileFormatError, OutArray, mapped, register_file_kind
from .untrusted import element_count

__all__ = ["NpyWriter", "RowSink", "npy_entry", "read_npy_header", "write_npy_header"]


#: What numpy's ``.npy`` reader accepts (``numpy/lib/format.py``: ``read_magic``,
#: ``_read_array_header``): the magic, versions 1.0 (a 2-byte header length, latin-1), 2.0 and 3.0
#: (4 bytes; 3.0 in UTF-8), a header of at most 10,000 characters (``_MAX_HEADER_SIZE``, its bound
#: for a file it does not trust) holding a Python literal dict of exactly these keys.
_MAGIC = b"\x93NUMPY"
_VERSIONS = {1: ("<H", "latin1"), 2: ("<I", "latin1"), 3: ("<I", "utf8")}
_MAX_HEADER_CHARS = 10_000
_KEYS = {"descr", "fortran_order", "shape"}


def read_npy_header(fh: BinaryIO, where: str, available: int) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the ``.npy`` header at ``fh``'s position, of which
    ``available`` bytes (header and data) belong to the array, read as numpy's reader reads it
    but stricter: every dimension an int >= 0 (not a bool), a shape numpy can make, no Python objects,
    no dtype of 0 bytes or with a subarray shape, and data of the size the header gives, held in ``available``; the
    Python-2 long suffix that numpy still filters out is refused. Any other header raises
    :class:`FileFormatError` naming ``where``."""

    def refuse(why: str) -> FileFormatError:
        return FileFormatError(f"{where}: not a valid .npy array ({why})")

    magic = fh.read(8)
    if len(magic) < 8 or magic[:6] != _MAGIC:
        raise refuse(f"it does not start with numpy's magic {_MAGIC!r}")
    major, minor = magic[6], magic[7]
    if major not in _VERSIONS or minor != 0:
        raise refuse(f"format version {major}.{minor}; numpy writes 1.0, 2.0 and 3.0")
    length_format, encoding = _VERSIONS[major]
    width = struct.calcsize(length_format)
    raw_length = fh.read(width)
    if len(raw_length) < width:
        raise refuse("truncated before its header length")
    (length,) = struct.unpack(length_format, raw_length)
    if length > 4 * _MAX_HEADER_CHARS or 8 + width + length > available:
        raise refuse(f"a header of {length} bytes; at most {_MAX_HEADER_CHARS} characters, inside the file")
    raw = fh.read(length)
    if len(raw) < length:
        raise refuse(f"truncated inside its header of {length} bytes")
    try:
        text = raw.decode(encoding)
        if len(text) > _MAX_HEADER_CHARS:
            raise ValueError(f"a header of {len(text)} characters, more than {_MAX_HEADER_CHARS}")
        header = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise refuse(f"its header is not a Python literal: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    if not isinstance(header, dict) or header.keys() != _KEYS:
        raise refuse("its header is not a dict of exactly 'descr', 'fortran_order' and 'shape'")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple):
        raise refuse(f"shape {shape!r:.80} is not a tuple of non-negative integers")
    if not isinstance(fortran, bool):
        raise refuse(f"fortran_order {fortran!r:.80} is not True or False")
    try:
        dtype = npformat.descr_to_dtype(header["descr"])
    except Exception:  # noqa: BLE001 - numpy's parse of a value from the file fails in many ways (SyntaxError too)
        raise refuse(f"descr {header['descr']!r:.80} is not a dtype numpy reads") from None
    if dtype.hasobject:
        raise FileFormatError(f"{where}: holds Python objects, which are never loaded")
    if dtype.subdtype is not None:  # numpy folds its shape into the array's; arrays of it are not read here
        raise refuse(f"its dtype {dtype} is a subarray dtype; a scalar or structured dtype is read")
    if dtype.itemsize == 0:  # numpy makes arrays of such a dtype ('<U0', 'V0') with items of another size
        raise refuse(f"its dtype {dtype} has no bytes per element")
    count = element_count(shape, where, "shape", itemsize=dtype.itemsize)
    if 8 + width + length + count * dtype.itemsize > available:
        raise FileFormatError(
            f"{where}: truncated ({available - 8 - width - length} bytes of data, {count * dtype.itemsize} "
            f"expected for shape {tuple(shape)} {dtype})"
        )
    return tuple(shape), fortran, dtype


def npy_entry(path: str, name: str | None, start: int, end: int) -> ArrayEntry:
    """The .npy array stored in ``path`` at bytes ``[start, end)`` (a whole file or a stored member)."""
    where = path if name is None else f"{path}[{name}]"
    size = os.path.getsize(path)
    if not 0 <= start <= end <= size:
        raise FileFormatError(
            f"{where}: truncated or corrupt: the array lies at bytes [{start}, {end}); the file holds {size}"
        )
    with open(path, "rb") as fh:
        fh.seek(start)
        shape, fortran, dtype = read_npy_header(fh, where, end - start)
        data = fh.tell()
    count = math.prod(shape)
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
        self.expected = math.prod(self.shape)
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
