"""Which tensors of a checkpoint are quantised, and which quantised tensors share a scale.

Each layout has its rule: for compressed-tensors and npz (:func:`tensor_decision`),
floating-point tensors named ``*.weight`` with two or more dimensions whose last dimension is a
multiple of the block size, except names matching the default exclusions
(:data:`DEFAULT_EXCLUDES`) and the caller's ``ignore`` patterns, or only those matching ``only``
patterns; for mxfp4 (:func:`expert_decision`), gpt-oss's expert parameters only. Everything else
is copied bit for bit. The shards of a layer runtimes fuse (:data:`FUSED_SHARDS`) share one
per-tensor scale (:func:`fused_groups`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from ..io.files import ArrayEntry

__all__ = [
    "DEFAULT_EXCLUDES",
    "FLOATS",
    "FUSED_SHARDS",
    "GPTOSS_EXPERTS",
    "GPTOSS_NOT_CONVERTED",
    "expert_decision",
    "fused_groups",
    "is_expert",
    "kept_modules",
    "tensor_decision",
]

#: Names that are never quantised (embeddings, norms, the output head, MoE routers): shell patterns.
DEFAULT_EXCLUDES: tuple[str, ...] = ("*embed*", "*norm*", "lm_head.*", "*.router.*", "*.mlp.gate.weight")
#: The dtypes a weight is quantised from (and dequantised to).
FLOATS = ("float32", "float16", "bfloat16", "float64")


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
    if dt.name not in FLOATS:
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
        and e.dtype.name in FLOATS + ("float8_e4m3fn", "float8_e5m2")
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
