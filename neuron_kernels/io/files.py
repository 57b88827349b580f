"""Array files: ``.npy``, ``.npz`` and ``.safetensors``, read and written in pieces.

Each kind of file is one record (:class:`ArrayFileKind`, all of them in :data:`ARRAY_FILES`) that
says how to open it (its arrays as :class:`ArrayEntry` objects, no data read) and how to write
arrays produced piece by piece; :func:`array_file_kind` is the one place that maps a path to its
record.

Inputs are read in flat C-order ranges, so that a file larger than memory can be processed piece
by piece: a ``.npy`` file, an uncompressed ``.npz`` member and a ``.safetensors`` tensor through a
memory map of the requested range only (unmapped when the piece is dropped), a compressed ``.npz``
member by reading it whole (zip compression cannot be read from the middle). ``.safetensors``
headers are read and checked here (:func:`read_safetensors_header`): a header that names a dtype,
a shape or a byte range the file does not hold is refused before any data is read.

Outputs go to a temporary name beside the target and are renamed into place only once complete
(:func:`atomic_output`, for a file or a directory): an interrupted or failed run, a full disk
included, leaves no output behind. Every output is written piece by piece
(:class:`NpyWriter`, :class:`NpzWriter`, :class:`SafetensorsWriter`).

Every problem with a file raises :class:`FileFormatError`, whose message names the file and what
is wrong with it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import shutil
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npformat

from ..errors import InvalidValueError, NeuronKernelsError

__all__ = [
    "FileFormatError",
    "ArrayEntry",
    "ArrayFileKind",
    "ARRAY_FILES",
    "OutArray",
    "array_file_kind",
    "open_arrays",
    "check_output_path",
    "atomic_output",
    "NpyWriter",
    "NpzWriter",
    "SafetensorsWriter",
    "TensorSpec",
    "read_safetensors_header",
    "safetensors_dtype_code",
    "stored_member_offset",
]

#: safetensors dtype names and the numpy dtypes they are read as.
SAFETENSORS_DTYPES = {
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
#: The largest header the safetensors format allows (its own readers refuse larger ones).
_MAX_HEADER = 100_000_000


class FileFormatError(NeuronKernelsError, ValueError):
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
    #: Where the elements lie in the file as raw C-order bytes (None: not stored that way), so
    #: that a copy can move bytes without reading them into memory.
    offset: int | None = None

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


def open_arrays(path: str | os.PathLike[str]) -> list[ArrayEntry]:
    """The arrays of a ``.npy``, ``.npz`` or ``.safetensors`` file, without reading their data."""
    path = os.fspath(path)
    kind = array_file_kind(path, "input")
    if not os.path.isfile(path):
        raise FileFormatError(f"{path}: no such file" if not os.path.exists(path) else f"{path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise FileFormatError(f"{path}: not readable (permission denied)")
    try:
        return kind.open(path)
    except FileFormatError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, struct.error, KeyError) as exc:
        raise FileFormatError(f"{path}: cannot read it as {kind.suffix} ({exc})") from None


def _npy_header(fh: BinaryIO, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
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


def _mapped(path: str, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """``count`` elements of ``dtype`` at byte ``offset`` of ``path``, read-only through a memory map.

    The map of one piece lives as long as the array viewing it, so pages read are released piece by
    piece. The file is opened by descriptor, not as a Python file object: numpy's ``memmap`` opens one
    before entering its ``with``, and an interrupt landing between the two (Ctrl-C during a long
    stream) leaves an unclosed file reported as a traceback at exit."""
    if count == 0:
        return np.empty(0, dtype)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    fd = os.open(path, os.O_RDONLY)
    try:
        view = mmap.mmap(fd, offset - start + count * dtype.itemsize, access=mmap.ACCESS_READ, offset=start)
    finally:
        os.close(fd)
    return np.frombuffer(view, dtype, count, offset - start)


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
                f_order = _mapped(path, dtype, data, count).reshape(shape[::-1]).T
                cache.append(np.ascontiguousarray(f_order).reshape(-1))
            return cache[0][start:stop]
        return _mapped(path, dtype, data + start * dtype.itemsize, stop - start)

    return ArrayEntry(path, name, shape, dtype, read, None if fortran else data)


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


def safetensors_dtype_code(dtype: Any) -> str:
    """The safetensors name of a numpy / ml_dtypes dtype (``FileFormatError`` if it has none)."""
    name = np.dtype(dtype).name
    for code, numpy_name in SAFETENSORS_DTYPES.items():
        if numpy_name == name:
            return code
    raise FileFormatError(f"dtype {name} cannot be stored in a .safetensors file")


def read_safetensors_header(path: str) -> tuple[int, dict[str, str], dict[str, tuple[np.dtype, tuple[int, ...], int]]]:
    """(file offset of the data, ``__metadata__``, name -> (dtype, shape, file offset)) of a
    ``.safetensors`` file, every entry checked against the file: a known dtype, a shape of
    non-negative ints, a byte range of the right length that the file holds."""
    from ..dtypes import as_dtype

    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise FileFormatError(f"{path}: not a valid .safetensors file (only {len(head)} bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise FileFormatError(
                f"{path}: not a valid .safetensors file (its header claims {length} bytes; the file holds {size})"
            )
        raw = fh.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FileFormatError(f"{path}: not a valid .safetensors file (its header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{path}: not a valid .safetensors file (its header is not a JSON object)")
    data, held = 8 + length, size - 8 - length
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FileFormatError(f"{path}: not a valid .safetensors file (__metadata__ must map names to strings)")
    tensors: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
    for name, info in header.items():
        where = f"{path}[{name}]"
        try:
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise FileFormatError(f"{where}: not a valid .safetensors entry ({info!r})") from None
        if code not in SAFETENSORS_DTYPES:
            raise FileFormatError(
                f"{where}: safetensors dtype {code!r} is not supported; supported: {', '.join(SAFETENSORS_DTYPES)}"
            )
        ints = [*shape, begin, end] if isinstance(shape, list) else None
        if ints is None or not all(type(v) is int and v >= 0 for v in ints):
            raise FileFormatError(f"{where}: not a valid .safetensors entry (shape {shape!r}, offsets {begin}, {end})")
        dtype = np.dtype(as_dtype(SAFETENSORS_DTYPES[code]))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != nbytes:
            raise FileFormatError(
                f"{where}: its byte range [{begin}, {end}) does not fit shape {tuple(shape)} {dtype} ({nbytes} bytes)"
            )
        if end > held:
            raise FileFormatError(
                f"{where}: truncated file (the header places it at bytes [{begin}, {end}) of the data; "
                f"the file holds {held})"
            )
        tensors[name] = (dtype, tuple(shape), data + begin)
    return data, metadata, tensors


def _raw_entry(path: str, name: str | None, shape: tuple[int, ...], dtype: np.dtype, offset: int) -> ArrayEntry:
    """An array stored as raw C-order bytes at ``offset`` of ``path``, read through memory maps."""

    def read(start: int, stop: int) -> np.ndarray:
        return _mapped(path, dtype, offset + start * dtype.itemsize, stop - start)

    return ArrayEntry(path, name, shape, dtype, read, offset)


def _safetensors_entries(path: str) -> list[ArrayEntry]:
    _, _, tensors = read_safetensors_header(path)
    if not tensors:
        raise FileFormatError(f"{path}: holds no tensors")
    return [_raw_entry(path, name, shape, dtype, offset) for name, (dtype, shape, offset) in tensors.items()]


# ---- outputs ------------------------------------------------------------------------------------


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two paths is the other or lies inside it (symlinks resolved)."""
    ra, rb = os.path.realpath(a), os.path.realpath(b)
    return ra == rb or ra.startswith(rb.rstrip(os.sep) + os.sep) or rb.startswith(ra.rstrip(os.sep) + os.sep)


