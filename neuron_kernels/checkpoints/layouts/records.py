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
from ...blocks.exact import mx_extremes
from ...blocks.layout import BlockLayout
from ...casting import cast
from ...formats import BLOCK_FORMATS, FORMATS, WHOLE, BlockFormat
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.file_jobs import decoded_pieces
from ...io.safetensors import TensorSpec
from ..folder import Checkpoint
from ..runtimes import LARGEST_MULTIPLIER
from ..selection import fused_groups, tensor_decision

__all__ = [
    "CheckpointLayout",
    "StoredWeight",
    "Weight",
    "scaled_weight",
    "FP8_CODES",
    "FOREIGN_PARTS",
    "KV_SCALES",
    "kv_cache_name",
    "Output",
    "uint8_view",
    "expect_tensor",
    "scales_and_codes",
    "stored_codes_dtype",
    "stored_scales_dtype",
    "check_fused_blocks",
    "check_fused_whole",
]


#: The last name component of the stored tensors of a quantised module that are not its weight's.
_NOT_WEIGHT_PARTS = ("input_scale", "input_global_scale", "k_scale", "v_scale")


@dataclass(frozen=True)
class StoredWeight:
    """A quantised weight as a layout stores it: its block layout, per-tensor scale, where its
    codes and scales are (codes as uint8, scales as bytes or, for FP8 with float scales, as their
    float dtype; C order), the stored tensors it takes, the name and orientation of its
    dequantised tensor (``transpose``: the last two axes swapped), and what reports call it
    (``description``; its block format by default)."""

    name: str
    layout: BlockLayout
    per_tensor_scale: float | None
    codes: ArrayEntry
    scales: ArrayEntry
    parts: tuple[str, ...]
    out_name: str
    transpose: bool = False
    description: str | None = None

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
        read (whole rows of tiles of 2-D blocks). For a stored [..., out, in] weight blocked along
        ``in`` (not gpt-oss's transposed experts)."""
        lay = self.layout
        if self.columns_scaled:
            return self._columns_entry()
        if self.transpose or lay.axis != len(lay.shape) - 1:
            raise FileFormatError(
                f"{self.codes.where}: {self.name} is stored transposed; dequantize the checkpoint first "
                f"(neuron-kernels dequantize), then quantise the result"
            )
        cols, crow, srow = lay.shape[-1], lay.codes_shape[-1], lay.scales_shape[-1]
        tile = lay.block_rows if lay.two_d else 1  # rows that share a row of scales
        rows = lay.shape[-2] if lay.two_d else 1  # rows of one matrix (tiles do not cross them)
        per = -(-rows // tile)  # rows of tiles per matrix
        codes, scales = self.codes, self.scales

        def read(start: int, stop: int) -> np.ndarray:
            r0, r1 = start // cols, -(-stop // cols)
            if r1 <= r0:
                return np.empty(0, np.float32)
            if tile == 1:
                grid = np.asarray(scales.read_flat(r0 * srow, r1 * srow)).reshape(r1 - r0, srow)
            else:  # each row with the scales of its row of tiles: 1-D blocks, the same values
                flat = np.arange(r0, r1)
                t = (flat // rows) * per + (flat % rows) // tile
                grid = np.asarray(scales.read_flat(int(t[0]) * srow, (int(t[-1]) + 1) * srow)).reshape(-1, srow)
                grid = grid[t - t[0]]
            part = BlockArray.from_parts(
                np.asarray(codes.read_flat(r0 * crow, r1 * crow)).reshape(r1 - r0, crow),
                grid,
                BlockLayout(lay.fmt, (r1 - r0, cols), 1, lay.block_size, 1, lay.packed),
                codes.where,
                per_tensor_scale=self.per_tensor_scale,
            )
            return part.dequantize("float32").reshape(-1)[start - r0 * cols : stop - r0 * cols]

        amax = self.finite_amax if lay.format.float_scales or self.packed_mx else None
        return ArrayEntry(codes.path, self.out_name, lay.shape, np.dtype(np.float32), read, finite_amax=amax)

    @property
    def columns_scaled(self) -> bool:
        """Whether the weight is stacked [E, in, out] with one float scale per expert and column
        (blocks along ``in``, axis 1, whole: NxDI's Llama 4 experts)."""
        lay = self.layout
        return (
            not self.transpose
            and len(lay.shape) == 3
            and lay.axis == 1
            and lay.format.float_scales
            and lay.block_size >= lay.shape[1]
        )

    def _columns_entry(self) -> ArrayEntry:
        """:meth:`decoded_entry` of a :attr:`columns_scaled` weight: each element's code times its
        expert's scale of its column, in float32."""
        lay, codes, scales = self.layout, self.codes, self.scales
        _, rows, cols = lay.shape
        per = rows * cols
        table = np.arange(256, dtype=np.uint8).view(lay.format.element_format.result_dtype).astype(np.float32)

        def read(start: int, stop: int) -> np.ndarray:
            out = np.empty(max(stop - start, 0), np.float32)
            at = start
            while at < stop:
                e, offset = divmod(at, per)
                end = min(stop, (e + 1) * per)
                row = np.asarray(scales.read_flat(e * cols, (e + 1) * cols), np.float32)
                values = table[np.asarray(codes.read_flat(at, end)).view(np.uint8)]
                out[at - start : end - start] = values * row[np.arange(offset, offset + end - at) % cols]
                at = end
            return out

        return ArrayEntry(codes.path, self.out_name, lay.shape, np.dtype(np.float32), read)

    @property
    def packed_mx(self) -> bool:
        """Whether the weight is an MX format of packed 4-bit codes, blocked along its last axis
        (what :func:`~neuron_kernels.blocks.exact.mx_extremes` reads)."""
        lay = self.layout
        return lay.format.is_mx and lay.packed and not self.transpose and lay.axis == len(lay.shape) - 1

    def row_pieces(self, chunk_bytes: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(codes, scales) of runs of whole rows of a weight blocked along its last axis in 1-D
        blocks, as (rows, bytes) and (rows, blocks) arrays, about ``chunk_bytes`` of codes each."""
        lay = self.layout
        crow, srow = lay.codes_shape[-1], lay.scales_shape[-1]
        rows = int(np.prod(lay.shape[:-1], dtype=np.int64))
        step = max(1, chunk_bytes // max(crow, 1))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            codes = np.asarray(self.codes.read_flat(r0 * crow, r1 * crow)).reshape(r1 - r0, crow)
            scales = np.asarray(self.scales.read_flat(r0 * srow, r1 * srow)).reshape(r1 - r0, srow)
            yield codes, scales

    def mx_extremes(self, chunk_bytes: int = 64 << 20) -> tuple[int | None, int | None, float]:
        """(lowest, highest) scale exponent of the blocks holding a non-zero code, and the finite
        amax, of a :attr:`packed_mx` weight, in one pass (:func:`~neuron_kernels.blocks.exact.mx_extremes`)."""
        lo: int | None = None
        hi: int | None = None
        amax = 0.0
        for codes, scales in self.row_pieces(chunk_bytes):
            a, b, m = mx_extremes(codes, scales, self.layout.format)
            lo = a if lo is None else lo if a is None else min(lo, a)
            hi = b if hi is None else hi if b is None else max(hi, b)
            amax = max(amax, m)
        return lo, hi, amax

    def finite_amax(self, chunk_bytes: int = 64 << 20) -> float:
        """The largest finite |value| of the weight from its codes and scales, without decoding it:
        of a :attr:`packed_mx` one, by :meth:`mx_extremes`; of an FP8 one with float scales, per
        block, the largest code magnitude (float8_e4m3fn codes order as their magnitudes) decoded,
        times the block's scale, each product exact in float32 as the values are; NaN blocks and
        NaN codes left out. Read ``chunk_bytes`` of codes at a time."""
        if self.packed_mx:
            return self.mx_extremes(chunk_bytes)[2]
        lay = self.layout
        magnitudes = np.arange(128, dtype=np.uint8).view(lay.format.element_format.result_dtype)
        table = np.nan_to_num(cast(magnitudes, "float32"), nan=0.0)  # the NaN code counts as nothing
        cols, nb, bc = lay.shape[-1], lay.scales_shape[-1], lay.block_size
        total = int(np.prod(lay.shape[:-1], dtype=np.int64))
        # rows that blocks never cross (a matrix of 2-D tiles; all rows of 1-D blocks), rows of a block
        matrix, br = (lay.shape[-2], lay.block_rows) if lay.two_d else (max(total, 1), 1)
        step = max(br, (chunk_bytes // max(cols, 1)) // br * br)

        def segments() -> Iterator[tuple[int, int, int]]:
            """(first row, end row, first row of scales) of runs of whole rows of blocks."""
            for a in range(0, total, matrix):
                for t0 in range(0, matrix, step):
                    yield a + t0, a + min(t0 + step, matrix), (a // matrix) * -(-matrix // br) + t0 // br

        amax = np.float32(0)
        for r0, r1, s0 in segments():
            codes = np.asarray(self.codes.read_flat(r0 * cols, r1 * cols)).reshape(r1 - r0, cols)
            if (r1 - r0) % br or cols % bc:
                codes = np.pad(codes, [(0, -(r1 - r0) % br), (0, -cols % bc)])
            biggest = _largest_magnitudes(codes.reshape(-1, br, nb, bc))
            grid = np.asarray(self.scales.read_flat(s0 * nb, (s0 + biggest.shape[0]) * nb), np.float32)
            values = table[biggest] * grid.reshape(biggest.shape)
            finite = values[np.isfinite(values)]
            amax = max(amax, np.float32(finite.max())) if finite.size else amax
        return float(amax)

    @property
    def label(self) -> str:
        """What the weight is stored as, as reports say it: its block format (or description)."""
        return self.description or self.layout.fmt

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape


def _largest_magnitudes(tiles: np.ndarray) -> np.ndarray:
    """The largest magnitude (the code without its sign bit) of the float8_e4m3fn codes of each
    tile of ``tiles`` (uint8, (tile rows, rows, tile columns, columns)), NaN codes (0x7f, 0xff)
    left out; two reductions and no copy: as signed bytes the positive codes are the largest, as
    unsigned the negative ones. A tile holding a NaN code is done again without it."""
    positive = tiles.view(np.int8).max(axis=(1, 3)).astype(np.int16)
    negative = tiles.max(axis=(1, 3)).astype(np.int16) - 128
    largest = np.maximum(np.maximum(positive, negative), 0).astype(np.uint8)
    for i, j in np.argwhere((positive == 127) | (negative == 127)):
        tile = tiles[i, :, j, :] & np.uint8(0x7F)
        largest[i, j] = tile[tile != 0x7F].max(initial=0)
    return largest


#: The last name components of the tensors of GPTQ's and AWQ's layouts: a checkpoint holding one
#: without a config saying which layout (and so which packing) is refused, never guessed.
FOREIGN_PARTS = ("qweight", "scales", "qzeros")

#: The KV cache's scales (and the queries' under attention quantisation): tensors of an attention
#: module, not of a quantised weight (compressed-tensors' ``...self_attn.k_scale`` [1] or [heads, 1,
#: 1], a multiplier), which vLLM loads into its attention layer (``maybe_remap_kv_scale_name`` in
#: vllm/model_executor/model_loader/weight_utils.py: ``.self_attn.k_scale`` -> ``.attn.k_scale``).
KV_SCALES = ("k_scale", "v_scale", "q_scale")


def kv_cache_name(name: str) -> str | None:
    """The KV-cache (or query) scale ``name`` as compressed-tensors names it, ``ATTN.k_scale``
    (ModelOpt's ``ATTN.k_proj.k_scale`` / ``v_proj.v_scale``: the same multiplier under its
    projection), or None for a tensor that is none."""
    head, _, last = name.rpartition(".")
    if last not in KV_SCALES:
        return None
    parent, _, proj = head.rpartition(".")
    return f"{parent}.{last}" if parent and proj == f"{last[0]}_proj" else name


#: The dtype of the FP8 layouts' codes, and those of their scales.
FP8_CODES = FORMATS["float8_e4m3fn"].result_dtype
FP8_SCALES = tuple(FORMATS[n].result_dtype for n in ("float32", "bfloat16", "float16"))

#: A quantised weight as a checkpoint stores it.
Weight = StoredWeight


def scaled_weight(
    name: str,
    codes: ArrayEntry,
    scales: ArrayEntry,
    block: tuple[int, int],
    parts: tuple[str, ...],
    label: str,
    fmt: str = "fp8_block",
) -> StoredWeight:
    """The weight of ``codes`` (float8_e4m3fn, 2 or more axes) and ``scales`` (a float32, bfloat16 or
    float16 grid of ``block`` = (rows, cols) blocks of the last two axes: the whole matrix for one
    scale per tensor, (1, in) per channel, (1, g) per group), refusing what does not fit: the FP8
    layouts (fine-grained FP8, compressed-tensors ``float-quantized``, ModelOpt's FP8) as ``fmt``, a
    block format of the table with float scales (``fp8_tensor``, ``fp8_channel`` per channel or
    group, ``fp8_block``), its values ``float32(code) * float32(scale)``, partial edge blocks taking
    the scale of their block as the producers' padding gives them."""
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
    bm, bn = min(bm, rows), min(bn, cols)  # a block is cut to the matrix, as a block array records it
    layout = BlockLayout(fmt, codes.shape, len(codes.shape) - 1, bn, bm, False)
    grid_entry = dataclasses.replace(scales, shape=grid)
    return StoredWeight(name, layout, None, uint8_view(codes), grid_entry, parts, name, False, label)


#: (tensor spec, what fills it: "codes", "scales" or "per_tensor") of one quantised weight.
Output = tuple[TensorSpec, str]


@dataclass(frozen=True)
class CheckpointLayout:
    """One checkpoint layout (see the module docstring).

    ``formats``: the block formats it stores; ``outputs(name, layout, scale_dtype)``: the tensors
    a quantised weight becomes (``scale_dtype``: that of its scales, which float scales choose);
    ``config(fmt, kept, ignore)``: the ``quantization_config`` given the (name, entry) of the
    tensors kept and the Linear modules left plain (:func:`ignored_modules`); ``detect(ckpt)``:
    whether a checkpoint is in this layout; ``weights(ckpt)``: its quantised weights (raising
    :class:`FileFormatError` where the checkpoint is not what its config promises); ``suffix``:
    the layout is one file with this suffix (the package's), not a folder of shards; ``decide``:
    its rule of which tensors are quantised (:func:`module_decision`, :func:`tensor_decision` or
    :func:`expert_decision`; called with ``arch=``, the checkpoint's
    :class:`~..architecture.Architecture` or None); ``transpose``: a quantised [..., in, out]
    tensor is stored as [..., out, in] (blocks along ``in``); ``fits(ckpt, quantised, fmt)``:
    raises if the layout cannot express the checkpoint so that its runtime loads it
    (``quantised``: the shape of each weight to quantise; keywords ``arch``, the checkpoint's
    architecture or None, ``scale_dtype``, the one the user chose or None, and ``ignored``, the
    modules left plain); ``parts``: the last name components of
    the tensors only its quantised modules hold (and ``part_suffixes``: endings of those
    components, of uint8 tensors), so that a checkpoint holding one without a config saying which
    layout is refused; ``config_files``: files of a checkpoint that describe its quantisation in
    this layout (not copied to an output of another); ``scale_dtype(dtype)``: the dtype it stores
    the float scales of a weight of ``dtype`` in, unless the user chooses one (None: the format's
    own, float32); ``files(config)``: files written beside config.json, by name, as JSON, given
    the ``quantization_config`` (ModelOpt's ``hf_quant_config.json``); ``refused``: formats it
    cannot write so that its runtime loads them, each with why and what to choose;
    ``splits_experts``: its runtime loads the stacked experts of the models whose experts
    transformers splits (:meth:`~..architecture.Architecture.split`) as per-expert Linear weights
    (:mod:`..experts`); the other layouts hold them stacked; ``quantises(ckpt, names)``: whether
    the checkpoint's config has its runtime quantise the Linear module of those names (its
    checkpoint and model names) on load (None: the config does not say, or the layout has no such
    config), which the doctor holds against what is stored; ``per_tensor_part``: the last name
    component of the tensor that holds a weight's per-tensor scale, and ``per_tensor_divides``:
    whether it is stored as a divisor (compressed-tensors' global scale) rather than a multiplier;
    ``fused_scale``: how vLLM takes one per-tensor scale for a fused layer's shards in this layout
    (:func:`~..runtimes.fused_scale_rule`); ``notes(fmt, arch, quantised)``: what the layout's
    runtimes are known to load wrong in a valid checkpoint, said in the summary; ``producer``:
    who made a checkpoint, where its files say so; ``ignore_key``: the ``quantization_config``
    entry that lists the modules kept plain, which the doctor may repair (None: none it repairs);
    ``mixed(parts, kept, ignore, modules)``: the ``quantization_config`` of a checkpoint of several
    schemes (None: the layout holds one), ``parts`` each scheme's (format, the tensors it quantises,
    its activations as a recipe gives them or ``OWN``), ``modules`` what the config needs of the model's
    modules (their names in the model, the fused layers, the MoE's names), and ``mixed_notes()`` what
    its runtimes are known to load wrong in such a checkpoint; ``targets(ckpt)``: each of the config's
    groups' targets by the group's name, in config order, and its ignore entries, which the doctor
    matches as each runtime does
    (None: the layout has no such config); ``group_format(group)``: the block format of a config
    group as a recipe gives it (None: not one it writes; the field None: the layout takes no recipe
    file); ``kv_scale(name)``: the name it stores a KV-cache scale under, given compressed-tensors'
    (:func:`kv_cache_name`; None: it cannot hold one); ``scheme_checks(ckpt, weights)``: the doctor's
    findings on how its runtime reads each module's scheme, (severity, kind, message, tensors);
    ``activations(config,
    given)``: the one-scheme config with the input activations a recipe gives (None: not said)."""

    name: str
    help: str
    formats: tuple[str, ...]
    outputs: Callable[[str, BlockLayout, str], list[Output]]
    config: Callable[[str, list[tuple[str, ArrayEntry]], list[str]], dict[str, Any]]
    detect: Callable[[Checkpoint], bool]
    weights: Callable[[Checkpoint], list[Weight]]
    suffix: str | None = None
    decide: Callable[..., str | None] = tensor_decision
    transpose: bool = False
    fits: Callable[..., None] = lambda ckpt, quantised, fmt, **context: None
    parts: tuple[str, ...] = ()
    part_suffixes: tuple[str, ...] = ()
    config_files: tuple[str, ...] = ()
    scale_dtype: Callable[[np.dtype], str | None] = lambda dtype: None
    files: Callable[[dict[str, Any]], dict[str, Any]] = lambda config: {}
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    splits_experts: bool = False
    quantises: Callable[[Checkpoint, tuple[str, ...]], bool | None] = lambda ckpt, names: None
    per_tensor_part: str | None = None
    per_tensor_divides: bool = False
    fused_scale: tuple[str, str] = LARGEST_MULTIPLIER
    notes: Callable[[str, Any, dict[str, tuple[int, ...]]], list[str]] = lambda fmt, arch, quantised: []
    producer: Callable[[Checkpoint], str | None] = lambda ckpt: None
    ignore_key: str | None = None
    mixed: Callable[..., dict[str, Any]] | None = None
    mixed_notes: Callable[[], list[str]] = lambda: []
    targets: Callable[[Checkpoint], tuple[dict[str, tuple[str, ...]], list[str]] | None] = lambda ckpt: None
    group_format: Callable[[dict[str, Any]], str | None] | None = None
    kv_scale: Callable[[str], str | None] = lambda name: None
    scheme_checks: Callable[[Checkpoint, list[Any]], list[tuple[str, str, str, tuple[str, ...]]]] = (
        lambda ckpt, weights: []
    )
    activations: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    #: Whether the settings ``config`` gives go into config.json as its ``quantization_config``
    #: (False: the runtime takes them elsewhere, and ``files`` writes them beside it).
    config_in_json: bool = True
    #: The largest FP8 value its runtime holds, where below float8_e4m3fn's 448 (Neuron's 240): an
    #: FP8 weight beyond it is brought into range (:mod:`..fp8_range`), and the doctor reports one.
    fp8_max: float | None = None
    #: Whether its runtime loads stacked expert parameters (:func:`~..selection.stacked_expert`:
    #: Llama 4's [E, in, out]) quantised as they are stored: the codes [E, in, out] under the
    #: parameter's name, one scale per expert and output column (blocks along ``in``, axis 1).
    experts_in_place: bool = False

    def stored_per_tensor(self, pts: float) -> np.ndarray:
        """A per-tensor scale (the multiplier ``pts``) as the layout stores it: [1] float32, its
        reciprocal where the layout's is a divisor."""
        value = np.float32(1) / np.float32(pts) if self.per_tensor_divides else np.float32(pts)
        return np.array([value], np.float32)

    @property
    def single_file(self) -> bool:
        return self.suffix is not None

    def check_format(self, fmt: str) -> None:
        if not self.formats:
            raise FileFormatError(f"the {self.name} layout is read only; choose another --layout")
        if fmt in self.refused:
            raise FileFormatError(f"the {self.name} layout does not store {fmt}: {self.refused[fmt]}")
        if fmt not in self.formats:
            raise FileFormatError(
                f"the {self.name} layout stores {', '.join(self.formats)}, not {fmt}; "
                f"choose another --format or --layout"
            )


def stored_codes_dtype(bf: BlockFormat) -> np.dtype:
    """The dtype a checkpoint stores the codes of ``bf`` in: 4-bit codes (packable) two per byte
    as uint8, other codes as the element's own dtype (float8_e4m3fn for ``mxfp8_e4m3``)."""
    return np.dtype(np.uint8) if bf.packable else np.dtype(bf.element_format.result_dtype)


def stored_scales_dtype(bf: BlockFormat, scale_dtype: str | None = None) -> np.dtype:
    """The dtype a checkpoint stores the block scales of ``bf`` in: e8m0 scales (MX) as their
    byte, uint8, other scales as their own dtype (float8_e4m3fn for ``nvfp4``; float scales as
    ``scale_dtype``, float32 by default)."""
    if bf.float_scales and scale_dtype is not None:
        return np.dtype(FORMATS[scale_dtype].result_dtype)
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
    ckpt: Checkpoint, scale_suffix: str, codes_suffix: str = "weight", modules: Any = None
) -> Iterator[tuple[str, ArrayEntry, ArrayEntry]]:
    """``(module, scale, codes)`` for each tensor ``MODULE.<scale_suffix>`` of the checkpoint (of the
    ``modules`` given, if any), with the tensor ``MODULE.<codes_suffix>`` beside it; a scale without
    its codes is refused."""
    t = ckpt.tensors
    for name, scale in t.items():
        if not name.endswith(f".{scale_suffix}"):
            continue
        module = name[: -len(scale_suffix) - 1]
        if modules is not None and module not in modules:
            continue
        codes = t.get(f"{module}.{codes_suffix}")
        if codes is None:
            raise FileFormatError(f"{ckpt.path}: {name} has no {module}.{codes_suffix} beside it")
        yield module, scale, codes


def check_fused_blocks(ckpt: Checkpoint, quantised: dict[str, tuple[int, ...]], fmt: str, arch: Any = None) -> None:
    """FP8 in 2-D tiles, as vLLM loads it: each shard of a fused layer (q/k/v, gate/up), but the
    last, must have a number of output rows that is a multiple of the tile's (vLLM's
    ``validate_fp8_block_shape`` for a merged GEMM, vllm/model_executor/layers/quantization/utils/
    fp8_utils.py: a tile that straddled two shards would have one scale for both)."""
    bf = BLOCK_FORMATS[fmt]
    if bf.block_rows in (1, WHOLE):
        return
    for group in dict.fromkeys(fused_groups(quantised, arch).values()):
        for name in group[:-1]:
            rows = quantised[name][-2] if len(quantised[name]) >= 2 else 1
            if rows % bf.block_rows:
                raise FileFormatError(
                    f"{ckpt.path}: {name} has {rows} output rows, not a multiple of {fmt}'s {bf.block_rows}-row "
                    f"tiles, and is fused with {', '.join(n for n in group if n != name)} in vLLM, which refuses "
                    f"such a layer (validate_fp8_block_shape); --ignore the fused layer, or choose fp8_channel"
                )


def check_fused_whole(ckpt: Checkpoint, quantised: dict[str, tuple[int, ...]], arch: Any = None) -> None:
    """The shards of a fused layer (q/k/v, gate/up; ``arch``'s runtime fusion table) quantised all
    or none: the runtimes refuse a fused layer quantised in part (vLLM's ``should_ignore_layer``
    for compressed-tensors and ``is_layer_skipped`` for ModelOpt raise on shards that disagree)."""
    done = set(quantised)
    names = set(quantised) | {n for n in ckpt.tensors if n.endswith(".weight")}
    for group in dict.fromkeys(fused_groups(names, arch).values()):
        if 0 < len(done.intersection(group)) < len(group):
            kept = ", ".join(n for n in group if n not in done)
            raise FileFormatError(
                f"{ckpt.path}: {', '.join(group)} are one fused layer in the runtimes, which refuse it quantised in "
                f"part ({kept} kept); --ignore all of them or none"
            )


def expect_tensor(entry: ArrayEntry, dtype: str, shape: tuple[int, ...], what: str) -> None:
    if entry.dtype.name != dtype or entry.shape != shape:
        raise FileFormatError(
            f"{entry.where}: {what} must be {dtype} of shape {shape}, found {entry.dtype} of shape {entry.shape}"
        )
