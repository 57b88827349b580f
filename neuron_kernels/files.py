"""Array files: ``.npy``, ``.npz`` and ``.safetensors`` inputs read in pieces, outputs written whole.

Inputs are read in row ranges along their first axis, so that a file larger than memory can be
processed piece by piece: a ``.npy`` file and an uncompressed ``.npz`` member through a memory map
of the requested rows only (unmapped when the piece is dropped), a compressed ``.npz`` member by
reading it whole (zip compression cannot be read from the middle), a ``.safetensors`` tensor
through the safetensors package's slices.

Outputs go to a temporary name beside the target and are renamed into place only once complete
(:func:`atomic_output`): an interrupted or failed run leaves no output behind. ``.npy`` and
``.npz`` outputs are written row range by row range (:class:`NpyWriter`, :class:`NpzWriter`);
a ``.safetensors`` output is assembled in memory, as the safetensors package writes whole dicts.

Every problem with a file raises :class:`FileFormatError`, whose message names the file and what
is wrong with it.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npformat

__all__ = [
    "FileFormatError",
    "ArrayEntry",
    "INPUT_SUFFIXES",
    "open_arrays",
    "check_output_path",
    "atomic_output",
    "NpyWriter",
    "NpzWriter",
    "write_safetensors",
    "stored_member_offset",
]

INPUT_SUFFIXES = (".npy", ".npz", ".safetensors")

#: safetensors dtype names and the numpy dtypes they are read as.
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


class FileFormatError(ValueError):
    """A file that cannot be read or written as asked (missing, unsupported, corrupt, exists)."""


@dataclass(frozen=True)
class ArrayEntry:
    """One array of an input file, read in pieces: :meth:`read_flat` gives the elements
    ``[start, stop)`` of its C-order flattening, :meth:`read` the rows ``[lo, hi)`` of its first axis."""

    path: str
    name: str | None  # None for a .npy file
    shape: tuple[int, ...]
    dtype: np.dtype
    _reader: Callable[[int, int], np.ndarray]  # flat C-order elements [start, stop), 1-D

    @property
    def label(self) -> str:
        return self.name if self.name is not None else os.path.basename(self.path)

    @property
    def where(self) -> str:
        """The array in messages: ``file`` or ``file[name]``."""
        return self.path if self.name is None else f"{self.path}[{self.name}]"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def read_flat(self, start: int, stop: int) -> np.ndarray:
        """Elements ``[start, stop)`` of the C-order flattening, as a 1-D array."""
        if stop <= start:
            return np.empty(0, self.dtype)
        return self._reader(start, stop)

    def read(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``[lo, hi)`` of the first axis (the whole array by default; a 0-d array whole)."""
        if not self.shape:
            return self._reader(0, 1).reshape(())
        hi = self.shape[0] if hi is None else hi
        row = int(np.prod(self.shape[1:], dtype=np.int64))
        return self.read_flat(lo * row, hi * row).reshape((hi - lo,) + self.shape[1:])


