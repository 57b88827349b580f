"""Model checkpoints: directories of ``.safetensors`` shards in, the layouts runtimes load out.

A checkpoint is a directory of ``.safetensors`` shards, with or without a
``model.safetensors.index.json`` (whose ``weight_map`` names each tensor's shard), a
``config.json`` and other files (tokenizer, generation config), or a single ``.safetensors``
file. :func:`open_checkpoint` reads its headers only; tensors are read piece by piece through
memory maps, so that a checkpoint of any size is processed in bounded memory.

Each layout is one record, :class:`CheckpointLayout` (all of them in :data:`LAYOUTS`): the tensors
a quantised weight becomes, the ``quantization_config`` that announces them, how to recognise the
layout in a checkpoint and where a stored weight's codes and scales are. The layouts:

- ``compressed-tensors`` (vLLM, transformers): per quantised ``NAME.weight``,
  ``NAME.weight_packed`` uint8 [..., out, in/2], ``NAME.weight_scale`` float8_e4m3fn
  [..., out, in/16] and ``NAME.weight_global_scale`` float32 [1] (= 1 / per-tensor scale) for
  ``nvfp4``; ``NAME.weight_packed`` and ``NAME.weight_scale`` uint8 (e8m0) [..., out, in/32] for
  ``mxfp4_e2m1``; ``NAME.weight`` float8_e4m3fn [..., out, in] and ``NAME.weight_scale`` uint8
  [..., out, in/32] for ``mxfp8_e4m3``.
- ``mxfp4`` (transformers' MXFP4, the layout of the gpt-oss checkpoints): per expert parameter
  ``NAME`` ([E, in, out]), ``NAME_blocks`` uint8 [E, out, in/32, 16] and ``NAME_scales`` uint8
  [E, out, in/32].
- ``npz``: the package's own file of block arrays (:mod:`neuron_kernels.blocks.file`).

Which tensors are quantised is the layout's rule: for compressed-tensors and npz
(:func:`tensor_decision`), floating-point tensors named ``*.weight`` with two or more dimensions
whose last dimension is a multiple of the block size, except names matching the default
exclusions (:data:`DEFAULT_EXCLUDES`) and the caller's ``ignore`` patterns, or only those matching
``only`` patterns; for mxfp4 (:func:`expert_decision`), gpt-oss's expert parameters only.
Everything else is copied bit for bit. The shards of a layer runtimes fuse
(:data:`FUSED_SHARDS`) share one per-tensor scale. The contract: ``docs/checkpoints.md``.

Outputs are written under a temporary name and renamed when complete
(:func:`neuron_kernels.files.atomic_output`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .blocks.array import BlockArray
from .blocks.file import BlockFileWriter, read_block_file
from .blocks.job import BlockJob, block_job
from .blocks.layout import BlockLayout
from .blocks.stats import ErrorStats, QuantizationStats
from .files import (
    ArrayEntry,
    FileFormatError,
    SafetensorsWriter,
    TensorSpec,
    read_safetensors_header,
)
from .formats import BLOCK_FORMATS, get_format
from .stream import Progress, decoded_pieces, entry_amax, quantized_pieces, transposed_pieces

__all__ = [
    "Checkpoint",
    "CheckpointLayout",
    "LAYOUTS",
    "DEFAULT_EXCLUDES",
    "StoredWeight",
    "TensorReport",
    "open_checkpoint",
    "load_checkpoint",
    "tensor_decision",
    "expert_decision",
    "fused_groups",
    "FUSED_SHARDS",
    "GPTOSS_EXPERTS",
    "GPTOSS_NOT_CONVERTED",
    "quantize_checkpoint",
    "dequantize_checkpoint",
    "DEFAULT_MAX_SHARD_BYTES",
]

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
#: Names that are never quantised (embeddings, norms, the output head, MoE routers): shell patterns.
DEFAULT_EXCLUDES: tuple[str, ...] = ("*embed*", "*norm*", "lm_head.*", "*.router.*", "*.mlp.gate.weight")
#: Weights of other formats in a checkpoint directory: not copied into a converted checkpoint.
_OTHER_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".index.json")
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
#: The shard metadata key under which the exact NVFP4 per-tensor scales are kept (JSON: name -> float),
#: so that the package reads back the scale it quantised with (1 / weight_global_scale otherwise).
_PTS_KEY = "per_tensor_scales"
_FLOATS = ("float32", "float16", "bfloat16", "float64")


# ---- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's tensors (data not read), its ``config.json`` and the other files beside it.

    ``tensors``: name -> :class:`ArrayEntry`, in the order of the index (else of the shards);
    ``metadata``: the shards' ``__metadata__`` merged; ``extra_files``: the other top-level files of
    the directory, copied into a converted checkpoint; ``skipped``: (name, why) of what is not.
    """

    path: str
    folder: str | None
    tensors: dict[str, ArrayEntry]
    config: dict[str, Any] | None
    metadata: dict[str, str] = field(default_factory=dict)
    extra_files: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        qc = (self.config or {}).get("quantization_config")
        return qc if isinstance(qc, dict) else None

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.tensors.values())


