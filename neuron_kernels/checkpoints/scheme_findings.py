"""The doctor on schemes: what a checkpoint's config and its scales say about how each module is
quantised, where the runtimes would read it differently or where it cannot be right
(docs/checkpoints.md "The checkpoint doctor").

- ``scheme-order``: a module compressed-tensors (transformers, llm-compressor) and vLLM would give
  different config groups, their orders of matching differing (:mod:`.targets`), or one vLLM
  refuses (a fused layer or MoE whose parts would take different schemes);
- ``scheme-fused``: the shards of a fused layer stored in different formats (vLLM runs the layer
  with one scheme and refuses it);
- ``scheme-vllm``: a module the layout's own rules say vLLM reads in another scheme than stored
  (ModelOpt ``MIXED_PRECISION``: a ``quant_algo`` vLLM runs no Linear with; the layout's
  ``scheme_checks``);
- ``scheme-unused``: a group target or an ignore entry that names no module of the model (a
  mistyped name, or a recipe made for another model);
- ``kv-scale``: a KV-cache or activation scale that is not positive and finite (an error),
  scales that are all exactly 1.0 (a calibration that never ran: the runtime runs unscaled), or a
  KV-cache scale under no attention module (vLLM's name remapping finds no parameter and drops it).

Each is ``(severity, code, message, tensors)``; :mod:`.doctor` makes them findings.
"""

from __future__ import annotations

import numpy as np

from .architecture import Architecture, module_of
from .folder import Checkpoint
from .layouts import CheckpointLayout, StoredWeight
from .layouts.records import KV_SCALES, kv_cache_name
from .selection import fused_layers
from .targets import Refused, ct_group, ct_matches, vllm_group

__all__ = ["scheme_findings"]

#: A finding as this module gives it: (severity, code, message, tensors).
Raw = tuple[str, str, str, tuple[str, ...]]

#: The modules through which an attention computes its keys, by their last name component (Llama's,
#: fused, BERT's, GPT-2's and Falcon's, MLA's, MPT's): a KV-cache scale belongs beside one.
KEY_PROJECTIONS = (
    "k_proj", "qkv_proj", "kv_proj", "key", "c_attn", "query_key_value", "kv_a_proj_with_mqa", "Wqkv", "wk", "wkv",
)  # fmt: skip

#: The last name components of the activations' scales, which runtimes load beside the weights.
ACTIVATION_SCALES = ("input_scale", "input_global_scale", "output_scale")


def scheme_findings(
    ckpt: Checkpoint, layout: CheckpointLayout, weights: list[StoredWeight], arch: Architecture | None
) -> list[Raw]:
    """Every finding of the module docstring for the checkpoint ``ckpt`` in ``layout``."""
    found = _fused_formats(weights, arch)
    config = layout.targets(ckpt)
    if config is not None:
        by_name, ignore = config
        names, groups = list(by_name), list(by_name.values())
        found += _orders(ckpt, names, groups, ignore, weights, arch)
        found += _unused(ckpt, names, groups, ignore, arch)
    found += layout.scheme_checks(ckpt, weights)
    found += _scales(ckpt)
    return found


def _fused_formats(weights: list[StoredWeight], arch: Architecture | None) -> list[Raw]:
    fmt = {w.name: w.layout.fmt for w in weights}
    found: list[Raw] = []
    for shards, _ in dict.fromkeys(fused_layers(list(fmt), arch).values()):
        formats = {fmt[s] for s in shards}
        if len(formats) > 1:
            words = ", ".join(f"{s} {fmt[s]}" for s in shards)
            found.append(
                (
                    "error",
                    "scheme-fused",
                    (
                        f"{words}: one fused layer in vLLM stored in {len(formats)} formats; vLLM runs the layer "
                        f"with one scheme and refuses it (requantise them to one format: quantize --scheme)"
                    ),
                    shards,
                )
            )
    return found


def _linear_modules(ckpt: Checkpoint, weights: list[StoredWeight], arch: Architecture | None) -> list[str]:
    """The modules a config's groups are matched against: the quantised weights' and the plain
    Linear weights' (two or more axes) of the checkpoint."""
    parts = {p for w in weights for p in w.parts}
    names = [w.name for w in weights]
    for name, entry in ckpt.tensors.items():
        if name not in parts and name.endswith(".weight") and len(entry.shape) >= 2:
            kind = arch.kind(module_of(name)) if arch is not None else "linear"
            if kind in ("linear", "expert", "head", "tower") or (arch is not None and kind is None):
                names.append(name)
    return names


