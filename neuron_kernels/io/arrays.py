"""Array files, whatever their kind: :class:`ArrayEntry` (one array of a file, read in flat
C-order pieces), :class:`OutArray` (one to write), and the table of file kinds
(:class:`ArrayFileKind`, :data:`ARRAY_FILES`), which each kind's module fills with
:func:`register_file_kind`; :func:`array_file_kind` is the one place that maps a path to its kind.
Every problem with a file raises :class:`FileFormatError`, naming the file and what is wrong."""

from __future__ import annotations

import math
import mmap
import os
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.lib.format as npformat

from ..errors import NeuronKernelsError

__all__ = [
    "FileFormatError",
    "ArrayEntry",
    "ArrayFileKind",
    "ARRAY_FILES",
    "OutArray",
    "array_file_kind",
    "mapped",
    "open_arrays",
    "raw_entry",
    "register_file_kind",
]


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
    #: The largest finite |value|, where it can be told without reading every value (a stored
    #: weight's, from its codes and block scales); None: read them.
    finite_amax: Callable[[], float] | None = None

    @property
    def label(self) -> str:
        return self.name if self.name is not None else os.path.basename(self.path)

    @property
    def where(self) -> str:
        """The array in messages: ``file`` or ``file[name]``."""
        return self.path if self.name is None else f"{self.path}[{self.name}]"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

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
        row = math.prod(self.shape[1:])
        return self.read_flat(lo * row, hi * row).reshape((hi - lo,) + self.shape[1:])


@dataclass(frozen=True)
class OutArray:
    """An array to write: name, shape, dtype (as stored), and ``pieces()``, which yields its
    consecutive C-order pieces (any shapes)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: Callable[[], Iterator[np.ndarray]] = field(repr=False)


@dataclass(frozen=True)
class ArrayFileKind:
    """One kind of array file: how to open it and how to write arrays to it.

    ``open(path)`` gives its arrays (no data read); ``write(path, items)`` writes
    :class:`OutArray` items piece by piece; ``one_array``: it holds exactly one array;
    ``native_dtypes``: it stores the ml_dtypes types (bfloat16, FP8) as themselves (otherwise as
    their unsigned-integer codes, see :meth:`stored_dtype`); ``block_file``: it is the package's
    block file, which holds quantised arrays with their scales (``quantize``'s output)."""

    name: str
    suffix: str
    open: Callable[[str], list[ArrayEntry]]
    write: Callable[[str, list[OutArray]], None]
    one_array: bool = False
    native_dtypes: bool = False
    block_file: bool = False

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


#: Every kind of array file, by suffix, in the order their modules registered them.
ARRAY_FILES: dict[str, ArrayFileKind] = {}


def register_file_kind(kind: ArrayFileKind) -> ArrayFileKind:
    """Add a kind of array file to :data:`ARRAY_FILES` (each kind's module does, on import)."""
    if kind.suffix in ARRAY_FILES:
        raise ValueError(f"a kind of array file is already registered for {kind.suffix}")
    ARRAY_FILES[kind.suffix] = kind
    return kind


def array_file_kind(path: str, role: str = "input") -> ArrayFileKind:
    """The record of the array file ``path`` by its suffix (``role`` names it in the error)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in ARRAY_FILES:
        raise FileFormatError(
            f"{path}: unsupported {role} file type {suffix or '(none)'!r}; use one of {', '.join(ARRAY_FILES)}"
        )
    return ARRAY_FILES[suffix]


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


def mapped(path: str, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
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


def raw_entry(path: str, name: str | None, shape: tuple[int, ...], dtype: np.dtype, offset: int) -> ArrayEntry:
    """An array stored as raw C-order bytes at ``offset`` of ``path``, read through memory maps."""

    def read(start: int, stop: int) -> np.ndarray:
        return mapped(path, dtype, offset + start * dtype.itemsize, stop - start)

    return ArrayEntry(path, name, shape, dtype, read, offset)
