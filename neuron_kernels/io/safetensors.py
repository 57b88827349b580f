"""``.safetensors`` files: the header read and checked (a dtype, shape or byte range the file does
not hold is refused before any data is read), tensors read through memory maps, and files whose
tensors are known up front written piece by piece, in any order (:class:`SafetensorsWriter`)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidValueError
from .arrays import ArrayEntry, ArrayFileKind, FileFormatError, OutArray, raw_entry, register_file_kind
from .untrusted import element_count, parse_json

__all__ = [
    "SAFETENSORS_DTYPES",
    "SafetensorsWriter",
    "TensorSpec",
    "read_safetensors_header",
    "safetensors_dtype_code",
]


#: safetensors dtype names and the numpy dtypes they are read as.
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
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
#: Shapes and offsets are Rust ``usize`` values in safetensors' reader: below 2^64.
_USIZE = 1 << 64


def safetensors_dtype_code(dtype: Any) -> str:
    """The safetensors name of a numpy / ml_dtypes dtype (``FileFormatError`` if it has none)."""
    name = np.dtype(dtype).name
    for code, numpy_name in SAFETENSORS_DTYPES.items():
        if numpy_name == name:
            return code
    raise FileFormatError(f"dtype {name} cannot be stored in a .safetensors file")


def read_safetensors_header(path: str) -> tuple[int, dict[str, str], dict[str, tuple[np.dtype, tuple[int, ...], int]]]:
    """(file offset of the data, ``__metadata__``, name -> (dtype, shape, file offset)) of a
    ``.safetensors`` file, every entry checked against the file before anything is read: a known
    dtype, a shape of non-negative ints, a byte range of the right length that the file holds.

    As strict as safetensors' own reader (``read_metadata`` and ``Metadata::validate`` in
    ``safetensors/src/tensor.rs``): a header of at most 100,000,000 bytes of UTF-8 JSON (nested at
    most 128 deep, serde_json's limit, no NaN, no key twice), ``__metadata__`` absent, null or an
    object of strings, every shape and offset below 2^64, the tensors' byte ranges contiguous from
    0 in the order of their offsets, and no byte after the last one."""
    from ..dtypes import as_dtype

    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise FileFormatError(f"{path}: not a valid .safetensors file (only {len(head)} bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise FileFormatError(
                f"{path}: not a valid .safetensors file (its header claims {length} bytes; the file holds {size} "
                f"and the format allows {_MAX_HEADER})"
            )
        raw = fh.read(length)
    try:
        header = parse_json(raw, strict=True)
    except ValueError as exc:
        raise FileFormatError(f"{path}: not a valid .safetensors file (its header {exc})") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{path}: not a valid .safetensors file (its header is not a JSON object)")
    data, held = 8 + length, size - 8 - length
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FileFormatError(f"{path}: not a valid .safetensors file (__metadata__ must map names to strings)")
    tensors: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        where = f"{path}[{name}]"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise FileFormatError(
                f"{where}: not a valid .safetensors entry (an object of dtype, shape and data_offsets; got "
                f"{_short(info)})"
            )
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
            raise FileFormatError(
                f"{where}: safetensors dtype {_short(code)} is not supported; "
                f"supported: {', '.join(SAFETENSORS_DTYPES)}"
            )
        if not isinstance(shape, list):
            raise FileFormatError(f"{where}: shape {_short(shape)} is not a list of non-negative integers")
        dtype = np.dtype(as_dtype(SAFETENSORS_DTYPES[code]))
        count = element_count(shape, where, "shape", _USIZE, dtype.itemsize)
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise FileFormatError(f"{where}: data_offsets {_short(offsets)} is not a pair [begin, end]")
        element_count(offsets, where, "data_offsets", _USIZE)
        begin, end = offsets
        nbytes = count * dtype.itemsize
        if nbytes >= _USIZE:
            raise FileFormatError(f"{where}: shape {_short(shape)} of {code} is 2^64 bytes or more")
        if end < begin or end - begin != nbytes:
            raise FileFormatError(
                f"{where}: its byte range [{begin}, {end}) does not fit shape {tuple(shape)} {dtype} ({nbytes} bytes)"
            )
        if end > held:
            raise FileFormatError(
                f"{where}: truncated file (the header places it at bytes [{begin}, {end}) of the data; "
                f"the file holds {held})"
            )
        tensors[name] = (dtype, tuple(shape), data + begin)
        spans.append((begin, end, name))
    _check_contiguous(path, sorted(spans), held)
    return data, metadata, tensors


def _check_contiguous(path: str, spans: list[tuple[int, int, str]], held: int) -> None:
    """The tensors' byte ranges, in order, must tile the data from its first byte to its last, as
    safetensors' reader requires (``Metadata::validate``): no gap, no overlap, nothing after."""
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the tensor before it" if begin < pos else f"leaves bytes [{pos}, {begin}) unused"
            raise FileFormatError(
                f"{path}[{name}]: its byte range [{begin}, {end}) {what}; the format's tensors tile the data "
                "contiguously, in the order of their offsets"
            )
        pos = end
    if pos != held:
        raise FileFormatError(
            f"{path}: {held - pos} byte(s) after the last tensor's data; the format allows none (its tensors end "
            f"at byte {pos} of the data)"
        )


def _short(value: Any, most: int = 80) -> str:
    """``repr(value)``, cut to ``most`` characters (a field of a header from anyone)."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _safetensors_entries(path: str) -> list[ArrayEntry]:
    _, _, tensors = read_safetensors_header(path)
    if not tensors:
        raise FileFormatError(f"{path}: holds no tensors")
    return [raw_entry(path, name, shape, dtype, offset) for name, (dtype, shape, offset) in tensors.items()]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a ``.safetensors`` file to be written: its name, dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


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


def _write_safetensors(path: str, items: list[OutArray]) -> None:
    specs = [TensorSpec(i.name, np.dtype(i.dtype), tuple(i.shape)) for i in items]
    with SafetensorsWriter(path, specs, {"format": "pt"}) as w:
        for item in items:
            with w.tensor(item.name) as t:
                for piece in item.pieces():
                    t.write(piece)


register_file_kind(
    ArrayFileKind("safetensors", ".safetensors", _safetensors_entries, _write_safetensors, native_dtypes=True)
)
