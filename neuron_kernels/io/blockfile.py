"""The package's block-format file: one uncompressed ``.npz`` holding one or more block arrays.

Layout (version 1). An array is three zip members, each an ordinary ``.npy`` array:

- ``meta.npy``: uint8 bytes of a UTF-8 JSON object ``{"version": 1, "fmt": ..., "block_size": ...,
  "axis": ..., "shape": [...], "packed": ...}``, plus, where they apply, ``"block_rows"`` (2-D
  tiles), ``"per_tensor_scale"`` (NVFP4's two levels, a float) and ``"rotation"`` (the 16 signs
  of a random Hadamard rotation applied before quantising);
- ``codes.npy``: uint8 element codes (see :class:`~neuron_kernels.blocks.array.BlockArray`);
- ``scales.npy``: uint8 scale bytes (e8m0 for MX, float8_e4m3fn for NVFP4), or float scales (FP8,
  the integer formats) as the unsigned integers of their bits, their dtype in the metadata's
  ``"scale_dtype"`` (``float32``, ``bfloat16`` or ``float16``: ``.npy`` has no bfloat16).

Two more members where they apply, both of the integer formats: ``zeros.npy`` (int8 zero points,
the scales' shape) of the formats with zero points, and ``group_index.npy`` (int32, one group per
column: act-order's ``g_idx``). An array with a group index is written as version 2, so that a
reader of version 1, which would not apply it, refuses the file instead of misreading it.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..blocks.array import BlockArray
from ..blocks.layout import BlockLayout
from ..errors import InvalidTypeError, InvalidValueError
from ..formats import BLOCK_FORMATS, FORMATS
from .arrays import ArrayEntry, FileFormatError, open_arrays
from .npz import NpzWriter
from .outputs import atomic_output
from .untrusted import parse_json

__all__ = ["FILE_VERSION", "StoredBlocks", "read_block_file", "BlockFileWriter", "save_blocks", "load_blocks"]

FILE_VERSION = 1
#: The version of an array with a group index (see the module's description).
GROUP_INDEX_VERSION = 2
_MEMBERS = ("meta", "codes", "scales")
_OPTIONAL = ("zeros", "group_index")


def _member(name: str | None, part: str) -> str:
    return part if name is None else f"{name}/{part}"


@dataclass(frozen=True)
class StoredBlocks:
    """One block array of a file, its data not yet read (``codes``/``scales``/``zeros`` read on
    demand; ``group_index``, one int32 per column, read and checked when the file is opened)."""

    path: str
    name: str | None
    layout: BlockLayout
    per_tensor_scale: float | None
    rotation: tuple[int, ...] | None
    codes: ArrayEntry
    scales: ArrayEntry
    scale_dtype: str | None = None
    zeros: ArrayEntry | None = None
    group_index: np.ndarray | None = None

    @property
    def fmt(self) -> str:
        return self.layout.fmt

    def scale_values(self, raw: np.ndarray) -> np.ndarray:
        """Scales as read from the file, as the block array holds them (float scales' bits viewed
        as their dtype; scale bytes as they are)."""
        return raw if self.scale_dtype is None else raw.view(FORMATS[self.scale_dtype].result_dtype)

    def scale_entry(self) -> ArrayEntry:
        """The scales as the block array holds them (float scales as floats), read in pieces."""
        if self.scale_dtype is None:
            return self.scales
        raw = self.scales
        dtype = np.dtype(FORMATS[self.scale_dtype].result_dtype)
        return ArrayEntry(raw.path, raw.name, raw.shape, dtype, lambda a, b: raw.read_flat(a, b).view(dtype))

    def block_array(self) -> BlockArray:
        """The whole array, read into memory."""
        lay = self.layout
        return BlockArray.from_parts(
            self.codes.read(),
            self.scale_values(self.scales.read()),
            lay,
            self.codes.where,
            per_tensor_scale=self.per_tensor_scale,
            rotation=self.rotation,
            zero_points=None if self.zeros is None else self.zeros.read().reshape(lay.scales_shape),
            group_index=self.group_index,
        )

    @property
    def nbytes(self) -> int:
        """The bytes of its codes, scales and zero points."""
        return self.codes.nbytes + self.scales.nbytes + (0 if self.zeros is None else self.zeros.nbytes)

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
        if part in _MEMBERS or part in _OPTIONAL:
            groups.setdefault(prefix if "/" in (entry.name or "") else None, {})[part] = entry
    arrays = {name: parts for name, parts in groups.items() if set(_MEMBERS) <= set(parts)}
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
    if type(version) is not int or version not in (FILE_VERSION, GROUP_INDEX_VERSION):
        raise FileFormatError(
            f"{where}: block file version {version!r} is not supported (this package reads "
            f"{FILE_VERSION} and {GROUP_INDEX_VERSION})"
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
    if problem is None and bf is not None:
        problem = _integer_parts_problem(bf, layout, parts, version)
    if problem:
        raise FileFormatError(f"{where}: {problem}")
    group_index = None
    if "group_index" in parts:
        group_index = np.ascontiguousarray(parts["group_index"].read())
        problem = _group_index_problem(group_index, layout)
        if problem:
            raise FileFormatError(f"{where}: {problem}")
    return StoredBlocks(
        path, name, layout, pts, None if rotation is None else tuple(rotation), codes, scales, scale_dtype,
        parts.get("zeros"), group_index,
    )  # fmt: skip


def _integer_parts_problem(bf: Any, layout: BlockLayout, parts: Mapping[str, Any], version: int) -> str | None:
    """What is wrong with the zero points and group index members of an array (None: nothing):
    zero points exactly where the format has them (int8, the scales' shape), a group index only
    for an integer format blocked along its last axis, in version 2 (int32, one per column)."""
    zeros, gidx = parts.get("zeros"), parts.get("group_index")
    if (zeros is not None) != bf.zero_points:
        return f"{bf.name} {'needs' if bf.zero_points else 'has no'} zero points (a zeros member)"
    if zeros is not None and (zeros.dtype != np.int8 or zeros.shape != layout.scales_shape):
        return f"zero points must be int8 of the scales' shape {layout.scales_shape}, got {zeros.dtype} {zeros.shape}"
    if gidx is None:
        return None
    if not bf.integer or layout.axis != len(layout.shape) - 1:
        return (
            f"a group index belongs to an integer format blocked along the last axis, not {bf.name} on axis "
            f"{layout.axis}"
        )
    if version != GROUP_INDEX_VERSION:
        return f"an array with a group index is version {GROUP_INDEX_VERSION}, this one says {version}"
    if gidx.dtype != np.int32 or gidx.shape != (layout.shape[-1],):
        return f"the group index must be int32 of shape ({layout.shape[-1]},), got {gidx.dtype} {gidx.shape}"
    return None


def _group_index_problem(group_index: np.ndarray, layout: BlockLayout) -> str | None:
    groups = layout.scales_shape[-1]
    if group_index.size and (int(group_index.min()) < 0 or int(group_index.max()) >= groups):
        return f"the group index names groups outside [0, {groups})"
    return None


@dataclass(frozen=True)
class _Shaped:
    """The shape and dtype of an array to be written (what the checks of a member read)."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _signs(rotation: Any) -> bool:
    return isinstance(rotation, list) and len(rotation) == 16 and all(type(v) is int and v in (1, -1) for v in rotation)


def _meta_bytes(
    layout: BlockLayout,
    per_tensor_scale: float | None,
    rotation: tuple[int, ...] | None,
    scale_dtype: str | None,
    version: int = FILE_VERSION,
) -> np.ndarray:
    meta: dict[str, Any] = {
        "version": version,
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
    """Appends codes to the zip and scale bytes (and zero points) to spill files, piece by piece
    (see BlockFileWriter)."""

    def __init__(self, fmt: str, codes: Any, spill: Any, zeros: Any) -> None:
        self._fmt, self._codes, self._spill, self._zeros = fmt, codes, spill, zeros

    def write(self, codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None) -> None:
        """The next pieces of the codes and scales (and the zero points of a format with them), in
        C order (any shapes)."""
        if (zero_points is None) != (self._zeros is None):
            raise InvalidValueError(
                f"{self._fmt} {'needs' if self._zeros is not None else 'has no'} zero points with its codes"
            )
        self._codes.write(codes)
        self._spill.write(memoryview(np.ascontiguousarray(scales).reshape(-1).view(np.uint8)))
        if zero_points is not None:
            self._zeros.write(memoryview(np.ascontiguousarray(zero_points, np.int8).reshape(-1).view(np.uint8)))


class BlockFileWriter:
    """A block file written array by array, each piece by piece, in bounded memory.

    ``with BlockFileWriter(path) as w: with w.array(name, layout) as a: a.write(codes, scales)``,
    consecutive C-order pieces of the whole array's. The codes go straight into the zip; the
    scales (1/block_size of the data) and zero points into temporary files beside it, copied in
    after the codes. ``name=None`` writes the single-array layout.
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
        group_index: np.ndarray | None = None,
    ) -> Iterator[_ArrayPieces]:
        """``scale_dtype``: the dtype of float scales (their format's default if not given);
        ``group_index``: act-order's group of each column (int32), of an integer format."""
        bf = layout.format
        if bf.float_scales:
            scale_dtype = scale_dtype or bf.scale
            stored = FORMATS[scale_dtype].storage_dtype
        else:
            scale_dtype, stored = None, np.dtype(np.uint8)
        version = FILE_VERSION
        if group_index is not None:
            group_index = np.ascontiguousarray(group_index, np.int32)
            parts = {"group_index": _Shaped(group_index.shape, group_index.dtype)}
            if bf.zero_points:  # written with the codes
                parts["zeros"] = _Shaped(layout.scales_shape, np.dtype(np.int8))
            problem = _integer_parts_problem(bf, layout, parts, GROUP_INDEX_VERSION) or _group_index_problem(
                group_index, layout
            )
            if problem:
                raise InvalidValueError(problem)
            version = GROUP_INDEX_VERSION
        self._npz.add(_member(name, "meta"), _meta_bytes(layout, per_tensor_scale, rotation, scale_dtype, version))
        if group_index is not None:
            self._npz.add(_member(name, "group_index"), group_index)
        folder = os.path.dirname(os.path.abspath(self._path))
        with contextlib.ExitStack() as stack:
            spill = stack.enter_context(tempfile.TemporaryFile(dir=folder, prefix=".mx-scales-"))
            zeros = None
            if bf.zero_points:
                zeros = stack.enter_context(tempfile.TemporaryFile(dir=folder, prefix=".mx-zeros-"))
            with self._npz.member(_member(name, "codes"), layout.codes_shape, np.uint8) as codes:
                yield _ArrayPieces(bf.name, codes, spill, zeros)
            self._copy_in(_member(name, "scales"), layout.scales_shape, stored, spill)
            if zeros is not None:
                self._copy_in(_member(name, "zeros"), layout.scales_shape, np.dtype(np.int8), zeros)

    def _copy_in(self, member: str, shape: tuple[int, ...], dtype: np.dtype, spill: Any) -> None:
        spill.seek(0)
        with self._npz.member(member, shape, dtype) as out:
            while block := spill.read(1 << 24):
                out.write_bytes(block)

    def add(self, name: str | None, blocks: Any) -> None:
        """Write a whole in-memory block array (anything with ``layout``, ``codes``, ``scales``,
        ``per_tensor_scale``, ``rotation``, ``zero_points`` and ``group_index``)."""
        dtype = blocks.scales.dtype.name if blocks.layout.format.float_scales else None
        gidx = blocks.group_index
        with self.array(name, blocks.layout, blocks.per_tensor_scale, blocks.rotation, dtype, gidx) as rows:
            rows.write(blocks.codes, blocks.scales, blocks.zero_points)

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
    return arrays[key].block_array()