def _inside(folder: str, name: str, what: str) -> str:
    """``folder/name`` for a ``name`` that stays inside ``folder``: relative, no ``..``, and no
    folder on the way that is a symlink leading out (the file itself may be a link, as in the
    Hugging Face cache, where every file links into a blob store)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise FileFormatError(f"{folder}: {what} {name!r} is not a file name")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts:
        raise FileFormatError(f"{folder}: {what} {name!r} points outside the checkpoint folder; refused")
    path = os.path.join(folder, *parts)
    root = os.path.realpath(folder)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != root and not parent.startswith(root + os.sep):
        raise FileFormatError(f"{folder}: {what} {name!r} leads outside the checkpoint folder (a symlink); refused")
    return path


def _json_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FileFormatError(f"{path}: cannot read it as JSON ({exc})") from None


def _shard_entries(path: str, shown: str) -> tuple[dict[str, ArrayEntry], dict[str, str]]:
    from .files import ARRAY_FILES

    if not os.path.isfile(path):
        raise FileFormatError(f"{shown}: missing (named by the checkpoint, not found)")
    _, metadata, _ = read_safetensors_header(path)
    entries = ARRAY_FILES[".safetensors"].open(path) if os.path.getsize(path) > 8 else []
    return {e.name or "": e for e in entries}, metadata


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint at ``path``: a folder of ``.safetensors`` shards (with or without
    ``model.safetensors.index.json``) or one ``.safetensors`` file; headers only are read.

    Every problem (a missing shard, an index naming a tensor its shard does not hold, a truncated
    or corrupt shard, a name leading outside the folder, a tensor in two shards) raises
    :class:`FileFormatError` naming it."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileFormatError(f"{path}: no such file or folder")
    if not os.path.isdir(path):
        if not path.lower().endswith(".safetensors"):
            raise FileFormatError(f"{path}: a checkpoint is a folder of .safetensors shards or one .safetensors file")
        tensors, metadata = _shard_entries(path, path)
        if not tensors:
            raise FileFormatError(f"{path}: holds no tensors")
        return Checkpoint(path, None, tensors, None, metadata)
    config = _json_file(os.path.join(path, CONFIG_NAME)) if os.path.isfile(os.path.join(path, CONFIG_NAME)) else None
    if config is not None and not isinstance(config, dict):
        raise FileFormatError(f"{os.path.join(path, CONFIG_NAME)}: not a JSON object")
    index_path = os.path.join(path, INDEX_NAME)
    shards: list[str]
    wanted: dict[str, str] = {}
    if os.path.isfile(index_path):
        index = _json_file(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise FileFormatError(f"{index_path}: no weight_map of tensor names to shard files")
        wanted = dict(weight_map)
        shards = list(dict.fromkeys(weight_map.values()))
    else:
        shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        if not shards:
            raise FileFormatError(f"{path}: holds no .safetensors files (and no {INDEX_NAME})")
    tensors: dict[str, ArrayEntry] = {}
    metadata: dict[str, str] = {}
    found: dict[str, str] = {}
    for shard in shards:
        shard_path = _inside(path, shard, "shard")
        entries, meta = _shard_entries(shard_path, shard_path)
        metadata.update(meta)
        for name, entry in entries.items():
            if name in found:
                raise FileFormatError(f"{path}: tensor {name!r} is in two shards, {found[name]} and {shard}")
            found[name] = shard
            tensors[name] = entry
    for name, shard in wanted.items():
        if found.get(name) != shard:
            raise FileFormatError(
                f"{index_path}: names tensor {name!r} in {shard}, which does not hold it"
                + (f" (it is in {found[name]})" if name in found else "")
            )
    ordered = {n: tensors[n] for n in wanted} | tensors  # the index's order, then any unlisted
    used = set(shards) | {INDEX_NAME, CONFIG_NAME}
    extra, skipped = [], []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name in used:
            continue
        if os.path.isdir(full):
            skipped.append((name + "/", "a folder (only the top-level files of a checkpoint are copied)"))
        elif name.lower().endswith(_OTHER_WEIGHTS):
            skipped.append((name, "weights or an index of another set of files"))
        elif os.path.isfile(full):
            extra.append(name)
    return Checkpoint(path, path, ordered, config, metadata, tuple(extra), tuple(skipped))


# ---- which tensors are quantised ------------------------------------------------------------------


def _matches(name: str, patterns: tuple[str, ...]) -> str | None:
    """The first pattern matching the tensor ``name`` or its module (the name without ``.weight``)."""
    module = name[: -len(".weight")] if name.endswith(".weight") else name
    for p in patterns:
        if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(module, p):
            return p
    return None


def tensor_decision(
    name: str,
    dtype: Any,
    shape: tuple[int, ...],
    block_size: int,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
) -> str | None:
    """None if the tensor is quantised, else why it is kept.

    Quantised: a float32, float16, bfloat16 or float64 tensor named ``*.weight`` with two or more
    dimensions whose last is a multiple of ``block_size``, whose name (or module name) matches
    none of :data:`DEFAULT_EXCLUDES` and ``ignore``; with ``only``, the name must match one of
    them instead of avoiding the default exclusions (``ignore`` still applies). Patterns are shell
    patterns (``*``, ``?``, ``[...]``)."""
    why = _not_a_float(dtype)
    if why is not None:
        return why
    if not name.endswith(".weight"):
        return "not a .weight"
    if len(shape) < 2:
        return f"{len(shape)}-D"
    why = _patterns_keep(name, ignore, only, DEFAULT_EXCLUDES)
    if why is not None:
        return why
    if shape[-1] % block_size:
        return f"last axis {shape[-1]} is not a multiple of the block size {block_size}"
    return None


def _not_a_float(dtype: Any) -> str | None:
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return f"{dt.name} (not a float)"
    if dt.name not in _FLOATS:
        return f"{dt.name} (quantised from float32, float16, bfloat16 or float64 only)"
    return None


def _patterns_keep(name: str, ignore: tuple[str, ...], only: tuple[str, ...], excludes: tuple[str, ...]) -> str | None:
    """Why the caller's patterns keep ``name`` (``only`` replaces the default ``excludes``)."""
    if only:
        if _matches(name, only) is None:
            return "not matched by --only"
    else:
        hit = _matches(name, excludes)
        if hit is not None:
            return f"excluded by default ({hit})"
    hit = _matches(name, ignore)
    if hit is not None:
        return f"--ignore {hit}"
    return None


#: The parameters gpt-oss stores in MXFP4: its experts' stacked projections, [E, in, out] in the
#: bfloat16 model (shell patterns; no ``.weight`` suffix).
GPTOSS_EXPERTS: tuple[str, ...] = ("*.experts.gate_up_proj", "*.experts.down_proj")
#: The modules gpt-oss keeps in bfloat16, as its checkpoints' ``modules_to_not_convert`` name them.
GPTOSS_NOT_CONVERTED: tuple[str, ...] = (
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
)


def _is_expert(name: str) -> bool:
    """Whether ``name`` is one of gpt-oss's expert parameters (:data:`GPTOSS_EXPERTS`)."""
    return any(fnmatch.fnmatchcase(name, p) for p in GPTOSS_EXPERTS)


def expert_decision(
    name: str,
    dtype: Any,
    shape: tuple[int, ...],
    block_size: int,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
) -> str | None:
    """The ``mxfp4`` layout's rule (gpt-oss's): None if the tensor is quantised, else why it is kept.

    Quantised: a float tensor matching :data:`GPTOSS_EXPERTS`, 3-D ([E, in, out]) with ``in`` a
    multiple of ``block_size``, and not kept by ``ignore`` / ``only``. Everything else (attention,
    router, embeddings, ``lm_head``, biases, sinks) stays as gpt-oss keeps it."""
    if not _is_expert(name):
        return "kept as gpt-oss keeps it (MXFP4 holds the experts' gate_up_proj / down_proj only)"
    why = _not_a_float(dtype)
    if why is not None:
        return why
    if len(shape) != 3:
        return f"{len(shape)}-D (gpt-oss's experts are [experts, in, out])"
    why = _patterns_keep(name, ignore, only, ())
    if why is not None:
        return why
    if shape[1] % block_size:
        return f"input axis {shape[1]} is not a multiple of the block size {block_size}"
    return None


