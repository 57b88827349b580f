"""``.npz`` files: every ``.npy`` member read in pieces (through memory maps when stored, whole when
compressed), written uncompressed one member at a time (:class:`NpzWriter`)."""

from __future__ import annotations

import contextlib
import struct
import zipfile
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npformat

from .arrays import ArrayEntry, ArrayFileKind, FileFormatError, OutArray, register_file_kind
from .npy import RowSink, npy_entry, read_npy_header

__all__ = ["NpzWriter", "stored_member_offset"]


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
                entries.append(npy_entry(path, name, start, start + info.file_size))
            else:
                entries.append(_compressed_entry(path, zf, info, name))
    if not entries:
        raise FileFormatError(f"{path}: holds no arrays")
    return entries


def _compressed_entry(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> ArrayEntry:
    with zf.open(info) as member:
        shape, _, dtype = read_npy_header(member, f"{path}[{name}]")  # type: ignore[arg-type]
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


class NpzWriter:
    """A ``.npz`` file (uncompressed, zip64) written one member at a time, each piece by piece.

    ``with NpzWriter(path) as z: with z.member("w", shape, dtype) as m: m.write(rows)``.
    """

    def __init__(self, path: str) -> None:
        self._zip = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)

    @contextlib.contextmanager
    def member(self, name: str, shape: tuple[int, ...], dtype: Any) -> Iterator[RowSink]:
        with self._zip.open(f"{name}.npy", "w", force_zip64=True) as fh:
            sink = RowSink(fh, shape, dtype, f"{name}.npy")  # type: ignore[arg-type]
            yield sink
            sink.finish()

    def add(self, name: str, array: np.ndarray) -> None:
        with self.member(name, array.shape, array.dtype) as m:
            m.write(array)

    def __enter__(self) -> NpzWriter:
        return self

    def __exit__(self, *_: Any) -> None:
        self._zip.close()


def _write_npz(path: str, items: list[OutArray]) -> None:
    with NpzWriter(path) as z:
        for item in items:
            with z.member(item.name, item.shape, item.dtype) as m:
                for piece in item.pieces():
                    m.write(piece)


register_file_kind(ArrayFileKind("npz", ".npz", _npz_entries, _write_npz))
