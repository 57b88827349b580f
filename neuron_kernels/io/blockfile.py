"""The package's block-format file: one uncompressed ``.npz`` holding one or more block arrays.

Layout (version 1). An array is three zip members, each an ordinary ``.npy`` array:

- ``meta.npy``: uint8 bytes of a UTF-8 JSON object ``{"version": 1, "fmt": ..., "block_size": ...,
  "axis": ..., "shape": [...], "packed": ...}``, plus, where they apply, ``"block_rows"`` (2-D
  tiles), ``"per_tensor_scale"`` (NVFP4's two levels, a float) and ``"rotation"`` (the 16 signs
  of a random Hadamard rotation applied before quantising);
- ``codes.npy``: uint8 element codes (see :class:`~neuron_kernels.blocks.array.BlockArray`);
- ``scales.npy``: uint8 scale bytes (e8m0 for MX, float8_e4m3fn for NVFP4), or float scales (FP8)
  as the unsigned integers of their bits, their dtype in the metadata's ``"scale_dtype"``
  (``float32``, ``bfloat16`` or ``float16``: ``.npy`` has no bfloat16).

A file written by :func:`save_blocks` holds one array under exactly these names. A file of several
arrays (``neuron-kernels quantize`` of an ``.npz`` or ``.safetensors`` input) prefixes each array's
members with its name and a slash: ``model.w/meta.npy``, ``model.w/codes.npy``, ...

Members are stored uncompressed, so that a reader can map any row range of the codes and scales
without reading the rest (:func:`read_mx_file`), and a writer can append them row range by row
range (:class:`BlockFileWriter`): a quantised file is written and read in bounded memory.
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

from ..blocks.array import BlockArray
from ..blocks.layout import BlockLayout
from ..errors import InvalidTypeError, InvalidValueError, NotApplicableError
from ..formats import BLOCK_FORMATS, FORMATS
from .arrays import ArrayEntry, FileFormatError, open_arrays
from .npz import NpzWriter
from .outputs import atomic_output
from .untrusted import parse_json

__all__ = ["FILE_VERSION", "StoredBlocks", "read_block_file", "BlockFileWriter", "save_blocks", "load_blocks"]

FILE_VERSION = 1
_MEMBERS = ("meta", "codes", "scales")


def _member(name: str | None, part: str) -> str:
    return part if name is None else f"{name}/{part}"


@dataclass(frozen=True)
class StoredBlocks:
    """One block array of a file, its data not yet read (``codes``/``scales`` read on demand)."""

    path: str
    name: str | None
    layout: BlockLayout
    per_tensor_scale: float | None
    rotation: tuple[int, ...] | None
    codes: ArrayEntry
    scales: ArrayEntry
    scale_dtype: str | None = None

    @property
    def fmt(self) -> str:
        return self.layout.fmt

    def scale_values(self, raw: np.ndarray) -> np.ndarray:
        """Scales as read from the file, as the block array holds them (float scales' bits viewed
        as their dtype; scale bytes as they are)."""
        return raw if self.scale_dtype is None else raw.view(FORMATS[self.scale_dtype].result_dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape


def read_block_file(path: str | os.PathLike[str]) -> dict[str | None, StoredBlocks]:
    """The arrays of a block file by name (``None`` for the one array of a single-array file),
    their metadata validated against their codes and scales; no data is read."""
    path = os.fspath(path)
    if not path.lower().endswith(".npz"):
        raise FileFormatError(f"{path}: a block file is a .npz file (the package's file of block arrays: MX, NVFP4)")
    try:
        entries = open_arrays(path)
    except FileFormatError as exc:
        raise FileFormatError(f"{path}: cannot read a block file ({exc})") from None
    groups: dict[str | None, dict[str, ArrayEntry]] = {}
    for entry in entries:
        prefix, _, part = (entry.name or "").rpartition("/")
        if part in _MEMBERS:
            groups.setdefault(prefix if "/" in (entry.name or "") else None, {})[part] = entry
    arrays = {name: parts for name, parts in groups.items() if set(parts) == set(_MEMBERS)}
    if not arrays:
        found = sorted(e.name or "" for e in entries)
        raise FileFormatError(f"{path}: not a block file (it has {found}; expected codes, scales, meta)")
    return {name: _stored(path, name, parts) for name, parts in arrays.items()}


def _stored(path: str, name: str | None, parts: dict[str, ArrayEntry]) -> StoredBlocks:
    where = path if name is None else f"{path}[{name}]"
    try:
        raw = parts["meta"].read()
        meta = parse_json(np.ascontiguousarray(raw).tobytes())
        layout = BlockLayout(
            meta["fmt"],
            tuple(meta["shape"]),
            meta["axis"],
            meta["block_size"],
            meta.get("block_rows", 1),
            meta["packed"],
        )
        version, pts, rotation = meta["version"], meta.get("per_tensor_scale"), meta.get("rotation")
        scale_dtype = meta.get("scale_dtype")
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise FileFormatError(f"{where}: corrupt block file metadata ({exc})") from None
    if type(version) is not int or version != FILE_VERSION:
        raise FileFormatError(
            f"{where}: block file version {version!r} is not supported (this package reads {FILE_VERSION})"
        )
    codes, scales = parts["codes"], parts["scales"]
    bf = layout.format if isinstance(layout.fmt, str) and layout.fmt in BLOCK_FORMATS else None
    scale_type: Any = scales.dtype
    if bf is not None and bf.float_scales:
        if scale_dtype not in bf.scale_dtypes or scales.dtype != FORMATS[scale_dtype].storage_dtype:
            raise FileFormatError(
                f"{where}: {bf.name} scales need a scale_dtype ({', '.join(bf.scale_dtypes)}) and its bits as "
                f"unsigned integers; got {scale_dtype!r} and {scales.dtype}"
            )
        scale_type = FORMATS[scale_dtype].result_dtype
    elif scale_dtype is not None:
        raise FileFormatError(f"{where}: a scale_dtype ({scale_dtype!r}) belongs to float scales, not {layout.fmt}'s")
    problem = layout.problem((codes.shape, codes.dtype), (scales.shape, scale_type))
    if problem is None and pts is not None and not (isinstance(pts, float) and np.isfinite(pts) and pts > 0):
        problem = f"invalid per_tensor_scale {pts!r}"
    if problem is None and rotation is not None and not _signs(rotation):
        problem = f"invalid rotation {rotation!r} (16 signs, each 1 or -1)"
    if problem:
        raise FileFormatError(f"{where}: {problem}")
    return StoredBlocks(
        path, name, layout, pts, None if rotation is None else tuple(rotation), codes, scales, scale_dtype
    )


def _signs(rotation: Any) -> bool:
    return isinstance(rotation, list) and len(rotation) == 16 and all(type(v) is int and v in (1, -1) for v in rotation)


def _meta_bytes(
    layout: BlockLayout, per_tensor_scale: float | None, rotation: tuple[int, ...] | None, scale_dtype: str | None
) -> np.ndarray:
    meta: dict[str, Any] = {
        "version": FILE_VERSION,
        "fmt": layout.fmt,
        "block_size": layout.block_size,
        "axis": layout.axis,
        "shape": list(layout.shape),
        "packed": layout.packed,
    }
    if layout.block_rows != 1:
        meta["block_rows"] = layout.block_rows
    if per_tensor_scale is not None:
        meta["per_tensor_scale"] = float(per_tensor_scale)
    if rotation is not None:
        meta["rotation"] = [int(v) for v in rotation]
    if scale_dtype is not None:
        meta["scale_dtype"] = scale_dtype
    return np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


class _ArrayPieces:
    """Appends codes to the zip and scale bytes to a spill file, piece by piece (see BlockFileWriter)."""

    def __init__(self, codes: Any, spill: Any) -> None:
        self._codes, self._spill = codes, spill

    def write(self, codes: np.ndarray, scales: np.ndarray) -> None:
        """The next pieces of the codes and scales, in C order (any shapes)."""
        self._codes.write(codes)
        self._spill.write(memoryview(np.ascontiguousarray(scales).reshape(-1).view(np.uint8)))


class BlockFileWriter:
    """A block file written array by array, each piece by piece, in bounded memory.

    ``with BlockFileWriter(path) as w: with w.array(name, layout) as a: a.write(codes, scales)``,
    consecutive C-order pieces of the whole array's. The codes go straight into the zip; the
    scales (1/block_size of the data) into a temporary file beside it, copied in after the codes.
    ``name=None`` writes the single-array layout.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._npz = NpzWriter(path)

    @contextlib.contextmanager
    def array(
        self,
        name: str | None,
        layout: BlockLayout,
        per_tensor_scale: float | None = None,
        rotation: tuple[int, ...] | None = None,
        scale_dtype: str | None = None,
    ) -> Iterator[_ArrayPieces]:
        """``scale_dtype``: the dtype of float scales (their format's default if not given)."""
        bf = layout.format
        if bf.zero_points:
            raise NotApplicableError(
                f"the package's block file holds no zero points yet, which {bf.name} needs; write it to a checkpoint "
                f"(--layout compressed-tensors), or choose the symmetric {bf.name.removesuffix('_asym')}"
            )
        if bf.float_scales:
            scale_dtype = scale_dtype or bf.scale
            stored = FORMATS[scale_dtype].storage_dtype
        else:
            scale_dtype, stored = None, np.dtype(np.uint8)
        self._npz.add(_member(name, "meta"), _meta_bytes(layout, per_tensor_scale, rotation, scale_dtype))
        folder = os.path.dirname(os.path.abspath(self._path))
        with tempfile.TemporaryFile(dir=folder, prefix=".mx-scales-") as spill:
            with self._npz.member(_member(name, "codes"), layout.codes_shape, np.uint8) as codes:
                yield _ArrayPieces(codes, spill)
            spill.seek(0)
            with self._npz.member(_member(name, "scales"), layout.scales_shape, stored) as scales:
                while block := spill.read(1 << 24):
                    scales.write_bytes(block)

    def add(self, name: str | None, blocks: Any) -> None:
        """Write a whole in-memory block array (anything with ``layout``, ``codes``, ``scales``,
        ``per_tensor_scale`` and ``rotation``)."""
        if getattr(blocks, "group_index", None) is not None:
            raise NotApplicableError(
                "the package's block file holds no group index (act-order) yet; dequantize the array, or keep it in "
                "its checkpoint"
            )
        dtype = blocks.scales.dtype.name if blocks.layout.format.float_scales else None
        with self.array(name, blocks.layout, blocks.per_tensor_scale, blocks.rotation, dtype) as rows:
            rows.write(blocks.codes, blocks.scales)

    def __enter__(self) -> BlockFileWriter:
        return self

    def __exit__(self, *_: Any) -> None:
        self._npz.__exit__()