def _orders(
    ckpt: Checkpoint,
    names: list[str],
    groups: list[tuple[str, ...]],
    ignore: list[str],
    weights: list[StoredWeight],
    arch: Architecture | None,
) -> list[Raw]:
    if len(groups) < 2:
        return []  # one group: the orders cannot differ
    linears = _linear_modules(ckpt, weights, arch)
    fused = fused_layers(linears, arch)
    found: list[Raw] = []
    for name in linears:
        m = module_of(name)
        model = arch.model_name(m) if arch is not None else m
        shards, layer = fused.get(name, ((), None))
        probes = arch.expert_probes(m) if arch is not None else ()
        ct = ct_group(tuple(dict.fromkeys((m, model))), groups, ignore)
        try:
            vllm = vllm_group(m, groups, ignore, [module_of(s) for s in shards], layer, probes)
        except Refused as e:
            found.append(("error", "scheme-order", f"{m}: {e}", (name,)))
            continue
        if ct != vllm:
            found.append(("error", "scheme-order", (
                f"{m}: compressed-tensors (transformers) gives it {_group_name(names, ct)} and vLLM "
                f"{_group_name(names, vllm)}; their orders of matching differ (exact names, then re: in string order, "
                f"then Linear; against the first target in config order), so the two load it differently: give each "
                f"module one matching target"), (name,)))  # fmt: skip
    return found


def _group_name(names: list[str], index: int | None) -> str:
    return "no group (plain)" if index is None else f"group {names[index]!r}"


def _unused(
    ckpt: Checkpoint, names: list[str], groups: list[tuple[str, ...]], ignore: list[str], arch: Architecture | None
) -> list[Raw]:
    """Targets and ignore entries that match no module: of the checkpoint (every tensor's module),
    of the model (its names, its Linear modules) or vLLM's MoE names."""
    modules = {n.rpartition(".")[0] for n in ckpt.tensors}
    if arch is not None:
        modules |= {arch.model_name(m) for m in list(modules)} | set(arch.linears)
        for m in list(modules):
            if arch.kind(m) in ("experts", "expert"):
                parent = m if arch.kind(m) == "experts" else m.rpartition(".")[0].rpartition(".")[0]
                modules.update(arch.runtime.moe_probes(parent))
    modules.discard("")
    found: list[Raw] = []
    for group, targets in zip(names, groups):
        for t in targets:
            if not any(ct_matches(m, [t]) is not False for m in modules):
                found.append(("warning", "scheme-unused", (
                    f"config group {group!r}: the target {t!r} names no module of this model; the group quantises "
                    f"none by it (a mistyped name, or a recipe made for another model)"), ()))  # fmt: skip
    for e in ignore:
        if isinstance(e, str) and not any(ct_matches(m, [e]) is not False for m in modules):
            found.append(("note", "scheme-unused", f"the ignore entry {e!r} names no module of this model", ()))
    return found


def _scales(ckpt: Checkpoint) -> list[Raw]:
    """KV-cache and activation scales: positive and finite, not all exactly 1.0, and (KV-cache
    scales) beside the attention whose cache they scale."""
    found: list[Raw] = []
    ones: list[str] = []
    seen = 0
    modules = {n.rpartition(".")[0] for n in ckpt.tensors}
    for name, entry in ckpt.tensors.items():
        last = name.rpartition(".")[2]
        if last not in KV_SCALES and last not in ACTIVATION_SCALES:
            continue
        canonical = kv_cache_name(name)
        attention = canonical.rpartition(".")[0] if canonical is not None else ""
        children = {m[len(attention) + 1 :].partition(".")[0] for m in modules if m.startswith(attention + ".")}
        if canonical is not None and not children & set(KEY_PROJECTIONS):
            found.append(("warning", "kv-scale", (
                f"{name}: {attention or 'the top level'} holds no key projection ({', '.join(KEY_PROJECTIONS[:3])}, "
                f"...), so this is no attention's scale; vLLM's maybe_remap_kv_scale_name finds no parameter "
                f"for it, drops it with a warning and runs the cache unscaled (the scale belongs at "
                f"ATTENTION.{last}, ATTENTION being the module of the q/k/v projections)"), (name,)))  # fmt: skip
        if entry.dtype.kind != "f" and entry.dtype.name != "bfloat16" or entry.size > 1 << 20:
            continue  # not a float scale: its reader refuses it
        values = np.asarray(entry.read_flat(0, entry.size), np.float32)
        seen += 1
        if not (np.isfinite(values).all() and (values > 0).all()):
            bad = values[~(np.isfinite(values) & (values > 0))]
            found.append(("error", "kv-scale", (
                f"{name}: a scale of {bad[0]} ({bad.size} of {values.size} not positive and finite); a runtime "
                f"multiplies the cache or the activations by it"), (name,)))  # fmt: skip
        elif (values == 1).all():
            ones.append(name)
    if ones and len(ones) == seen:
        found.append(("warning", "kv-scale", (
            f"all {len(ones)} KV-cache and activation scales are exactly 1.0 ({ones[0]}, ...): a calibration that "
            f"never ran, so the runtime runs the cache and activations unscaled"), tuple(ones)))  # fmt: skip
    return found
