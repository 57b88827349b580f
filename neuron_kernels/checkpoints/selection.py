"""Which tensors of a checkpoint are quantised, and which quantised tensors share a scale.

Each layout has its rule: for compressed-tensors and npz (:func:`module_decision`), the weights
of the model's Linear modules (:mod:`.architecture` says which modules those are), except the
output head, the towers of a multimodal model (unless asked), the modules the runtimes keep plain
(routers, and each architecture's exceptions in :mod:`.runtime_modules`) and the caller's
``ignore`` patterns, or only those matching ``only`` patterns; for a checkpoint of an
architecture the package does not know, with ``only``, the tensors matching it
(:func:`tensor_decision`); for mxfp4 (:func:`expert_decision`), gpt-oss's expert parameters only.
Everything else is copied bit for bit. The shards of a layer a runtime fuses (its fusion table
per architecture; :data:`FUSED_SHARDS` where it has none) share one per-tensor scale
(:func:`fused_groups`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from ..formats import INPUT_DTYPES
from ..io.arrays import ArrayEntry
from .architecture import Architecture, module_of, normalise
from .architecture import fused_groups as _fused_groups
from .architecture import fused_layers as _fused_layers
from .runtime_modules import GENERIC

__all__ = [
    "DEFAULT_EXCLUDES",
    "FUSED_SHARDS",
    "GPTOSS_EXPERTS",
    "GPTOSS_NOT_CONVERTED",
    "expert_decision",
    "fused_groups",
    "fused_layers",
    "is_expert",
    "ignored_modules",
    "kept_modules",
    "pattern_match",
    "module_decision",
    "tensor_decision",
    "TOWER_KEPT",
]

#: Names that are never quantised (embeddings, norms, the output head, MoE routers): shell patterns.
DEFAULT_EXCLUDES: tuple[str, ...] = ("*embed*", "*norm*", "lm_head.*", "*.router.*", "*.mlp.gate.weight")
#: The dtypes a weight is quantised from (and dequantised to).


def pattern_match(name: str, patterns: tuple[str, ...]) -> str | None:
    """The first pattern matching the tensor ``name`` or its module (the name without ``.weight``)."""
    module = module_of(name)
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
    arch: Any = None,
    towers: bool = False,
) -> str | None:
    """None if the tensor is quantised, else why it is kept: the rule by name alone, for a
    checkpoint of an architecture the package does not know (``arch`` and ``towers`` are not read).

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
    if dt.name not in INPUT_DTYPES:
        return f"{dt.name} (quantised from float32, float16, bfloat16 or float64 only)"
    return None


def _patterns_keep(name: str, ignore: tuple[str, ...], only: tuple[str, ...], excludes: tuple[str, ...]) -> str | None:
    """Why the caller's patterns keep ``name`` (``only`` replaces the default ``excludes``)."""
    if only:
        if pattern_match(name, only) is None:
            return "not matched by --only"
    else:
        hit = pattern_match(name, excludes)
        if hit is not None:
            return f"excluded by default ({hit})"
    hit = pattern_match(name, ignore)
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


def is_expert(name: str) -> bool:
    """Whether ``name`` is one of gpt-oss's expert parameters (:data:`GPTOSS_EXPERTS`)."""
    return any(fnmatch.fnmatchcase(name, p) for p in GPTOSS_EXPERTS)


def expert_decision(
    name: str,
    dtype: Any,
    shape: tuple[int, ...],
    block_size: int,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    arch: Any = None,
    towers: bool = False,
) -> str | None:
    """The ``mxfp4`` layout's rule (gpt-oss's): None if the tensor is quantised, else why it is kept
    (``arch`` and ``towers`` are not read).

    Quantised: a float tensor matching :data:`GPTOSS_EXPERTS`, 3-D ([E, in, out]) with ``in`` a
    multiple of ``block_size``, and not kept by ``ignore`` / ``only``. Everything else (attention,
    router, embeddings, ``lm_head``, biases, sinks) stays as gpt-oss keeps it."""
    if not is_expert(name):
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


