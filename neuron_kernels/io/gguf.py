"""GGUF files (llama.cpp's): the header read and written through ``gguf`` (gguf-py, llama.cpp's own
Python package), the tensor data read through memory maps and written piece by piece, and the
byte layout of the two FP4 block types.

- :func:`open_gguf` reads the header (metadata and tensor table) of a file and checks that every
  tensor's data lies inside it; :class:`GgufTensor` is one tensor, :meth:`GgufTensor.entry` its
  values as an :class:`~.arrays.ArrayEntry` (float types) and :meth:`GgufTensor.raw` its stored
  bytes.
- :class:`GgufOutput` writes a file: the metadata of a source file with some keys changed, a
  tensor table declared up front, then each tensor's bytes in order, in pieces.
- :func:`mxfp4_blocks`, :func:`nvfp4_blocks` and their inverses re-lay 4-bit codes (one per byte)
  and block scale bytes into ggml's blocks and back: ``block_mxfp4`` (type 39) is the e8m0 scale
  then 16 bytes, byte ``j`` holding element ``j`` in its low nibble and element ``j + 16`` in its
  high nibble; ``block_nvfp4`` (type 40) covers 64 elements, four UE4M3 scales (one per 16) then
  32 bytes, byte ``8 s + j`` holding elements ``16 s + j`` (low) and ``16 s + j + 8`` (high). The
  4-bit codes are E2M1's, as everywhere else (ggml's value table is E2M1's doubled).

GGUF shapes are numpy's here (the slowest axis first), the reverse of ggml's ``ne``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from .arrays import ArrayEntry, FileFormatError, mapped, raw_entry

__all__ = [
    "GGUF_SUFFIX",
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
        return int(np.prod(self.shape, dtype=np.int64))

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
        return self.raw().reshape(-1, row)

    def decoded(self) -> np.ndarray:
        """Its values as float32 through gguf-py's own decoding (any type gguf-py decodes)."""
        if self.plain:
            return np.asarray(self.entry().read(), np.float32)
        quants = _gguf().quants
        try:
            values = quants.dequantize(self.rows(), ggml_type(self.type))
        except NotImplementedError:
            raise FileFormatError(
                f"{self.path}[{self.name}]: gguf-py cannot decode type {self.type}; it is copied as stored"
            ) from None
        return np.asarray(values, np.float32).reshape(self.shape)


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file's header: ``fields`` its metadata (gguf-py ``ReaderField`` objects by key,
    without the ``GGUF.*`` entries of the header itself), ``tensors`` its tensor table in file
    order."""

    path: str
    version: int
    alignment: int
    fields: dict[str, Any]
    tensors: dict[str, GgufTensor]

    def value(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    @property
    def architecture(self) -> str | None:
        arch = self.value("general.architecture")
        return None if arch is None else str(arch)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def open_gguf(path: str | os.PathLike[str]) -> GgufFile:
    """Read the header of a GGUF file. A file that is not GGUF, of a version or tensor type gguf-py
    does not know, or shorter than its tensor table says raises :class:`FileFormatError`."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path}: is a folder, not a GGUF file") from None
    if head[:4] != _MAGIC:
        raise FileFormatError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    version = int.from_bytes(head[4:8], "little") if len(head) == 8 else -1
    if version not in _VERSIONS:
        raise FileFormatError(
            f"{path}: GGUF version {version} is not read here (versions {', '.join(map(str, _VERSIONS))})"
        )
    gguf = _gguf()
    size = os.path.getsize(path)
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, KeyError, IndexError, OverflowError) as exc:
        message = str(exc)
        if "is not a valid GGMLQuantizationType" in message:
            known = ", ".join(t.name for t in gguf.GGMLQuantizationType)
            raise FileFormatError(f"{path}: unknown ggml tensor type ({message}); known: {known}") from None
        raise FileFormatError(f"{path}: truncated or corrupt GGUF file ({size} bytes): {message}") from None
    tensors: dict[str, GgufTensor] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensor = GgufTensor(path, t.name, t.tensor_type.name, shape, int(t.data_offset), int(t.n_bytes))
        if tensor.offset + tensor.nbytes > size:
            raise FileFormatError(
                f"{path}: truncated: tensor {t.name} ends at byte {tensor.offset + tensor.nbytes}, the file has {size}"
            )
        if shape and tensor.type not in _PLAIN and shape[-1] % tensor.block[0]:
            raise FileFormatError(f"{path}[{t.name}]: rows of {shape[-1]} are not whole {tensor.type} blocks")
        tensors[t.name] = tensor
    fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    alignment = int(getattr(reader, "alignment", 32))
    del reader  # its memory map of the whole file
    return GgufFile(path, version, alignment, fields, tensors)