def _kept_modules(kept: list[tuple[str, ArrayEntry]]) -> list[str]:
    """The Linear-like modules left unquantised: 2-D ``*.weight`` floats that are not embeddings
    or norms (what a runtime must be told not to expect in the quantised layout)."""
    return [
        name[: -len(".weight")]
        for name, e in kept
        if name.endswith(".weight")
        and len(e.shape) == 2
        and e.dtype.name in _FLOATS + ("float8_e4m3fn", "float8_e5m2")
        and _matches(name, ("*embed*", "*norm*")) is None
    ]


# ---- fused layers ----------------------------------------------------------------------------------

#: Layers that runtimes fuse into one GEMM with one per-tensor scale, as rows of sibling module
#: names: the shards of a row that share a parent module are one fused layer. vLLM fuses
#: q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj`` (each MoE expert's too: ``w13``),
#: Mixtral's experts' ``w1``/``w3``, and MLA's ``q_a_proj``/``kv_a_proj_with_mqa`` into
#: ``fused_qkv_a_proj``; it keeps the largest of the shards' per-tensor scales for the whole layer
#: (``weight_global_scale.max()``), so every shard must be quantised with that one scale.
FUSED_SHARDS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("w1", "w3"),
    ("q_a_proj", "kv_a_proj_with_mqa"),
)


def fused_groups(names: Any) -> dict[str, tuple[str, ...]]:
    """Each of ``names`` (tensor names, ``MODULE.weight`` or ``MODULE``) that is a shard of a
    fused layer (:data:`FUSED_SHARDS`) with at least one other shard among ``names`` -> the names of
    its group, in the order of the table's row. Names in no such group are not keys."""
    groups: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for name in names:
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        parent, _, last = module.rpartition(".")
        for row, shards in enumerate(FUSED_SHARDS):
            if last in shards:
                groups.setdefault((parent, row), []).append((shards.index(last), name))
    fused = [tuple(n for _, n in sorted(g)) for g in groups.values() if len(g) > 1]
    return {n: g for g in fused for n in g}


# ---- layouts -------------------------------------------------------------------------------------


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

    def block_array(self) -> BlockArray:
        """The whole weight as a :class:`BlockArray` (read into memory)."""
        lay = self.layout
        return BlockArray.from_parts(
            self.codes.read().reshape(lay.codes_shape),
            self.scales.read().reshape(lay.scales_shape),
            lay.fmt,
            lay.block_size,
            lay.axis,
            lay.shape,
            lay.packed,
            self.codes.where,
            per_tensor_scale=self.per_tensor_scale,
        )


#: (tensor spec, what fills it: "codes", "scales" or "per_tensor") of one quantised weight.
Output = tuple[TensorSpec, str]


@dataclass(frozen=True)
class CheckpointLayout:
    """One checkpoint layout (see the module docstring).

    ``formats``: the block formats it stores; ``outputs(name, layout)``: the tensors a quantised
    weight becomes; ``config(fmt, kept)``: the ``quantization_config`` given the (name, entry) of
    the tensors kept; ``detect(ckpt)``: whether a checkpoint is in this layout; ``weights(ckpt)``:
    its quantised weights (raising :class:`FileFormatError` where the checkpoint is not what its
    config promises); ``suffix``: the layout is one file with this suffix (the package's), not a
    folder of shards; ``decide``: its rule of which tensors are quantised (:func:`tensor_decision`
    or :func:`expert_decision`); ``transpose``: a quantised [..., in, out] tensor is stored as
    [..., out, in] (blocks along ``in``); ``fits(ckpt, quantised)``: raises if the layout cannot
    express the checkpoint so that its runtime loads it."""

    name: str
    help: str
    formats: tuple[str, ...]
    outputs: Callable[[str, BlockLayout], list[Output]]
    config: Callable[[str, list[tuple[str, ArrayEntry]]], dict[str, Any]]
    detect: Callable[[Checkpoint], bool]
    weights: Callable[[Checkpoint], list[StoredWeight]]
    suffix: str | None = None
    decide: Callable[..., str | None] = tensor_decision
    transpose: bool = False
    fits: Callable[[Checkpoint, list[str]], None] = lambda ckpt, quantised: None

    @property
    def single_file(self) -> bool:
        return self.suffix is not None

    def check_format(self, fmt: str) -> None:
        if fmt not in self.formats:
            raise FileFormatError(
                f"the {self.name} layout stores {', '.join(self.formats)}, not {fmt}; "
                f"choose another --format or --layout"
            )


def _u8(entry: ArrayEntry, shape: tuple[int, ...] | None = None) -> ArrayEntry:
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


def _expect(entry: ArrayEntry, dtype: str, shape: tuple[int, ...], what: str) -> None:
    if entry.dtype.name != dtype or entry.shape != shape:
        raise FileFormatError(
            f"{entry.where}: {what} must be {dtype} of shape {shape}, found {entry.dtype} of shape {entry.shape}"
        )


# compressed-tensors ---------------------------------------------------------------------------------

#: compressed-tensors' format strings by block format.
_CT_FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp4_e2m1": "mxfp4-pack-quantized", "mxfp8_e4m3": "mxfp8-quantized"}


def _ct_outputs(name: str, layout: BlockLayout) -> list[Output]:
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    scale = np.dtype(BLOCK_FORMATS[layout.fmt].scale_format.dtype) if layout.fmt == "nvfp4" else np.dtype(np.uint8)
    if layout.fmt == "mxfp8_e4m3":
        codes = TensorSpec(f"{base}.weight", np.dtype(get_format("float8_e4m3fn").result_dtype), layout.codes_shape)
    else:
        codes = TensorSpec(f"{base}.weight_packed", np.dtype(np.uint8), layout.codes_shape)
    out = [(codes, "codes"), (TensorSpec(f"{base}.weight_scale", scale, layout.scales_shape), "scales")]
    if layout.fmt == "nvfp4":
        out.append((TensorSpec(f"{base}.weight_global_scale", np.dtype(np.float32), (1,)), "per_tensor"))
    return out


