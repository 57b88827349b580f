"""GGUF files (llama.cpp's): the header (read and written here, in the layout of ggml's ``gguf.h``,
with gguf-py's tables of tensor types and block sizes; the tests read every file written with
gguf-py's own reader), the tensor data read through memory maps and written piece by piece, and
the byte layout of the two FP4 block types.

- :func:`open_gguf` reads the header (metadata and tensor table) of a file and checks that every
  tensor's data lies inside it; :class:`GgufTensor` is one tensor, :meth:`GgufTensor.entry` its
  values as an :class:`~.arrays.ArrayEntry` (float types) and :meth:`GgufTensor.raw` its stored
  bytes.
- :class:`GgufOutput` writes a file: the metadata entries of a source file as stored, some keys
  changed, a tensor table declared up front, then each tensor's bytes in order, in pieces.
- :func:`mxfp4_blocks`, :func:`nvfp4_blocks` and their inverses re-lay 4-bit codes (one per byte)
  and block scale bytes into ggml's blocks and back: ``block_mxfp4`` (type 39) is the e8m0 scale
  then 16 bytes, byte ``j`` holding element ``j`` in its low nibble and element ``j + 16`` in its
  high nibble; ``block_nvfp4`` (type 40) covers 64 elements, four UE4M3 scales (one per 16) then
  32 bytes, byte ``8 s + j`` holding elements ``16 s + j`` (low) and ``16 s + j + 8`` (high). The
  4-bit codes are E2M1's, as everywhere else (ggml's value table is E2M1's doubled).

GGUF shapes are numpy's here (the slowest axis first), the reverse of ggml's ``ne``.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from .arrays import ArrayEntry, FileFormatError, mapped, raw_entry
from .untrusted import element_count

__all__ = [
    "UINT32",
    "GGUF_SUFFIX",
    "GgufField",
    "GgufFile",
    "GgufOutput",
    "GgufTensor",
    "ggml_type",
    "mxfp4_blocks",
    "mxfp4_codes",
    "nvfp4_blocks",
    "nvfp4_codes",
    "open_gguf",
]

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"
_VERSIONS = (2, 3)

#: numpy dtypes of the plain GGUF types whose values the package reads and writes directly.
_PLAIN = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}


def _gguf() -> Any:
    import gguf

    return gguf


def ggml_type(name: str) -> Any:
    """gguf-py's ``GGMLQuantizationType`` member named ``name`` (``"NVFP4"``, ``"F32"``, ...)."""
    return _gguf().GGMLQuantizationType[name]


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file: ``type`` its ggml type's name (``F32``, ``BF16``, ``NVFP4``,
    ``Q8_0``, ...), ``shape`` in numpy order, ``offset`` and ``nbytes`` where its data lies."""

    path: str
    name: str
    type: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def plain(self) -> bool:
        """Whether its values are stored as F32, F16 or BF16 (no blocks)."""
        return self.type in _PLAIN

    @property
    def block(self) -> tuple[int, int]:
        """ggml's (elements, bytes) of one block of its type ((1, itemsize) for a plain type)."""
        elements, nbytes = _gguf().GGML_QUANT_SIZES[ggml_type(self.type)]
        return int(elements), int(nbytes)

    def entry(self) -> ArrayEntry:
        """Its values, read in pieces (a plain type only)."""
        if not self.plain:
            raise FileFormatError(f"{self.path}[{self.name}]: stored as {self.type}, not as F32, F16 or BF16")
        return raw_entry(self.path, self.name, self.shape, _PLAIN[self.type], self.offset)

    def raw(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Bytes ``[start, stop)`` of its data, through a memory map."""
        stop = self.nbytes if stop is None else stop
        return mapped(self.path, np.dtype(np.uint8), self.offset + start, stop - start)

    def rows(self) -> np.ndarray:
        """Its stored bytes as (rows, bytes of a row): one row per ggml row (the last axis)."""
        row = self.shape[-1] // self.block[0] * self.block[1] if self.shape else self.nbytes
        if self.nbytes == 0:
            return np.empty((0, row), np.uint8)
        return self.raw().reshape(-1, row)

    def decoded(self) -> np.ndarray:
        """Its values as float32 through gguf-py's own decoding (any type gguf-py decodes)."""
        if self.plain:
            return np.asarray(self.entry().read(), np.float32)
        if not self.size:  # gguf-py's decoding takes no empty tensor
            return np.zeros(self.shape, np.float32)
        quants = _gguf().quants
        try:
            with np.errstate(all="ignore"):  # NaN or infinite scales decode as NaN: the file's values
                values = quants.dequantize(self.rows(), ggml_type(self.type))
        except NotImplementedError:
            raise FileFormatError(
                f"{self.path}[{self.name}]: gguf-py cannot decode type {self.type}; it is copied as stored"
            ) from None
        return np.asarray(values, np.float32).reshape(self.shape)


#: GGUF value types (``gguf_type`` in ggml's ``gguf.h``): the struct format of each scalar type.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: The GGUF value type of ``general.file_type``.
UINT32 = 4
#: Arrays of arrays: gguf-py reads them, ggml's reader refuses them; the package reads a few levels.
_MAX_ARRAY_NESTING = 4
#: ggml's bounds on a tensor (``ggml.h``): at most 4 dimensions, a name of fewer than 64 bytes.
_MAX_DIMS = 4
_MAX_NAME = 64
_INT64 = 1 << 63


class _Cursor:
    """Little-endian reads from a buffer (a memory map of the file), advancing a position; a read
    past the end raises ``IndexError``, a string that is not UTF-8 (gguf-py decodes every key,
    name and string strictly) ``UnicodeDecodeError``, an unknown value type ``ValueError``."""

    def __init__(self, buf: Any, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > len(self.buf) - self.pos:
            raise IndexError("a string runs past the end of the file")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def skip(self, kind: int, depth: int = 0) -> None:
        """Past one value of GGUF type ``kind``, every string in it checked as UTF-8."""
        if kind in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            self.string()
        elif kind == _ARRAY:
            if depth >= _MAX_ARRAY_NESTING:
                raise ValueError(f"arrays nested more than {_MAX_ARRAY_NESTING} deep")
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item])
            elif item in (_STRING, _ARRAY):
                for _ in range(count):  # each item takes at least 8 bytes: the file ends the loop
                    self.skip(item, depth + 1)
            else:
                raise ValueError(f"unknown GGUF value type {item}")
        else:
            raise ValueError(f"unknown GGUF value type {kind}")
        if self.pos > len(self.buf):
            raise IndexError("a value runs past the end of the file")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        item, count = self.scalar("<I"), self.scalar("<Q")
        if item in _SCALARS:
            dtype = np.dtype(_SCALARS[item])
            values = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            return values.tolist()
        return [self.value(item) for _ in range(count)]


