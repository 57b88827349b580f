"""``.npz`` files: every ``.npy`` member read in pieces (through memory maps when stored, whole when
compressed), written uncompressed one member at a time (:class:`NpzWriter`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
import threading
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npformat

from .arrays import ArrayEntry, ArrayFileKind, FileFormatError, OutArray, mapped, register_file_kind
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


#: The largest ratio of a deflated member's size to its compressed size: deflate's own bound
#: (a 258-byte match per 2 bits at best, about 1032 to 1). A member claiming more is refused before
#: anything is decompressed, so that a compressed member allocates no more than its bytes can hold.
_DEFLATE_RATIO = 1032
#: The zip methods of an ``.npz`` (numpy writes these two: ``np.savez`` and ``np.savez_compressed``).
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}


def _npz_entries(path: str) -> list[ArrayEntry]:
    try:
        return _members(path)
    except FileFormatError as exc:
        message = str(exc)
        raise FileFormatError(message if message.startswith(path) else f"{path}: {message}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, struct.error, zlib.error, NotImplementedError) as exc:
        raise FileFormatError(f"{path}: cannot read it as .npz ({exc})") from None


#: How an ``.npz`` starts (``numpy/lib/_npyio_impl.py``, ``load``: anything else is read as a pickle,
#: which it refuses): a zip's first local header, or the end record of a zip of no member.
_ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")


def _members(path: str) -> list[ArrayEntry]:
    entries = []
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if fh.read(4) not in _ZIP_STARTS:
            raise FileFormatError(f"{path}: cannot read it as .npz (it does not start as a zip file does)")
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        twice = [n for n, k in Counter(info.filename for info in zf.infolist()).items() if k > 1]
        if twice:
            raise FileFormatError(f"{path}: the member {twice[0]!r} appears twice; a member name is unique")
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            if info.compress_type not in _METHODS:
                raise FileFormatError(
                    f"{path}[{name}]: zip compression method {info.compress_type}; an .npz member is stored or "
                    "deflated (as numpy writes them)"
                )
            if info.flag_bits & 0x1:
                raise FileFormatError(f"{path}[{name}]: an encrypted member; an .npz member is not encrypted")
            with zf.open(info):  # zipfile's checks of the member's local header (its name, its flags)
                pass
            if info.compress_type == zipfile.ZIP_STORED:
                start = stored_member_offset(zf, fh, info)
                if info.compress_size != info.file_size or start + info.file_size > size:
                    raise FileFormatError(
                        f"{path}[{name}]: truncated or corrupt: a stored member of {info.file_size} bytes at byte "
                        f"{start}; the file holds {size}"
                    )
                entries.append(_verified(npy_entry(path, name, start, start + info.file_size), info, start))
            else:
                entries.append(_compressed_entry(path, zf, info, name, size))
    if not entries:
        raise FileFormatError(f"{path}: holds no arrays")
    return entries


#: Stored members up to this size have their CRC-32 checked when the file is opened (larger ones on
#: their first read, so that opening a large file to list its arrays reads none of their data).
_CHECKED_AT_OPEN = 1 << 20


def _verified(entry: ArrayEntry, info: zipfile.ZipInfo, start: int) -> ArrayEntry:
    """A stored member's array whose CRC-32 is checked before its data is used, as zipfile (and so
    numpy's ``np.load``) checks every member it reads: one pass over the member, in pieces, when
    the file is opened (a small member, or one of no element, whose data no read would reach) or
    on its first read. Its bytes are not offered for a raw copy (``offset``), which would bypass
    the check."""
    checked: list[bool] = []
    lock = threading.Lock()
    read_flat = entry._reader

    def check() -> None:
        crc, step = 0, 64 << 20
        for at in range(0, info.file_size, step):
            piece = mapped(entry.path, np.dtype(np.uint8), start + at, min(step, info.file_size - at))
            crc = zlib.crc32(piece, crc)
        if crc != info.CRC:
            raise FileFormatError(f"{entry.where}: its bytes do not match the member's CRC-32 (corrupt)")
        checked.append(True)

    if info.file_size <= _CHECKED_AT_OPEN or not entry.size:
        check()

    def read(lo: int, hi: int) -> np.ndarray:
        if not checked:
            with lock:
                if not checked:
                    check()
        return read_flat(lo, hi)

    return dataclasses.replace(entry, _reader=read, offset=None)


def _compressed_entry(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, size: int) -> ArrayEntry:
    where = f"{path}[{name}]"
    if info.compress_size > size or info.file_size > info.compress_size * _DEFLATE_RATIO + 1024:
        raise FileFormatError(
            f"{where}: a deflated member claiming {info.file_size} bytes from {info.compress_size} (the file holds "
            f"{size}); deflate expands at most {_DEFLATE_RATIO} times"
        )
    with zf.open(info) as member:
        shape, _, dtype = read_npy_header(member, where, info.file_size)  # type: ignore[arg-type]
    cache: list[np.ndarray] = []

    def read(start: int, stop: int) -> np.ndarray:
        if not cache:  # a compressed member can only be read from its start: read it once, whole
            try:
                with zipfile.ZipFile(path) as z, z.open(info) as member:
                    whole = npformat.read_array(member, allow_pickle=False)  # type: ignore[arg-type]
                    while member.read(1 << 20):  # to the member's end, where zipfile checks its CRC-32
                        pass
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                raise FileFormatError(f"{where}: cannot read the compressed member ({exc})") from None
            if whole.shape != shape or whole.dtype != dtype:
                raise FileFormatError(f"{where}: the compressed member changed while being read")
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


register_file_kind(ArrayFileKind("npz", ".npz", _npz_entries, _write_npz, block_file=True))
