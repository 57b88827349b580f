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

#: Every output dimension of a Linear a multiple of 128 (one head of 128, one key-value head), so that
#: FP8 in 128 x 128 tiles fits the layers vLLM fuses (its merged-GEMM rule) and every format loads.
_D = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
          head_dim=128, vocab_size=128, max_position_embeddings=64)  # fmt: skip
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
_DEEPSEEK = dict(
    _D, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, n_shared_experts=1,
    first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64,
    v_head_dim=128, n_group=1, topk_group=1, num_key_value_heads=2, head_dim=64)  # fmt: skip
_VISION = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2, image_size=32,
               patch_size=16)  # fmt: skip

#: name -> (config class, model class, config arguments): tiny models of the architectures people
#: quantise. Several names may share a model_type (a tied Llama; DeepSeek-V2 with and without
#: ``q_lora_rank``): the table's entry is the union of their modules.
TINY: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _D),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", {**_D, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", _D),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_D, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _D),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _D),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**_D, **_MOE, "shared_expert_intermediate_size": 256}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**_D, **_MOE}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {**_DEEPSEEK, "q_lora_rank": 128}),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", _DEEPSEEK),  # V2-Lite's shape: q_proj
    "deepseek_v2_q_lora": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {**_DEEPSEEK, "q_lora_rank": 128}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _D),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", _D),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_D, "pad_token_id": 0}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _D),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=2,
                                                          vocab_size=128)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=256, ffn_dim=512, num_hidden_layers=2,
                                                num_attention_heads=2, vocab_size=128, max_position_embeddings=64,
                                                word_embed_proj_dim=256)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=256, n_layer=2, n_head=2, vocab_size=128, n_positions=64)),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(d_model=256, d_ff=512, d_kv=128, num_layers=2, num_heads=2,
                                                          vocab_size=128)),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(
        d_model=256, encoder_ffn_dim=512, decoder_ffn_dim=512, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, vocab_size=128, max_position_embeddings=64)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=256, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=128, num_local_experts=4, num_experts_per_tok=2, vocab_size=128, max_position_embeddings=64,
        layer_types=["full_attention"])),
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(hidden_size=256, state_size=8, num_hidden_layers=2,
                                                      vocab_size=128, expand=2, intermediate_size=512)),
    "llama4": ("Llama4Config", "Llama4ForConditionalGeneration", dict(
        text_config=dict(hidden_size=256, intermediate_size=128, intermediate_size_mlp=512, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=128, num_local_experts=4,
                         num_experts_per_tok=1, vocab_size=128, max_position_embeddings=64),
        vision_config=dict(_VISION, vision_output_dim=128, projector_input_dim=128, projector_output_dim=256,
                           pixel_shuffle_ratio=0.5))),
    "dbrx": ("DbrxConfig", "DbrxForCausalLM", dict(
        d_model=256, n_heads=2, n_layers=2, max_seq_len=64, vocab_size=128,
        # transformers 5.25 reads rope_theta from attn_config, and clamps with clip_qkv (None fails)
        attn_config=dict(kv_n_heads=1, rope_theta=10000.0, clip_qkv=8.0),
        ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {**_D, "intermediate_size": 128, "num_local_experts": 4,
                                                                  "num_experts_per_tok": 2}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {**_D, "intermediate_size": 128, "num_experts": 4,
                                                  "num_experts_per_tok": 2}),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {**_D, **_MOE, "n_routed_experts": 4, "n_shared_experts": 1,
                                                        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    "jamba": ("JambaConfig", "JambaForCausalLM", {**_D, "num_experts": 4, "num_experts_per_tok": 2,
                                                  "expert_layer_period": 2, "expert_layer_offset": 1,
                                                  "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 8,
                                                  "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8,
                                                  "use_mamba_kernels": False}),
    "bert": ("BertConfig", "BertForMaskedLM", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                   num_attention_heads=2, vocab_size=128,
                                                   max_position_embeddings=64)),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                            num_attention_heads=2, vocab_size=128,
                                                            max_position_embeddings=66, pad_token_id=1)),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", dict(
        d_model=256, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=128, num_mel_bins=16, max_source_positions=32,
        max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
        begin_suppress_tokens=None)),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", dict(
        text_config={**_D, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
        vision_config=dict(depth=1, hidden_size=128, intermediate_size=256, num_heads=2, out_hidden_size=256,
                           fullatt_block_indexes=[0], window_size=32, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2))),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", dict(
        text_config={**_D, "model_type": "llama"},
        vision_config=dict(_VISION, model_type="clip_vision_model", projection_dim=128))),
    "gemma3_vl": ("Gemma3Config", "Gemma3ForConditionalGeneration", dict(
        text_config=_D, vision_config=_VISION, mm_tokens_per_image=4)),
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