def _ct_config(fmt: str, kept: list[tuple[str, ArrayEntry]]) -> dict[str, Any]:
    nv = fmt == "nvfp4"
    weights = {
        "num_bits": 4 if "fp4" in fmt else 8,
        "type": "float",
        "symmetric": True,
        "strategy": "tensor_group" if nv else "group",
        "group_size": BLOCK_FORMATS[fmt].block_size,
        "dynamic": False,
        "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8",
        "actorder": None,
        "block_structure": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    group = {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": None,
        "output_activations": None,
        "format": _CT_FORMATS[fmt],
    }
    return {
        "quant_method": "compressed-tensors",
        "format": _CT_FORMATS[fmt],
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": _kept_modules(kept),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
    }


def _ct_fits(ckpt: Checkpoint, quantised: list[str]) -> None:
    """vLLM refuses a fused layer whose shards are quantised in part (``should_ignore_layer``)."""
    done = set(quantised)
    for group in dict.fromkeys(fused_groups(n for n in ckpt.tensors if n.endswith(".weight")).values()):
        if 0 < len(done.intersection(group)) < len(group):
            kept = ", ".join(n for n in group if n not in done)
            raise FileFormatError(
                f"{ckpt.path}: {', '.join(group)} are one fused layer in the runtimes, which refuse it quantised in "
                f"part ({kept} kept); --ignore all of them or none"
            )


def _ct_detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    return qc is not None and qc.get("quant_method") == "compressed-tensors"


def _ct_format(ckpt: Checkpoint) -> str:
    qc = ckpt.quantization_config or {}
    formats = {qc.get("format")} | {
        g.get("format") for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict) and g.get("format")
    }
    formats.discard(None)
    formats.discard("mixed-precision")
    known = {v: k for k, v in _CT_FORMATS.items()}
    if len(formats) != 1 or next(iter(formats)) not in known:
        raise FileFormatError(
            f"{ckpt.path}: compressed-tensors format {sorted(map(str, formats))} is not one this package reads "
            f"({', '.join(known)})"
        )
    return known[next(iter(formats))]


def _ct_weights(ckpt: Checkpoint) -> list[StoredWeight]:
    fmt = _ct_format(ckpt)
    bf = BLOCK_FORMATS[fmt]
    t = ckpt.tensors
    exact = json.loads(ckpt.metadata.get(_PTS_KEY, "{}"))
    found = []
    for name, scale in t.items():
        if not name.endswith(".weight_scale"):
            continue
        base = name[: -len(".weight_scale")]
        codes_name = f"{base}.weight" if fmt == "mxfp8_e4m3" else f"{base}.weight_packed"
        if codes_name not in t:
            raise FileFormatError(f"{ckpt.path}: {name} has no {codes_name} beside it")
        codes = t[codes_name]
        if not codes.shape:
            raise FileFormatError(f"{codes.where}: a 0-d tensor cannot hold block codes")
        shape = codes.shape[:-1] + (codes.shape[-1] * (2 if bf.packable else 1),)
        layout = BlockLayout(fmt, shape, len(shape) - 1, bf.block_size, 1, bf.packable)
        scale_dtype = "float8_e4m3fn" if fmt == "nvfp4" else "uint8"
        _expect(scale, scale_dtype, layout.scales_shape, "the block scales")
        parts = [codes_name, name]
        pts = None
        if fmt == "nvfp4":
            gname = f"{base}.weight_global_scale"
            if gname not in t:
                raise FileFormatError(f"{ckpt.path}: {codes_name} has no {gname} beside it")
            g = t[gname]
            if g.dtype.name != "float32" or g.size != 1:
                raise FileFormatError(f"{g.where}: must be one float32, found {g.dtype} of shape {g.shape}")
            gs = np.float32(g.read_flat(0, 1)[0])
            if not (np.isfinite(gs) and gs > 0):
                raise FileFormatError(f"{g.where}: the global scale {gs} is not a positive finite number")
            pts = float(np.float32(1) / gs)
            kept = exact.get(gname)
            if isinstance(kept, float) and np.float32(1) / np.float32(kept) == gs:
                pts = kept
            parts.append(gname)
        found.append(
            StoredWeight(f"{base}.weight", layout, pts, _u8(codes), _u8(scale), tuple(parts), f"{base}.weight")
        )
    _ct_check_rest(ckpt, {p for w in found for p in w.parts}, bf.block_size)
    return found


#: Suffixes of the tensors compressed-tensors adds to a quantised module.
_CT_PARTS = (
    "weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_shape", "weight_g_idx",
    "input_scale", "input_global_scale", "input_zero_point", "output_scale", "k_scale", "v_scale",
)  # fmt: skip


def _ct_matches(module: str, patterns: Any) -> bool | None:
    """Whether compressed-tensors' ``targets`` / ``ignore`` entries name ``module`` (a name, or
    ``re:`` and a regular expression matched from the start; ``Linear``: any Linear module), or
    None where an entry names a module class other than Linear (not decidable from the names)."""
    undecided = False
    for p in patterns or ():
        if not isinstance(p, str):
            continue
        if p.startswith("re:"):
            with contextlib.suppress(re.error):
                if re.match(p[3:], module):
                    return True
        elif p == "Linear" or p == module:
            return True
        elif "." not in p:
            undecided = True
    return None if undecided else False


def _ct_check_rest(ckpt: Checkpoint, claimed: set[str], block_size: int) -> None:
    """Refuse a compressed-tensors checkpoint that is not what its config promises: quantisation
    tensors that no quantised weight claims, or a Linear weight the config quantises (targeted,
    not ignored) stored plain. A runtime would load either wrong (an unexpected key, or a weight
    initialised at random)."""
    qc = ckpt.quantization_config or {}
    targets = [
        t for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict) for t in g.get("targets") or ()
    ]
    for name, entry in ckpt.tensors.items():
        if name in claimed:
            continue
        module, _, last = name.rpartition(".")
        if last in _CT_PARTS:
            raise FileFormatError(
                f"{ckpt.path}: {name} belongs to no quantised weight of the layout (its module has no complete "
                f"set of tensors); a runtime would not load it"
            )
        if (
            last == "weight"
            and tensor_decision(name, entry.dtype, entry.shape, block_size) is None
            and _ct_matches(module, targets) is True
            and _ct_matches(module, qc.get("ignore")) is False
        ):
            raise FileFormatError(
                f"{ckpt.path}: quantization_config quantises {module} (a Linear not in ignore), but "
                f"{name} is a plain {entry.dtype} tensor; a runtime would expect its quantised tensors"
            )


# transformers MXFP4 (gpt-oss) ------------------------------------------------------------------------