@dataclass(frozen=True)
class GgufField:
    """One metadata entry: its key, GGUF value type and the entry's bytes as stored (key, type and
    value), copied as they are into a file written from this one."""

    key: str
    type: int
    raw: bytes
    value_at: int

    def contents(self) -> Any:
        """The value: a number, a string, or a list of them (an array)."""
        return _Cursor(self.raw, self.value_at).value(self.type)


def _field_bytes(key: str, kind: int, value: Any) -> bytes:
    """A metadata entry of a scalar or string value, as GGUF stores it."""
    name = key.encode()
    head = struct.pack("<Q", len(name)) + name + struct.pack("<I", kind)
    if kind == _STRING:
        text = str(value).encode()
        return head + struct.pack("<Q", len(text)) + text
    return head + struct.pack(_SCALARS[kind], value)


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file's header: ``fields`` its metadata entries by key, ``tensors`` its tensor table
    in file order, ``alignment`` that of its tensor data."""

    path: str
    version: int
    alignment: int
    fields: dict[str, GgufField]
    tensors: dict[str, GgufTensor]

    def value(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def count(self, key: str, default: int = 0, most: int | None = None) -> int:
        """The value of ``key``, a count: a non-negative integer (at most ``most``), or ``default``
        where the key is absent; another value raises :class:`FileFormatError`."""
        value = self.value(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (most is not None and value > most):
            bound = f" of at most {most}" if most is not None else ""
            raise FileFormatError(f"{self.path}: {key} is {value!r:.80}; a non-negative integer{bound} is read")
        return value

    @property
    def architecture(self) -> str | None:
        arch = self.value("general.architecture")
        return None if arch is None else str(arch)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def open_gguf(path: str | os.PathLike[str]) -> GgufFile:
    """Read the header of a GGUF file (version 2 or 3, little-endian; the layout of ggml's
    ``gguf.h``, the tensor types and block sizes gguf-py's). A file that is not GGUF, of another
    version, with a tensor type gguf-py does not know, or shorter than its header or tensor table
    says raises :class:`FileFormatError`. (gguf-py's own reader takes seconds over the
    vocabulary of a large model; this one reads the metadata's arrays only when asked.)"""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path}: is a folder, not a GGUF file") from None
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise FileFormatError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
        buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    with buf:
        return _header(path, buf, size)


def _header(path: str, buf: Any, size: int) -> GgufFile:
    """The header, as strict as gguf-py's reader (``gguf/gguf_reader.py``: every key, tensor name
    and string UTF-8, no key or tensor name twice, ``general.alignment`` a UINT32 power of two)
    and as ggml's (``ggml/src/gguf.cpp``, ``gguf_init_from_reader``: no empty key, at most 4
    dimensions, names shorter than 64 bytes, dimensions and element counts below 2^63, rows of whole
    blocks, each tensor's data at the offset where the previous one's ends, padded to the
    alignment), and stricter where a number would otherwise reach an allocation: the alignment no
    larger than the file, every tensor's data inside it."""
    if buf[:4] != _MAGIC:
        raise FileFormatError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    version = int.from_bytes(buf[4:8], "little")
    if version not in _VERSIONS:
        raise FileFormatError(
            f"{path}: GGUF version {version} is not read here (versions {', '.join(map(str, _VERSIONS))}, "
            "little-endian)"
        )
    gguf = _gguf()
    cur = _Cursor(buf, 8)
    fields: dict[str, GgufField] = {}
    infos = []
    try:
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        for _ in range(n_kv):  # each entry takes at least 13 bytes: the file ends the loop
            start = cur.pos
            key = cur.string()
            if not key or key in fields:
                raise ValueError(f"the key {key!r} is empty or appears twice" if key else "an empty key")
            kind = cur.scalar("<I")
            value_at = cur.pos - start
            cur.skip(kind)
            fields[key] = GgufField(key, kind, bytes(buf[start : cur.pos]), value_at)
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > _MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions; ggml's tensors have at most {_MAX_DIMS}")
            dims = [cur.scalar("<Q") for _ in range(n_dims)]
            infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
    except (struct.error, IndexError, ValueError, OverflowError) as exc:  # UnicodeDecodeError is a ValueError
        raise FileFormatError(f"{path}: truncated or corrupt GGUF header ({size} bytes): {exc}") from None
    alignment = _alignment(path, fields, size)
    data = cur.pos + (-cur.pos % alignment)
    tensors: dict[str, GgufTensor] = {}
    known = {int(t): t.name for t in gguf.GGMLQuantizationType}
    expected = 0  # where the next tensor's data starts, past the previous one's, padded
    for name, dims, kind, offset in infos:
        where = f"{path}[{name}]"
        if kind not in known:
            raise FileFormatError(
                f"{where}: unknown ggml tensor type {kind} (gguf-py {gguf_version()} knows {', '.join(known.values())})"
            )
        if name in tensors:
            raise FileFormatError(f"{path}: two tensors are named {name}")
        if not name or len(name.encode()) >= _MAX_NAME:
            raise FileFormatError(
                f"{where}: a tensor name of {len(name.encode())} bytes; ggml's are 1 to {_MAX_NAME - 1}"
            )
        shape = tuple(reversed(dims))
        count = element_count(shape, where, "shape", _INT64, 8)
        if count >= _INT64:
            raise FileFormatError(
                f"{where}: shape {list(shape)} holds 2^63 elements or more (ggml counts them in int64)"
            )
        tensor = GgufTensor(path, name, known[kind], shape, data + offset, 0)
        elements, nbytes = tensor.block
        row = shape[-1] if shape else 1
        if row % elements:
            raise FileFormatError(f"{where}: rows of {row} are not whole {tensor.type} blocks of {elements}")
        tensor = replace(tensor, nbytes=count // elements * nbytes)
        if offset != expected:
            raise FileFormatError(
                f"{where}: its data is at offset {offset} of the data section; ggml reads it at {expected} (each "
                f"tensor's data follows the previous one's, padded to the alignment {alignment})"
            )
        if tensor.offset + tensor.nbytes > size:
            raise FileFormatError(
                f"{path}: truncated: tensor {name} ends at byte {tensor.offset + tensor.nbytes}, the file has {size}"
            )
        expected += tensor.nbytes + (-tensor.nbytes % alignment)
        tensors[name] = tensor
    return GgufFile(path, version, alignment, fields, tensors)


def _alignment(path: str, fields: dict[str, GgufField], size: int) -> int:
    """``general.alignment``: a UINT32 (gguf-py and ggml refuse another type), a power of two, and
    no larger than the file (the padding written for it in a new file is paid for by the input)."""
    field = fields.get("general.alignment")
    if field is None:
        return 32
    alignment = field.contents()
    if field.type != UINT32 or not isinstance(alignment, int):
        raise FileFormatError(
            f"{path}: general.alignment is stored as GGUF type {field.type}; gguf-py and ggml read a UINT32 ({UINT32})"
        )
    if alignment <= 0 or alignment & (alignment - 1):
        raise FileFormatError(f"{path}: general.alignment {alignment!r} is not a power of two")
    if alignment > size:
        raise FileFormatError(f"{path}: general.alignment {alignment} is larger than the file ({size} bytes)")
    return alignment


def gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


class GgufOutput:
    """A GGUF file (version 3) written in one pass: :meth:`add` declares each tensor (name, numpy
    shape, ggml type) in file order, :meth:`begin` writes the header (the metadata entries of
    ``source`` as stored, in its order, with ``changes`` applied: key -> (value, GGUF value type of
    a scalar or string), None to drop a key), then :meth:`write` takes each tensor's bytes in
    order, in pieces of any size."""

    def __init__(self, path: str, source: GgufFile, changes: dict[str, tuple[Any, int] | None]) -> None:
        self.path = path
        self._source = source
        self._changes = changes
        self._planned: list[tuple[str, tuple[int, ...], int, int]] = []  # name, shape, type, bytes
        self._current = 0
        self._left = 0
        self._written = 0  # bytes handed to the writer thread so far
        self._out: BinaryIO | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[Any]] = deque()

    def add(self, name: str, shape: tuple[int, ...], type_name: str) -> None:
        kind = ggml_type(type_name)
        elements, nbytes = _gguf().GGML_QUANT_SIZES[kind]
        size = math.prod(shape)
        self._planned.append((name, shape, int(kind), size // elements * nbytes))

    def _header(self) -> bytes:
        fields = []
        for key, field in self._source.fields.items():  # in the source's order, a changed key in its place
            if key in self._changes:
                change = self._changes[key]
                if change is not None:
                    fields.append(_field_bytes(key, int(change[1]), change[0]))
            else:
                fields.append(field.raw)
        for key, change in self._changes.items():
            if change is not None and key not in self._source.fields:
                fields.append(_field_bytes(key, int(change[1]), change[0]))
        head = [_MAGIC, struct.pack("<IQQ", 3, len(self._planned), len(fields)), *fields]
        offset, align = 0, self._source.alignment
        for name, shape, kind, nbytes in self._planned:
            encoded = name.encode()
            dims = struct.pack(f"<{len(shape)}Q", *reversed(shape))
            head += [struct.pack("<Q", len(encoded)), encoded, struct.pack("<I", len(shape)), dims]
            head.append(struct.pack("<IQ", kind, offset))
            offset += nbytes + (-nbytes % align)
        return b"".join(head)

    def begin(self) -> None:
        self._out = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nk-gguf-writer")
        self._emit(np.frombuffer(self._header(), np.uint8))
        self._pad()
        self._left = self._planned[0][3] if self._planned else 0
        self._skip_empty()

    def _emit(self, data: np.ndarray) -> None:
        """Hand ``data`` to the writer thread, which writes while the caller makes the next piece
        (at most two pieces wait; an error of the writer is raised here, at the next piece)."""
        assert self._pool is not None and self._out is not None
        while len(self._pending) >= 2:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._out.write, data.data))
        self._written += data.nbytes

    def _pad(self) -> None:
        left = -self._written % self._source.alignment  # at most the alignment, at most the input's size
        while left:
            n = min(left, 1 << 20)
            self._emit(np.zeros(n, np.uint8))
            left -= n

    def _skip_empty(self) -> None:
        while self._left == 0 and self._current < len(self._planned):
            self._pad()
            self._current += 1
            self._left = self._planned[self._current][3] if self._current < len(self._planned) else -1

    def write(self, data: np.ndarray) -> None:
        """The next bytes of the current tensor (any array: its bytes in C order)."""
        assert self._out is not None
        n = data.nbytes
        if n == 0:  # a tensor of no element (whose place is passed already)
            return
        if n > self._left:
            name = self._planned[self._current][0] if self._current < len(self._planned) else "(none)"
            raise RuntimeError(f"{n} bytes written to {name}, {self._left} were left")
        self._emit(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        self._left -= n
        self._skip_empty()

    def close(self, failed: bool = False) -> None:
        """Wait for the writer and close the file (``failed``: without raising the writer's errors)."""
        if self._out is None:
            return
        out, self._out = self._out, None
        try:
            while self._pending:
                future = self._pending.popleft()
                if failed:
                    future.exception()
                else:
                    future.result()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            out.close()
        if not failed and self._current < len(self._planned):
            raise RuntimeError(f"{self.path}: tensor {self._planned[self._current][0]} was not written in full")

    def __enter__(self) -> GgufOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(failed=exc[0] is not None)


# ---- the FP4 blocks ----------------------------------------------------------------------------------


def mxfp4_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """ggml ``block_mxfp4`` bytes (n / 32, 17) of ``codes`` (n 4-bit codes, one per byte, in
    element order; n a multiple of 32) and their ``scales`` (n / 32 e8m0 bytes)."""
    return _blocks(codes, scales, 32, 32)


def mxfp4_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`mxfp4_blocks`: (codes one per byte (n,), e8m0 scale bytes (n / 32,))."""
    b = blocks.reshape(-1, 17)
    codes = np.empty((b.shape[0], 32), np.uint8)
    np.bitwise_and(b[:, 1:], 0x0F, out=codes[:, :16])
    np.right_shift(b[:, 1:], 4, out=codes[:, 16:])
    return codes.reshape(-1), np.ascontiguousarray(b[:, 0])


def nvfp4_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """ggml ``block_nvfp4`` bytes (n / 64, 36) of ``codes`` (n 4-bit codes, one per byte, in
    element order; n a multiple of 64) and their ``scales`` (n / 16 float8_e4m3fn bytes, one per 16
    elements; ggml reads them as unsigned UE4M3, so they must be positive or zero)."""
    return _blocks(codes, scales, 64, 16)


def _blocks(codes: np.ndarray, scales: np.ndarray, block: int, group: int) -> np.ndarray:
    from .._parallel import run_tasks
    from ..kernels.ggml import ggml_blocks

    c = np.ascontiguousarray(codes).reshape(-1).view(np.uint8)
    if c.size % block:
        raise ValueError(f"{c.size} codes are not whole ggml blocks of {block}")
    out = np.empty((c.size // block, block // group + block // 2), np.uint8)
    s = np.ascontiguousarray(scales).reshape(-1).view(np.uint8)
    run_tasks(ggml_blocks, out.shape[0], c.size, (c, s, out, block, group))
    return out


def nvfp4_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`nvfp4_blocks`: (codes one per byte (n,), UE4M3 scale bytes (n / 16,))."""
    b = blocks.reshape(-1, 36)
    q = b[:, 4:].reshape(-1, 4, 8)
    codes = np.empty((b.shape[0], 4, 16), np.uint8)
    np.bitwise_and(q, 0x0F, out=codes[:, :, :8])
    np.right_shift(q, 4, out=codes[:, :, 8:])
    return codes.reshape(-1), np.ascontiguousarray(b[:, :4]).reshape(-1)


def byte_pieces(tensor: GgufTensor, chunk_bytes: int) -> Iterator[np.ndarray]:
    """A tensor's stored bytes in pieces of about ``chunk_bytes`` (whole blocks)."""
    step = max(tensor.block[1], chunk_bytes - chunk_bytes % tensor.block[1])
    for start in range(0, tensor.nbytes, step):
        yield tensor.raw(start, min(start + step, tensor.nbytes))
