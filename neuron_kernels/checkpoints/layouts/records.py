"""The records of a checkpoint layout: :class:`CheckpointLayout` and :class:`StoredWeight`.

Each layout is one record, :class:`CheckpointLayout` (all of them in
:data:`neuron_kernels.checkpoints.layouts.LAYOUTS`, one module each): the tensors a quantised
weight becomes, the ``quantization_config`` that announces them, how to recognise the layout in
a checkpoint and where a stored weight's codes and scales are (:class:`StoredWeight`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...blocks.array import BlockArray
from ...blocks.layout import BlockLayout
from ...casting import cast
from ...formats import FORMATS, BlockFormat
from ...io.files import ArrayEntry, FileFormatError, TensorSpec
from ...io.stream import decoded_pieces
from ..folder import Checkpoint
from ..selection import tensor_decision

__all__ = [
    "CheckpointLayout",
    "StoredWeight",
    "ScaledWeight",
    "Weight",
    "scaled_weight",
    "FP8_CODES",
    "FOREIGN_PARTS",
    "Output",
    "uint8_view",
    "expect_tensor",
    "scales_and_codes",
    "stored_codes_dtype",
    "stored_scales_dtype",
]


#: The last name component of the stored tensors of a quantised module that are not its weight's.
_NOT_WEIGHT_PARTS = ("input_scale", "input_global_scale", "k_scale", "v_scale")


@dataclass(frozen=True)
class StoredWeight:
    """A quantised weight as a layout stores it: its block layout, per-tensor scale, where its
    codes and scales are (uint8, C order), the stored tensors it takes, and the name and
    orientation of its dequantised tensor (``transpose``: the last two axes swapped)."""

    name: str
    layout: BlockLayout
    per_tensor_scale: float | None
    codes: ArrayEntry
    scales: ArrayEntry
    parts: tuple[str, ...]
    out_name: str
    transpose: bool = False

    @property
    def dropped(self) -> tuple[str, ...]:
        """The stored tensors that go with the weight but not into its dequantisation or into
        another layout (activation and KV-cache scales)."""
        return tuple(p for p in self.parts if p.rpartition(".")[2] in _NOT_WEIGHT_PARTS)

    def block_array(self) -> BlockArray:
        """The whole weight as a :class:`BlockArray` (read into memory)."""
        lay = self.layout
        return BlockArray.from_parts(
            self.codes.read().reshape(lay.codes_shape),
            self.scales.read().reshape(lay.scales_shape),
            lay,
            self.codes.where,
            per_tensor_scale=self.per_tensor_scale,
        )

    def decoded_pieces(self, dtype: str, chunk_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
        """The values in ``dtype`` in C order of the weight as written (a transposed stored weight as
        [..., in, out], one matrix at a time), each piece with the bytes of codes and scales it read."""
        if not self.transpose:
            yield from decoded_pieces(
                self.codes, self.scales, self.layout, self.per_tensor_scale, None, dtype, chunk_bytes
            )
            return
        lay = self.layout
        rows, cols = lay.shape[-2], lay.shape[-1]
        count = int(np.prod(lay.shape[:-2], dtype=np.int64))
        per_codes, per_scales = rows * lay.codes_shape[-1], rows * lay.scales_shape[-1]
        for m in range(count):
            part = BlockArray.from_parts(
                np.asarray(self.codes.read_flat(m * per_codes, (m + 1) * per_codes)).reshape(rows, -1),
                np.asarray(self.scales.read_flat(m * per_scales, (m + 1) * per_scales)).reshape(rows, -1),
                BlockLayout(lay.fmt, (rows, cols), 1, lay.block_size, 1, lay.packed),
                self.codes.where,
                per_tensor_scale=self.per_tensor_scale,
            )
            yield np.ascontiguousarray(part.dequantize(dtype).T), per_codes + per_scales

    def decoded_entry(self) -> ArrayEntry:
        """The weight dequantised to float32 (exact: one rounding of code times scale), as an
        :class:`ArrayEntry` read piece by piece: the rows a piece touches are decoded when it is
        read. For a stored [..., out, in] weight (not gpt-oss's transposed experts)."""
        lay = self.layout
        if self.transpose or lay.axis != len(lay.shape) - 1 or lay.block_rows != 1:
            raise FileFormatError(
                f"{self.codes.where}: {self.name} is stored transposed; dequantize the checkpoint first "
                f"(neuron-kernels dequantize), then quantise the result"
            )
        cols, crow, srow = lay.shape[-1], lay.codes_shape[-1], lay.scales_shape[-1]
        codes, scales = self.codes, self.scales

        def read(start: int, stop: int) -> np.ndarray:
            r0, r1 = start // cols, -(-stop // cols)
            part = BlockArray.from_parts(
                np.asarray(codes.read_flat(r0 * crow, r1 * crow)).reshape(r1 - r0, crow),
                np.asarray(scales.read_flat(r0 * srow, r1 * srow)).reshape(r1 - r0, srow),
                BlockLayout(lay.fmt, (r1 - r0, cols), 1, lay.block_size, 1, lay.packed),
                codes.where,
                per_tensor_scale=self.per_tensor_scale,
            )
            return part.dequantize("float32").reshape(-1)[start - r0 * cols : stop - r0 * cols]

        return ArrayEntry(codes.path, self.out_name, lay.shape, np.dtype(np.float32), read)

    @property
    def label(self) -> str:
        """What the weight is stored as, as reports say it: its block format."""
        return self.layout.fmt

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape


@dataclass(frozen=True)
class ScaledWeight:
    """A weight stored as float8_e4m3fn codes times a float scale per block of ``block`` = (rows,
    cols) elements of its last two axes (the whole matrix for one scale per tensor, (1, in) per
    channel, (1, g) per group): the FP8 layouts (fine-grained FP8, compressed-tensors
    ``float-quantized``), whose float scales no block format of the table holds. Read as its exact
    float32 values: ``float32(code) * float32(scale)``, one rounding (none for 16-bit scales: the
    product of an FP8 and a bfloat16 or float16 value fits in float32); partial edge blocks take the
    scale of their block, as the producers' padding gives them."""

    name: str
    shape: tuple[int, ...]
    codes: ArrayEntry
    scales: ArrayEntry
    block: tuple[int, int]
    parts: tuple[str, ...]
    out_name: str
    label: str
    transpose: bool = False

    @property
    def dropped(self) -> tuple[str, ...]:
        return tuple(p for p in self.parts if p.rpartition(".")[2] in _NOT_WEIGHT_PARTS)

    def decoded_entry(self) -> ArrayEntry:
        """The exact float32 values as an :class:`ArrayEntry` read piece by piece."""
        rows, cols = self.shape[-2], self.shape[-1]
        bm, bn = self.block
        srows, scols = -(-rows // bm), -(-cols // bn)
        codes, scales = self.codes, self.scales

        def read(start: int, stop: int) -> np.ndarray:
            r0, r1 = start // cols, -(-stop // cols)
            flat_rows = np.arange(r0, r1, dtype=np.int64)
            grid_rows = (flat_rows // rows) * srows + (flat_rows % rows) // bm
            g0 = int(grid_rows.min()) if flat_rows.size else 0
            g1 = int(grid_rows.max()) + 1 if flat_rows.size else 0
            grid = np.asarray(scales.read_flat(g0 * scols, g1 * scols)).astype(np.float32).reshape(g1 - g0, scols)
            per_element = np.repeat(grid[grid_rows - g0], bn, axis=1)[:, :cols]
            values = cast(np.asarray(codes.read_flat(r0 * cols, r1 * cols)).reshape(r1 - r0, cols), "float32")
            values *= per_element
            return values.reshape(-1)[start - r0 * cols : stop - r0 * cols]

        return ArrayEntry(codes.path, self.out_name, self.shape, np.dtype(np.float32), read)

    def values(self) -> np.ndarray:
        """The whole weight's exact float32 values (read into memory)."""
        return self.decoded_entry().read()

    def decoded_pieces(self, dtype: str, chunk_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
        """The values in ``dtype``, whole rows at a time in C order, each with the elements it read."""
        entry = self.decoded_entry()
        step = max(self.shape[-1], (chunk_bytes // 4) // self.shape[-1] * self.shape[-1])
        for start in range(0, entry.size, step):
            values = entry.read_flat(start, min(start + step, entry.size))
            yield (values if dtype == "float32" else cast(values, dtype)), values.size


#: The last name components of the tensors of quantised layouts the package does not read (GPTQ,
#: AWQ): a checkpoint holding one is refused like one of a layout it reads without its config.
FOREIGN_PARTS = ("qweight", "scales", "qzeros")

#: The dtype of the FP8 layouts' codes, and those of their scales.
FP8_CODES = FORMATS["float8_e4m3fn"].result_dtype
FP8_SCALES = tuple(FORMATS[n].result_dtype for n in ("float32", "bfloat16", "float16"))

#: A quantised weight as a checkpoint stores it.
Weight = StoredWeight | ScaledWeight


def scaled_weight(
    name: str, codes: ArrayEntry, scales: ArrayEntry, block: tuple[int, int], parts: tuple[str, ...], label: str
) -> ScaledWeight:
    """The :class:`ScaledWeight` of ``codes`` (float8_e4m3fn, 2 or more axes) and ``scales`` (a float32,
    bfloat16 or float16 grid of ``block``-sized blocks of the last two axes), refusing what does not fit."""
    if codes.dtype != FP8_CODES or len(codes.shape) < 2:
        raise FileFormatError(
            f"{codes.where}: FP8 weights must be float8_e4m3fn with 2 or more axes, found {codes.dtype} of shape "
            f"{codes.shape}"
        )
    if scales.dtype not in FP8_SCALES:
        raise FileFormatError(f"{scales.where}: FP8 scales must be float32, bfloat16 or float16, found {scales.dtype}")
    rows, cols = codes.shape[-2:]
    bm, bn = block
    grid = codes.shape[:-2] + (-(-rows // bm), -(-cols // bn))
    if scales.shape != grid and not (grid[-2:] == (1, 1) and scales.size == int(np.prod(grid))):
        raise FileFormatError(
            f"{scales.where}: a scale grid of shape {scales.shape} does not fit the weight {codes.shape} in blocks "
            f"of {bm}x{bn} (expected {grid})"
        )
    return ScaledWeight(name, codes.shape, codes, scales, block, parts, name, label)


#: (tensor spec, what fills it: "codes", "scales" or "per_tensor") of one quantised weight.
Output = tuple[TensorSpec, str]


@dataclass(frozen=True)
class CheckpointLayout:
    """One checkpoint layout (see the module docstring).

    ``formats``: the block formats it stores; ``outputs(name, layout)``: the tensors a quantised
    weight becomes; ``config(fmt, kept, ignore)``: the ``quantization_config`` given the (name,
    entry) of the tensors kept and the Linear modules left plain (:func:`ignored_modules`);
    ``detect(ckpt)``: whether a checkpoint is in this layout; ``weights(ckpt)``: its quantised
    weights (raising :class:`FileFormatError` where the checkpoint is not what its config
    promises); ``suffix``: the layout is one file with this suffix (the package's), not a folder
    of shards; ``decide``: its rule of which tensors are quantised (:func:`module_decision`,
    :func:`tensor_decision` or :func:`expert_decision`; called with ``arch=``, the checkpoint's
    :class:`~..architecture.Architecture` or None); ``transpose``: a quantised [..., in, out]
    tensor is stored as [..., out, in] (blocks along ``in``); ``fits(ckpt, quantised)``: raises if the layout cannot
    express the checkpoint so that its runtime loads it; ``parts``: the last name components of the
    tensors only its quantised modules hold (and ``part_suffixes``: endings of those components, of
    uint8 tensors), so that a checkpoint holding one without a config saying which layout is refused;
    ``config_files``: files of a checkpoint that describe its quantisation in this layout (not
    copied to an output of another)."""

    name: str
    help: str
    formats: tuple[str, ...]
    outputs: Callable[[str, BlockLayout], list[Output]]
    config: Callable[[str, list[tuple[str, ArrayEntry]], list[str]], dict[str, Any]]
    detect: Callable[[Checkpoint], bool]
    weights: Callable[[Checkpoint], list[Weight]]
    suffix: str | None = None
    decide: Callable[..., str | None] = tensor_decision
    transpose: bool = False
    fits: Callable[[Checkpoint, list[str]], None] = lambda ckpt, quantised: None
    parts: tuple[str, ...] = ()
    part_suffixes: tuple[str, ...] = ()
    config_files: tuple[str, ...] = ()

    @property
    def single_file(self) -> bool:
        return self.suffix is not None

    def check_format(self, fmt: str) -> None:
        if not self.formats:
            raise FileFormatError(f"the {self.name} layout is read only; choose another --layout")
        if fmt not in self.formats:
            raise FileFormatError(
                f"the {self.name} layout stores {', '.join(self.formats)}, not {fmt}; "
                f"choose another --format or --layout"
            )


def stored_codes_dtype(bf: BlockFormat) -> np.dtype:
    """The dtype a checkpoint stores the codes of ``bf`` in: 4-bit codes (packable) two per byte
    as uint8, other codes as the element's own dtype (float8_e4m3fn for ``mxfp8_e4m3``)."""
    return np.dtype(np.uint8) if bf.packable else np.dtype(bf.element_format.result_dtype)


def stored_scales_dtype(bf: BlockFormat) -> np.dtype:
    """The dtype a checkpoint stores the block scales of ``bf`` in: e8m0 scales (MX) as their
    byte, uint8, other scales as their own dtype (float8_e4m3fn for ``nvfp4``)."""
    return bf.scale_format.storage_dtype if bf.is_mx else np.dtype(bf.scale_format.result_dtype)


def uint8_view(entry: ArrayEntry, shape: tuple[int, ...] | None = None) -> ArrayEntry:
    """``entry`` read as its raw bytes (a 1-byte dtype) and seen with ``shape``."""
    if entry.dtype.itemsize != 1:
        raise FileFormatError(f"{entry.where}: expected a 1-byte dtype, found {entry.dtype}")
    base = entry._reader
    return dataclasses.replace(
        entry,
        dtype=np.dtype(np.uint8),
        shape=entry.shape if shape is None else shape,
        _reader=lambda a, b: base(a, b).view(np.uint8),
    )


def scales_and_codes(
    ckpt: Checkpoint, scale_suffix: str, codes_suffix: str = "weight"
) -> Iterator[tuple[str, ArrayEntry, ArrayEntry]]:
    """``(module, scale, codes)`` for each tensor ``MODULE.<scale_suffix>`` of the checkpoint, with
    the tensor ``MODULE.<codes_suffix>`` beside it; a scale without its codes is refused."""
    t = ckpt.tensors
    for name, scale in t.items():
        if not name.endswith(f".{scale_suffix}"):
            continue
        module = name[: -len(scale_suffix) - 1]
        codes = t.get(f"{module}.{codes_suffix}")
        if codes is None:
            raise FileFormatError(f"{ckpt.path}: {name} has no {module}.{codes_suffix} beside it")
        yield module, scale, codes


def expect_tensor(entry: ArrayEntry, dtype: str, shape: tuple[int, ...], what: str) -> None:
    if entry.dtype.name != dtype or entry.shape != shape:
        raise FileFormatError(
            f"{entry.where}: {what} must be {dtype} of shape {shape}, found {entry.dtype} of shape {entry.shape}"
        )