def _gptoss_outputs(name: str, layout: BlockLayout) -> list[Output]:
    groups = layout.scales_shape[-1]
    blocks = layout.shape[:-1] + (groups, 16)
    return [
        (TensorSpec(f"{name}_blocks", np.dtype(np.uint8), blocks), "codes"),
        (TensorSpec(f"{name}_scales", np.dtype(np.uint8), layout.scales_shape), "scales"),
    ]


def _expert_modules(names: Any) -> set[str]:
    return {n.rpartition(".")[0] for n in names}


def _gptoss_config(fmt: str, kept: list[tuple[str, ArrayEntry]]) -> dict[str, Any]:
    """gpt-oss's ``modules_to_not_convert``, and the experts modules kept in bfloat16 (by --ignore)."""
    experts = sorted(_expert_modules(n for n, _ in kept if _is_expert(n)))
    return {"quant_method": "mxfp4", "modules_to_not_convert": list(GPTOSS_NOT_CONVERTED) + experts}


def _gptoss_fits(ckpt: Checkpoint, quantised: list[str]) -> None:
    """transformers reads MXFP4 into gpt-oss's experts only: refuse what it would load wrong."""
    model_type = (ckpt.config or {}).get("model_type")
    fit = "--layout compressed-tensors (--format mxfp4_e2m1) suits other models"
    if model_type is not None and model_type != "gpt_oss":
        raise FileFormatError(
            f"{ckpt.path}: the mxfp4 layout is gpt-oss's (transformers reads it for model_type gpt_oss only), "
            f"not {model_type!r}; {fit}"
        )
    if not quantised:
        raise FileFormatError(
            f"{ckpt.path}: no gpt-oss expert parameters ({', '.join(GPTOSS_EXPERTS)}) to quantise; the mxfp4 "
            f"layout holds nothing else; {fit}"
        )
    done = set(quantised)
    half = _expert_modules(done) & _expert_modules(n for n in ckpt.tensors if n not in done and _is_expert(n))
    if half:
        raise FileFormatError(
            f"{ckpt.path}: {sorted(half)[0]}: transformers converts an experts module whole; quantise both its "
            f"gate_up_proj and down_proj or neither (--ignore the module)"
        )


def _gptoss_detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    if qc is not None:
        return qc.get("quant_method") == "mxfp4"
    return any(n.endswith("_blocks") and n[: -len("_blocks")] + "_scales" in ckpt.tensors for n in ckpt.tensors)


def _not_converted(ckpt: Checkpoint) -> tuple[str, ...]:
    patterns = (ckpt.quantization_config or {}).get("modules_to_not_convert") or ()
    return tuple(p for p in patterns if isinstance(p, str))


def _gptoss_weights(ckpt: Checkpoint) -> list[StoredWeight]:
    found = []
    t = ckpt.tensors
    for name, blocks in t.items():
        if not name.endswith(("_blocks", "_scales")):
            continue
        base = name[: -len("_blocks")]  # as long as "_scales"
        if not _is_expert(base):
            raise FileFormatError(
                f"{ckpt.path}: {name} is not an expert parameter ({', '.join(GPTOSS_EXPERTS)}), the only tensors "
                f"the mxfp4 layout stores in blocks; its runtime would not load it"
            )
        if name.endswith("_scales"):
            if f"{base}_blocks" not in t:
                raise FileFormatError(f"{ckpt.path}: {name} has no {base}_blocks beside it")
            continue
        sname = f"{base}_scales"
        if sname not in t:
            raise FileFormatError(f"{ckpt.path}: {name} has no {sname} beside it")
        if blocks.dtype.name != "uint8" or len(blocks.shape) != 4 or blocks.shape[-1] != 16:
            raise FileFormatError(
                f"{blocks.where}: MXFP4 blocks must be uint8 of shape [experts, out, in/32, 16], found "
                f"{blocks.dtype} of shape {blocks.shape}"
            )
        shape = blocks.shape[:-2] + (blocks.shape[-2] * 32,)
        layout = BlockLayout("mxfp4_e2m1", shape, len(shape) - 1, 32, 1, True)
        _expect(t[sname], "uint8", layout.scales_shape, "the e8m0 scales")
        found.append(
            StoredWeight(
                base, layout, None, _u8(blocks, layout.codes_shape), _u8(t[sname]), (name, sname), base, transpose=True
            )
        )
    if ckpt.quantization_config is not None:
        kept, stored = _not_converted(ckpt), {w.name for w in found}
        for name in t:
            module = name.rpartition(".")[0]
            if _is_expert(name) and not any(_module_matches(module, p) for p in kept) and name not in stored:
                raise FileFormatError(
                    f"{ckpt.path}: quantization_config (mxfp4) promises {name} in MXFP4 ({module} is not in "
                    f"modules_to_not_convert), but it is a plain {t[name].dtype} tensor"
                )
    return found


def _module_matches(module: str, pattern: str) -> bool:
    """transformers' test of a module against a ``modules_to_not_convert`` entry: the pattern
    (shell wildcards) names the module or one of its parents."""
    return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")


# the package's file --------------------------------------------------------------------------------


def _npz_detect(ckpt: Checkpoint) -> bool:
    return os.path.isfile(ckpt.path) and ckpt.path.lower().endswith(LAYOUTS["npz"].suffix or "")


def _npz_weights(ckpt: Checkpoint) -> list[StoredWeight]:
    found = []
    for key, s in read_block_file(ckpt.path).items():
        if s.rotation is not None:
            raise FileFormatError(
                f"{ckpt.path}[{key}]: quantised with a rotation; read it with MXArray.load and "
                f"dequantize(unrotate=True)"
            )
        name = "array" if key is None else str(key)
        found.append(StoredWeight(name, s.layout, s.per_tensor_scale, s.codes, s.scales, (), name))
    return found


def _no_config(fmt: str, kept: list[tuple[str, ArrayEntry]]) -> dict[str, Any]:
    return {}


