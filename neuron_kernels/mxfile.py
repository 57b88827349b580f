"""The package's MX file: one uncompressed ``.npz`` holding one or more MX arrays.

Layout (version 1). An array is three zip members, each an ordinary ``.npy`` array:

- ``meta.npy``: uint8 bytes of a UTF-8 JSON object ``{"version": 1, "fmt": ..., "block_size": ...,
  "axis": ..., "shape": [...], "packed": ...}``;
- ``codes.npy``: uint8 element codes (see :class:`~neuron_kernels.mx.MXArray`);
- ``scales.npy``: uint8 e8m0 scale bytes.

A file written by :meth:`MXArray.save <neuron_kernels.mx.MXArray.save>` holds one array under
exactly these names. A file of several arrays (``neuron-kernels quantize`` of an ``.npz`` or
``.safetensors`` input) prefixes each array's members with its name and a slash:
``model.w/meta.npy``, ``model.w/codes.npy``, ...

Members are stored uncompressed, so that a reader can map any row range of the codes and scales
without reading the rest (:func:`read_mx_file`), and a writer can append them row range by row
range (:class:`MXFileWriter`): a quantised file is written and read in bounded memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .files import ArrayEntry, FileFormatError, NpzWriter, open_arrays

__all__ = ["FILE_VERSION", "StoredMX", "read_mx_file", "MXFileWriter", "layout_error"]

FILE_VERSION = 1
_MEMBERS = ("meta", "codes", "scales")


def _member(name: str | None, part: str) -> str:
    return part if name is None else f"{name}/{part}"


def layout_error(
    fmt: Any,
    block_size: Any,
    axis: Any,
    shape: Any,
    packed: Any,
    codes: tuple[tuple[int, ...], Any],
    scales: tuple[tuple[int, ...], Any],
) -> str | None:
    """What is inconsistent in an MX array's metadata and its codes/scales (shape, dtype), or None."""
    from .mx import MX_FORMATS

    if not isinstance(fmt, str) or fmt not in MX_FORMATS:
        return f"unknown MX format {fmt!r}"
    if isinstance(block_size, bool) or not (isinstance(block_size, int) and block_size >= 1):
        return f"invalid block_size {block_size!r}"
    if not (
        isinstance(shape, tuple)
        and shape
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        return f"invalid shape {shape!r}"
    if isinstance(axis, bool) or not (isinstance(axis, int) and 0 <= axis < len(shape)):
        return f"invalid axis {axis!r} for shape {shape}"
    if not isinstance(packed, bool) or (packed and not MX_FORMATS[fmt].packable):
        return f"invalid packed flag {packed!r} for {fmt}"
    expected_codes = list(shape)
    if packed:
        expected_codes[axis] = (shape[axis] + 1) // 2
    expected_scales = list(shape)
    expected_scales[axis] = -(-shape[axis] // block_size)
    if np.dtype(codes[1]) != np.uint8 or list(codes[0]) != expected_codes:
        return f"codes must be uint8 of shape {tuple(expected_codes)}"
    if np.dtype(scales[1]).itemsize != 1 or np.dtype(scales[1]).kind not in "uV" or list(scales[0]) != expected_scales:
        return f"scales must be e8m0 bytes of shape {tuple(expected_scales)}"
    return None


@dataclass(frozen=True)
class StoredMX:
    """One MX array of a file, its data not yet read."""

    path: str
    name: str | None
    fmt: str
    block_size: int
    axis: int
    shape: tuple[int, ...]
    packed: bool
    codes: ArrayEntry
    scales: ArrayEntry

    def load(self) -> Any:
        """The whole array as an :class:`~neuron_kernels.mx.MXArray`."""
        from .mx import MXArray

        return MXArray.from_parts(
            self.codes.read(),
            self.scales.read(),
            self.fmt,
            self.block_size,
            self.axis,
            self.shape,
            self.packed,
            self.path,
        )


def read_mx_file(path: str | os.PathLike[str]) -> dict[str | None, StoredMX]:
    """The arrays of an MX file by name (``None`` for the one array of a single-array file),
    their metadata validated against their codes and scales; no data is read."""
    path = os.fspath(path)
    if not path.lower().endswith(".npz"):
        raise FileFormatError(f"{path}: an MX file is a .npz file")
    try:
        entries = open_arrays(path)
    except FileFormatError as exc:
        raise FileFormatError(f"{path}: cannot read an MX file ({exc})") from None
    groups: dict[str | None, dict[str, ArrayEntry]] = {}
    for entry in entries:
        prefix, _, part = (entry.name or "").rpartition("/")
        if part in _MEMBERS:
            groups.setdefault(prefix if "/" in (entry.name or "") else None, {})[part] = entry
    arrays = {name: parts for name, parts in groups.items() if set(parts) == set(_MEMBERS)}
    if not arrays:
        found = sorted(e.name or "" for e in entries)
        raise FileFormatError(f"{path}: not an MX file (it has {found}; expected codes, scales, meta)")
    return {name: _stored(path, name, parts) for name, parts in arrays.items()}


def _stored(path: str, name: str | None, parts: dict[str, ArrayEntry]) -> StoredMX:
    where = path if name is None else f"{path}[{name}]"
    try:
        raw = parts["meta"].read()
        meta = json.loads(np.ascontiguousarray(raw).tobytes().decode())
        fmt, block_size, axis = meta["fmt"], meta["block_size"], meta["axis"]
        shape, packed, version = tuple(meta["shape"]), meta["packed"], meta["version"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise FileFormatError(f"{where}: corrupt MX metadata ({exc})") from None
    if type(version) is not int or version != FILE_VERSION:
        raise FileFormatError(
            f"{where}: MX file version {version!r} is not supported (this package reads {FILE_VERSION})"
        )
    codes, scales = parts["codes"], parts["scales"]
    problem = layout_error(
        fmt, block_size, axis, shape, packed, (codes.shape, codes.dtype), (scales.shape, scales.dtype)
    )
    if problem:
        raise FileFormatError(f"{where}: {problem}")
    return StoredMX(path, name, fmt, block_size, axis, shape, packed, codes, scales)


def _meta_bytes(fmt: str, block_size: int, axis: int, shape: tuple[int, ...], packed: bool) -> np.ndarray:
    meta = {
        "version": FILE_VERSION,
        "fmt": fmt,
        "block_size": block_size,
        "axis": axis,
        "shape": list(shape),
        "packed": packed,
    }
    return np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


class _ArrayPieces:
    """Appends codes to the zip and scale bytes to a spill file, piece by piece (see MXFileWriter)."""

    def __init__(self, codes: Any, spill: Any) -> None:
        self._codes, self._spill = codes, spill

    def write(self, codes: np.ndarray, scales: np.ndarray) -> None:
        """The next pieces of the codes and scales, in C order (any shapes)."""
        self._codes.write(codes)
        self._spill.write(memoryview(np.ascontiguousarray(scales).reshape(-1).view(np.uint8)))


class MXFileWriter:
    """An MX file written array by array, each piece by piece, in bounded memory.

    ``with MXFileWriter(path) as w: with w.array(name, fmt, block_size, axis, shape, packed) as a:
    a.write(codes, scales)``, consecutive C-order pieces of the whole array's. The codes go
    straight into the zip; the scales (1/block_size of the data) into a temporary file beside it,
    copied in after the codes. ``name=None`` writes the single-array layout.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._npz = NpzWriter(path)

    @contextlib.contextmanager
    def array(
        self, name: str | None, fmt: str, block_size: int, axis: int, shape: tuple[int, ...], packed: bool
    ) -> Iterator[_ArrayPieces]:
        codes_shape = list(shape)
        if packed:
            codes_shape[axis] = (shape[axis] + 1) // 2
        scales_shape = list(shape)
        scales_shape[axis] = -(-shape[axis] // block_size)
        self._npz.add(_member(name, "meta"), _meta_bytes(fmt, block_size, axis, shape, packed))
        folder = os.path.dirname(os.path.abspath(self._path))
        with tempfile.TemporaryFile(dir=folder, prefix=".mx-scales-") as spill:
            with self._npz.member(_member(name, "codes"), tuple(codes_shape), np.uint8) as codes:
                yield _ArrayPieces(codes, spill)
            spill.seek(0)
            with self._npz.member(_member(name, "scales"), tuple(scales_shape), np.uint8) as scales:
                while block := spill.read(1 << 24):
                    scales.write_bytes(block)

    def add(self, name: str | None, mx: Any) -> None:
        """Write a whole in-memory MXArray."""
        with self.array(name, mx.fmt, mx.block_size, mx.axis, mx.shape, mx.packed) as rows:
            rows.write(mx.codes, mx.scales)

    def __enter__(self) -> MXFileWriter:
        return self

    def __exit__(self, *_: Any) -> None:
        self._npz.__exit__()