def _suffix(path: str, allowed: tuple[str, ...], what: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in allowed:
        raise FileFormatError(
            f"{path}: unsupported {what} file type {suffix or '(none)'!r}; use one of {', '.join(allowed)}"
        )
    return suffix


def open_arrays(path: str | os.PathLike[str]) -> list[ArrayEntry]:
    """The arrays of a ``.npy``, ``.npz`` or ``.safetensors`` file, without reading their data."""
    path = os.fspath(path)
    suffix = _suffix(path, INPUT_SUFFIXES, "input")
    if not os.path.isfile(path):
        raise FileFormatError(f"{path}: no such file" if not os.path.exists(path) else f"{path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise FileFormatError(f"{path}: not readable (permission denied)")
    try:
        if suffix == ".npy":
            return [_npy_entry(path, None, 0, os.path.getsize(path))]
        if suffix == ".npz":
            return _npz_entries(path)
        return _safetensors_entries(path)
    except FileFormatError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, struct.error, KeyError) as exc:
        raise FileFormatError(f"{path}: cannot read it as {suffix} ({exc})") from None


def _npy_header(fh: BinaryIO, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npformat.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except ValueError as exc:
        raise FileFormatError(f"{where}: not a valid .npy array ({exc})") from None
    if dtype.hasobject:
        raise FileFormatError(f"{where}: holds Python objects, which are never loaded")
    return tuple(int(n) for n in shape), bool(fortran), dtype


def _npy_entry(path: str, name: str | None, start: int, end: int) -> ArrayEntry:
    """The .npy array stored in ``path`` at bytes ``[start, end)`` (a whole file or a stored member)."""
    where = path if name is None else f"{path}[{name}]"
    with open(path, "rb") as fh:
        fh.seek(start)
        shape, fortran, dtype = _npy_header(fh, where)
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
                f_order = np.memmap(path, dtype, "r", offset=data, shape=shape[::-1]).T
                cache.append(np.ascontiguousarray(f_order).reshape(-1))
            return cache[0][start:stop]
        return np.memmap(path, dtype, "r", offset=data + start * dtype.itemsize, shape=(stop - start,))

    return ArrayEntry(path, name, shape, dtype, read)


def stored_member_offset(zf: zipfile.ZipFile, fh: BinaryIO, info: zipfile.ZipInfo) -> int:
    """The file offset of an uncompressed zip member's data (past its local header)."""
    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise FileFormatError(f"bad local header for member {info.filename}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _npz_entries(path: str) -> list[ArrayEntry]:
    entries = []
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            if info.compress_type == zipfile.ZIP_STORED:
                start = stored_member_offset(zf, fh, info)
                entries.append(_npy_entry(path, name, start, start + info.file_size))
            else:
                entries.append(_compressed_entry(path, zf, info, name))
    if not entries:
        raise FileFormatError(f"{path}: holds no arrays")
    return entries


def _compressed_entry(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> ArrayEntry:
    with zf.open(info) as member:
        shape, _, dtype = _npy_header(member, f"{path}[{name}]")  # type: ignore[arg-type]
    cache: list[np.ndarray] = []

    def read(start: int, stop: int) -> np.ndarray:
        if not cache:  # a compressed member can only be read from its start: read it once, whole
            try:
                with zipfile.ZipFile(path) as z, z.open(info) as member:
                    whole = npformat.read_array(member, allow_pickle=False)  # type: ignore[arg-type]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise FileFormatError(f"{path}[{name}]: cannot read the compressed member ({exc})") from None
            cache.append(np.ascontiguousarray(whole).reshape(-1))
        return cache[0][start:stop]

    return ArrayEntry(path, name, shape, dtype, read)


def _safetensors_entries(path: str) -> list[ArrayEntry]:
    from safetensors import SafetensorError, safe_open

    entries = []
    try:
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open objects are not iterable
                sl = f.get_slice(name)
                code = sl.get_dtype()
                if code not in _SAFETENSORS_DTYPES:
                    raise FileFormatError(f"{path}[{name}]: safetensors dtype {code} is not supported")
                from .formats import as_dtype

                dtype = np.dtype(as_dtype(_SAFETENSORS_DTYPES[code]))
                entries.append(ArrayEntry(path, name, tuple(sl.get_shape()), dtype, _safetensors_reader(path, name)))
    except SafetensorError as exc:
        raise FileFormatError(f"{path}: not a valid .safetensors file ({exc})") from None
    if not entries:
        raise FileFormatError(f"{path}: holds no tensors")
    return entries


def _safetensors_reader(path: str, name: str) -> Callable[[int, int], np.ndarray]:
    """Flat ranges through the package's slices of the first axis: the rows that cover the range
    are read, so a piece costs at most two first-axis rows more than its own size."""

    def read(start: int, stop: int) -> np.ndarray:
        from safetensors import safe_open

        with safe_open(path, framework="numpy") as f:
            sl = f.get_slice(name)
            shape = sl.get_shape()
            if not shape:
                return np.ascontiguousarray(f.get_tensor(name)).reshape(-1)[start:stop]
            row = int(np.prod(shape[1:], dtype=np.int64))
            lo, hi = start // row, -(-stop // row)
            rows = np.ascontiguousarray(sl[lo:hi]).reshape(-1)
            return rows[start - lo * row : stop - lo * row]

    return read


# ---- outputs ------------------------------------------------------------------------------------


def check_output_path(path: str, force: bool, inputs: tuple[str, ...] = ()) -> None:
    """Refuse an output that exists (without ``force``), is an input, or has no writable folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileFormatError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise FileFormatError(f"{path}: the folder {folder} is not writable")
    for src in inputs:
        if os.path.exists(path) and os.path.samefile(path, src):
            raise FileFormatError(f"{path}: is also the input; the input is never overwritten")
    if os.path.isdir(path):
        raise FileFormatError(f"{path}: is a folder")
    if os.path.exists(path) and not force:
        raise FileFormatError(f"{path}: exists; pass --force to overwrite it")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], force: bool = False, inputs: tuple[str, ...] = ()) -> Iterator[str]:
    """Yield a temporary path beside ``path``; rename it to ``path`` if the block completes, else
    remove it (on any exception, KeyboardInterrupt included)."""
    path = os.fspath(path)
    check_output_path(path, force, inputs)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".partial-{os.getpid()}-{base}")  # same suffix: writers go by it
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _write_npy_header(fh: BinaryIO, shape: tuple[int, ...], dtype: np.dtype) -> None:
    header = {"descr": npformat.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    try:
        npformat.write_array_header_1_0(fh, header)
    except ValueError:  # a header too long for version 1.0
        npformat.write_array_header_2_0(fh, header)


class _RowSink:
    """The elements of a C-order array appended in order to a binary stream, with a count check."""

    def __init__(self, fh: BinaryIO, shape: tuple[int, ...], dtype: Any, where: str) -> None:
        self.fh, self.shape, self.dtype, self.where = fh, tuple(shape), np.dtype(dtype), where
        self.expected = int(np.prod(shape, dtype=np.int64))
        self.written = 0
        _write_npy_header(fh, self.shape, self.dtype)

    def write(self, values: np.ndarray) -> None:
        """The next ``values.size`` elements (C order), whatever ``values``' shape."""
        if values.dtype != self.dtype:
            raise ValueError(f"{self.where}: {values.dtype} elements written to a {self.dtype} array")
        values = np.ascontiguousarray(values)
        self.fh.write(memoryview(values.reshape(-1).view(np.uint8)))
        self.written += values.size

    def write_bytes(self, raw: bytes) -> None:
        """Raw element bytes, in order (whole elements)."""
        self.fh.write(raw)
        self.written += len(raw) // self.dtype.itemsize

    def finish(self) -> None:
        if self.written != self.expected:
            raise ValueError(f"{self.where}: {self.written} elements written, {self.expected} expected")


class NpyWriter:
    """A ``.npy`` file written piece by piece in C order (``with NpyWriter(p, shape, dtype) as w``)."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype: Any) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 - closed in __exit__
        self._sink = _RowSink(self._fh, shape, dtype, path)

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


class NpzWriter:
    """A ``.npz`` file (uncompressed, zip64) written one member at a time, each piece by piece.

    ``with NpzWriter(path) as z: with z.member("w", shape, dtype) as m: m.write(rows)``.
    """

    def __init__(self, path: str) -> None:
        self._zip = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)

    @contextlib.contextmanager
    def member(self, name: str, shape: tuple[int, ...], dtype: Any) -> Iterator[_RowSink]:
        with self._zip.open(f"{name}.npy", "w", force_zip64=True) as fh:
            sink = _RowSink(fh, shape, dtype, f"{name}.npy")  # type: ignore[arg-type]
            yield sink
            sink.finish()

    def add(self, name: str, array: np.ndarray) -> None:
        with self.member(name, array.shape, array.dtype) as m:
            m.write(array)

    def __enter__(self) -> NpzWriter:
        return self

    def __exit__(self, *_: Any) -> None:
        self._zip.close()


def write_safetensors(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` with the safetensors package (which takes whole arrays)."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path)