#: Every checkpoint layout, by the name ``--layout`` takes.
LAYOUTS: dict[str, CheckpointLayout] = {
    "compressed-tensors": CheckpointLayout(
        "compressed-tensors",
        "vLLM / transformers compressed-tensors (weight_packed, weight_scale, weight_global_scale)",
        tuple(_CT_FORMATS),
        _ct_outputs,
        _ct_config,
        _ct_detect,
        _ct_weights,
        fits=_ct_fits,
    ),
    "mxfp4": CheckpointLayout(
        "mxfp4",
        "transformers MXFP4, the gpt-oss layout (NAME_blocks, NAME_scales)",
        ("mxfp4_e2m1",),
        _gptoss_outputs,
        _gptoss_config,
        _gptoss_detect,
        _gptoss_weights,
        decide=expert_decision,
        transpose=True,
        fits=_gptoss_fits,
    ),
    "npz": CheckpointLayout(
        "npz",
        "the package's file of block arrays (one .npz)",
        tuple(BLOCK_FORMATS),
        lambda name, layout: [],
        _no_config,
        _npz_detect,
        _npz_weights,
        suffix=".npz",
    ),
}


def detect_layout(ckpt: Checkpoint) -> CheckpointLayout | None:
    """The layout of a quantised checkpoint, or None for a plain one."""
    for layout in LAYOUTS.values():
        if layout.detect(ckpt):
            return layout
    qc = ckpt.quantization_config
    if qc is not None:
        raise FileFormatError(
            f"{ckpt.path}: quantization_config with quant_method {qc.get('quant_method')!r} is not a layout "
            f"this package reads ({', '.join(LAYOUTS)})"
        )
    return None


def _open_any(path: str) -> tuple[Checkpoint, CheckpointLayout | None]:
    for layout in LAYOUTS.values():  # a layout that is one file of its own (the package's)
        if layout.suffix and os.path.isfile(path) and path.lower().endswith(layout.suffix):
            return Checkpoint(path, None, {}, None), layout
    ckpt = open_checkpoint(path)
    return ckpt, detect_layout(ckpt)


def _stored_weights(ckpt: Checkpoint, layout: CheckpointLayout | None) -> list[StoredWeight]:
    weights = layout.weights(ckpt) if layout is not None else []
    if layout is not None and not weights and not layout.single_file:
        raise FileFormatError(f"{ckpt.path}: says it is {layout.name} but holds no quantised weight of that layout")
    return weights


def load_checkpoint(path: str | os.PathLike[str], names: Any = None) -> dict[str, BlockArray | np.ndarray]:
    """Read a checkpoint into memory: a :class:`BlockArray` for each quantised weight (as stored:
    gpt-oss's expert parameters are [E, out, in] blocks), a numpy array for every other tensor.

    ``path``: a checkpoint folder or ``.safetensors`` file in any layout of :data:`LAYOUTS` (or
    plain), or the package's ``.npz`` file. ``names``: only these names (an iterable). Keys are
    the weights' names (``NAME.weight``; ``NAME`` for gpt-oss's experts) and the other tensors'.
    NVFP4's per-tensor scale is the one quantised with when this package wrote the checkpoint,
    else ``1 / weight_global_scale`` in float32."""
    ckpt, layout = _open_any(os.fspath(path))
    wanted = None if names is None else set(names)
    out: dict[str, BlockArray | np.ndarray] = {}
    taken: set[str] = set()
    for w in _stored_weights(ckpt, layout):
        taken.update(w.parts)
        if wanted is None or w.name in wanted:
            out[w.name] = w.block_array()
    for name, entry in ckpt.tensors.items():
        if name not in taken and (wanted is None or name in wanted):
            out[name] = np.array(entry.read())
    if wanted is not None and wanted - set(out):
        raise KeyError(f"{path}: no tensor or weight named {', '.join(sorted(wanted - set(out)))}")
    return out


# ---- writing ---------------------------------------------------------------------------------------


