"""The checkpoint doctor: :func:`check_checkpoint` reports what would make a quantised checkpoint's
runtime refuse it or load it wrong; :func:`repair_checkpoint` writes a corrected copy where a
correction keeps the values or brings them closer (docs/checkpoints.md "The checkpoint doctor").

What is checked, per weight and over the checkpoint:

- structure: the layout's reader (:mod:`.layouts`) accepts every tensor (all parts of each weight,
  dtypes and shapes that fit, no tensor a weight does not claim), and the shards agree with their
  index (else the checkpoint is unreadable: :class:`~neuron_kernels.io.arrays.FileFormatError`);
- modules: what is stored against the decisions the command makes for each module (the model's
  modules and the runtimes' own rules, :mod:`.architecture`) and against what the config has the
  runtime quantise on load: a Linear the config quantises stored plain, a module the config
  ignores stored quantised, a module the runtime builds unquantised (a router, a tower vLLM keeps)
  or that is no Linear stored quantised, stacked expert parameters neither quantised nor ignored;
- values: NaN, infinite, negative block scales; block scales of zero under non-zero codes (the
  block's values lost); e8m0's NaN byte 0xff; NaN values; weights that are all zero; a per-tensor
  scale that reads as the reciprocal of its layout's convention (the weight's largest value over
  ``RECIPROCAL_LIMITS[1]`` under the convention, within the limits under the reciprocal), and
  float block scales that read as divisors where the layout's multiply (``divisor-scales``);
- schemes: modules the runtimes would give different schemes, fused layers stored in several formats,
  targets and ignore entries that name no module, KV-cache and activation scales that cannot be
  right (:mod:`.scheme_findings`);
- runtime rules: what a runtime is known to refuse or load wrong in a valid checkpoint (the
  command's notes); the shards of a fused layer whose per-tensor scales differ, each with the SQNR
  it gets under the runtime's rule (its layout's ``fused_scale``, :func:`~.runtimes.fused_scale_rule`)
  against its own scale (an error below :data:`SERIOUS_DB`, a warning below :data:`NEGLIGIBLE_DB`,
  a note above).

Findings are ``error`` (a runtime loads the checkpoint wrong or refuses it) or ``warning``
(likely a mistake: an all-zero weight); ``note`` says what is not a problem.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..blocks.array import BlockArray
from ..blocks.exact import block_magnitudes
from ..blocks.scheme import block_job
from ..blocks.stats import quantization_error
from ..casting import cast
from ..formats import FORMATS
from ..io.arrays import ArrayEntry, FileFormatError
from .architecture import Architecture, architecture_of, normalise
from .folder import CONFIG_NAME, INDEX_NAME, Checkpoint, json_file, write_json
from .fp8_range import OCP_E4M3, beyond
from .layouts import CheckpointLayout, StoredWeight, open_any, stored_weights
from .layouts.nxd_inference import NEURON_FP8_MAX
from .layouts.records import check_fused_whole
from .runtimes import fused_scale_ratio, fused_scale_rule
from .scheme_findings import scheme_findings
from .selection import KIND_TEXT, QUANTISABLE, fused_groups, tensor_decision

__all__ = [
    "Finding", "Checkup", "Repair", "check_checkpoint", "repair_checkpoint", "RECIPROCAL_LIMITS", "NEGLIGIBLE_DB",
    "SERIOUS_DB",
]  # fmt: skip

#: The largest |value| a Linear weight is taken to hold (10^-4 .. 10^3): a weight whose largest value
#: is over the upper limit under its layout's per-tensor convention and within both under the
#: reciprocal has its per-tensor scale stored inverted.
RECIPROCAL_LIMITS = (1e-4, 1e3)

#: A fused layer whose shards' scales differ so little that vLLM's rule changes their values by less than
#: bfloat16's rounding (SQNR at or above this many dB) gets a note, not an error.
NEGLIGIBLE_DB = 60
#: Below this SQNR under vLLM's rule (values off by more than about 3%), fused scales apart are an
#: error; from it up to :data:`NEGLIGIBLE_DB`, a warning.
SERIOUS_DB = 30

_SEVERITIES = ("error", "warning", "note")


@dataclass(frozen=True)
class Finding:
    """One thing found: ``severity`` (error, warning, note), ``kind`` (a short name: structure,
    fused-scales, nan-scales, negative-scales, zero-scales, nan-values, all-zero, reciprocal,
    divisor-scales, fp8-range, neuron-fp8-range),
    the tensors concerned and what was found; ``sqnr_db``: for fused scales, each shard's SQNR
    under the runtime's rule against its own scale."""

    severity: str
    kind: str
    message: str
    tensors: tuple[str, ...] = ()
    sqnr_db: dict[str, float] = field(default_factory=dict)