def kept_modules(kept: list[tuple[str, ArrayEntry]]) -> list[str]:
    """The Linear-like modules left unquantised: 2-D ``*.weight`` floats that are not embeddings
    or norms (what a runtime must be told not to expect in the quantised layout)."""
    return [
        name[: -len(".weight")]
        for name, e in kept
        if name.endswith(".weight")
        and len(e.shape) == 2
        and e.dtype.name in INPUT_DTYPES + ("float8_e4m3fn", "float8_e5m2")
        and pattern_match(name, ("*embed*", "*norm*")) is None
    ]


# ---- from the model's modules -----------------------------------------------------------------------

#: The kinds of module whose ``weight`` is quantised (see :mod:`.architecture`); a tower's Linear
#: too where asked.
QUANTISABLE = ("linear", "expert", "head")
KIND_TEXT = {
    "embedding": "an embedding", "conv1d": "a Conv1D (GPT-2's Linear stored [in, out], which runtimes do not quantise)",
    "conv": "a convolution", "router": "a MoE router", "norm": "a norm",
    "experts": "stacked expert parameters (no Linear module for the runtime to quantise; listed in ignore)",
    "tower": "a Linear of a vision or audio tower or its projector (kept in higher precision, as producers' recipes "
             "keep them; --quantize-towers quantises them)",
    "other": "not a Linear",
}  # fmt: skip


#: Why a tower's Linear is kept (the command's summary counts them).
TOWER_KEPT = KIND_TEXT["tower"]


def module_decision(
    name: str,
    dtype: Any,
    shape: tuple[int, ...],
    block_size: int,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    arch: Architecture | None = None,
    towers: bool = False,
) -> str | None:
    """None if the tensor is quantised, else why it is kept: the compressed-tensors and npz rule.

    With ``arch`` (an :class:`~.architecture.Architecture`): quantised, the ``weight`` of a
    Linear module of the model (an expert's projection included; a tower's with ``towers``),
    float, two or more dimensions, the last a multiple of ``block_size``, unless a runtime keeps
    the module plain (:meth:`~.architecture.Architecture.plain_why`) or ``ignore`` names it; the
    output head only where ``only`` names it; with ``only``, the Linear weights it names. Never an
    embedding, a Conv1D, a router, stacked expert parameters or a norm, whatever its name.
    Without ``arch``, the caller's ``only`` decides by name (:func:`tensor_decision`)."""
    if arch is None:
        return tensor_decision(name, dtype, shape, block_size, ignore, only)
    module, _, param = name.rpartition(".")
    kind = arch.kind(module)
    if kind is None:
        return f"no module {module or name} in {arch.source}"
    if kind not in QUANTISABLE and not (kind == "tower" and towers):
        plain = arch.plain_why(module, shape) if kind in ("router", "tower") else None
        return plain or KIND_TEXT.get(kind, kind)
    if param != "weight":
        return f"the {param} of a Linear"
    why = _not_a_float(dtype)
    if why is not None:
        return why
    if len(shape) < 2:
        return f"{len(shape)}-D"
    plain = arch.plain_why(module, shape)
    if plain is not None:
        return plain
    if kind == "head" and not only:
        return "the output head (kept in higher precision; --only names it to quantise it)"
    why = _patterns_keep(name, ignore, only, ())
    if why is not None:
        return why
    if shape[-1] % block_size:
        return f"last axis {shape[-1]} is not a multiple of the block size {block_size}"
    return None


def stacked_expert(name: str, shape: tuple[int, ...], arch: Architecture | None) -> bool:
    """Whether ``name`` is a stacked expert parameter ([E, in, out]) of a module whose experts
    transformers splits (:meth:`~.architecture.Architecture.split`: Llama 4's ``gate_up_proj`` and
    ``down_proj``)."""
    if arch is None or len(shape) != 3:
        return False
    module, _, param = name.rpartition(".")
    split = arch.split(module)
    return split is not None and param in dict(split.parameters)


