"""Converting checkpoints: quantising one into a layout, dequantising one back, reading one into memory.

:func:`quantize_checkpoint` writes each quantised weight as its layout's tensors and copies
everything else bit for bit; :func:`dequantize_checkpoint` writes a plain checkpoint back;
:func:`load_checkpoint` reads one into memory. Shards are written by
:class:`neuron_kernels.io.safetensors.SafetensorsWriter`, one tensor piece at a time; outputs are written
under a temporary name and renamed when complete (:func:`neuron_kernels.io.outputs.atomic_output`).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..blocks.array import BlockArray
from ..blocks.exact import nvfp4_scales, per_tensor_exponent, relayable
from ..blocks.job import BlockJob
from ..blocks.scheme import DEFAULT, Scheme, scheme_of
from ..casting import cast
from ..dtypes import get_format
from ..formats import BLOCK_FORMATS, INPUT_DTYPES, WHOLE
from ..io.arrays import ArrayEntry, FileFormatError
from ..io.blockfile import BlockFileWriter
from ..io.file_jobs import Progress, entry_amax, quantized_pieces, transposed_pieces
from ..io.safetensors import TensorSpec
from ..recipes import RECIPES
from .architecture import Architecture, architecture_of, module_of, transformers_available
from .cluster import write_on_cluster
from .experts import split_experts, stack_experts, stacked_fp8_experts
from .folder import CONFIG_NAME, Checkpoint, write_json
from .fp8_range import MAGNITUDE, OCP_E4M3, beyond, halve
from .layouts import LAYOUTS, CheckpointLayout, Output, StoredWeight, Weight, detect_layout, open_any, stored_weights
from .layouts.integer_weights import offset_fields, pack_words
from .layouts.records import FOREIGN_PARTS, KV_SCALES, kv_cache_name
from .reports import TensorReport, exact_stats, pipelined_stats
from .scheme_map import OWN, SchemeMap
from .selection import (
    fused_groups,
    fused_layers,
    ignored_modules,
    module_decision,
    stacked_expert,
    stacked_expert_decision,
)
from .shards import Item, Tally, shards_of, write_shards

__all__ = [
    "TensorReport",
    "load_checkpoint",
    "quantize_checkpoint",
    "dequantize_checkpoint",
    "DEFAULT_MAX_SHARD_BYTES",
]

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9


def load_checkpoint(path: str | os.PathLike[str], names: Any = None) -> dict[str, BlockArray | np.ndarray]:
    """Read a checkpoint into memory: a :class:`BlockArray` for each quantised weight (as stored:
    gpt-oss's expert parameters are [E, out, in] blocks), a numpy array for every other tensor.

    ``path``: a checkpoint folder or ``.safetensors`` file in any layout of :data:`LAYOUTS` (or
    plain), the package's ``.npz`` file, or a GGUF file (:func:`~.gguf_convert.load_gguf`). ``names``:
    only these names (an iterable). Keys are
    the weights' names (``NAME.weight``; ``NAME`` for gpt-oss's experts) and the other tensors'.
    The FP8 layouts' weights come as block arrays of ``fp8_block``, ``fp8_channel`` or ``fp8_tensor``
    (float scales in their stored dtype).
    NVFP4's per-tensor scale is the one quantised with when this package wrote the checkpoint,
    else ``1 / weight_global_scale`` in float32."""
    if os.fspath(path).lower().endswith(".gguf"):  # llama.cpp's file: its own reader
        from .gguf_convert import load_gguf

        return load_gguf(path, names)
    ckpt, layout = open_any(os.fspath(path))
    wanted = None if names is None else set(names)
    out: dict[str, BlockArray | np.ndarray] = {}
    taken: set[str] = set()
    for w in stored_weights(ckpt, layout):
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


class Reports(list[TensorReport]):
    """The reports of a quantisation, with ``notes`` (what runtimes are known to load wrong from
    it, each layout's ``notes``) and ``architecture`` (where the modules came from, or None)."""

    def __init__(self, reports: list[TensorReport], notes: list[str], architecture: Architecture | None) -> None:
        super().__init__(reports)
        self.notes = notes
        self.architecture = architecture


def _copy_item(name: str, entry: ArrayEntry, progress: Progress, chunk_bytes: int, as_name: str | None = None) -> Item:
    """A tensor copied bit for bit (bytes moved by the kernel where the input stores them raw),
    under ``as_name`` if given."""
    spec = TensorSpec(as_name or name, entry.dtype, entry.shape)

    def fill(sinks: dict[str, Any]) -> None:
        sink = sinks[spec.name]
        if entry.offset is not None:
            sink.copy_from(entry.path, entry.offset, entry.nbytes)
            progress(entry.nbytes)
            return
        step = max(1, chunk_bytes // max(entry.dtype.itemsize, 1))
        for start in range(0, entry.size, step):
            piece = entry.read_flat(start, min(start + step, entry.size))
            sink.write(np.ascontiguousarray(piece))
            progress(piece.nbytes)

    return Item([spec], fill, kept=name)


def _finish_folder(
    ckpt: Checkpoint,
    folder: str,
    quantization_config: dict[str, Any] | None,
    remove_quantization: bool,
    files: dict[str, Any] | None = None,
) -> None:
    """config.json (with the new quantization_config, or without one), the layout's own ``files``
    (name -> JSON) and the other files of the input."""
    config = dict(ckpt.config or {})
    if remove_quantization:
        config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    if config or ckpt.config is not None:
        write_json(os.path.join(folder, CONFIG_NAME), config)
    if ckpt.folder is not None:
        described = {f for lay in LAYOUTS.values() for f in lay.config_files}
        for name in ckpt.extra_files:
            if name in described:  # the input's quantisation, not the output's
                continue
            shutil.copyfile(os.path.join(ckpt.folder, name), os.path.join(folder, name))
    for name, content in (files or {}).items():
        write_json(os.path.join(folder, name), content)


def _report_kept(name: str, entry: ArrayEntry, reason: str) -> TensorReport:
    return TensorReport(name, entry.shape, entry.dtype.name, "kept", reason, outputs=(name,))


def quantize_checkpoint(
    src: str | Checkpoint,
    dst: str,
    layout_name: str,
    fmt: str,
    *,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    fuse: bool = True,
    modules: str = "auto",
    towers: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    chunk_bytes: int = 256 << 20,
    progress: Progress = lambda _: None,
    require_exact: bool = False,
    stats: bool = True,
    client: Any = None,
    schemes: SchemeMap | None = None,
    **options: Any,
) -> Reports:
    """Quantise the checkpoint ``src`` (a path, or a :class:`~.folder.Checkpoint` opened already:
    with ``client``, of absolute paths) into ``dst`` (already a temporary path: an empty folder, or
    the ``.npz`` file of the ``npz`` layout) in the layout ``layout_name``.

    ``src`` may be quantised, in any layout of :data:`LAYOUTS`: a weight already ``fmt`` is
    converted (its bytes copied into the layout's tensors, action ``converted``), any other is
    dequantised exactly to float32, piece by piece, and quantised. A checkpoint holding a
    quantised layout's tensors without a config that names the layout, and one where nothing
    would be quantised, are refused (:class:`FileFormatError`).

    ``options`` are those of :func:`neuron_kernels.quantize` (blocks run along the last axis).
    Which tensors are quantised follows the model's modules (:func:`~.selection.module_decision`),
    taken from the package's table or transformers (``modules``: ``auto``, ``transformers`` or
    ``table``; :mod:`.architecture`); a checkpoint of an architecture neither knows is refused
    unless ``only`` says which tensors to quantise. The towers of a multimodal model (its vision
    or audio encoder and projector) are kept unless ``towers``. Stacked experts are written as the
    layout's runtime loads them (:mod:`.experts`: per expert in compressed-tensors where
    transformers splits them, stacked elsewhere).
    With ``fuse`` (the default), the shards of each fused layer (the runtime's fusion table of the
    architecture, :func:`~.selection.fused_groups`) quantised with a per-tensor scale from the amax
    share one scale, from the amax over all of them.
    A conversion keeps every value where it can (docs/checkpoints.md "Exact conversions"): a
    weight already ``fmt`` is copied; MXFP4 goes into NVFP4 as its codes with re-laid scales
    (:mod:`neuron_kernels.blocks.exact`) when its block exponents fit; MX into FP8 with float
    scales takes power-of-two scales (``scale_mode="pow2"``) unless ``scale_mode`` is given. With
    ``require_exact``, a tensor whose values would change raises :class:`FileFormatError` (the
    caller's output, written to a temporary path, is then dropped).
    Each quantised weight's error statistics (``TensorReport.stats``) are computed as it is written;
    ``stats=False`` skips them (None; they take about 40% of a conversion's time), but where
    ``require_exact`` needs them.
    With ``client`` (a ``distributed.Client``), the per-tensor scales' reads and then the shards
    are tasks on its cluster, whose workers must see ``src`` and ``dst`` (:mod:`.cluster`): the
    same bytes, each shard written by one worker.
    Returns one :class:`TensorReport` per input tensor, in order (a :class:`Reports`: with the
    runtimes' notes and the architecture the decisions came from)."""
    layout = LAYOUTS[layout_name]
    if schemes is None:
        layout.check_format(fmt)
    if client is not None and layout.single_file:
        raise FileFormatError(
            f"the {layout.name} layout is one file; a cluster writes checkpoint folders, a shard per task"
        )
    if isinstance(src, Checkpoint):  # opened already (the command opens it once, for its size)
        ckpt, source = src, detect_layout(src)
    else:
        ckpt, source = open_any(os.path.abspath(src) if client is not None else src)
    chosen = scheme_of(fmt, options) if schemes is None else schemes
    plan = plan_quantization(ckpt, source, layout, chosen, ignore, only, fuse, chunk_bytes, modules, towers=towers)
    plan.require_exact, plan.stats = require_exact, stats
    result = Reports(plan.reports, plan.notes, plan.arch)
    if layout.single_file:
        _quantize_to_block_file(dst, plan.chosen, plan.reports, plan.resolve, chunk_bytes, progress, stats)
        return result
    if client is not None:
        tally = Tally()
        shards = shards_of(plan.items(tally), max_shard_bytes, tally)
        write_on_cluster(client, os.path.abspath(dst), shards, plan.resolve, progress)
    else:
        write_shards(dst, plan.items(progress), max_shard_bytes)
    _finish_folder(ckpt, dst, plan.config if layout.config_in_json else None, True, layout.files(plan.config))
    return result


@dataclass
class _Plan:
    """What quantising a checkpoint into a layout does, decided before anything is written: one
    report per input tensor, each tensor's job (None: kept), the per-tensor scales' resolver, the
    weights converted as their bytes, and the layout's ``quantization_config``."""

    layout: CheckpointLayout
    reports: list[TensorReport]
    chosen: list[tuple[str, ArrayEntry, BlockJob | None]]
    resolve: _ScaleResolver
    copies: dict[str, StoredWeight]
    config: dict[str, Any]
    chunk_bytes: int
    arch: Architecture | None = None
    notes: list[str] = field(default_factory=list)
    require_exact: bool = False
    stats: bool = True
    renames: dict[str, str | None] = field(default_factory=dict)
    #: FP8 weights brought into the layout's smaller range (:mod:`.fp8_range`).
    rescales: dict[str, StoredWeight] = field(default_factory=dict)

    def items(self, progress: Progress) -> list[Item]:
        """The output's tensors, in the input's order, and how to fill each (a KV-cache scale under
        the layout's name for it; one it has no place for left out)."""
        layout, items = self.layout, []
        for (name, entry, job), report in zip(self.chosen, self.reports):
            if job is None:
                target = self.renames.get(name, name)
                if target is not None:
                    items.append(_copy_item(name, entry, progress, self.chunk_bytes, target))
                continue
            shape = entry.shape[:-2] + (entry.shape[-1], entry.shape[-2]) if layout.transpose else entry.shape
            w = self.copies.get(name)
            # a converted weight keeps its scales' dtype unless the layout stores one dtype (float32)
            scale_dtype = (
                (layout.scale_dtype(w.scales.dtype) or w.scales.dtype.name) if w is not None else job.fmt.scale
            )
            outputs = layout.outputs(name, w.layout if w is not None else job.layout(shape), scale_dtype)
            report.outputs = tuple(s.name for s, _ in outputs)
            divides = layout.per_tensor_divides
            if w is not None:
                items.append(_converted_item(w, outputs, progress, divides))
                continue
            if name in self.rescales:
                assert layout.fp8_max is not None
                rescaled = self.rescales[name]
                outputs = layout.outputs(name, job.layout(shape), "float32")
                items.append(_rescaled_item(rescaled, outputs, report, layout.fp8_max, self.require_exact, progress))
                continue
            item = _quantize_item(
                name, entry, layout.transpose, outputs, report, self.resolve, self.chunk_bytes, progress,
                self.require_exact, self.stats, divides,
            )  # fmt: skip
            relay = self.resolve.relays.get(name)
            if relay is not None:
                item = _relaid_item(
                    relay, item, outputs, report, self.resolve, self.chunk_bytes, progress, self.require_exact,
                    divides,
                )  # fmt: skip
            items.append(item)
        return items


def plan_quantization(
    ckpt: Checkpoint,
    source: CheckpointLayout | None,
    layout: CheckpointLayout,
    scheme: Scheme | SchemeMap,
    ignore: tuple[str, ...],
    only: tuple[str, ...],
    fuse: bool,
    chunk_bytes: int,
    modules: str = "auto",
    arch: Architecture | None = None,
    towers: bool = False,
) -> _Plan:
    """The :class:`_Plan` of quantising ``ckpt`` (in the layout ``source``, or plain) into ``layout``
    (see :func:`quantize_checkpoint`) with ``scheme`` (one for every weight, or a
    :class:`~.scheme_map.SchemeMap`); every refusal is raised here, before anything is written."""
    schemes = scheme if isinstance(scheme, SchemeMap) else SchemeMap.one(scheme)
    stored = stored_weights(ckpt, source)
    if source is None:
        _refuse_unannounced(ckpt)
    for each in schemes.schemes():
        _check_scheme(layout, each)
    reports: list[TensorReport] = []
    chosen: list[tuple[str, ArrayEntry, BlockJob | None]] = []
    inputs, by_name = _inputs(ckpt, stored)
    if arch is None and layout.decide is module_decision:
        arch = architecture_of(ckpt.config, inputs, modules)
        if arch is None and not only:
            raise FileFormatError(_unknown_architecture(ckpt, modules))
    if layout.decide is module_decision:  # stacked experts as the layout's runtime holds them
        inputs = split_experts(inputs, arch) if layout.splits_experts else stack_experts(inputs, arch)
    if layout.experts_in_place and layout.fp8_max is not None and source is not None:
        by_name.update(stacked_fp8_experts(by_name, arch))  # their codes moved, halved if need be
    copies: dict[str, StoredWeight] = {}
    relays: dict[str, StoredWeight] = {}
    rescales: dict[str, StoredWeight] = {}
    of: dict[str, Scheme] = {}  # each quantised tensor's scheme
    renames: dict[str, str | None] = {}  # KV-cache scales: each under the layout's name, or dropped (None)
    for name, entry in inputs.items():
        canonical = kv_cache_name(name)
        if canonical is not None:
            renames[name] = layout.kv_scale(canonical)
            chosen.append((name, entry, None))
            reports.append(_kv_report(name, entry, renames[name], layout))
            continue
        mine = schemes.scheme_for(name, _model_name(arch, name))
        in_place = layout.experts_in_place and stacked_expert(name, entry.shape, arch)
        if in_place:
            why = stacked_expert_decision(name, entry.dtype, ignore, only)
        else:
            why = layout.decide(name, entry.dtype, entry.shape, _whole(mine), ignore, only, arch=arch, towers=towers)
        if not why and mine is None:
            why = schemes.kept_why()
        w = by_name.get(name)
        if why or mine is None:
            chosen.append((name, entry, None))
            reports.append(_report_kept(name, entry, str(why) + (f" (dequantised from {w.label})" if w else "")))
            continue
        if in_place and mine.recipe is not None:
            raise FileFormatError(
                f"{name}: recipe {mine.recipe!r} quantises Linear weights along their input; these stacked experts "
                "are blocked along another axis, which its producer does not quantise; --ignore them or drop --recipe"
            )
        job = _layout_scheme(layout, mine, entry, w).job(len(entry.shape), entry.dtype.name)
        chosen.append((name, entry, replace(job, axis=1) if in_place else job))
        of[name] = mine
        fmt = mine.format
        if w is not None and source is not None and _copies_bytes(w, layout, mine):
            copies[name] = w
            how = f"bytes copied from {source.name}" + _dropped_note(w)
            reports.append(TensorReport(name, entry.shape, fmt, "converted", how, format=fmt))
        elif w is not None and source is not None and _rescales(w, layout, mine):
            rescales[name] = w  # halved where a value exceeds the range (decided when it is written)
            how = f"from {w.label} into +-{layout.fp8_max:g}" + _dropped_note(w)
            reports.append(TensorReport(name, entry.shape, fmt, "converted", how, format=fmt))
        elif isinstance(w, StoredWeight) and not layout.single_file and _relays(w, mine):
            relays[name] = w  # re-laid exactly if its exponents fit (decided when it is written)
            reports.append(TensorReport(name, entry.shape, fmt, "converted", f"re-laid from {w.label}", format=fmt))
        else:
            how = f"dequantised from {w.label}{_dropped_note(w)}" if w is not None else ""
            reports.append(TensorReport(name, entry.shape, entry.dtype.name, "quantised", how, format=fmt))
    kept = [(renames.get(n, n), e) for (n, e, j) in chosen if j is None and renames.get(n, n) is not None]
    ignored = ignored_modules(kept, arch, inputs)
    by_scheme: dict[Scheme, dict[str, tuple[int, ...]]] = {}
    for n, e, j in chosen:
        if j is not None:
            by_scheme.setdefault(of[n], {})[n] = e.shape
    quantised = {n: e.shape for n, e, j in chosen if j is not None}
    if len(by_scheme) > 1:
        _check_mixed(ckpt, layout, of, arch, [n for n, _ in kept])
    first = next(schemes.schemes(), None)
    for each, shapes in (by_scheme or ({first: {}} if first is not None else {})).items():
        chosen_dtype = each.job(2).fmt.scale if each.scale_dtype is not None else None
        size = each.job(2).block_size
        layout.fits(
            ckpt, shapes, each.format, arch=arch, scale_dtype=chosen_dtype, ignored=tuple(ignored), block_size=size
        )
    if not quantised:
        why_kept = Counter(r.reason for r in reports).most_common(3)
        raise FileFormatError(
            f"{ckpt.path}: no tensor to quantise ({len(chosen)} kept, "
            + "; ".join(f"{n}: {reason}" for reason, n in why_kept)
            + (f"; modules from {arch.source}" if arch is not None else "")
            + '; see --only / --ignore and docs/checkpoints.md "Which tensors are quantised"); nothing written'
        )
    needs = (n for n, _, j in chosen if j is not None and j.needs_amax and n not in copies and _fuses(of[n]))
    groups = fused_groups(needs, arch) if fuse else {}
    for report in reports:
        report.fused_with = groups.get(report.name, ())
    resolve = _ScaleResolver({n: (e, j) for n, e, j in chosen if j is not None}, groups, chunk_bytes, relays)
    config: dict[str, Any] = {}
    if not layout.single_file and len(by_scheme) > 1:
        assert layout.mixed is not None
        parts = [(s.format, tuple(by_scheme[s]), schemes.activations(s)) for s in by_scheme]
        sizes = [s.job(2).block_size if BLOCK_FORMATS[s.format].integer else None for s in by_scheme]
        extra = {"group_sizes": sizes} if any(sizes) else {}  # integer groups: layouts that hold them take sizes
        config = layout.mixed(parts, kept, ignored, _Modules(arch), **extra)
    elif not layout.single_file:
        (only_scheme,) = by_scheme
        groups: dict[str, Any] = {}
        if BLOCK_FORMATS[only_scheme.format].integer:
            groups["group_size"] = only_scheme.job(2).block_size
        if layout.experts_in_place:
            groups["experts"] = sorted(n for n in quantised if stacked_expert(n, quantised[n], arch))
        config = layout.config(only_scheme.format, kept, ignored, **groups)
        activations = schemes.activations(only_scheme)
        if activations is not OWN and layout.activations is not None:
            config = layout.activations(config, activations)
    notes = [note for each, shapes in by_scheme.items() for note in layout.notes(each.format, arch, shapes)]
    notes += layout.mixed_notes() if len(by_scheme) > 1 else []
    plan = _Plan(layout, reports, chosen, resolve, copies, config, chunk_bytes, arch, list(dict.fromkeys(notes)))
    plan.renames = renames
    plan.rescales = rescales
    return plan


def _fuses(scheme: Scheme) -> bool:
    """Whether the shards of a fused layer quantised with ``scheme`` share a per-tensor scale (not
    under torchao's and ggml's recipes, one scale per tensor)."""
    return scheme.recipe is None or RECIPES[scheme.recipe].fuses


def _kv_report(name: str, entry: ArrayEntry, target: str | None, layout: CheckpointLayout) -> TensorReport:
    """A KV-cache scale: carried under the layout's name for it, or dropped where it has none."""
    if target is None:
        why = (
            f"a KV-cache scale the {layout.name} layout has no place for: its runtimes run the cache unscaled "
            f"(choose --layout compressed-tensors to keep it)"
        )
        return TensorReport(name, entry.shape, entry.dtype.name, "dropped", why)
    why = "a KV-cache scale" + (f", as {target} (the {layout.name} layout's name)" if target != name else "")
    return TensorReport(name, entry.shape, entry.dtype.name, "kept", why, outputs=(target,))


def _whole(scheme: Scheme | None) -> int:
    """The elements a weight's last axis must be a multiple of to be quantised with ``scheme``:
    its blocks' (1 for float scales, whose edge blocks may be partial; none without a scheme)."""
    if scheme is None or BLOCK_FORMATS[scheme.format].float_scales:
        return 1
    return scheme.job(2).block_size


def _model_name(arch: Architecture | None, name: str) -> str | None:
    module = module_of(name)
    return arch.model_name(module) if arch is not None else None


def _check_scheme(layout: CheckpointLayout, scheme: Scheme) -> None:
    """Refuse a scheme the layout cannot store: another format, blocks other than the format's, a
    rotation, unpacked 4-bit codes, blocks across another axis."""
    layout.check_format(scheme.format)
    fmt = scheme.format
    if scheme.axis not in (-1, None):
        raise FileFormatError("checkpoint layouts block the last axis (the input dimension); --axis must be -1")
    probe = scheme.job(2)
    own = (probe.block_size, probe.block_rows) == (probe.fmt.block_size, probe.fmt.block_rows)
    if not layout.single_file and not own and not (probe.fmt.integer and probe.block_rows == 1):  # groups: any
        raise FileFormatError(
            f"the {layout.name} layout stores {fmt} with {_blocks_of(probe.fmt)}; "
            f"--block-size/--block-shape other than that need --layout npz"
        )
    if not layout.single_file and probe.rotation is not None:
        raise FileFormatError(f"the {layout.name} layout has no place for a rotation (--rht needs --layout npz)")
    if not layout.single_file and not probe.pack and probe.fmt.packable:
        raise FileFormatError(f"the {layout.name} layout stores 4-bit codes two per byte (no --no-pack)")


class _Modules:
    """What a layout's mixed config needs of the model's modules: each module's name in the model,
    the fused layers, and the names vLLM looks each expert's fused MoE up by."""

    def __init__(self, arch: Architecture | None) -> None:
        self.arch = arch

    def model_name(self, module: str) -> str:
        return self.arch.model_name(module) if self.arch is not None else module

    def moe_probes(self, module: str) -> tuple[str, ...]:
        """For one expert's Linear (``...experts.E.gate_proj``), the names of its fused MoE."""
        return self.arch.expert_probes(module) if self.arch is not None else ()

    def fused(self, names: Any) -> dict[str, tuple[tuple[str, ...], str | None]]:
        """Each module that is a shard of a fused layer -> (the shards, the fused layer's name or None)."""
        return fused_layers(names, self.arch)


def _check_mixed(
    ckpt: Checkpoint, layout: CheckpointLayout, of: dict[str, Scheme], arch: Architecture | None, kept: list[str]
) -> None:
    """Several schemes: the layout must hold them, and the shards of a fused layer (and the experts of
    one MoE) must share one, as vLLM requires of a layer it runs as one."""
    if layout.mixed is None:
        raise FileFormatError(
            f"the {layout.name} layout holds one scheme per checkpoint; several (--scheme, --recipe-file) need "
            f"another --layout ({', '.join(n for n, lay in LAYOUTS.items() if lay.mixed is not None)})"
        )
    names = list(of) + kept
    for group in dict.fromkeys(fused_groups(names, arch).values()):
        found = {of.get(m) for m in group}
        if len(found) > 1:
            words = ", ".join(f"{m} {of[m].format if m in of else 'kept'}" for m in group)
            raise FileFormatError(
                f"{ckpt.path}: {words} are one fused layer in the runtimes, which need one scheme for all its "
                f"shards (vLLM refuses it otherwise); give them the same --scheme"
            )
    modules = _Modules(arch)
    moes: dict[tuple[str, ...], set[Any]] = {}
    for name in names:
        probes = modules.moe_probes(module_of(name))
        if probes:
            moes.setdefault(probes, set()).add(of.get(name))
    for probes, found in moes.items():
        if len(found) > 1:
            raise FileFormatError(
                f"{ckpt.path}: the experts of {probes[0].rpartition('.')[0].rpartition('.')[0]} take different "
                f"schemes; vLLM's fused MoE needs one for all of them (give them the same --scheme)"
            )


def _blocks_of(bf: Any) -> str:
    """A format's default blocks, as messages say them."""
    whole = {WHOLE: "a whole axis"}
    if bf.block_rows == 1:
        return f"1-D blocks of {whole.get(bf.block_size, bf.block_size)}"
    return f"tiles of {whole.get(bf.block_rows, bf.block_rows)} x {whole.get(bf.block_size, bf.block_size)}"


def _layout_scheme(layout: CheckpointLayout, scheme: Scheme, entry: ArrayEntry, w: Weight | None = None) -> Scheme:
    """The scheme of a weight: the user's; for float scales, the scale dtype its layout stores
    those of a weight of its dtype in where the user chose none, and power-of-two scales for a
    stored MX weight (its values are on a power-of-two grid, which they keep) where the user chose
    no scale mode. A recipe computes in the weight's dtype (the job is given it)."""
    if scheme.recipe is not None or not BLOCK_FORMATS[scheme.format].float_scales:
        return scheme
    if w is not None and w.layout.format.is_mx and scheme.scale_mode in (None, DEFAULT):
        scheme = replace(scheme, scale_mode="pow2")
    chosen = layout.scale_dtype(entry.dtype) if scheme.scale_dtype is None else None
    return scheme if chosen is None else replace(scheme, scale_dtype=chosen)


def _unknown_architecture(ckpt: Checkpoint, modules: str) -> str:
    model_type = (ckpt.config or {}).get("model_type")
    what = "no config.json with a model_type" if not isinstance(model_type, str) else f"model_type {model_type!r}"
    where = {"table": "the package's table", "transformers": "transformers"}.get(
        modules, "transformers" + ("" if transformers_available() else " (not installed)") + " or the package's table"
    )
    return (
        f"{ckpt.path}: {what}, an architecture {where} does not know, so which tensors are Linear weights "
        f"cannot be told; say which to quantise with --only PATTERN (and keep some with --ignore PATTERN; in "
        f"memory: only=, or the model= or config= it comes from)"
    )


def _refuse_unannounced(ckpt: Checkpoint) -> None:
    """A checkpoint without a quantisation config (no layout) that holds a quantised layout's
    tensors (those the layouts declare, and those of layouts the package does not read) is
    refused: quantising the rest and relabelling it would write a checkpoint that loads wrong."""
    folders = [lay for lay in LAYOUTS.values() if not lay.single_file]
    parts = {p for lay in folders for p in lay.parts} | set(FOREIGN_PARTS)
    suffixes = tuple(s for lay in folders for s in lay.part_suffixes)
    for name, entry in ckpt.tensors.items():
        last = name.rpartition(".")[2]
        if last in parts or last.endswith(suffixes) and entry.dtype == np.uint8:
            raise FileFormatError(
                f"{ckpt.path}: holds {name} ({entry.dtype}), a tensor of a quantised layout, but no "
                f"quantization_config or hf_quant_config.json says which layout; this package will not guess "
                f"(it reads {', '.join(lay.name for lay in folders)})"
            )


def _inputs(ckpt: Checkpoint, stored: list[Weight]) -> tuple[dict[str, ArrayEntry], dict[str, Weight]]:
    """The tensors to quantise or keep, in the checkpoint's order: each stored quantised weight
    as its exact float32 dequantisation (read piece by piece), its parts (scales) consumed; every
    other tensor as it is. Also the stored weights by their dequantised name."""
    by_part = {p: w for w in stored for p in w.parts}
    inputs: dict[str, ArrayEntry] = {}
    by_name: dict[str, Weight] = {}
    for name, entry in ckpt.tensors.items():
        w = by_part.get(name)
        if w is None:
            inputs[name] = entry
        elif w.out_name not in by_name:
            by_name[w.out_name] = w
            inputs[w.out_name] = w.decoded_entry()
    return inputs, by_name


def _dropped_note(w: Weight) -> str:
    return f" ({', '.join(p.rpartition('.')[2] for p in w.dropped)} dropped)" if w.dropped else ""


def _copies_bytes(w: Weight, layout: Any, scheme: Scheme) -> bool:
    """Whether a stored weight goes into ``layout`` as its bytes: already the scheme's format in the
    blocks the layout stores. Options that would change its bytes are refused (they need it
    dequantised)."""
    fmt = scheme.format
    if not isinstance(w, StoredWeight) or w.layout.fmt != fmt or w.transpose != layout.transpose:
        return False
    if (w.layout.block_size, w.layout.block_rows) != Scheme(fmt).job(len(w.shape)).stored_blocks(w.shape):
        return False  # other blocks of the same format (FP8 per group, not per channel): quantised anew
    given = _given(scheme)
    if given:
        raise FileFormatError(
            f"{w.name} is already {fmt}: converting it to the {layout.name} layout copies its bytes, so "
            f"{', '.join(sorted(given))} cannot apply; dequantize the checkpoint first to quantise it anew"
        )
    return True


def _rescales(w: Weight, layout: Any, scheme: Scheme) -> bool:
    """Whether a stored OCP FP8 weight goes into ``layout``'s smaller FP8 range as its codes, halved
    where needed (:mod:`.fp8_range`): the layout declares a maximum below float8_e4m3fn's, the
    scheme's format is FP8 with float scales within it, in the blocks the weight is stored in, and
    no option asks for a quantisation of its own."""
    if layout.fp8_max is None or not isinstance(w, StoredWeight) or w.transpose:
        return False
    if len(w.shape) != 2 and not w.columns_scaled:
        return False
    source, target = w.layout.format, BLOCK_FORMATS[scheme.format]
    if source.element_format is not OCP_E4M3 or not source.float_scales or not target.float_scales:
        return False
    if target.element_bits != 8 or target.max_element > layout.fp8_max:
        return False
    if w.columns_scaled:  # stacked experts, one scale per expert and column: a per-channel target
        return target.block_rows == 1 and target.block_size == WHOLE and not _given(scheme)
    blocks = Scheme(scheme.format).job(len(w.shape)).stored_blocks(w.shape)
    return (w.layout.block_size, w.layout.block_rows) == blocks and not _given(scheme)


def _rescaled_item(
    w: StoredWeight,
    outputs: list[Output],
    report: TensorReport,
    largest: float,
    require_exact: bool,
    progress: Progress,
) -> Item:
    """An OCP FP8 weight written into a range of ``largest`` (:mod:`.fp8_range`): copied byte for
    byte if every value lies within it, else every code halved and every scale doubled; the report
    says which, and how many elements (the smallest subnormals) changed and by how much at most."""
    by_role = {role: spec.name for spec, role in outputs}
    if w.columns_scaled:  # [E, in, out] as rows of out, a scale per expert's rows and column
        experts, depth, cols = w.shape
        rows, bm, bn, grid_shape = experts * depth, depth, 1, (experts, cols)
    else:
        rows, cols = w.shape
        bm, bn, grid_shape = w.layout.block_rows, w.layout.block_size, w.scales.shape

    def fill(sinks: dict[str, Any]) -> None:
        step = max(1, (16 << 20) // max(cols, 1))
        over = 0
        for r0 in range(0, rows, step):
            over += beyond(np.asarray(w.codes.read_flat(r0 * cols, min(rows, r0 + step) * cols)), largest)
        grid = np.asarray(w.scales.read_flat(0, w.scales.size), np.float64).reshape(grid_shape)
        scale_sink, codes_sink = sinks[by_role["scales"]], sinks[by_role["codes"]]
        if not over:
            report.reason = f"bytes copied: every value of {w.label} lies within +-{largest:g}"
            if w.codes.offset is not None:
                codes_sink.copy_from(w.codes.path, w.codes.offset, w.codes.nbytes)
            else:
                codes_sink.write(np.asarray(w.codes.read_flat(0, w.codes.size)).view(codes_sink.spec.dtype))
            scale_sink.write(grid.astype(np.float32).reshape(scale_sink.spec.shape))
            progress(w.codes.nbytes + w.scales.nbytes)
            return
        doubled = (grid * 2).astype(np.float32)
        if not np.isfinite(doubled[np.isfinite(grid)]).all():
            raise FileFormatError(f"{w.name}: a scale doubled exceeds float32; it cannot be brought into +-{largest:g}")
        inexact, worst = 0, 0.0
        col_block = np.arange(cols) // bn
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            codes = np.asarray(w.codes.read_flat(r0 * cols, r1 * cols)).view(np.uint8).reshape(r1 - r0, cols)
            halved, changed = halve(codes)
            if changed.any():
                inexact += int(changed.sum())
                r, c = np.nonzero(changed)
                before = MAGNITUDE[codes[r, c]].astype(np.float64)
                after = MAGNITUDE[halved[r, c]].astype(np.float64) * 2
                worst = max(worst, float((np.abs(before - after) * np.abs(grid[(r + r0) // bm, col_block[c]])).max()))
            codes_sink.write(halved.view(codes_sink.spec.dtype))
            progress(codes.nbytes)
        scale_sink.write(doubled.reshape(scale_sink.spec.shape))
        report.inexact = inexact
        report.reason = f"codes halved, scales doubled: {over} value(s) of {w.label} beyond +-{largest:g}; " + (
            f"{inexact} element(s) not exact (the smallest subnormals), largest error {worst:.3g}"
            if inexact
            else "every value exact"
        )
        if require_exact and inexact:
            raise FileFormatError(
                f"{w.name}: {inexact} element(s) would change bringing it into +-{largest:g} (halving its smallest "
                f"subnormals); --require-exact refuses"
            )

    return Item([spec for spec, _ in outputs], fill, report=report)


def _given(scheme: Scheme) -> dict[str, Any]:
    """The options that would change how a weight is quantised (none: the defaults)."""
    neutral = {"axis": (-1, None), "pack": (True,), "rounding": ("nearest_even",), "rht": (False,)}
    return {
        k: v for k, v in scheme.options().items() if v is not None and v is not DEFAULT and v not in neutral.get(k, ())
    }


def _relays(w: StoredWeight, scheme: Scheme) -> bool:
    """Whether a stored weight may go into the scheme's format as its codes with re-laid scales
    (MXFP4 to NVFP4, :func:`~neuron_kernels.blocks.exact.relayable`): blocked along its last axis,
    and no option asking for a quantisation of its own."""
    return w.packed_mx and relayable(w.layout.format, BLOCK_FORMATS[scheme.format]) and not _given(scheme)


def _converted_item(w: StoredWeight, outputs: list[Output], progress: Progress, divides: bool = True) -> Item:
    """A stored weight written into another layout: its codes and scales copied byte for byte,
    its per-tensor scale written as the layout keeps it (``divides``: as a divisor; the exact value
    in the shard's metadata)."""
    by_role = {role: spec.name for spec, role in outputs}

    def prepare() -> dict[str, float]:
        pts = w.per_tensor_scale
        return {by_role["per_tensor"]: float(pts)} if "per_tensor" in by_role and pts is not None else {}

    def fill(sinks: dict[str, Any]) -> None:
        for role, entry in (("codes", w.codes), ("scales", w.scales)):
            sink = sinks[by_role[role]]
            if entry.offset is not None and entry.dtype.itemsize == sink.spec.dtype.itemsize:
                sink.copy_from(entry.path, entry.offset, entry.nbytes)
            elif entry.dtype.itemsize == sink.spec.dtype.itemsize:
                sink.write(np.ascontiguousarray(entry.read_flat(0, entry.size)).view(sink.spec.dtype))
            else:  # float scales widened to the layout's float32: exact
                sink.write(_widened(np.asarray(entry.read_flat(0, entry.size)), sink.spec.dtype, entry.where))
            progress(entry.nbytes)
        if "per_tensor" in by_role:
            assert w.per_tensor_scale is not None
            pts = np.float32(w.per_tensor_scale)
            sinks[by_role["per_tensor"]].write(np.array([np.float32(1) / pts if divides else pts], np.float32))

    return Item([spec for spec, _ in outputs], fill, prepare)


def _widened(values: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    """``values`` (bfloat16 or float16 scales) in ``dtype`` (float32), refused unless exact."""
    out = values.astype(dtype)
    if not np.array_equal(out.astype(values.dtype), values, equal_nan=True):
        raise FileFormatError(f"{where}: its scales do not convert to {dtype} exactly")
    return out


class _ScaleResolver:
    """Each quantised tensor's job with its per-tensor scale resolved: from its own amax, or from
    the amax over its fused group (one pass over each shard, when the first is asked for); and of
    the weights that may be re-laid exactly (``relays``), the per-tensor exponent of their group
    (:meth:`relay`)."""

    def __init__(
        self,
        jobs: dict[str, tuple[ArrayEntry, BlockJob]],
        groups: dict[str, tuple[str, ...]],
        chunk_bytes: int,
        relays: dict[str, StoredWeight] | None = None,
    ) -> None:
        self.jobs, self.groups, self.chunk_bytes = jobs, groups, chunk_bytes
        self.relays = relays or {}
        self.amax: dict[tuple[str, ...], float] = {}
        self.exponent: dict[tuple[str, ...], tuple[int | None, str]] = {}

    def relay(self, name: str) -> tuple[int | None, str]:
        """(g, why): the exponent of the per-tensor scale 2^g under which every shard of the
        weight's fused group is re-laid exactly, or None and why not. One pass over each shard's
        codes and scales, which also gives the group's amax (for quantising it anew instead)."""
        group = self.groups.get(name, (name,))
        if group not in self.exponent:
            members = [self.relays.get(m) for m in group]
            if any(m is None for m in members):
                self.exponent[group] = (None, "a shard of its fused layer is not MXFP4")
            else:
                self._settle_relay(group, [m.mx_extremes(self.chunk_bytes) for m in members if m is not None])
        return self.exponent[group]

    def _settle_relay(self, group: tuple[str, ...], found: list[tuple[int | None, int | None, float]]) -> None:
        lows = [lo for lo, _, _ in found if lo is not None]
        highs = [hi for _, hi, _ in found if hi is not None]
        lo, hi = (min(lows), max(highs)) if lows else (None, None)
        self.amax[group] = max(a for _, _, a in found)
        g = per_tensor_exponent(lo, hi)
        why = "" if g is not None else f"its block scales span 2^{lo} to 2^{hi}, more than 18 binades"
        self.exponent[group] = (g, why)

    def __call__(self, name: str) -> BlockJob:
        entry, job = self.jobs[name]
        if not job.needs_amax:
            return job
        group = self.groups.get(name, (name,))
        if group not in self.amax:
            self.amax[group] = max(entry_amax(*self.jobs[m], self.chunk_bytes) for m in group)
        return job.with_amax(self.amax.pop(group) if len(group) == 1 else self.amax[group])

    def passes(self) -> list[tuple[tuple[str, ...], list[Callable[[], Any]]]]:
        """The reads that resolving every job needs, to run ahead (on a cluster, :mod:`.cluster`):
        per group, one call per shard (its amax, or the extremes of a weight to be re-laid), whose
        results :meth:`settle` takes. Without them, each group is read when its first job is asked for."""
        out: dict[tuple[str, ...], list[Callable[[], Any]]] = {}
        for name, (_, job) in self.jobs.items():
            group = self.groups.get(name, (name,))
            if group in out:
                continue
            if name in self.relays and all(m in self.relays for m in group):
                out[group] = [functools.partial(self.relays[m].mx_extremes, self.chunk_bytes) for m in group]
            elif job.needs_amax:
                out[group] = [functools.partial(entry_amax, *self.jobs[m], self.chunk_bytes) for m in group]
        return list(out.items())

    def settle(self, group: tuple[str, ...], results: list[Any]) -> None:
        """Take the results of a group's calls of :meth:`passes`."""
        if group[0] in self.relays and all(m in self.relays for m in group):
            self._settle_relay(group, results)
        else:
            self.amax[group] = max(results)


def _quantize_item(
    name: str,
    entry: ArrayEntry,
    transpose: bool,
    outputs: list[Output],
    report: TensorReport,
    resolve: _ScaleResolver,
    chunk_bytes: int,
    progress: Progress,
    require_exact: bool = False,
    stats: bool = True,
    divides: bool = True,
) -> Item:
    by_role = {role: spec.name for spec, role in outputs}
    resolved: list[BlockJob] = []

    def prepare() -> dict[str, float]:
        resolved.append(resolve(name))
        pts = resolved[-1].per_tensor_scale
        return {by_role["per_tensor"]: float(pts)} if "per_tensor" in by_role and isinstance(pts, float) else {}

    def fill(sinks: dict[str, Any]) -> None:
        done = resolved.pop()
        scales = sinks[by_role["scales"]]
        bits = done.fmt.element_bits
        zeros: list[np.ndarray] = []

        def write(mx: BlockArray) -> None:
            if "packed_codes" in by_role:  # integers in int32 words, each code offset to unsigned
                fields = offset_fields(mx.unpacked_codes().reshape(-1, mx.shape[mx.axis]), bits)
                sinks[by_role["packed_codes"]].write(pack_words(fields, bits).reshape(-1))
            else:
                codes = sinks[by_role["codes"]]
                codes.write(mx.codes.reshape(-1).view(codes.spec.dtype))
            scales.write(mx.scales.reshape(-1).view(np.uint8).view(scales.spec.dtype))
            if mx.zero_points is not None and "packed_zeros" in by_role:
                zeros.append(mx.zero_points.reshape(-1, mx.layout.scales_shape[mx.axis]))

        pieces = transposed_pieces(entry, done) if transpose else quantized_pieces(entry, done, chunk_bytes)
        report.stats = pipelined_stats(pieces, write, progress, stats or require_exact)
        if "shape" in by_role:
            sinks[by_role["shape"]].write(np.array(entry.shape, np.int64))
        if "packed_zeros" in by_role:  # packed along the output dimension: written once all rows are known
            fields = offset_fields(np.concatenate(zeros).T, bits)
            sinks[by_role["packed_zeros"]].write(np.ascontiguousarray(pack_words(fields, bits).T).reshape(-1))
        if "per_tensor" in by_role:
            pts = done.per_tensor_scale
            assert isinstance(pts, float)
            # a divisor in double precision: a recipe's global scale (compressed-tensors') comes back exactly
            sinks[by_role["per_tensor"]].write(np.array([np.float32(1.0 / pts) if divides else pts], np.float32))
        if require_exact and report.stats is not None and not exact_stats(report.stats):
            src = report.reason.partition(" (")[0].removeprefix("dequantised from ") or report.dtype
            raise FileFormatError(
                f"{name}: {src} to {done.fmt.name} changes its values (max abs error {report.stats.max_abs_error:.3g}, "
                f"SQNR {report.stats.sqnr_db:.1f} dB), which --require-exact refuses; nothing written"
            )

    return Item([spec for spec, _ in outputs], fill, prepare, report=report)


def _relaid_item(
    w: StoredWeight,
    fallback: Item,
    outputs: list[Output],
    report: TensorReport,
    resolve: _ScaleResolver,
    chunk_bytes: int,
    progress: Progress,
    require_exact: bool = False,
    divides: bool = True,
) -> Item:
    """An MXFP4 weight written as NVFP4 exactly: its codes copied, each block's scale 2^k written
    as two float8_e4m3fn scales 2^(k - g) under the per-tensor scale 2^g of its fused group; or,
    where the group's exponents do not fit, ``fallback`` (quantised anew, reported so)."""
    by_role = {role: spec.name for spec, role in outputs}
    chosen: list[int | None] = []
    dst = BLOCK_FORMATS[report.dtype]

    def prepare() -> dict[str, float]:
        g, why = resolve.relay(report.name)
        chosen.append(g)
        if g is None and require_exact:
            raise FileFormatError(
                f"{report.name}: {w.label} to {dst.name} is not exact ({why}), which --require-exact refuses; "
                f"nothing written"
            )
        if g is None:
            report.action, report.dtype = "quantised", resolve.jobs[report.name][0].dtype.name
            report.reason = f"dequantised from {w.label} ({why}; not exact)"
            return fallback.prepare()
        report.reason = f"re-laid exactly from {w.label}: codes copied, per-tensor scale 2^{g}"
        return {by_role["per_tensor"]: float(2.0**g)}

    def fill(sinks: dict[str, Any]) -> None:
        g = chosen.pop()
        if g is None:
            fallback.fill(sinks)
            return
        codes, scales = sinks[by_role["codes"]], sinks[by_role["scales"]]
        for c, s in w.row_pieces(chunk_bytes):
            codes.write(c.reshape(-1))
            scales.write(nvfp4_scales(c, s, w.layout.format, dst, g).reshape(-1).view(scales.spec.dtype))
            progress(c.nbytes + s.nbytes)
        sinks[by_role["per_tensor"]].write(np.array([2.0 ** (-g) if divides else 2.0**g], np.float32))

    return Item([spec for spec, _ in outputs], fill, prepare, report=report)


def _quantize_to_block_file(
    dst: str,
    chosen: list[tuple[str, ArrayEntry, BlockJob | None]],
    reports: list[TensorReport],
    resolve: _ScaleResolver,
    chunk_bytes: int,
    progress: Progress,
    stats: bool = True,
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
            with writer.array(name, job.layout(entry.shape), pts, job.rotation, job.fmt.scale) as out:
                pieces = quantized_pieces(entry, job, chunk_bytes)
                report.stats = pipelined_stats(
                    pieces, lambda mx: out.write(mx.codes, mx.scales, mx.zero_points), progress, stats
                )
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
    ckpt, layout = open_any(src)
    if layout is None:
        raise FileFormatError(f"{src}: not a quantised checkpoint (no quantization_config, no block tensors)")
    out_fmt = get_format(dtype)
    if out_fmt.name not in INPUT_DTYPES:
        raise FileFormatError(f"dequantisation writes float32, float16, bfloat16 or float64, not {dtype}")
    out_dtype = np.dtype(out_fmt.result_dtype)
    weights = stored_weights(ckpt, layout)
    stacks = _stacked_experts(ckpt, weights, out_dtype)
    by_part = {p: w for w in weights for p in w.parts}
    reports: list[TensorReport] = []
    items: list[Item] = []
    order: list[tuple[str, Weight | None]] = [(w.name, w) for w in weights if not w.parts]
    seen: set[str] = set()
    for name in ckpt.tensors:
        w = by_part.get(name)
        if w is None:
            order.append((name, None))
        elif w.name not in seen:
            seen.add(w.name)
            order.append((w.name, w))
    for name, w in order:
        if name in stacks.members:
            stacked = stacks.members[name]
            for key in stacks.first.pop(stacked, ()):  # the stacked parameters, at their first expert's place
                entry = stacks.entries[key]
                items.append(_cast_item(key, entry, out_dtype, progress, chunk_bytes))
                reports.append(
                    TensorReport(key, entry.shape, out_dtype.name, "dequantised", stacks.why, outputs=(key,))
                )
            continue
        if w is None:
            entry = ckpt.tensors[name]
            if name.rpartition(".")[2] in KV_SCALES:
                why = "a KV-cache scale: a plain checkpoint quantises no KV cache"
                reports.append(TensorReport(name, entry.shape, entry.dtype.name, "dropped", why))
                continue
            items.append(_copy_item(name, entry, progress, chunk_bytes))
            reports.append(_report_kept(name, entry, "not quantised"))
            continue
        shape = w.shape
        out_shape = shape[:-2] + (shape[-1], shape[-2]) if w.transpose else shape
        spec = TensorSpec(w.out_name, out_dtype, out_shape)
        items.append(Item([spec], _decode_fill(w, out_fmt.name, chunk_bytes, progress)))
        why = _dropped_note(w).strip()
        reports.append(TensorReport(w.name, shape, w.label, "dequantised", why, outputs=(w.out_name,)))
    write_shards(dst, items, max_shard_bytes)
    _finish_folder(ckpt, dst, None, True)
    return reports


@dataclass
class _Stacks:
    """Per-expert weights stacked back into the model's parameters for a plain checkpoint: the
    stacked entries by name, each per-expert tensor's module, and each module's stacked names."""

    entries: dict[str, ArrayEntry] = field(default_factory=dict)
    members: dict[str, str] = field(default_factory=dict)
    first: dict[str, list[str]] = field(default_factory=dict)
    why: str = ""


def _stacked_experts(ckpt: Checkpoint, weights: list[Weight], dtype: np.dtype) -> _Stacks:
    """The stacked expert parameters of a checkpoint that holds them per expert (compressed-tensors'
    Llama 4, :mod:`.experts`): a plain checkpoint holds them stacked, as the model does."""
    parts = {p for w in weights for p in w.parts}
    inputs: dict[str, ArrayEntry] = {}
    of: dict[str, list[str]] = {}
    for w in weights:
        if isinstance(w, StoredWeight) and not w.transpose:
            inputs[w.name] = w.decoded_entry()
            of[w.name] = list(w.parts)
    for name, entry in ckpt.tensors.items():
        if name not in parts:
            inputs[name] = entry
            of[name] = [name]
    arch = architecture_of(ckpt.config, inputs, "table" if not transformers_available() else "auto")
    if arch is None or not arch.splits:
        return _Stacks()
    stacked = stack_experts(inputs, arch, dtype)
    out = _Stacks(why=f"stacked from its experts' Linear weights, as the model holds them ({arch.source})")
    for name in inputs:
        if name in stacked:
            continue
        module = name.rpartition(".")[0].rpartition(".")[0].rpartition(".")[0]
        keys = [k for k in stacked if k.startswith(module + ".") and k not in inputs]
        for member in (name, *of[name]):
            out.members[member] = module
        out.first.setdefault(module, keys)
        out.entries.update({k: stacked[k] for k in keys})
    return out


def _cast_item(name: str, entry: ArrayEntry, dtype: np.dtype, progress: Progress, chunk_bytes: int) -> Item:
    """A tensor written in ``dtype`` (rounded to nearest even), piece by piece."""
    spec = TensorSpec(name, dtype, entry.shape)

    def fill(sinks: dict[str, Any]) -> None:
        step = max(1, chunk_bytes // max(entry.dtype.itemsize, 1))
        for start in range(0, entry.size, step):
            piece = np.asarray(entry.read_flat(start, min(start + step, entry.size)))
            sinks[name].write(piece if piece.dtype == dtype else cast(piece, dtype.name))
            progress(piece.nbytes)

    return Item([spec], fill)


def _decode_fill(w: Weight, dtype: str, chunk_bytes: int, progress: Progress) -> Callable[[dict[str, Any]], None]:
    def fill(sinks: dict[str, Any]) -> None:
        for values, used in w.decoded_pieces(dtype, chunk_bytes):
            sinks[w.out_name].write(values)
            progress(used)

    return fill
