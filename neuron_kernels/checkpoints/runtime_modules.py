"""What each runtime does with a model's modules on load, per architecture: which it builds
unquantised whatever the checkpoint's config says, which it fuses into one layer with one
per-tensor scale, under which name it looks up a mixture of experts, and which stacked expert
parameters transformers replaces by per-expert Linear modules.

These are facts of the runtimes' model files, not of the model, so they are written here, per
``model_type``, with the file each comes from; :mod:`.architecture` gives the model's own modules
(a router's class, a vision tower, stacked experts). Names are checkpoint module names, matched
as shell patterns (``*`` for a layer's or an expert's number, or any run of names).

vLLM (``vllm/model_executor/models/``, read at the commits named; where a file's versions differ,
the rule that loads in all of them):

- a module built with ``quant_config=None`` or as a plain ``torch.nn.Linear`` gets vLLM's
  unquantised method whatever the config says (``LinearBase``, ``linear.py``): a quantised weight
  there has nowhere to go (:attr:`RuntimeModules.plain`);
- ``packed_modules_mapping`` and the ``stacked_params_mapping`` of ``load_weights`` fuse sibling
  Linear layers into one (:attr:`RuntimeModules.fused`); its compressed-tensors and ModelOpt NVFP4
  methods then keep one per-tensor scale for the fused layer (:mod:`.runtimes`), and
  ``should_ignore_layer`` refuses a fused layer whose shards disagree;
- a fused MoE layer (``FusedMoE``) is looked up in compressed-tensors' ``ignore`` as
  ``PREFIX.0.gate_proj``, ``PREFIX.0.up_proj`` and ``PREFIX.0.down_proj``
  (``CompressedTensorsMoEMethod.get_moe_method``, ``compressed_tensors_moe.py``): all three
  ignored give it the unquantised method. Stacked expert parameters kept plain are listed under
  those names (:attr:`RuntimeModules.moe_prefix` gives ``PREFIX`` from the stacked module's name).

transformers (5.25, ``quantizers/base.py``, ``MODULES_TO_PATCH_FOR_QUANTIZATION``): for a
compressed-tensors checkpoint it replaces Llama 4's stacked ``Llama4TextExperts`` by
``SequentialLlama4TextExperts``, one ``Llama4TextMLP`` (``gate_proj``, ``up_proj``,
``down_proj`` Linear modules) per expert, so a compressed-tensors checkpoint holds Llama 4's
experts as per-expert Linear weights (:data:`EXPERT_SPLITS`).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

__all__ = [
    "ExpertSplit",
    "EXPERT_FUSED",
    "EXPERT_SPLITS",
    "Fused",
    "GENERIC",
    "Plain",
    "RUNTIME_MODULES",
    "RuntimeModules",
    "runtime_modules",
]


@dataclass(frozen=True)
class Plain:
    """Modules a runtime builds unquantised: checkpoint module names matching ``pattern``; ``why``
    says which and where. ``quantised_if_multiple``: the runtime quantises the module after all
    where both dimensions of its weight are multiples of this (SigLIP's MLP in vLLM)."""

    pattern: str
    why: str
    quantised_if_multiple: int = 0

    def keeps(self, module: str, shape: tuple[int, ...] | None = None) -> bool:
        if not fnmatch.fnmatchcase(module, self.pattern):
            return False
        m = self.quantised_if_multiple
        return not (m and shape is not None and len(shape) >= 2 and shape[-1] % m == 0 and shape[-2] % m == 0)


@dataclass(frozen=True)
class Fused:
    """Sibling Linear modules (``shards``, in the fused layer's order) that a runtime runs as one
    layer with one per-tensor scale, under a parent whose last name component matches ``parent``;
    ``name``: the fused layer's own last name component in vLLM (None where not recorded)."""

    shards: tuple[str, ...]
    parent: str = "*"
    name: str | None = None


@dataclass(frozen=True)
class RuntimeModules:
    """One architecture's runtime facts: ``source``, the files they come from; ``plain``, the
    modules built unquantised; ``fused``, the layers fused; ``moe_prefix``, (regular expression,
    replacement) turning a stacked expert module's name into the name vLLM gives its fused MoE."""

    source: str
    plain: tuple[Plain, ...] = ()
    fused: tuple[Fused, ...] = ()
    moe_prefix: tuple[str, str] = ("$", "")

    @property
    def fused_layers(self) -> tuple[Fused, ...]:
        """The layers fused: the model file's, then each expert's gate and up (:data:`EXPERT_FUSED`)."""
        return self.fused + EXPERT_FUSED

    def plain_why(self, module: str, shape: tuple[int, ...] | None = None) -> str | None:
        """Why the runtime builds ``module`` unquantised, or None."""
        return next((p.why for p in self.plain if p.keeps(module, shape)), None)

    def moe_probes(self, module: str) -> tuple[str, ...]:
        """The names vLLM looks up in ``ignore`` for the fused MoE that the stacked expert
        parameters of ``module`` load into."""
        prefix = re.sub(self.moe_prefix[0], self.moe_prefix[1], module, count=1)
        return tuple(f"{prefix}.0.{p}" for p in ("gate_proj", "up_proj", "down_proj"))


#: Each MoE expert's gate and up projections (``w1`` and ``w3``) under the expert's number, in every
#: model: vLLM's fused MoE loads them into one ``w13`` per expert, whose NVFP4 methods keep one
#: global scale for both (``w13_weight_global_scale[:, 0]``, the gate's).
EXPERT_FUSED = (Fused(("gate_proj", "up_proj"), "[0-9]*"), Fused(("w1", "w3"), "[0-9]*"))

_QKV = Fused(("q_proj", "k_proj", "v_proj"), name="qkv_proj")
_GATE_UP = Fused(("gate_proj", "up_proj"), name="gate_up_proj")
_MLA = Fused(("q_a_proj", "kv_a_proj_with_mqa"), name="fused_qkv_a_proj")  # fused_qkv_a_proj where q_lora_rank is set

_ROUTER = "the MoE router, which vLLM builds unquantised (quant_config=None)"
_LLAMA = "llama.py@e06c9ba (LlamaForCausalLM.packed_modules_mapping)"

#: Where a model type has no entry: the common names (routers called ``gate`` / ``router`` in an
#: ``mlp`` or ``block_sparse_moe``, Qwen2-MoE's ``shared_expert_gate``) and fused layers.
GENERIC = RuntimeModules(
    "no model file of the runtimes read for this model type: the common names",
    plain=(
        Plain("*.mlp.gate", _ROUTER),
        Plain("*.block_sparse_moe.gate", _ROUTER),
        Plain("*.mlp.router", _ROUTER),
        Plain("*.shared_expert_gate", "the shared-expert gate, which vLLM builds as an unquantised Linear"),
    ),
    fused=(_QKV, _GATE_UP, _MLA),
)

_DENSE = RuntimeModules(_LLAMA, fused=(_QKV, _GATE_UP))

#: The facts per ``model_type``.
RUNTIME_MODULES: dict[str, RuntimeModules] = {
    "llama": _DENSE,
    "mistral": _DENSE,
    "qwen2": RuntimeModules("qwen2.py@cb24295 (Qwen2ForCausalLM.packed_modules_mapping)", fused=(_QKV, _GATE_UP)),
    "qwen3": RuntimeModules("qwen3.py@e745baf (Qwen3ForCausalLM.packed_modules_mapping)", fused=(_QKV, _GATE_UP)),
    "gemma2": RuntimeModules("gemma2.py@02cda6e", fused=(_QKV, _GATE_UP)),
    "gemma3_text": RuntimeModules("gemma3.py@311a97c", fused=(_QKV, _GATE_UP)),
    "opt": RuntimeModules("opt.py (OPTDecoderLayer: qkv_proj)", fused=(_QKV,)),
    # stored fused already (one Linear each): nothing to share
    "phi3": RuntimeModules("phi3.py@d339021 (qkv_proj and gate_up_proj stored fused)"),
    "gpt_neox": RuntimeModules("gpt_neox.py@642d31b (query_key_value stored fused)"),
    "falcon": RuntimeModules("falcon.py (query_key_value stored fused)"),
    "gpt2": RuntimeModules("gpt2.py (c_attn stored fused; Conv1D weights)"),
    "mixtral": RuntimeModules(
        "mixtral.py@f0e2695 (MixtralMoE.gate: ReplicatedLinear, quant_config=None; packed_modules_mapping)",
        plain=(Plain("*.block_sparse_moe.gate", _ROUTER),),
        fused=(_QKV,),
    ),
    "qwen2_moe": RuntimeModules(
        "qwen2_moe.py@8bbabf0 (Qwen2MoeSparseMoeBlock.gate: quant_config=None; shared_expert_gate: torch.nn.Linear)",
        plain=(
            Plain("*.mlp.gate", _ROUTER),
            Plain("*.mlp.shared_expert_gate", "Qwen2-MoE's shared-expert gate, which vLLM builds as a torch.nn.Linear"),
        ),
        fused=(_QKV, _GATE_UP),
    ),
    # the router: quant_config=None at 002456d, quant_config at 2e0831b; kept plain (and in ignore),
    # which both load
    "qwen3_moe": RuntimeModules(
        "qwen3_moe.py@002456d and @2e0831b (Qwen3MoeSparseMoeBlock.gate)",
        plain=(Plain("*.mlp.gate", _ROUTER), Plain("*.mlp.shared_expert_gate", _ROUTER)),
        fused=(_QKV, _GATE_UP),
    ),
    "olmoe": RuntimeModules(
        "olmoe.py@e9b0f07 (OlmoeMoE.gate: quant_config=None)", plain=(Plain("*.mlp.gate", _ROUTER),), fused=(_QKV,)
    ),
    "glm4_moe": RuntimeModules(
        "glm4_moe.py@a4cd9d0 (Glm4MoE.gate: a float32 torch.nn.Linear)",
        plain=(Plain("*.mlp.gate", "the MoE router, which vLLM builds as a float32 torch.nn.Linear"),),
        fused=(_QKV, _GATE_UP),
    ),
    "jamba": RuntimeModules(
        "jamba.py and layers/mamba/mamba_mixer.py@00f8d44 (JambaMoE.router: quant_config=None; MambaMixer takes no "
        "quant_config)",
        plain=(
            Plain("*.feed_forward.router", _ROUTER),
            Plain(
                "*.mamba.*",
                "a Mamba mixer's projection, which vLLM builds unquantised (MambaMixer has no quant_config)",
            ),
        ),
        fused=(_QKV, _GATE_UP),
    ),
    "mamba": RuntimeModules(
        "mamba.py@58c92a9 and layers/mamba/mamba_mixer.py@00f8d44 (MambaMixer takes no quant_config)",
        plain=(
            Plain(
                "*.mixer.*",
                "a Mamba mixer's projection, which vLLM builds unquantised (MambaMixer has no quant_config)",
            ),
        ),
    ),
    "granitemoe": RuntimeModules(
        "granitemoe.py@5d4420d (GraniteMoeMoE.gate: quant_config=None; input_linear / output_linear split into "
        "experts.E.w1 / w3 / w2 by name, .weight only)",
        plain=(Plain("*.block_sparse_moe.router*", _ROUTER),),
        fused=(_QKV,),
        moe_prefix=(r"\.(input|output)_linear$", ".experts"),
    ),
    "dbrx": RuntimeModules(
        "dbrx.py (DbrxRouter.layer: ReplicatedLinear, quant_config=None; Wqkv stored fused; experts w1 / v1 / w2 "
        "read as per-tensor FP8 only)",
        plain=(Plain("*.ffn.router*", _ROUTER),),
        moe_prefix=(r"\.mlp$", ""),
    ),
    "deepseek_v2": RuntimeModules(
        "deepseek_v2.py@b863fe5 (DeepSeekV2Gate: quant_config=None; fused_qkv_a_proj where q_lora_rank is set)",
        plain=(
            Plain("*.mlp.gate", _ROUTER),
            Plain(
                "*.self_attn.indexer.weights_proj",
                "the V3.2 indexer's weights_proj, which vLLM builds unquantised (quant_config=None)",
            ),
        ),
        fused=(_QKV, _GATE_UP, _MLA),
    ),  # fmt: skip
    "gpt_oss": RuntimeModules(
        "gpt_oss.py (the router: a torch.nn.Linear; experts stacked, read as MXFP4 or plain)",
        plain=(Plain("*.mlp.router", _ROUTER),),
        fused=(_QKV,),
    ),
    "llama4": RuntimeModules(
        "llama4.py@0303cbd and mllama4.py@60d375c (Llama4MoE.router: quant_config=None; vision_model and "
        "multi_modal_projector built with quant_config=None; experts read per expert, experts.E.gate_proj ...)",
        plain=(
            Plain("*.feed_forward.router", _ROUTER),
            Plain("vision_model*", "Llama 4's vision model, which vLLM builds unquantised (quant_config=None)"),
            Plain("*.vision_model*", "Llama 4's vision model, which vLLM builds unquantised (quant_config=None)"),
            Plain("multi_modal_projector*", "Llama 4's projector, which vLLM builds unquantised (quant_config=None)"),
            Plain("*.multi_modal_projector*", "Llama 4's projector, which vLLM builds unquantised (quant_config=None)"),
        ),
        fused=(_QKV, _GATE_UP),
    ),
    "llama4_text": RuntimeModules(
        "llama4.py@0303cbd (Llama4MoE.router: quant_config=None)",
        plain=(Plain("*.feed_forward.router", _ROUTER),),
        fused=(_QKV, _GATE_UP),
    ),
    # encoders: query / key / value into qkv_proj; the pooler, classifiers and the masked-LM head are
    # torch.nn.Linear
    "bert": RuntimeModules(
        "bert.py@d5b3937 (BertModel.packed_modules_mapping; BertPooler.dense, BertMLMHead and the classifiers: "
        "torch.nn.Linear)",
        plain=(
            Plain("*pooler.dense", "BERT's pooler, which vLLM builds as a torch.nn.Linear"),
            Plain("*classifier*", "a classifier head, which vLLM builds as a torch.nn.Linear"),
            Plain("cls.predictions.*", "the masked-LM head, which vLLM builds as torch.nn.Linear layers"),
        ),
        fused=(Fused(("query", "key", "value")),),
    ),
    "roberta": RuntimeModules(
        "roberta.py@14a1f94 (BertModel's layers; RobertaClassificationHead: torch.nn.Linear)",
        plain=(
            Plain("*pooler.dense", "the pooler, which vLLM builds as a torch.nn.Linear"),
            Plain("*classifier*", "a classifier head, which vLLM builds as a torch.nn.Linear"),
            Plain("lm_head.*", "the masked-LM head, kept with the output head"),
        ),
        fused=(Fused(("query", "key", "value")),),
    ),
    # encoder-decoders: the cross-attention's key and value fused, its query apart
    "whisper": RuntimeModules(
        "whisper.py@d1a2e94 (self_attn.qkv_proj; encoder_attn.kv_proj of k_proj / v_proj, q_proj apart)",
        fused=(Fused(("q_proj", "k_proj", "v_proj"), "self_attn"), Fused(("k_proj", "v_proj"), "encoder_attn")),
    ),
    "bart": RuntimeModules(
        "bart.py (self_attn.qkv_proj; encoder_attn: QKVCrossParallelLinear, q from the decoder, k / v fused)",
        fused=(Fused(("q_proj", "k_proj", "v_proj"), "self_attn"), Fused(("k_proj", "v_proj"), "encoder_attn")),
    ),
    # vision-language: the towers are the model's (kept by default); vLLM's own exceptions in them
    "qwen2_5_vl": RuntimeModules(
        "qwen2_5_vl.py@fb33ec8 (visual.patch_embed.proj: quant_config=None; the blocks' gate_up_proj)",
        plain=(Plain("*patch_embed.proj", "the patch embedding, which vLLM builds unquantised"),),
        fused=(_QKV, _GATE_UP),
    ),
    "llava": RuntimeModules("llava.py@35d3c24 and clip.py@85f1f91 (qkv_proj, gate_up_proj)", fused=(_QKV, _GATE_UP)),
    "gemma3": RuntimeModules(
        "gemma3_mm.py@e5fa945 and siglip.py@0c028ba (SiglipMLP's fc1 / fc2 take quant_config only where both "
        "dimensions are multiples of 64)",
        plain=(
            Plain(
                "*vision_tower.*.mlp.fc1",
                "SigLIP's fc1, which vLLM builds unquantised unless its dimensions are multiples of 64",
                64,
            ),
            Plain(
                "*vision_tower.*.mlp.fc2",
                "SigLIP's fc2, which vLLM builds unquantised unless its dimensions are multiples of 64",
                64,
            ),
        ),
        fused=(_QKV, _GATE_UP),
    ),  # fmt: skip
}


def runtime_modules(model_type: str | None) -> RuntimeModules:
    """The runtime facts of ``model_type`` (:data:`GENERIC` where there are none)."""
    return RUNTIME_MODULES.get(model_type or "", GENERIC)


@dataclass(frozen=True)
class ExpertSplit:
    """Stacked expert parameters that transformers replaces by per-expert Linear modules for a
    compressed-tensors checkpoint: each ``(parameter, ((linear, part), ...))`` names the Linear
    modules (``MODULE.E.linear``) whose weights are expert E's slice of the [E, in, out]
    parameter, ``part`` of its columns (``whole``, ``first half`` or ``second half``), transposed
    to [out, in]."""

    parameters: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    source: str

    def linears(self) -> tuple[str, ...]:
        return tuple(linear for _, parts in self.parameters for linear, _ in parts)


#: transformers' class name of the stacked experts -> how a compressed-tensors checkpoint holds them.
#: ``Llama4TextExperts.forward`` computes ``x @ gate_up_proj[e]`` ([E, H, 2I]) and chunks it into
#: gate and up, then ``@ down_proj[e]`` ([E, I, H]); ``SequentialLlama4TextExperts`` holds a
#: ``Llama4TextMLP`` per expert, whose Linear weights are those slices transposed.
EXPERT_SPLITS: dict[str, ExpertSplit] = {
    "Llama4TextExperts": ExpertSplit(
        (
            ("gate_up_proj", (("gate_proj", "first half"), ("up_proj", "second half"))),
            ("down_proj", (("down_proj", "whole"),)),
        ),
        "transformers 5.25 models/llama4/modeling_llama4.py (Llama4TextExperts) and quantizers/base.py "
        "(SequentialLlama4TextExperts)",
    ),
}

#: The ``quant_method`` of the checkpoints for which transformers splits a stacked-experts module
#: into per-expert Linear modules (the ``quantization_methods`` of its entry in
#: ``MODULES_TO_PATCH_FOR_QUANTIZATION``, transformers 5.25 ``quantizers/base.py``).
SPLIT_FOR_METHODS = ("compressed-tensors",)