def check_output_path(path: str, force: bool, inputs: tuple[str, ...] = (), directory: bool = False) -> None:
    """Refuse an output that exists (without ``force``), is an input, lies inside an input folder
    (or holds one), or has no writable folder. ``directory``: the output is a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileFormatError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise FileFormatError(f"{path}: the folder {folder} is not writable")
    for src in inputs:
        if os.path.exists(path) and os.path.samefile(path, src):
            raise FileFormatError(f"{path}: is also the input; the input is never overwritten")
        if os.path.isdir(src) and _overlaps(path, src):
            raise FileFormatError(
                f"{path}: lies inside the input folder {src} (or holds it); write the output elsewhere"
            )
    if os.path.isdir(path) and not directory:
        raise FileFormatError(f"{path}: is a folder")
    if os.path.exists(path) and directory and not os.path.isdir(path):
        raise FileFormatError(f"{path}: exists and is not a folder")
    if os.path.exists(path) and not force:
        raise FileFormatError(f"{path}: exists; pass --force to overwrite it")


#: Errors of a write that ran out of room (disk full, quota, file size limit).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str], force: bool = False, inputs: tuple[str, ...] = (), directory: bool = False
) -> Iterator[str]:
    """Yield a temporary path beside ``path`` (an empty folder with ``directory``); rename it to
    ``path`` if the block completes, else remove it (on any exception, KeyboardInterrupt
    included). A write that runs out of room becomes a :class:`FileFormatError` saying so."""
    path = os.fspath(path)
    check_output_path(path, force, inputs, directory)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".partial-{os.getpid()}-{base}")  # same suffix: writers go by it
    old = os.path.join(folder, f".replaced-{os.getpid()}-{base}")
    if directory:
        os.mkdir(tmp)
    try:
        try:
            yield tmp
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise FileFormatError(
                    f"{path}: writing failed ({exc.strerror or exc}); no output was written"
                ) from None
            raise
        if directory and os.path.isdir(path):  # --force on an existing folder: swap, then remove it
            os.rename(path, old)
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, old):
            if os.path.isdir(leftover) and not os.path.islink(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)


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


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a ``.safetensors`` file to be written: its name, dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class _TensorSink:
    """The bytes of one tensor of a :class:`SafetensorsWriter`, appended in C order."""

    def __init__(self, fd: int, spec: TensorSpec, offset: int, where: str) -> None:
        self._fd, self.spec, self._pos, self._end, self._where = fd, spec, offset, offset + spec.nbytes, where

    def write(self, values: np.ndarray | bytes | memoryview) -> None:
        """The next elements (an array of the tensor's dtype, any shape) or raw bytes."""
        if isinstance(values, np.ndarray):
            if values.dtype != self.spec.dtype:
                raise InvalidValueError(f"{self._where}: {values.dtype} elements written to a {self.spec.dtype} tensor")
            raw: Any = memoryview(np.ascontiguousarray(values).reshape(-1).view(np.uint8))
        else:
            raw = memoryview(values).cast("B")
        if self._pos + len(raw) > self._end:
            raise InvalidValueError(f"{self._where}: more bytes written than its shape {self.spec.shape} holds")
        while len(raw):
            done = os.pwrite(self._fd, raw, self._pos)
            self._pos += done
            raw = raw[done:]

    def copy_from(self, path: str, offset: int, nbytes: int) -> None:
        """``nbytes`` raw bytes of ``path`` at ``offset``, copied by the kernel where it can."""
        if self._pos + nbytes > self._end:
            raise InvalidValueError(f"{self._where}: more bytes written than its shape {self.spec.shape} holds")
        with open(path, "rb") as src:
            fd_in = src.fileno()
            while nbytes:
                try:
                    done = os.copy_file_range(fd_in, self._fd, min(nbytes, 1 << 30), offset, self._pos)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    done = 0
                if done == 0:  # not supported here, or the source ended: fall back to reads
                    block = os.pread(fd_in, min(nbytes, 1 << 24), offset)
                    if not block:
                        raise FileFormatError(f"{path}: ended early (truncated while being read?)")
                    self.write(block)
                    done = len(block)
                else:
                    self._pos += done
                offset += done
                nbytes -= done

    def finish(self) -> None:
        if self._pos != self._end:
            raise InvalidValueError(
                f"{self._where}: {self._pos - self._end + self.spec.nbytes} bytes written, {self.spec.nbytes} expected"
            )


class SafetensorsWriter:
    """A ``.safetensors`` file whose tensors are known up front and written piece by piece, in
    any order: ``with SafetensorsWriter(path, specs) as w: with w.tensor(name) as t: t.write(piece)``.

    The header (``__metadata__`` and every tensor's dtype, shape and byte range) is written first;
    each tensor then fills its own byte range, so that several tensors may be written at once
    (the codes and the scales of one quantised weight). Tensors are laid out by decreasing item
    size (then in the given order), so that every tensor is aligned to its item size, as the
    safetensors package lays them out.
    """

    def __init__(self, path: str, specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None) -> None:
        self._path = path
        specs = list(specs)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise InvalidValueError(f"{path}: a tensor name appears twice")
        order = sorted(range(len(specs)), key=lambda i: (-np.dtype(specs[i].dtype).itemsize, i))
        header: dict[str, Any] = {"__metadata__": dict(metadata or {})} if metadata else {}
        pos = 0
        offsets: dict[str, int] = {}
        for i in order:
            spec = specs[i]
            header[spec.name] = {
                "dtype": safetensors_dtype_code(spec.dtype),
                "shape": list(spec.shape),
                "data_offsets": [pos, pos + spec.nbytes],
            }
            offsets[spec.name] = pos
            pos += spec.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._specs = {s.name: s for s in specs}
        self._data = 8 + len(raw)
        self._offsets = offsets
        self._done: set[str] = set()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(self._fd, struct.pack("<Q", len(raw)) + raw)
        except BaseException:
            os.close(self._fd)
            raise
        self.nbytes = self._data + pos

    @contextlib.contextmanager
    def tensor(self, name: str) -> Iterator[_TensorSink]:
        """The sink of tensor ``name``; its bytes must all be written before the block ends."""
        sink = _TensorSink(self._fd, self._specs[name], self._data + self._offsets[name], f"{self._path}[{name}]")
        yield sink
        sink.finish()
        self._done.add(name)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        try:
            if kind is None:
                missing = [n for n in self._specs if n not in self._done]
                if missing:
                    raise InvalidValueError(f"{self._path}: tensors never written: {', '.join(missing[:5])}")
                os.ftruncate(self._fd, self.nbytes)
        finally:
            os.close(self._fd)


# ---- the records of array files -------------------------------------------------------------------


@dataclass(frozen=True)
class OutArray:
    """An array to write: name, shape, dtype (as stored), and ``pieces()``, which yields its
    consecutive C-order pieces (any shapes)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: Callable[[], Iterator[np.ndarray]] = field(repr=False)


def _write_npy(path: str, items: list[OutArray]) -> None:
    (item,) = items
    with NpyWriter(path, item.shape, item.dtype) as w:
        for piece in item.pieces():
            w.write(piece)


def _write_npz(path: str, items: list[OutArray]) -> None:
    with NpzWriter(path) as z:
        for item in items:
            with z.member(item.name, item.shape, item.dtype) as m:
                for piece in item.pieces():
                    m.write(piece)


def _write_safetensors(path: str, items: list[OutArray]) -> None:
    specs = [TensorSpec(i.name, np.dtype(i.dtype), tuple(i.shape)) for i in items]
    with SafetensorsWriter(path, specs, {"format": "pt"}) as w:
        for item in items:
            with w.tensor(item.name) as t:
                for piece in item.pieces():
                    t.write(piece)


@dataclass(frozen=True)
class ArrayFileKind:
    """One kind of array file: how to open it and how to write arrays to it.

    ``open(path)`` gives its arrays (no data read); ``write(path, items)`` writes
    :class:`OutArray` items piece by piece; ``one_array``: it holds exactly one array;
    ``native_dtypes``: it stores the ml_dtypes types (bfloat16, FP8) as themselves (otherwise as
    their unsigned-integer codes, see :meth:`stored_dtype`)."""

    name: str
    suffix: str
    open: Callable[[str], list[ArrayEntry]]
    write: Callable[[str, list[OutArray]], None]
    one_array: bool = False
    native_dtypes: bool = False

    def stored_dtype(self, dtype: Any) -> np.dtype:
        """The dtype an array of ``dtype`` is written with: .npy/.npz cannot describe the
        ml_dtypes types (bfloat16, FP8, ...), which are stored there as their unsigned-integer codes."""
        dtype = np.dtype(dtype)
        if self.native_dtypes:
            return dtype
        try:
            if npformat.descr_to_dtype(npformat.dtype_to_descr(dtype)) == dtype:
                return dtype
        except (TypeError, ValueError):
            pass
        return np.dtype(f"u{dtype.itemsize}")

    def check_count(self, path: str, count: int) -> None:
        """Refuse ``count`` arrays for a file that holds one."""
        if self.one_array and count != 1:
            raise FileFormatError(
                f"{path}: a {self.suffix} file holds one array and there are {count}; write .npz or "
                f".safetensors, or pick one array by name"
            )


def _npy_file(path: str) -> list[ArrayEntry]:
    return [_npy_entry(path, None, 0, os.path.getsize(path))]


#: Every kind of array file, by suffix.
ARRAY_FILES: dict[str, ArrayFileKind] = {
    ".npy": ArrayFileKind("npy", ".npy", _npy_file, _write_npy, one_array=True),
    ".npz": ArrayFileKind("npz", ".npz", _npz_entries, _write_npz),
    ".safetensors": ArrayFileKind("safetensors", ".safetensors", _safetensors_entries, _write_safetensors,
                                  native_dtypes=True),
}  # fmt: skip


def array_file_kind(path: str, role: str = "input") -> ArrayFileKind:
    """The record of the array file ``path`` by its suffix (``role`` names it in the error)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in ARRAY_FILES:
        raise FileFormatError(
            f"{path}: unsupported {role} file type {suffix or '(none)'!r}; use one of {', '.join(ARRAY_FILES)}"
        )
    return ARRAY_FILES[suffix]