class GgufOutput:
    """A GGUF file written in one pass: :meth:`add` declares each tensor (name, numpy shape, ggml
    type) in file order, :meth:`begin` writes the header (the metadata of ``source`` with
    ``changes`` applied: key -> (value, gguf-py ``GGUFValueType``), None to drop a key), then
    :meth:`write` takes each tensor's bytes in order, in pieces of any size."""

    def __init__(self, path: str, source: GgufFile, changes: dict[str, tuple[Any, Any] | None]) -> None:
        gguf = _gguf()
        self.path = path
        arch = source.architecture or ""
        self._writer = gguf.GGUFWriter(path, arch, use_temp_file=False)
        self._writer.data_alignment = source.alignment
        self._writer.kv_data = [{}]  # the source's keys, general.architecture included, in its order
        for key, field in source.fields.items():  # in the source's order, a changed key in its place
            if key in changes:
                change = changes[key]
                if change is not None:
                    self._writer.add_key_value(key, change[0], change[1])
                continue
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            self._writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
        for key, change in changes.items():
            if change is not None and key not in source.fields:
                self._writer.add_key_value(key, change[0], change[1])
        self._planned: list[tuple[str, int]] = []
        self._current = 0
        self._left = 0
        self._out: BinaryIO | None = None

    def add(self, name: str, shape: tuple[int, ...], type_name: str) -> None:
        gguf = _gguf()
        kind = ggml_type(type_name)
        elements, nbytes = gguf.GGML_QUANT_SIZES[kind]
        size = int(np.prod(shape, dtype=np.int64))
        total = size // elements * nbytes
        # the shape is given in elements (gguf-py takes a uint8 array's shape as bytes instead)
        self._writer.add_tensor_info(name, shape, np.dtype(np.float32), total, kind)
        self._planned.append((name, total))

    def begin(self) -> None:
        self._writer.write_header_to_file()
        self._writer.write_kv_data_to_file()
        self._writer.write_ti_data_to_file()
        self._out = self._writer.fout[0]
        self._pad()
        self._left = self._planned[0][1] if self._planned else 0

    def _pad(self) -> None:
        assert self._out is not None
        align = self._writer.data_alignment
        self._out.write(b"\0" * (-self._out.tell() % align))

    def write(self, data: np.ndarray) -> None:
        """The next bytes of the current tensor (any array: its bytes in C order)."""
        assert self._out is not None
        n = data.nbytes
        if n > self._left:
            name = self._planned[self._current][0] if self._current < len(self._planned) else "(none)"
            raise RuntimeError(f"{n} bytes written to {name}, {self._left} were left")
        self._out.write(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
        self._left -= n
        while self._left == 0 and self._current < len(self._planned):
            self._pad()
            self._current += 1
            self._left = self._planned[self._current][1] if self._current < len(self._planned) else -1

    def close(self) -> None:
        if self._out is not None and self._current < len(self._planned):
            name = self._planned[self._current][0]
            self._writer.close()
            raise RuntimeError(f"{self.path}: tensor {name} was not written in full")
        self._writer.close()

    def __enter__(self) -> GgufOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._writer.close()


# ---- the FP4 blocks ----------------------------------------------------------------------------------


def mxfp4_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """ggml ``block_mxfp4`` bytes (n / 32, 17) of ``codes`` (n 4-bit codes, one per byte, in
    element order; n a multiple of 32) and their ``scales`` (n / 32 e8m0 bytes)."""
    c = codes.reshape(-1, 32)
    out = np.empty((c.shape[0], 17), np.uint8)
    out[:, 0] = scales.reshape(-1).view(np.uint8)
    np.bitwise_or(c[:, :16], c[:, 16:] << 4, out=out[:, 1:])
    return out


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
    c = codes.reshape(-1, 4, 16)
    out = np.empty((c.shape[0], 36), np.uint8)
    out[:, :4] = scales.reshape(-1, 4).view(np.uint8)
    np.bitwise_or(c[:, :, :8], c[:, :, 8:] << 4, out=out[:, 4:].reshape(-1, 4, 8))
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
