"""vLLM's rules for loading a compressed-tensors checkpoint, written from its source (vLLM needs a
GPU; the commits are those docs/checkpoints.md cites): what an architecture's model file builds
unquantised, which Linear layers it fuses, and how ``CompressedTensorsConfig`` matches ``ignore``.

- ``vllm/model_executor/layers/quantization/compressed_tensors/utils.py``, ``should_ignore_layer``:
  an ``ignore`` entry matches a layer's name exactly or, with ``re:``, as ``re.match``; a fused
  layer is looked up as its shards, which must all be ignored or none (``ValueError``);
- ``compressed_tensors_moe.py``, ``CompressedTensorsMoEMethod.get_moe_method``: a fused MoE layer
  ``PREFIX`` is looked up as ``PREFIX.0.gate_proj``, ``PREFIX.0.up_proj`` and
  ``PREFIX.0.down_proj``, all ignored giving the unquantised method;
- a module built with ``quant_config=None`` or as a ``torch.nn.Linear`` loads a plain ``weight`` only;
- the NVFP4 schemes keep ``weight_global_scale.max()`` over a fused Linear's shards and the MoE
  method the w1's for w1 and w3 of each expert.

The tables are written here in vLLM's terms, apart from the package's (its
``checkpoints/runtime_modules.py``), and the checks read only the files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from .checkpoint_helpers import read_dir

#: Layers built unquantised, per model_type: regular expressions searched in checkpoint module names
#: (mixtral.py, qwen2_moe.py, qwen3_moe.py, deepseek_v2.py, olmoe.py, glm4_moe.py: the router
#: ``gate``; jamba.py: its router and every Mamba mixer projection (MambaMixer takes no quant config);
#: mamba.py: the mixer; granitemoe.py and dbrx.py: ``router.layer``; gpt_oss.py: ``mlp.router``;
#: llama4.py / mllama4.py: the router, ``vision_model`` and ``multi_modal_projector``; bert.py:
#: the pooler and the masked-LM head).
UNQUANTISED = {
    "mixtral": [r"\.block_sparse_moe\.gate$"],
    "qwen2_moe": [r"\.mlp\.gate$", r"\.shared_expert_gate$"],
    "qwen3_moe": [r"\.mlp\.gate$"],
    "deepseek_v2": [r"\.mlp\.gate$"],
    "deepseek_v3": [r"\.mlp\.gate$"],
    "olmoe": [r"\.mlp\.gate$"],
    "glm4_moe": [r"\.mlp\.gate$"],
    "jamba": [r"\.feed_forward\.router$", r"\.mamba\.(in_proj|x_proj|dt_proj|out_proj|conv1d)$"],
    "mamba": [r"\.mixer\."],
    "granitemoe": [r"\.block_sparse_moe\.router"],
    "dbrx": [r"\.ffn\.router\.layer$"],
    "gpt_oss": [r"\.mlp\.router$"],
    "llama4": [r"\.feed_forward\.router$", r"^vision_model\.", r"^multi_modal_projector\."],
    "bert": [r"pooler\.dense$", r"^cls\.predictions\."],
}

_QKV = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
_GATE_UP = {"gate_up_proj": ("gate_proj", "up_proj")}
#: Fused layers (packed_modules_mapping / stacked_params_mapping) per model_type: fused name -> shards
#: (siblings); ``a.b`` keys and shards fuse under a parent whose last component is ``a`` only.
PACKED = {
    "mixtral": _QKV,
    "opt": _QKV,
    "olmoe": _QKV,
    "granitemoe": _QKV,
    "gpt_oss": _QKV,
    "phi3": {},
    "gpt_neox": {},
    "falcon": {},
    "dbrx": {},
    "deepseek_v2": {**_QKV, **_GATE_UP, "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")},
    "deepseek_v3": {**_QKV, **_GATE_UP, "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")},
    "bert": {"qkv_proj": ("query", "key", "value")},
    "roberta": {"qkv_proj": ("query", "key", "value")},
    "whisper": {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "encoder_attn.kv_proj": ("k_proj", "v_proj")},
    "bart": {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "encoder_attn.kv_proj": ("k_proj", "v_proj")},
}
_DEFAULT_PACKED = {**_QKV, **_GATE_UP}
#: A stacked expert parameter's module -> the fused MoE layer's name (dbrx.py: ``ffn.experts``;
#: granitemoe.py: ``block_sparse_moe.experts``; the others: the module itself).
MOE_PREFIX = [
    (r"\.ffn\.experts\.mlp$", ".ffn.experts"),
    (r"\.block_sparse_moe\.(input|output)_linear$", ".block_sparse_moe.experts"),
]


def _ignored(name: str, ignore: list[str]) -> bool:
    return any(name == e or (e.startswith("re:") and re.match(e[3:], name)) for e in ignore)


def check(folder: Path, model_type: str) -> list[str]:
    """What vLLM would refuse or load wrong in the compressed-tensors checkpoint ``folder`` of a
    ``model_type`` model (empty: it loads every module as written)."""
    tensors, _ = read_dir(folder)
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    ignore = qc["ignore"]
    assert all(g["targets"] == ["Linear"] for g in qc["config_groups"].values())
    quantised = {n.rpartition(".")[0] for n in tensors if n.endswith((".weight_scale", ".weight_packed"))}
    problems = []
    for module in sorted(quantised):
        if any(re.search(p, module) for p in UNQUANTISED.get(model_type, ())):
            problems.append(f"{module}: built unquantised by vLLM, stored quantised")
        if _ignored(module, ignore):
            problems.append(f"{module}: ignored, stored quantised")
    # fused layers: shards agree, one NVFP4 global scale
    packed = PACKED.get(model_type, _DEFAULT_PACKED)
    modules = {n.rpartition(".")[0] for n in tensors}
    for fused, shards in packed.items():
        where, _, _ = fused.rpartition(".")
        for parent in sorted({m.rpartition(".")[0] for m in modules if m.rpartition(".")[2] in shards}):
            if where and parent.rpartition(".")[2] != where:
                continue
            present = [f"{parent}.{s}" for s in shards if f"{parent}.{s}" in modules]
            if len(present) < 2:
                continue
            if len({m in quantised for m in present}) > 1 or len({_ignored(m, ignore) for m in present}) > 1:
                problems.append(f"{parent}: fused shards {present} disagree (stored quantised, or ignored, in part)")
            scales = [tensors.get(f"{m}.weight_global_scale") for m in present]
            if all(s is not None for s in scales) and len({float(np.asarray(s).reshape(-1)[0]) for s in scales}) > 1:
                problems.append(f"{parent}: fused shards {present} have different global scales")
    # fused MoE: per-expert weights quantised and not ignored, with one w13 scale per expert; stacked
    # weights kept plain and ignored as vLLM looks them up
    experts = {re.sub(r"\.\d+\.[^.]+$", "", m) for m in modules if re.search(r"\.experts\.\d+\.[^.]+$", m)}
    for prefix in sorted(experts):
        probes = [f"{prefix}.0.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
        members = {m for m in modules if m.startswith(prefix + ".")}
        if members & quantised and any(_ignored(p, ignore) for p in probes):
            problems.append(f"{prefix}: experts stored quantised, but vLLM's MoE lookup finds them ignored")
        for e in {m.split(".")[len(prefix.split("."))] for m in members}:
            gate_up = [f"{prefix}.{e}.{a}" for a in ("gate_proj", "up_proj", "w1", "w3")]
            scales = [tensors[f"{m}.weight_global_scale"] for m in gate_up if f"{m}.weight_global_scale" in tensors]
            if len({float(np.asarray(s).reshape(-1)[0]) for s in scales}) > 1:
                problems.append(f"{prefix}.{e}: gate and up with different global scales")
    for name in tensors:
        module, _, param = name.rpartition(".")
        stacked = (
            param in ("gate_up_proj", "down_proj")
            and module.endswith(".experts")
            or re.search(r"\.(ffn\.experts\.mlp\.(w1|v1|w2)|block_sparse_moe\.(input|output)_linear\.weight)$", name)
        )
        if not stacked or module in quantised:
            continue
        prefix = module
        for pattern, repl in MOE_PREFIX:
            prefix = re.sub(pattern, repl, prefix)
        if not all(_ignored(f"{prefix}.0.{p}", ignore) for p in ("gate_proj", "up_proj", "down_proj")):
            problems.append(f"{name}: stacked experts stored plain, but vLLM's MoE lookup of {prefix} is not ignored")
    return problems
