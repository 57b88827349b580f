"""The package's table of architectures (neuron_kernels/checkpoints/architectures.json), from transformers.

For each architecture of :data:`TINY`, a tiny random model is built with transformers' own
classes and saved with ``save_pretrained`` (so that the tensor names are the ones checkpoints
carry); each saved tensor is mapped to the module that owns it as transformers' loader maps it
(:func:`neuron_kernels.checkpoints.architecture.from_model`), and the module kinds are written
with every layer and expert number as ``*``. The table is what the package uses where
transformers is not installed; ``tests/test_checkpoints_architectures.py`` builds it again in
CI and compares. The same tiny models are the architecture matrix those tests load.

    python scripts/make_architecture_table.py            # write the table
    python scripts/make_architecture_table.py --models DIR [NAME ...]   # save the tiny models
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

_D = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
          vocab_size=128, max_position_embeddings=64)  # fmt: skip
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
_DEEPSEEK = dict(
    _D, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
    first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=32, qk_nope_head_dim=32,
    v_head_dim=32, n_group=1, topk_group=1, num_key_value_heads=2)  # fmt: skip

#: name -> (config class, model class, config arguments): tiny models of the architectures people
#: quantise. Several names may share a model_type (a tied Llama; DeepSeek-V2 with and without
#: ``q_lora_rank``): the table's entry is the union of their modules.
TINY: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _D),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", {**_D, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", _D),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_D, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _D),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_D, "head_dim": 32}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**_D, **_MOE, "shared_expert_intermediate_size": 128}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**_D, **_MOE, "head_dim": 32}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {**_DEEPSEEK, "q_lora_rank": 32}),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", _DEEPSEEK),  # V2-Lite's shape: q_proj
    "deepseek_v2_q_lora": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {**_DEEPSEEK, "q_lora_rank": 32}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**_D, "head_dim": 32}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {**_D, "head_dim": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_D, "pad_token_id": 0}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _D),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                          vocab_size=128)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                                num_attention_heads=2, vocab_size=128, max_position_embeddings=64,
                                                word_embed_proj_dim=64)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=2, vocab_size=128, n_positions=64)),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(d_model=64, d_ff=128, d_kv=32, num_layers=2, num_heads=2,
                                                          vocab_size=128)),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(
        d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, vocab_size=128, max_position_embeddings=64)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=128, max_position_embeddings=64,
        layer_types=["full_attention"])),
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(hidden_size=64, state_size=8, num_hidden_layers=2,
                                                      vocab_size=128, expand=2, intermediate_size=128)),
}  # fmt: skip


def save_tiny(folder: str, names: list[str]) -> None:
    """Each named tiny model, random weights (seed 0) in bfloat16, saved to ``folder/NAME``."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    for name in names:
        config_cls, model_cls, kwargs = TINY[name]
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).to(torch.bfloat16)
        model.save_pretrained(os.path.join(folder, name))


def _union(entry: dict | None, more: dict) -> dict:
    """The table entry of a model type made of two variants' (each module of one kind in both)."""
    if entry is None:
        return more
    for key in ("kinds", "model_names"):
        for name, value in more[key].items():
            assert entry[key].setdefault(name, value) == value, (name, entry[key][name], value)
        entry[key] = dict(sorted(entry[key].items()))
    entry["linears"] = sorted(set(entry["linears"]) | set(more["linears"]))
    return entry


def table() -> dict:
    """The table, built from transformers as the module docstring says."""
    import transformers
    from safetensors import safe_open

    from neuron_kernels.checkpoints.architecture import architecture_of

    entries: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny(tmp, list(TINY))
        for name in TINY:
            with open(os.path.join(tmp, name, "config.json"), encoding="utf-8") as fh:
                config = json.load(fh)
            with safe_open(os.path.join(tmp, name, "model.safetensors"), "np") as f:
                keys = list(f.keys())
            arch = architecture_of(config, keys, "transformers")
            assert arch is not None, name
            entries[config["model_type"]] = _union(entries.get(config["model_type"]), arch.normalised())
    return {"transformers": transformers.__version__, "architectures": dict(sorted(entries.items()))}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", metavar="DIR", help="save the tiny models into DIR instead of writing the table")
    p.add_argument("names", nargs="*", help="with --models: only these (default: all)")
    args = p.parse_args(argv)
    if args.models:
        save_tiny(args.models, args.names or list(TINY))
        return 0
    from neuron_kernels.checkpoints.architecture import TABLE_PATH

    with open(TABLE_PATH, "w", encoding="utf-8") as fh:
        json.dump(table(), fh, indent=1)
        fh.write("\n")
    print(f"wrote {TABLE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