@dataclass
class TensorReport:
    """What happened to one tensor: ``action`` is ``quantised``, ``dequantised`` or ``kept``;
    ``reason`` why it was kept; ``stats`` the error of a quantised one; ``fused_with``: the shards
    of its fused layer (itself included) whose per-tensor scale it shares, if any."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    action: str
    reason: str = ""
    stats: QuantizationStats | None = None
    outputs: tuple[str, ...] = ()
    fused_with: tuple[str, ...] = ()


@dataclass
class _Item:
    """A unit of output that goes into one shard: its tensors and how to fill them.

    ``prepare()`` runs before its shard's header is written (the per-tensor scale's pass) and
    returns metadata; ``fill(sinks)`` writes every tensor through ``sinks`` (name -> sink)."""

    specs: list[TensorSpec]
    fill: Callable[[dict[str, Any]], None]
    prepare: Callable[[], dict[str, float]] = lambda: {}

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)


def _shards(items: list[_Item], max_bytes: int) -> list[list[_Item]]:
    """Consecutive items grouped into shards of at most ``max_bytes`` (an item larger than that
    gets a shard of its own)."""
    shards: list[list[_Item]] = [[]]
    size = 0
    for item in items:
        if shards[-1] and size + item.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item.nbytes
    return shards


def _write_shards(folder: str, items: list[_Item], max_bytes: int) -> None:
    """The items as ``model.safetensors`` (one shard) or ``model-0000k-of-0000n.safetensors`` with
    ``model.safetensors.index.json``."""
    groups = _shards(items, max_bytes)
    n = len(groups)
    weight_map: dict[str, str] = {}
    total = 0
    for k, group in enumerate(groups, 1):
        fname = "model.safetensors" if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"
        pts: dict[str, float] = {}
        for item in group:
            pts.update(item.prepare())
        metadata = {"format": "pt"} | ({_PTS_KEY: json.dumps(pts)} if pts else {})
        specs = [s for item in group for s in item.specs]
        with SafetensorsWriter(os.path.join(folder, fname), specs, metadata) as writer:
            for item in group:
                with contextlib.ExitStack() as stack:
                    sinks = {s.name: stack.enter_context(writer.tensor(s.name)) for s in item.specs}
                    item.fill(sinks)
        for s in specs:
            weight_map[s.name] = fname
            total += s.nbytes
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        with open(os.path.join(folder, INDEX_NAME), "w", encoding="utf-8") as fh:
            json.dump(index, fh, indent=2)
            fh.write("\n")


def _copy_item(name: str, entry: ArrayEntry, progress: Progress, chunk_bytes: int) -> _Item:
    """A tensor copied bit for bit (bytes moved by the kernel where the input stores them raw)."""
    spec = TensorSpec(name, entry.dtype, entry.shape)

    def fill(sinks: dict[str, Any]) -> None:
        sink = sinks[name]
        if entry.offset is not None:
            sink.copy_from(entry.path, entry.offset, entry.nbytes)
            progress(entry.nbytes)
            return
        step = max(1, chunk_bytes // max(entry.dtype.itemsize, 1))
        for start in range(0, entry.size, step):
            piece = entry.read_flat(start, min(start + step, entry.size))
            sink.write(np.ascontiguousarray(piece))
            progress(piece.nbytes)

    return _Item([spec], fill)


def _finish_folder(
    ckpt: Checkpoint, folder: str, quantization_config: dict[str, Any] | None, remove_quantization: bool
) -> None:
    """config.json (with the new quantization_config, or without one) and the other files."""
    config = dict(ckpt.config or {})
    if remove_quantization:
        config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    if config or ckpt.config is not None:
        with open(os.path.join(folder, CONFIG_NAME), "w", encoding="utf-8") as fh:
            json.dump(config, fh, indent=2)
            fh.write("\n")
    if ckpt.folder is not None:
        for name in ckpt.extra_files:
            shutil.copyfile(os.path.join(ckpt.folder, name), os.path.join(folder, name))


def _report_kept(name: str, entry: ArrayEntry, reason: str) -> TensorReport:
    return TensorReport(name, entry.shape, entry.dtype.name, "kept", reason, outputs=(name,))


def quantize_checkpoint(
    src: str,
    dst: str,
    layout_name: str,
    fmt: str,
    *,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    fuse: bool = True,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    chunk_bytes: int = 256 << 20,
    progress: Progress = lambda _: None,
    **options: Any,
) -> list[TensorReport]:
    """Quantise the checkpoint ``src`` into ``dst`` (already a temporary path: an empty folder, or
    the ``.npz`` file of the ``npz`` layout) in the layout ``layout_name``.

    ``options`` are those of :func:`neuron_kernels.quantize` (blocks run along the last axis).
    With ``fuse`` (the default), the shards of each fused layer (:func:`fused_groups`) quantised
    with a per-tensor scale from the amax share one scale, from the amax over all of them.
    Returns one :class:`TensorReport` per input tensor, in order."""
    layout = LAYOUTS[layout_name]
    layout.check_format(fmt)
    ckpt = open_checkpoint(src)
    if ckpt.quantization_config is not None:
        qc = ckpt.quantization_config
        raise FileFormatError(
            f"{src}: already quantised (quantization_config, quant_method {qc.get('quant_method')!r}); "
            f"dequantize it first"
        )
    if options.get("axis", -1) not in (-1, None):
        raise FileFormatError("checkpoint layouts block the last axis (the input dimension); --axis must be -1")
    probe = block_job(fmt, 2, **options)
    if not layout.single_file and (probe.block_size != probe.fmt.block_size or probe.block_rows != 1):
        raise FileFormatError(
            f"the {layout.name} layout stores {fmt} with 1-D blocks of {probe.fmt.block_size}; "
            f"--block-size/--block-shape other than that need --layout npz"
        )
    if not layout.single_file and probe.rotation is not None:
        raise FileFormatError(f"the {layout.name} layout has no place for a rotation (--rht needs --layout npz)")
    if not layout.single_file and not probe.pack and probe.fmt.packable:
        raise FileFormatError(f"the {layout.name} layout stores 4-bit codes two per byte (no --no-pack)")
    reports: list[TensorReport] = []
    chosen: list[tuple[str, ArrayEntry, BlockJob | None]] = []
    for name, entry in ckpt.tensors.items():
        why = layout.decide(name, entry.dtype, entry.shape, probe.block_size, ignore, only)
        chosen.append((name, entry, None if why else block_job(fmt, len(entry.shape), **options)))
        reports.append(
            _report_kept(name, entry, why) if why else TensorReport(name, entry.shape, entry.dtype.name, "quantised")
        )
    layout.fits(ckpt, [n for n, _, j in chosen if j is not None])
    groups = fused_groups(n for n, _, j in chosen if j is not None and j.needs_amax) if fuse else {}
    for report in reports:
        report.fused_with = groups.get(report.name, ())
    resolve = _ScaleResolver({n: (e, j) for n, e, j in chosen if j is not None}, groups, chunk_bytes)
    kept = [(n, e) for (n, e, j), r in zip(chosen, reports) if j is None]
    if layout.single_file:
        _quantize_to_block_file(dst, chosen, reports, resolve, chunk_bytes, progress)
        return reports
    items: list[_Item] = []
    for (name, entry, job), report in zip(chosen, reports):
        if job is None:
            items.append(_copy_item(name, entry, progress, chunk_bytes))
            continue
        shape = entry.shape[:-2] + (entry.shape[-1], entry.shape[-2]) if layout.transpose else entry.shape
        outputs = layout.outputs(name, job.layout(shape))
        report.outputs = tuple(s.name for s, _ in outputs)
        items.append(_quantize_item(name, entry, layout.transpose, outputs, report, resolve, chunk_bytes, progress))
    _write_shards(dst, items, max_shard_bytes)
    _finish_folder(ckpt, dst, layout.config(fmt, kept), False)
    return reports


class _ScaleResolver:
    """Each quantised tensor's job with its per-tensor scale resolved: from its own amax, or from
    the amax over its fused group (one pass over each shard, when the first is asked for)."""

    def __init__(
        self, jobs: dict[str, tuple[ArrayEntry, BlockJob]], groups: dict[str, tuple[str, ...]], chunk_bytes: int
    ) -> None:
        self.jobs, self.groups, self.chunk_bytes = jobs, groups, chunk_bytes
        self.amax: dict[tuple[str, ...], float] = {}

    def __call__(self, name: str) -> BlockJob:
        entry, job = self.jobs[name]
        if not job.needs_amax:
            return job
        group = self.groups.get(name, (name,))
        if group not in self.amax:
            self.amax[group] = max(entry_amax(*self.jobs[m], self.chunk_bytes) for m in group)
        return job.with_amax(self.amax.pop(group) if len(group) == 1 else self.amax[group])


def _pipelined_stats(
    pieces: Iterator[tuple[np.ndarray, BlockArray]], write: Callable[[BlockArray], None], progress: Progress
) -> ErrorStats:
    """Write each quantised piece and fold it into the error statistics, the statistics of one
    piece running on a worker thread while the next is read and quantised (the statistics'
    kernels are serial; this keeps a second core busy). At most one piece waits for them."""
    from concurrent.futures import Future, ThreadPoolExecutor

    acc = ErrorStats()
    with ThreadPoolExecutor(1, thread_name_prefix="nk-stats") as pool:
        pending: Future[None] | None = None
        for arr, mx in pieces:
            write(mx)
            if pending is not None:
                pending.result()
            pending = pool.submit(acc.add, arr, mx)
            progress(arr.nbytes)
        if pending is not None:
            pending.result()
    return acc


def _quantize_item(
    name: str,
    entry: ArrayEntry,
    transpose: bool,
    outputs: list[Output],
    report: TensorReport,
    resolve: _ScaleResolver,
    chunk_bytes: int,
    progress: Progress,
) -> _Item:
    by_role = {role: spec.name for spec, role in outputs}
    resolved: list[BlockJob] = []

    def prepare() -> dict[str, float]:
        resolved.append(resolve(name))
        pts = resolved[-1].per_tensor_scale
        return {by_role["per_tensor"]: float(pts)} if "per_tensor" in by_role and isinstance(pts, float) else {}

    def fill(sinks: dict[str, Any]) -> None:
        done = resolved.pop()
        codes, scales = sinks[by_role["codes"]], sinks[by_role["scales"]]

        def write(mx: BlockArray) -> None:
            codes.write(mx.codes.reshape(-1).view(codes.spec.dtype))
            scales.write(mx.scales.reshape(-1).view(np.uint8).view(scales.spec.dtype))

        pieces = transposed_pieces(entry, done) if transpose else quantized_pieces(entry, done, chunk_bytes)
        acc = _pipelined_stats(pieces, write, progress)
        if "per_tensor" in by_role:
            pts = done.per_tensor_scale
            assert isinstance(pts, float)
            sinks[by_role["per_tensor"]].write(np.array([np.float32(1) / np.float32(pts)], np.float32))
        report.stats = acc.result()

    return _Item([spec for spec, _ in outputs], fill, prepare)


def _quantize_to_block_file(
    dst: str,
    chosen: list[tuple[str, ArrayEntry, BlockJob | None]],
    reports: list[TensorReport],
    resolve: _ScaleResolver,
    chunk_bytes: int,
    progress: Progress,
) -> None:
    """The ``npz`` layout: the quantised weights as the package's file (the kept tensors are not
    in it: it holds block arrays only)."""
    for name, _, job in chosen:
        parts = name.replace("\\", "/").split("/")
        if job is not None and (name.startswith("/") or ".." in parts):
            raise FileFormatError(f"tensor name {name!r} would make a file member outside the file; refused")
    with BlockFileWriter(dst) as writer:
        for (name, entry, job), report in zip(chosen, reports):
            if job is None:
                report.reason += " (not in the npz layout, which holds block arrays only)"
                report.outputs = ()
                continue
            job = resolve(name)
            pts = job.per_tensor_scale if isinstance(job.per_tensor_scale, float) else None
            with writer.array(name, job.layout(entry.shape), pts, job.rotation) as out:
                pieces = quantized_pieces(entry, job, chunk_bytes)
                acc = _pipelined_stats(pieces, lambda mx: out.write(mx.codes, mx.scales), progress)
            report.stats = acc.result()
            report.outputs = (name,)


def dequantize_checkpoint(
    src: str,
    dst: str,
    *,
    dtype: str = "bfloat16",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    chunk_bytes: int = 256 << 20,
    progress: Progress = lambda _: None,
) -> list[TensorReport]:
    """Dequantise a checkpoint in any layout of :data:`LAYOUTS` (or the package's ``.npz`` file)
    into the plain checkpoint folder ``dst`` (already a temporary, empty folder): each quantised
    weight as a ``dtype`` tensor (gpt-oss's expert parameters transposed to [E, in, out]), every
    other tensor bit for bit, ``config.json`` without its ``quantization_config``, the other files
    copied."""
    ckpt, layout = _open_any(src)
    if layout is None:
        raise FileFormatError(f"{src}: not a quantised checkpoint (no quantization_config, no block tensors)")
    out_fmt = get_format(dtype)
    if out_fmt.name not in _FLOATS:
        raise FileFormatError(f"dequantisation writes float32, float16, bfloat16 or float64, not {dtype}")
    out_dtype = np.dtype(out_fmt.result_dtype)
    weights = _stored_weights(ckpt, layout)
    by_part = {p: w for w in weights for p in w.parts}
    reports: list[TensorReport] = []
    items: list[_Item] = []
    order: list[tuple[str, StoredWeight | None]] = [(w.name, w) for w in weights if not w.parts]
    seen: set[str] = set()
    for name in ckpt.tensors:
        w = by_part.get(name)
        if w is None:
            order.append((name, None))
        elif w.name not in seen:
            seen.add(w.name)
            order.append((w.name, w))
    for name, w in order:
        if w is None:
            entry = ckpt.tensors[name]
            items.append(_copy_item(name, entry, progress, chunk_bytes))
            reports.append(_report_kept(name, entry, "not quantised"))
            continue
        shape = w.layout.shape
        out_shape = shape[:-2] + (shape[-1], shape[-2]) if w.transpose else shape
        spec = TensorSpec(w.out_name, out_dtype, out_shape)
        items.append(_Item([spec], _decode_fill(w, out_fmt.name, chunk_bytes, progress)))
        reports.append(TensorReport(w.name, shape, w.layout.fmt, "dequantised", outputs=(w.out_name,)))
    _write_shards(dst, items, max_shard_bytes)
    _finish_folder(ckpt, dst, None, True)
    return reports


def _decode_fill(w: StoredWeight, dtype: str, chunk_bytes: int, progress: Progress) -> Callable[[dict[str, Any]], None]:
    def fill(sinks: dict[str, Any]) -> None:
        sink = sinks[w.out_name]
        if not w.transpose:
            for values, used in decoded_pieces(w.codes, w.scales, w.layout, w.per_tensor_scale, None, dtype,
                                               chunk_bytes):  # fmt: skip
                sink.write(values)
                progress(used)
            return
        # one matrix at a time: decoded [out, in], written transposed as [in, out]
        lay = w.layout
        rows, cols = lay.shape[-2], lay.shape[-1]
        count = int(np.prod(lay.shape[:-2], dtype=np.int64))
        per_codes, per_scales = rows * lay.codes_shape[-1], rows * lay.scales_shape[-1]
        for m in range(count):
            part = BlockArray.from_parts(
                np.asarray(w.codes.read_flat(m * per_codes, (m + 1) * per_codes)).reshape(rows, -1),
                np.asarray(w.scales.read_flat(m * per_scales, (m + 1) * per_scales)).reshape(rows, -1),
                lay.fmt,
                lay.block_size,
                1,
                (rows, cols),
                lay.packed,
                w.codes.where,
                per_tensor_scale=w.per_tensor_scale,
            )
            sink.write(np.ascontiguousarray(part.dequantize(dtype).T))
            progress(per_codes + per_scales)

    return fill