def save_blocks(path: str | os.PathLike[str], q: BlockArray) -> None:
    """Write one block array to one ``.npz`` file (codes, scale bytes and the metadata), atomically.
    ``.npz`` is appended to a path without it."""
    if not isinstance(q, BlockArray):
        raise InvalidTypeError(f"save_blocks writes a BlockArray (a block-format array), got {type(q).__name__}")
    path = os.fspath(path)
    if not path.endswith(".npz"):
        path += ".npz"
    with atomic_output(path, force=True) as tmp, BlockFileWriter(tmp) as writer:
        writer.add(None, q)


def load_blocks(path: str | os.PathLike[str], name: str | None = None) -> BlockArray:
    """Read a block array from a block file (written by :func:`save_blocks` or ``neuron-kernels
    quantize``); ``name`` picks one array of a file that holds several. A corrupt or inconsistent
    file raises ``ValueError``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    arrays = read_block_file(path)
    names = ", ".join(sorted(map(str, arrays))) if None not in arrays else "one unnamed array (no name= needed)"
    if name is None and len(arrays) > 1:
        raise InvalidValueError(f"{path} holds {len(arrays)} block arrays; pick one with name= ({names})")
    key = next(iter(arrays)) if name is None else name
    if key not in arrays:
        raise InvalidValueError(f"{path} has no block array named {name!r}; it has {names}")
    s = arrays[key]
    return BlockArray.from_parts(
        s.codes.read(),
        s.scale_values(s.scales.read()),
        s.layout,
        path,
        per_tensor_scale=s.per_tensor_scale,
        rotation=s.rotation,
    )