def stacked_expert_decision(
    name: str, dtype: Any, ignore: tuple[str, ...] = (), only: tuple[str, ...] = ()
) -> str | None:
    """The rule for a :func:`stacked_expert` parameter in a layout that holds them quantised as
    they are (NxD Inference's Llama 4 experts): None if quantised, else why it is kept (not a
    float, or ``ignore`` / ``only`` keeps its name or its module's)."""
    why = _not_a_float(dtype)
    if why is not None:
        return why
    return _patterns_keep(name, ignore, only, ())


def ignored_modules(kept: list[tuple[str, ArrayEntry]], arch: Architecture | None, names: Any = ()) -> list[str]:
    """compressed-tensors' ``ignore``: every Linear module left in higher precision, so that no
    runtime quantises on load what the file holds plain. With ``arch``: each kept tensor's module
    that the model has as a Linear (a tower's and a router's included) or a runtime builds as one,
    or that the model does not have (a weight of two or more dimensions no module claims), under
    its checkpoint name and, where transformers renames it, the model's name too; stacked expert
    parameters kept, under their module's names and the names vLLM looks their fused MoE up by
    (:meth:`~.runtime_modules.RuntimeModules.moe_probes`); and the model's Linear modules with no
    tensor in the file (a tied ``lm_head``). Without ``arch``: :func:`kept_modules`. ``names``:
    every tensor of the checkpoint."""
    if arch is None:
        return kept_modules(kept)
    out: dict[str, None] = {}
    present: set[str] = set()
    for name, entry in kept:
        module, _, param = name.rpartition(".")
        kind = arch.kind(module)
        if kind == "experts" and len(entry.shape) >= 2:
            out.update(dict.fromkeys((module, arch.model_name(module), *arch.runtime.moe_probes(module))))
            continue
        if param != "weight":
            continue
        unplaced = kind is None and len(entry.shape) >= 2  # no module the model has: ignored, to be safe
        if unplaced or kind in QUANTISABLE or kind in ("router", "tower"):
            out[module] = None
            out[arch.model_name(module)] = None
    for name in names:
        module = name.rpartition(".")[0]
        present.update((module, arch.model_name(module)))
    for linear in arch.linears:
        if "*" in normalise(linear):
            continue  # a layer's or an expert's: such modules are in the file (a tied module is never numbered)
        if linear not in present and not any(n.startswith(linear + ".") for n in present):
            out[linear] = None
    return list(out)


# ---- fused layers ----------------------------------------------------------------------------------

#: The fused layers where a model type has no fusion table of its own (:data:`~.runtime_modules.GENERIC`):
#: rows of sibling module names; the shards of a row that share a parent module are one fused
#: layer. vLLM fuses q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj`` (each MoE expert's
#: too: ``w13``), Mixtral's experts' ``w1``/``w3``, and MLA's ``q_a_proj``/``kv_a_proj_with_mqa``
#: into ``fused_qkv_a_proj``, and keeps one per-tensor scale for the fused layer, so every shard
#: must be quantised with that one scale.
FUSED_SHARDS: tuple[tuple[str, ...], ...] = tuple(dict.fromkeys(f.shards for f in GENERIC.fused_layers))


def fused_groups(names: Any, arch: Architecture | None = None) -> dict[str, tuple[str, ...]]:
    """Each of ``names`` (tensor names, ``MODULE.weight`` or ``MODULE``) that is a shard of a fused
    layer with at least one other shard among ``names`` -> the names of its group, in the order of
    the fusion table's row: ``arch``'s runtime fusion table, or :data:`FUSED_SHARDS` without one.
    Names in no such group are not keys."""
    return arch.fused_groups(names) if arch is not None else _fused_groups(names)


def fused_layers(names: Any, arch: Architecture | None = None) -> dict[str, tuple[tuple[str, ...], str | None]]:
    """:func:`fused_groups`, each group with the fused layer's name in vLLM (or None)."""
    return _fused_layers(names, arch.runtime if arch is not None else None)
