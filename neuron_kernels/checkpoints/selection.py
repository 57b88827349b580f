"""Which tensors of a checkpoint are quantised, and which quantised tensors share a scale.

Each layout has its rule: for compressed-tensors and npz (:func:`module_decision`), the weights
of the model's Linear modules (:mod:`.architecture` says which modules those are), except the
output head, the modules runtimes keep plain (:data:`RUNTIME_PLAIN`) and the caller's ``ignore``
patterns, or only those matching ``only`` patterns; for a checkpoint of an architecture the
package does not know, with ``only``, the tensors matching it (:func:`tensor_decision`); for
mxfp4 (:func:`expert_decision`), gpt-oss's expert parameters only. Everything else is copied bit
for bit. The shards of a layer runtimes fuse (:data:`FUSED_SHARDS`) share one
per-tensor scale (:func:`fused_groups`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from ..formats import INPUT_DTYPES
from ..io.files import ArrayEntry
from .architecture import normalise

__all__ = [
    "DEFAULT_EXCLUDES",
    "FUSED_SHARDS",
    "GPTOSS_EXPERTS",
    "GPTOSS_NOT_CONVERTED",
    "expert_decision",
    "fused_groups",
    "is_expert",
    "ignored_modules",
    "kept_modules",
    "module_decision",
    "RUNTIME_PLAIN",
    "tensor_decision",
]

#: Names that are never quantised (embeddings, norms, the output head, MoE routers): shell patterns.
DEFAULT_EXCLUDES: tuple[str, ...] = ("*embed*", "*norm*", "lm_head.*", "*.router.*", "*.mlp.gate.weight")
#: The dtypes a weight is quantised from (and dequantised to).


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
    arch: Any = None,
) -> str | None:
    """None if the tensor is quantised, else why it is kept: the rule by name alone, for a
    checkpoint of an architecture the package does not know (``arch`` is not read).

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
) -> str | None:
    """The ``mxfp4`` layout's rule (gpt-oss's): None if the tensor is quantised, else why it is kept.

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
        and _matches(name, ("*embed*", "*norm*")) is None
    ]


# ---- from the model's modules -----------------------------------------------------------------------

#: Modules that runtimes build as plain (unquantised) Linear layers whatever the checkpoint's
#: config says, so a quantised weight there would not load: shell patterns of checkpoint module
#: names -> why. From vLLM's model definitions (``vllm/model_executor/models/``): the MoE routers
#: are built with ``quant_config=None`` (``mixtral.py``, ``qwen2_moe.py``, ``qwen3_moe.py``,
#: ``deepseek_v2.py``, ``gpt_oss.py``) and Qwen2-MoE's ``shared_expert_gate`` as an unquantised
#: Linear (``qwen2_moe.py``).
RUNTIME_PLAIN: dict[str, str] = {
    "*.mlp.gate": "the MoE router, which vLLM builds unquantised (quant_config=None)",
    "*.block_sparse_moe.gate": "the MoE router, which vLLM builds unquantised (quant_config=None)",
    "*.mlp.router": "the MoE router, which vLLM builds unquantised (quant_config=None)",
    "*.shared_expert_gate": "Qwen2-MoE's shared-expert gate, which vLLM builds as an unquantised Linear",
}

#: The kinds of module whose ``weight`` is quantised (see :mod:`.architecture`).
QUANTISABLE = ("linear", "expert", "head")
_KIND_TEXT = {
    "embedding": "an embedding", "conv1d": "a Conv1D (GPT-2's Linear stored [in, out], which runtimes do not quantise)",
    "conv": "a convolution", "router": "a MoE router", "norm": "a norm", "experts": "stacked expert parameters",
    "other": "not a Linear",
}  # fmt: skip


def runtime_plain(module: str) -> str | None:
    """Why runtimes keep ``module`` (a checkpoint module name) plain, or None."""
    hit = _matches(module, tuple(RUNTIME_PLAIN))
    return None if hit is None else RUNTIME_PLAIN[hit]


def module_decision(
    name: str,
    dtype: Any,
    shape: tuple[int, ...],
    block_size: int,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    arch: Any = None,
) -> str | None:
    """None if the tensor is quantised, else why it is kept: the compressed-tensors and npz rule.

    With ``arch`` (an :class:`~.architecture.Architecture`): quantised, the ``weight`` of a
    Linear module of the model (an expert's projection included), float, two or more dimensions,
    the last a multiple of ``block_size``, unless a runtime keeps the module plain
    (:data:`RUNTIME_PLAIN`) or ``ignore`` names it; the output head only where ``only`` names it;
    with ``only``, the Linear weights it names. Never an embedding, a Conv1D, a router or a norm,
    whatever its name. Without ``arch``, the caller's ``only`` decides by name
    (:func:`tensor_decision`)."""
    if arch is None:
        return tensor_decision(name, dtype, shape, block_size, ignore, only)
    module, _, param = name.rpartition(".")
    kind = arch.kind(module)
    if kind is None:
        return f"no module {module or name} in {arch.source}"
    if kind not in QUANTISABLE:
        return _KIND_TEXT.get(kind, kind)
    if param != "weight":
        return f"the {param} of a Linear"
    why = _not_a_float(dtype)
    if why is not None:
        return why
    if len(shape) < 2:
        return f"{len(shape)}-D"
    plain = runtime_plain(module)
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


def ignored_modules(kept: list[tuple[str, ArrayEntry]], arch: Any, names: Any = ()) -> list[str]:
    """compressed-tensors' ``ignore``: every Linear module left in higher precision, so that no
    runtime quantises on load what the file holds plain. With ``arch``: each kept tensor's module
    that the model has as a Linear (or a runtime builds as one: :data:`RUNTIME_PLAIN`), or that
    the model does not have (a weight of two or more dimensions no module claims), under
    its checkpoint name and, where transformers renames it, the model's name too; and the
    model's Linear modules with no tensor in the file (a tied ``lm_head``). Without ``arch``:
    :func:`kept_modules`. ``names``: every tensor of the checkpoint."""
    if arch is None:
        return kept_modules(kept)
    out: dict[str, None] = {}
    present: set[str] = set()
    for name, entry in kept:
        module, _, param = name.rpartition(".")
        if param != "weight":
            continue
        kind = arch.kind(module)
        unplaced = kind is None and len(entry.shape) >= 2  # no module the model has: ignored, to be safe
        if unplaced or kind in QUANTISABLE or kind == "router" or (kind is not None and runtime_plain(module)):
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