@dataclass
class Checkup:
    """What :func:`check_checkpoint` found: the layout (None: plain), the producer where the
    checkpoint says it, the number of quantised weights and the findings, errors first."""

    path: str
    layout: str | None
    producer: str | None
    weights: int
    findings: list[Finding]

    @property
    def clean(self) -> bool:
        """No error or warning (notes are not findings)."""
        return not any(f.severity != "note" for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


def _producer(ckpt: Any, layout: CheckpointLayout | None) -> str | None:
    """Who made the checkpoint, where it says so (ModelOpt's and the package's ``producer``, a
    compressed-tensors version)."""
    qc = ckpt.quantization_config or {}
    producer = qc.get("producer")
    if producer is None and ckpt.folder is not None and "hf_quant_config.json" in ckpt.extra_files:
        with contextlib.suppress(FileFormatError):
            producer = (json_file(os.path.join(ckpt.folder, "hf_quant_config.json")) or {}).get("producer")
    if isinstance(producer, dict) and isinstance(producer.get("name"), str):
        return str(producer["name"]) + (f" {producer['version']}" if producer.get("version") else "")
    if isinstance(producer, str):
        return producer
    return layout.producer(ckpt) if layout is not None else None


def check_checkpoint(path: str | os.PathLike[str], chunk_bytes: int = 64 << 20) -> Checkup:
    """Check the checkpoint at ``path`` (see the module docstring). A checkpoint that cannot be
    read at all (missing or truncated shards, an index that disagrees with them, a layout the
    package does not read) raises :class:`FileFormatError`; everything else is a finding."""
    ckpt, layout = open_any(os.fspath(path))
    producer = _producer(ckpt, layout)
    if layout is None:
        note = Finding("note", "plain", "no quantisation config and no quantised tensors: a plain checkpoint")
        return Checkup(ckpt.path, None, producer, 0, [note])
    structure = _structure_findings(ckpt, layout)
    if structure:
        return Checkup(ckpt.path, layout.name, producer, 0, structure)
    weights = stored_weights(ckpt, layout)
    arch = _architecture(ckpt, weights)
    findings: list[Finding] = []
    try:  # vLLM refuses a fused layer quantised in part
        check_fused_whole(ckpt, {w.name: w.shape for w in weights}, arch)
    except FileFormatError as exc:
        findings.append(Finding("error", "structure", str(exc).removeprefix(f"{ckpt.path}: ")))
    findings += _module_findings(ckpt, layout, weights, arch)
    for w in weights:
        findings += _value_findings(w, chunk_bytes)
        findings += _range_findings(layout, w, chunk_bytes)
    findings += _neuron_findings(layout, weights, chunk_bytes)
    findings += _fused_findings(layout, weights, arch)
    findings += _runtime_findings(layout, weights, arch)
    findings += [Finding(sev, code, message, tensors) for sev, code, message, tensors in scheme_findings(
        ckpt, layout, weights, arch)]  # fmt: skip
    findings.sort(key=lambda f: _SEVERITIES.index(f.severity))
    return Checkup(ckpt.path, layout.name, producer, len(weights), findings)


def _architecture(ckpt: Checkpoint, weights: list[StoredWeight]) -> Architecture | None:
    """The model's modules, as the command takes them (the table, else transformers where installed)."""
    parts = {p for w in weights for p in w.parts}
    names = [w.name for w in weights] + [n for n in ckpt.tensors if n not in parts]
    return architecture_of(ckpt.config, names)


def _module_findings(
    ckpt: Checkpoint, layout: CheckpointLayout, weights: list[StoredWeight], arch: Architecture | None
) -> list[Finding]:
    """Each module's stored form against the command's decision and the config (see the module
    docstring): ``module-ignored``, ``module-kept`` (the runtime builds it unquantised, or it is no
    Linear), ``module-plain`` and ``module-experts``."""
    found: list[Finding] = []
    linears = {normalise(n) for n in arch.linears} if arch is not None else set()

    def names(module: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys((module, arch.model_name(module)))) if arch is not None else (module,)

    parts: set[str] = set()
    for w in weights:
        parts.update(w.parts)
        module = w.name.rpartition(".")[0] if w.name.endswith(".weight") else w.name
        if layout.quantises(ckpt, names(module)) is False:
            stored = ", ".join(p.rpartition(".")[2] for p in w.parts)
            found.append(Finding("error", "module-ignored", (
                f"{module} is stored quantised, but the config ignores it: a runtime builds it plain, finds {stored} "
                "unexpected and its weight missing, and initialises it at random (--repair takes it out of ignore)"),
                (w.name,)))  # fmt: skip
        kind = arch.kind(module) if arch is not None else None
        why = arch.plain_why(module, w.shape) if arch is not None else None
        if why is None and kind is not None and kind not in (*QUANTISABLE, "tower"):
            why = f"it is {KIND_TEXT.get(kind, kind).partition(' (')[0]}, which no runtime quantises"
        if why is not None:
            found.append(Finding("error", "module-kept", (
                f"{module} is stored quantised, but {why}: its quantised tensors have nowhere to go in the runtime"
                f" (modules from {arch.source if arch is not None else '?'})"), (w.name,)))  # fmt: skip
    for name, entry in ckpt.tensors.items():
        if name in parts:
            continue
        module, _, param = name.rpartition(".")
        kind = arch.kind(module) if arch is not None else None
        if kind == "experts" and len(entry.shape) >= 2:
            if layout.quantises(ckpt, names(module)) is True:
                found.append(Finding("error", "module-experts", (
                    f"{name}: stacked expert parameters stored plain and not in the config's ignore: a runtime whose "
                    f"MoE method expects every expert quantised has nothing to tell it otherwise (--repair adds "
                    f"{module} to ignore)"), (name,)))  # fmt: skip
            continue
        if param != "weight" or len(entry.shape) < 2 or entry.dtype.kind != "f" and entry.dtype.name != "bfloat16":
            continue
        if arch is not None:
            linear = kind in ("linear", "head", "expert", "tower") or normalise(arch.model_name(module)) in linears
        else:
            linear = tensor_decision(name, entry.dtype, entry.shape, 1) is None
        if linear and layout.quantises(ckpt, names(module)) is True:
            found.append(Finding("error", "module-plain", (
                f"quantization_config quantises {module} (a Linear not in ignore), but {name} is a plain "
                f"{entry.dtype} tensor; a runtime would expect its quantised tensors (--repair adds it to ignore)"),
                (name,)))  # fmt: skip
    return found


def _structure_findings(ckpt: Checkpoint, layout: CheckpointLayout, most: int = 100) -> list[Finding]:
    """What the layout's reader refuses, each tensor it names once: the reader stops at the first
    problem, so the tensor it names is set aside and the reader asked again (up to ``most``)."""
    found: list[Finding] = []
    tensors = dict(ckpt.tensors)
    for _ in range(most):
        try:
            stored_weights(dataclasses.replace(ckpt, tensors=tensors), layout)
            return found
        except FileFormatError as exc:
            message = str(exc).removeprefix(f"{ckpt.path}: ")
            named = sorted((message.find(n), -len(n), n) for n in tensors if n in message)
            found.append(Finding("error", "structure", message, (named[0][2],) if named else ()))
            if not named:
                return found
            del tensors[named[0][2]]
    return found


def _range_findings(layout: CheckpointLayout, w: StoredWeight, chunk_bytes: int) -> list[Finding]:
    """FP8 codes beyond the largest value the layout's runtime holds (Neuron's 240: NxD's
    ``DtypeBound``; such values may become NaN on the device)."""
    largest = layout.fp8_max
    if largest is None or w.layout.format.element_format is not OCP_E4M3:
        return []
    step = max(1, chunk_bytes)
    over = sum(beyond(np.asarray(w.codes.read_flat(a, min(a + step, w.codes.size))), largest)
               for a in range(0, w.codes.size, step))  # fmt: skip
    if not over:
        return []
    message = (
        f"{w.name}: {over} FP8 value(s) beyond +-{largest:g}, which the {layout.name} layout's runtime does not hold "
        f"(they may become NaN on the device); convert the FP8 checkpoint it came from with --layout {layout.name}, "
        f"which halves the codes and doubles the scales"
    )
    return [Finding("error", "fp8-range", message, (w.name,))]


def _neuron_findings(layout: CheckpointLayout, weights: list[StoredWeight], chunk_bytes: int) -> list[Finding]:
    """A note on an OCP FP8 checkpoint whose ``*.weight_scale`` NxD Inference would load as its own
    ``*.scale`` (``get_state_dict`` renames them, models/application_base.py), where FP8 values lie
    beyond +-240: on Trn1 and Trn2 they may become NaN. One note for the checkpoint."""
    if layout.fp8_max is not None:
        return []  # the layout's own range: _range_findings
    over: list[str] = []
    for w in weights:
        bf = w.layout.format
        if bf.element_format is not OCP_E4M3 or not bf.float_scales or w.transpose:
            continue
        if not any(p.endswith(".weight_scale") for p in w.parts):
            continue
        step = max(1, chunk_bytes)
        if any(beyond(np.asarray(w.codes.read_flat(a, min(a + step, w.codes.size))), NEURON_FP8_MAX)
               for a in range(0, w.codes.size, step)):  # fmt: skip
            over.append(w.name)
    if not over:
        return []
    message = (
        f"{len(over)} FP8 weight(s) hold values beyond +-{NEURON_FP8_MAX:g}: NxD Inference would load this "
        f"checkpoint's weight_scale as its scale, but Trn1/Trn2 hold FP8 within +-{NEURON_FP8_MAX:g} (beyond, values "
        "may become NaN); --layout neuron with the fp8_e4m3_* format of the same blocks halves the codes instead"
    )
    return [Finding("note", "neuron-fp8-range", message, tuple(over))]


def _divisor_findings(w: StoredWeight, scales: np.ndarray, amax: float) -> list[Finding]:
    """Float block scales that read as divisors where the layout's multiply (``code * scale``; NxD's
    ``scale_dequantize``): the weight's largest value over the limit as stored, and every value
    within the limits were each scale its reciprocal (bounded by the largest code magnitude over
    the smallest scale, at least the largest value's block's reading)."""
    low, high = RECIPROCAL_LIMITS
    positive = scales[np.isfinite(scales) & (scales > 0)]
    if not positive.size:
        return []
    largest_code = float(w.layout.format.element_format.max)
    upper = largest_code / float(positive.min())
    if not (upper <= high and amax / float(positive.max()) ** 2 >= low):
        return []
    return [
        Finding(
            "error",
            "divisor-scales",
            f"{w.name}: its largest value is {amax:.3g} with its block scales as multipliers (code * scale, as the "
            f"layout's runtime reads them), and at most {upper:.3g} were they divisors: the scales look stored as "
            "divisors (1 / scale); write their reciprocals",
            (w.name,),
        )
    ]


def _value_findings(w: StoredWeight, chunk_bytes: int) -> list[Finding]:
    """The findings of one weight's block scales and values (one pass over each)."""
    found: list[Finding] = []
    bf = w.layout.format
    scales = np.asarray(w.scales.read_flat(0, w.scales.size))
    if bf.float_scales:
        values = scales.astype(np.float32)
        nan, negative = int(np.isnan(values).sum() + np.isinf(values).sum()), int((values < 0).sum())
        zero = values == 0
    elif bf.is_mx:
        nan, negative, zero = int((scales == 0xFF).sum()), 0, np.zeros(scales.shape, bool)
    else:  # float8_e4m3fn scales, as bytes
        magnitude = scales & np.uint8(0x7F)
        nan = int((magnitude == 0x7F).sum())
        negative = int(((scales & np.uint8(0x80)) != 0).sum() - ((scales == 0x80) | (scales == 0xFF)).sum())
        zero = magnitude == 0
    what = "e8m0 byte 0xff (NaN)" if bf.is_mx else "NaN or infinite"
    if nan:
        found.append(
            Finding(
                "error",
                "nan-scales",
                f"{w.name}: {nan} block scale(s) {what}: the runtimes decode the block's values as NaN",
                (w.name,),
            )
        )
    if negative:
        found.append(
            Finding(
                "error",
                "negative-scales",
                f"{w.name}: {negative} negative block scale(s): the block's values come out with their signs flipped",
                (w.name,),
            )
        )
    lost = _zero_scaled_codes(w, zero, chunk_bytes) if zero.any() else 0
    if lost:
        found.append(
            Finding(
                "error",
                "zero-scales",
                f"{w.name}: {lost} block(s) with a scale of zero hold non-zero codes: their values decode as 0",
                (w.name,),
            )
        )
    amax, nans, nonzero = _packed_extremes(w, chunk_bytes) if _by_codes(w) else _decoded_extremes(w, chunk_bytes)
    if nans:
        found.append(Finding("error", "nan-values", f"{w.name}: {nans} value(s) decode as NaN or infinity", (w.name,)))
    if not nonzero:
        found.append(
            Finding("warning", "all-zero", f"{w.name}: every value is zero (a weight never written?)", (w.name,))
        )
    pts = w.per_tensor_scale
    low, high = RECIPROCAL_LIMITS
    if bf.float_scales and not pts and amax > high:
        found += _divisor_findings(w, values, amax)
    if pts and amax > high and low <= amax / pts**2 <= high:
        found.append(
            Finding(
                "error",
                "reciprocal",
                f"{w.name}: its largest value is {amax:.3g} under the layout's per-tensor scale convention and "
                f"{amax / pts**2:.3g} under the reciprocal: the per-tensor scale looks stored inverted "
                f"(a ModelOpt weight_scale_2 written as a compressed-tensors weight_global_scale, or the reverse)",
                (w.name,),
            )
        )
    return found


def _decoded_extremes(w: StoredWeight, chunk_bytes: int) -> tuple[float, int, int]:
    """(largest finite |value|, values NaN or infinite, non-zero values) of a weight, decoded."""
    amax, nans, nonzero = 0.0, 0, 0
    for piece, _ in w.decoded_pieces("float32", chunk_bytes):
        finite = np.isfinite(piece)
        nans += int(piece.size - finite.sum())
        nonzero += int(np.count_nonzero(piece))
        if finite.any():
            amax = max(amax, float(np.abs(piece[finite]).max()))
    return amax, nans, nonzero


def _by_codes(w: StoredWeight) -> bool:
    """Whether :func:`_packed_extremes` reads the weight: 4-bit codes two per byte in 1-D blocks
    along the last axis (NVFP4, MXFP4), whose values are never NaN but through their scale (not
    the integer formats: their codes are no E2M1 magnitudes, and a zero point shifts them)."""
    lay = w.layout
    if not lay.packed or lay.format.integer or lay.two_d or w.transpose:
        return False
    return lay.axis == len(lay.shape) - 1 and lay.block_rows == 1


def _packed_extremes(w: StoredWeight, chunk_bytes: int) -> tuple[float, int, int]:
    """:func:`_decoded_extremes` from the codes and scales, without decoding: per block, the
    largest code magnitude's value times the block's scale (and the per-tensor scale); a block of
    a NaN scale counts all its values as NaN, one of a zero scale or only zero codes none as
    non-zero (so "non-zero" counts blocks' values, not every value: enough to tell all-zero)."""
    lay = w.layout
    bf = lay.format
    magnitudes = np.arange(8, dtype=np.uint8).view(bf.element_format.result_dtype)  # E2M1 magnitudes
    table = magnitudes.astype(np.float32)
    per_block = lay.block_size // 2
    pts = np.float32(w.per_tensor_scale if w.per_tensor_scale is not None else 1.0)
    amax, nans, nonzero = 0.0, 0, 0
    for codes, scales in w.row_pieces(chunk_bytes):
        width = codes.shape[1] // per_block * per_block
        top = block_magnitudes(codes if width == codes.shape[1] else codes[:, :width].copy(), per_block)
        s = np.abs(scales[:, : top.shape[1]].view(bf.scale_format.result_dtype).astype(np.float32))
        with np.errstate(over="ignore", invalid="ignore"):  # values beyond float32: counted below
            values = table[top] * (s * pts)
        bad = ~np.isfinite(s)
        nans += int(bad.sum()) * lay.block_size + int((~np.isfinite(values) & ~bad).sum())  # a block's top value
        nonzero += int(((top > 0) & (s > 0) & ~bad).sum()) * lay.block_size
        finite = values[np.isfinite(values)]
        if finite.size:
            amax = max(amax, float(finite.max()))
    return amax, nans, nonzero


def _zero_scaled_codes(w: StoredWeight, zero: np.ndarray, chunk_bytes: int) -> int:
    """How many blocks with a zero scale hold a non-zero code (1-D blocks along the last axis;
    0 where the blocks are tiles, not checked)."""
    lay = w.layout
    if lay.two_d or w.transpose or lay.axis != len(lay.shape) - 1 or lay.block_rows != 1:
        return 0
    # a code's magnitude bits (E2M1 nibbles, E4M3); every bit of an integer's two's-complement code
    nonzero_bits = np.uint8(0xFF if lay.format.integer else 0x77 if lay.packed else 0x7F)
    per_block = lay.block_size // 2 if lay.packed else lay.block_size
    zero = zero.reshape(-1, lay.scales_shape[-1])
    lost, row = 0, 0
    for codes, _ in w.row_pieces(chunk_bytes):
        n = codes.shape[0]
        width = codes.shape[1] // per_block * per_block
        blocks = (codes[:, :width].reshape(n, -1, per_block) & nonzero_bits).any(axis=2)
        z = zero[row : row + n, : blocks.shape[1]]
        lost += int((blocks & z).sum())
        row += n
    return lost


def _fused_findings(layout: CheckpointLayout, weights: list[StoredWeight], arch: Architecture | None) -> list[Finding]:
    """The fused layers (``arch``'s runtime fusion table) whose shards' per-tensor scales differ,
    with each shard's SQNR under the runtime's rule against its own scale."""
    by_name = {w.name: w for w in weights if w.per_tensor_scale is not None}
    found = []
    for group in dict.fromkeys(fused_groups(by_name, arch).values()):
        scales = [float(by_name[n].per_tensor_scale or 0.0) for n in group]
        if len(set(scales)) == 1:
            continue
        ratios = fused_scale_ratio(layout.fused_scale, group, scales)
        sqnr = {n: _ratio_sqnr(r) for n, r in zip(group, ratios)}
        worst = min(sqnr.values())
        if worst >= NEGLIGIBLE_DB:
            found.append(
                Finding(
                    "note",
                    "fused-scales",
                    f"{', '.join(group)}: per-tensor scales apart by "
                    f"{max(scales) / min(scales) - 1:.2g} (relative), {worst:.0f} dB: below bfloat16's "
                    "precision under vLLM's rule",
                    group,
                    sqnr,
                )
            )
            continue
        spread = max(scales) / min(scales)
        found.append(
            Finding(
                "error" if worst < SERIOUS_DB else "warning",
                "fused-scales",
                f"{', '.join(group)}: one fused layer in vLLM, with per-tensor scales {spread:.3g}x apart; vLLM "
                f"keeps one for all ({_rule_words(layout, group)}), so the worst shard comes out at "
                f"{worst:.1f} dB SQNR against its own scale (--repair requantises them under one shared scale)",
                group,
                sqnr,
            )
        )
    return found


def _runtime_findings(
    layout: CheckpointLayout, weights: list[StoredWeight], arch: Architecture | None
) -> list[Finding]:
    """What a runtime is known to load wrong or refuse in a valid checkpoint (the command's notes,
    its layout's ``notes``: transformers' MoE experts, fine-grained FP8 in partial tiles),
    as warnings."""
    found = []
    for fmt in dict.fromkeys(w.layout.fmt for w in weights):
        shapes = {w.name: w.shape for w in weights if w.layout.fmt == fmt}
        for note in layout.notes(fmt, arch, shapes):
            found.append(Finding("warning", "runtime", note))
    return found


def _ratio_sqnr(ratio: float) -> float:
    """The SQNR of values all multiplied by ``ratio`` against themselves: -20 log10 |1 - ratio|."""
    return math.inf if ratio == 1 else -20 * math.log10(abs(1 - ratio))


def _rule_words(layout: CheckpointLayout, group: tuple[str, ...]) -> str:
    rule = fused_scale_rule(layout.fused_scale, group)
    return {"min": "the smallest", "max": "the largest", "first": "the first shard's"}[rule] + " per-tensor scale"


# ---- repair ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repair:
    """One change :func:`repair_checkpoint` made, or declined to make (``done`` False, ``why``):
    the tensors, each weight's SQNR under the runtime's rule before and after, against the values
    its own scale gave."""

    kind: str
    tensors: tuple[str, ...]
    done: bool
    why: str
    before_db: dict[str, float] = field(default_factory=dict)
    after_db: dict[str, float] = field(default_factory=dict)


def repair_checkpoint(src: str | os.PathLike[str], dst: str, chunk_bytes: int = 64 << 20) -> list[Repair]:
    """Write ``src`` into the folder ``dst`` (already a temporary, empty folder) with what
    :func:`check_checkpoint` finds corrected where a correction is exact or better: every file
    copied, then the tensors of each repaired weight overwritten in place (same dtypes and shapes,
    so every other byte stays where it was).

    - fused shards with different per-tensor scales: every shard requantised under one scale, from
      the amax of their exact values (a shard whose own scale that is keeps its bytes); per block,
      the same codes under its scale rescaled or the block quantised anew, whichever is closer to
      the block's values. Done only where the worst shard comes out better than under the runtime's
      rule (requantising costs about 30 dB against the values; a close pair loses less as it is).
    - a per-tensor scale stored inverted: replaced by its reciprocal (float32);
    - tensors that belong to no quantised weight, where their module holds nothing else (a stray
      scale): dropped, their shards written again without them (every other tensor's bytes
      copied) and the index updated; where the module holds more (a weight missing a part),
      nothing can be made, and the report says so;
    - a Linear the config quantises (compressed-tensors: targeted, not in ``ignore``) stored plain:
      added to ``ignore``.

    Returns what was changed and what was not, with the SQNR before and after."""
    checkup = check_checkpoint(src, chunk_bytes)
    ckpt, layout = open_any(os.fspath(src))
    if ckpt.folder is None or layout is None:
        raise FileFormatError(f"{src}: repair writes a checkpoint folder from a quantised checkpoint folder")
    for name in os.listdir(ckpt.folder):
        source = os.path.join(ckpt.folder, name)
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(dst, name))
    repairs: list[Repair] = []
    structure = [f for f in checkup.findings if f.kind == "structure"]
    if structure:
        repairs += _repair_structure(ckpt, layout, structure, dst)
        if not all(r.done for r in repairs):
            return repairs + [Repair("values", (), False, "not checked: the structure is not repaired")]
        checkup = check_checkpoint(dst, chunk_bytes)
    ckpt, layout = open_any(dst)  # the copy, its tensors where the repairs write them
    assert layout is not None
    weights = {w.name: w for w in stored_weights(ckpt, layout)}
    for finding in checkup.findings:
        if finding.severity == "note":
            continue
        if finding.kind == "fused-scales":
            repairs.append(_repair_fused(layout, [weights[n] for n in finding.tensors], finding.sqnr_db, ckpt, dst))
        elif finding.kind == "reciprocal":
            repairs.append(_repair_reciprocal(layout, weights[finding.tensors[0]], ckpt, dst))
        elif finding.kind in ("module-plain", "module-experts", "module-ignored"):
            repairs.append(_repair_ignore(layout, finding, _architecture(ckpt, list(weights.values())), dst))
        else:
            repairs.append(
                Repair(finding.kind, finding.tensors, False, "not repairable from the file: " + finding.message)
            )
    return repairs


