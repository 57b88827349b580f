"""Tiny Llama models as GGUF files, written with gguf-py, for the GGUF tests: random weights of a
transformer small enough to run in a test, shaped like a real one (grouped-query attention, a
SentencePiece-style vocabulary of byte tokens, optionally merged experts)."""

from __future__ import annotations

import numpy as np


def tiny_llama_gguf(
    path,
    *,
    dtype: str = "F32",
    n_embd: int = 128,
    n_ff: int = 256,
    n_layer: int = 2,
    n_head: int = 4,
    n_kv: int = 2,
    experts: int = 0,
    tied: bool = False,
    seed: int = 0,
    std: float = 0.02,
) -> dict[str, np.ndarray]:
    """Write a tiny Llama to ``path`` with its weights as ``dtype`` (F32, F16 or BF16); return the
    float32 values of every tensor (as stored: BF16 and F16 rounded), by GGUF name."""
    import gguf
    import ml_dtypes

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁the", "▁a", "e", "t"]
    vocab = len(tokens)
    head = n_embd // n_head
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, n_embd), "output_norm.weight": (n_embd,)}
    if not tied:
        shapes["output.weight"] = (vocab, n_embd)
    for i in range(n_layer):
        b = f"blk.{i}."
        shapes[b + "attn_norm.weight"] = (n_embd,)
        shapes[b + "attn_q.weight"] = (n_embd, n_embd)
        shapes[b + "attn_k.weight"] = (n_kv * head, n_embd)
        shapes[b + "attn_v.weight"] = (n_kv * head, n_embd)
        shapes[b + "attn_output.weight"] = (n_embd, n_embd)
        shapes[b + "ffn_norm.weight"] = (n_embd,)
        if experts:
            shapes[b + "ffn_gate_inp.weight"] = (experts, n_embd)
            shapes[b + "ffn_gate_exps.weight"] = (experts, n_ff, n_embd)
            shapes[b + "ffn_up_exps.weight"] = (experts, n_ff, n_embd)
            shapes[b + "ffn_down_exps.weight"] = (experts, n_embd, n_ff)
        else:
            shapes[b + "ffn_gate.weight"] = (n_ff, n_embd)
            shapes[b + "ffn_up.weight"] = (n_ff, n_embd)
            shapes[b + "ffn_down.weight"] = (n_embd, n_ff)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({"F32": 0, "F16": 1, "BF16": 32}[dtype])
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [-1000.0] * 256 + [-1.0, -2.0, -3.0, -4.0])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    w.add_token_types(types + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 4)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    values: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            x = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            x = (std * rng.standard_normal(shape)).astype(np.float32)
        if len(shape) == 1 or dtype == "F32":
            w.add_tensor(name, x)
            values[name] = x
        elif dtype == "F16":
            w.add_tensor(name, x.astype(np.float16))
            values[name] = x.astype(np.float16).astype(np.float32)
        else:
            b16 = x.astype(ml_dtypes.bfloat16)
            w.add_tensor(name, b16.view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
            values[name] = b16.astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values