def _per_tensor_part(layout: CheckpointLayout, w: StoredWeight) -> str:
    """The name of the tensor holding a weight's per-tensor scale."""
    return next(p for p in w.parts if p.endswith(f".{layout.per_tensor_part}"))


def _overwrite(ckpt: Any, dst: str, name: str, data: np.ndarray) -> None:
    """Write ``data`` (the tensor's dtype and size) over tensor ``name`` in its shard's copy in ``dst``."""
    entry: ArrayEntry = ckpt.tensors[name]
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if entry.offset is None or raw.size != entry.nbytes:
        raise FileFormatError(f"{entry.where}: cannot be overwritten in place ({raw.size} bytes for {entry.nbytes})")
    with open(os.path.join(dst, os.path.basename(entry.path)), "r+b") as fh:
        fh.seek(entry.offset)
        fh.write(raw.tobytes())


def _repair_fused(
    layout: CheckpointLayout, shards: list[StoredWeight], before: dict[str, float], ckpt: Any, dst: str
) -> Repair:
    names = tuple(w.name for w in shards)
    exact = {w.name: w.block_array() for w in shards}
    values = {n: q.dequantize(np.float32) for n, q in exact.items()}
    amax = max(float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for v in values.values())
    pts = block_job(shards[0].layout.fmt, 2).with_amax(amax).per_tensor_scale
    assert isinstance(pts, float)
    fixed: dict[str, BlockArray] = {}
    after: dict[str, float] = {}
    for w in shards:
        own = exact[w.name]
        if own.per_tensor_scale == pts:
            fixed[w.name], after[w.name] = own, math.inf
            continue
        q = _requantised(own, values[w.name], pts)
        fixed[w.name], after[w.name] = q, quantization_error(values[w.name], q).sqnr_db
    if min(after.values()) <= min(before.values()):
        return Repair(
            "fused-scales",
            names,
            False,
            f"requantising under one scale would leave the worst shard at {min(after.values()):.1f} dB, no better than "
            f"the runtime's rule's {min(before.values()):.1f} dB (the scales are close): kept as it is",
            before,
            after,
        )
    for w in shards:
        q = fixed[w.name]
        if q is exact[w.name]:
            continue
        codes_name, scales_name = w.parts[0], w.parts[1]
        _overwrite(ckpt, dst, codes_name, q.codes)
        _overwrite(ckpt, dst, scales_name, q.scales.view(np.uint8))
        _overwrite(ckpt, dst, _per_tensor_part(layout, w), layout.stored_per_tensor(pts))
    how = f"requantised under one per-tensor scale ({pts:.6g}, from the amax over the layer)"
    return Repair("fused-scales", names, True, how, before, after)


def _requantised(own: BlockArray, values: np.ndarray, pts: float) -> BlockArray:
    """``own`` (NVFP4, packed, blocks along the last axis) under the per-tensor scale ``pts``,
    block by block the closer to ``values`` of: its codes under its block scale times its
    per-tensor scale over ``pts`` (rounded to the scale's format), or the block quantised anew."""
    fresh = block_job(own.fmt, values.ndim, per_tensor_scale=pts).quantize(values, FORMATS["float32"])
    ratio = np.float32(own.per_tensor_scale) / np.float32(pts)
    rescaled = cast(np.asarray(cast(own.scales, "float32") * ratio, np.float32), own.format.scale)
    kept = dataclasses.replace(own, scales=rescaled, per_tensor_scale=pts)
    size = own.block_size
    v = values.reshape(-1, size)
    a = kept.dequantize(np.float32).reshape(-1, size)
    b = fresh.dequantize(np.float32).reshape(-1, size)
    with np.errstate(invalid="ignore", over="ignore"):
        use_kept = ((a - v) ** 2).sum(axis=1) <= ((b - v) ** 2).sum(axis=1)  # per block; NaN: anew
    scales = np.where(use_kept, kept.scales.reshape(-1), fresh.scales.reshape(-1)).reshape(own.scales.shape)
    codes = np.where(use_kept[:, None], kept.codes.reshape(-1, size // 2), fresh.codes.reshape(-1, size // 2))
    return dataclasses.replace(own, codes=codes.reshape(own.codes.shape), scales=scales, per_tensor_scale=pts)


def _repair_reciprocal(layout: CheckpointLayout, w: StoredWeight, ckpt: Any, dst: str) -> Repair:
    assert w.per_tensor_scale is not None
    part = _per_tensor_part(layout, w)
    stored = np.float32(np.asarray(ckpt.tensors[part].read_flat(0, 1))[0])
    _overwrite(ckpt, dst, part, np.array([np.float32(1) / stored], np.float32))
    return Repair("reciprocal", (w.name,), True, f"{part}: {stored:.6g} replaced by its reciprocal")


# ---- structure repairs ------------------------------------------------------------------------------

#: What the readers say of a tensor no quantised weight takes (its module's other tensors decide
#: whether it is a stray, dropped, or a weight missing a part).
_ORPHAN = ("belongs to no quantised weight", " beside it")


def _repair_structure(ckpt: Checkpoint, layout: CheckpointLayout, findings: list[Finding], dst: str) -> list[Repair]:
    """The structure findings repaired in ``dst`` where they can be (see :func:`repair_checkpoint`)."""
    repairs: list[Repair] = []
    orphans = {f.tensors[0] for f in findings if any(m in f.message for m in _ORPHAN) and f.tensors}
    dropped: set[str] = set()
    for f in findings:
        name = f.tensors[0] if f.tensors else ""
        module = name.rpartition(".")[0]
        if name in orphans:
            held = [n for n in ckpt.tensors if n.rpartition(".")[0] == module]
            if set(held) <= orphans and not any(n.endswith((".weight", ".weight_packed")) for n in held):
                dropped.add(name)
                repairs.append(Repair("structure", (name,), True, f"dropped: {module} holds no weight it belongs to"))
            else:
                others = ", ".join(n for n in held if n not in orphans)
                repairs.append(Repair("structure", (name,), False, f"{module} also holds {others}: a part is "
                                      "missing, which cannot be made from the file"))  # fmt: skip
        else:
            repairs.append(Repair("structure", f.tensors, False, "not repairable from the file: " + f.message))
    if dropped:
        _drop_tensors(ckpt, dropped, dst)
    return repairs


def _repair_ignore(layout: CheckpointLayout, finding: Finding, arch: Architecture | None, dst: str) -> Repair:
    """A module's entry in compressed-tensors' ``ignore`` made to say what is stored: added for a
    Linear stored plain (and for stacked experts kept, with the names vLLM looks their fused MoE up
    by), taken out for a module stored quantised (where an entry names it exactly)."""
    name = finding.tensors[0]
    module = name.rpartition(".")[0]
    names = [module] if arch is None else list(dict.fromkeys((module, arch.model_name(module))))
    key = layout.ignore_key
    if key is None:
        return Repair(finding.kind, finding.tensors, False, f"the {layout.name} layout keeps no list the doctor edits")
    path = os.path.join(dst, CONFIG_NAME)
    config = json_file(path)
    qc = config["quantization_config"]
    ignore = list(qc.get(key) or [])
    if finding.kind == "module-ignored":
        kept = [e for e in ignore if e not in names]
        if len(kept) == len(ignore):
            return Repair(finding.kind, finding.tensors, False, f"{module} is ignored by a pattern, not by its name")
        qc[key] = kept
        write_json(path, config)
        return Repair(
            finding.kind, finding.tensors, True, f"{module} taken out of the config's ignore (stored quantised)"
        )
    if finding.kind == "module-experts" and arch is not None:
        names += arch.runtime.moe_probes(module)
    qc[key] = ignore + [n for n in names if n not in ignore]
    write_json(path, config)
    return Repair(finding.kind, finding.tensors, True, f"{module} added to the config's ignore (stored plain)")


def _drop_tensors(ckpt: Checkpoint, dropped: set[str], dst: str) -> None:
    """The shards of ``dst`` that hold a tensor of ``dropped`` written again without it (the other
    tensors' bytes copied from ``ckpt``'s shards, the metadata kept), and the index updated."""
    from ..io.safetensors import SafetensorsWriter, TensorSpec, read_safetensors_header

    for shard in sorted({ckpt.tensors[n].path for n in dropped}):
        _, metadata, entries = read_safetensors_header(shard)
        kept = [(n, e) for n, e in entries.items() if n not in dropped]
        target = os.path.join(dst, os.path.basename(shard))
        tmp = target + ".partial"
        specs = [TensorSpec(n, dtype, shape) for n, (dtype, shape, _) in kept]
        with SafetensorsWriter(tmp, specs, metadata) as writer:
            for (n, (_, _, offset)), spec in zip(kept, specs):
                with writer.tensor(n) as sink:
                    sink.copy_from(shard, offset, spec.nbytes)
        os.replace(tmp, target)
    index_path = os.path.join(dst, INDEX_NAME)
    if os.path.isfile(index_path):
        index = json_file(index_path)
        removed = sum(ckpt.tensors[n].nbytes for n in dropped)
        index["weight_map"] = {n: f for n, f in index["weight_map"].items() if n not in dropped}
        if isinstance(index.get("metadata"), dict) and isinstance(index["metadata"].get("total_size"), int):
            index["metadata"]["total_size"] -= removed
        write_json(index_path, index)
