"""The fuzzer's seeds: files the package itself writes (and the plain inputs it reads), made once
into a folder and reused by every target.

Each seed is a file or a folder under the seeds folder; :data:`SEEDS` names what each one is
made from. They are small (the fuzzer mutates every byte): a one-layer model of width 64.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil

import ml_dtypes
import numpy as np

from neuron_kernels.checkpoints import load_checkpoint
from neuron_kernels.io.blockfile import BlockFileWriter

from ..checkpoint_helpers import make_deepseek_v4

__all__ = ["VERSION", "build_seeds", "seeds_folder"]

#: Bumped when the seeds change: a folder of another version is made anew.
VERSION = 7
HIDDEN, INTER, VOCAB = 64, 128, 32
BF16 = np.dtype(ml_dtypes.bfloat16)


def seeds_folder() -> str:
    """Where the seeds are kept: ``$NEURON_KERNELS_FUZZ_SEEDS``, else a folder in the temporary folder."""
    import tempfile

    default = os.path.join(tempfile.gettempdir(), f"neuron-kernels-fuzz-seeds-{VERSION}")
    return os.environ.get("NEURON_KERNELS_FUZZ_SEEDS", default)


def _cli(*args: str, cwd: str) -> None:
    from neuron_kernels.cli import main

    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            status = main([*args, "--quiet"] if args[0] in ("quantize", "dequantize", "cast") else list(args))
    finally:
        os.chdir(here)
    if status != 0:
        raise RuntimeError(f"making a seed: neuron-kernels {' '.join(args)}: exit {status}: {err.getvalue()}")


def _llama(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A one-layer Llama's tensors, bfloat16."""

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(BF16)

    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": w(VOCAB, HIDDEN),
        p + "input_layernorm.weight": w(HIDDEN),
        p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
        p + "self_attn.k_proj.weight": w(HIDDEN // 2, HIDDEN),
        p + "self_attn.v_proj.weight": w(HIDDEN // 2, HIDDEN),
        p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
        p + "post_attention_layernorm.weight": w(HIDDEN),
        p + "mlp.gate_proj.weight": w(INTER, HIDDEN),
        p + "mlp.up_proj.weight": w(INTER, HIDDEN),
        p + "mlp.down_proj.weight": w(HIDDEN, INTER),
        "model.norm.weight": w(HIDDEN),
        "lm_head.weight": w(VOCAB, HIDDEN),
    }


_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": VOCAB,
    "torch_dtype": "bfloat16",
}


def _write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    from neuron_kernels.io.safetensors import SafetensorsWriter, TensorSpec

    specs = [TensorSpec(k, v.dtype, v.shape) for k, v in tensors.items()]
    with SafetensorsWriter(path, specs, {"format": "pt"}) as w:
        for k, v in tensors.items():
            with w.tensor(k) as t:
                t.write(v)


def _plain_checkpoint(folder: str, tensors: dict[str, np.ndarray], shards: int) -> None:
    """A plain checkpoint folder: ``shards`` shards with an index (one shard: no index)."""
    os.makedirs(folder)
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        shard = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        _write_safetensors(os.path.join(folder, shard), part)
        weight_map |= dict.fromkeys(part, shard)
    if shards > 1:
        index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())}, "weight_map": weight_map}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
            json.dump(index, fh, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(_CONFIG, fh, indent=2)
    with open(os.path.join(folder, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, fh)


def _neuron_experts(folder: str, rng: np.random.Generator) -> None:
    """NxD Inference's Llama 4 experts (the neuron layout): stacked float8_e4m3fn [E, in, out]
    within 240 with a float32 scale per expert and column [E, 1, out], beside a Linear per channel."""
    e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
    prefix = "language_model.model.layers.0"
    tensors = {}
    for param, shape in (("gate_up_proj", (2, HIDDEN, 2 * INTER)), ("down_proj", (2, INTER, HIDDEN))):
        name = f"{prefix}.feed_forward.experts.{param}"
        tensors[name] = np.clip(rng.standard_normal(shape) * 60, -240, 240).astype(e4m3)
        tensors[f"{name}.scale"] = rng.uniform(1e-4, 1e-3, (shape[0], 1, shape[2])).astype(np.float32)
    q = np.clip(rng.standard_normal((HIDDEN, HIDDEN)) * 60, -240, 240)
    tensors[f"{prefix}.self_attn.q_proj.weight"] = q.astype(e4m3)
    tensors[f"{prefix}.self_attn.q_proj.scale"] = rng.uniform(1e-4, 1e-3, (HIDDEN, 1)).astype(np.float32)
    os.makedirs(folder)
    _write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    settings = {"quantized": True, "quantization_type": "expert_wise_per_channel_symmetric",
                "quantization_dtype": "f8e4m3", "modules_to_not_convert": []}  # fmt: skip
    for name, content in (("neuron_quantization.json", settings), ("config.json", {"model_type": "llama4"})):
        with open(os.path.join(folder, name), "w") as fh:
            json.dump(content, fh)


def _gguf(path: str, rng: np.random.Generator, experts: int = 0) -> None:
    """A one-layer llama GGUF file written with gguf-py (F32 and F16 tensors), as llama.cpp's
    converter writes one."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("fuzz-seed")
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(1)
    w.add_feed_forward_length(INTER)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(VOCAB - 3)])
    w.add_token_scores([0.0] * VOCAB)
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "output.weight": (VOCAB, HIDDEN),
        "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HIDDEN, HIDDEN),
        "blk.0.attn_k.weight": (HIDDEN // 2, HIDDEN),
        "blk.0.attn_v.weight": (HIDDEN // 2, HIDDEN),
        "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
        "blk.0.ffn_norm.weight": (HIDDEN,),
    }
    if experts:
        shapes |= {
            "blk.0.ffn_gate_inp.weight": (experts, HIDDEN),
            "blk.0.ffn_gate_exps.weight": (experts, INTER, HIDDEN),
            "blk.0.ffn_up_exps.weight": (experts, INTER, HIDDEN),
            "blk.0.ffn_down_exps.weight": (experts, HIDDEN, INTER),
        }
    else:
        shapes |= {
            "blk.0.ffn_gate.weight": (INTER, HIDDEN),
            "blk.0.ffn_up.weight": (INTER, HIDDEN),
            "blk.0.ffn_down.weight": (HIDDEN, INTER),
        }
    for name, shape in shapes.items():
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32 if len(shape) == 1 else np.float16)
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


#: A recipe of llm-compressor's shape: two config groups and an ignore list.
_RECIPE = """quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: [lm_head]
      config_groups:
        attention:
          targets: ["re:.*self_attn.*"]
          weights: {num_bits: 8, type: float, symmetric: true, strategy: channel, dynamic: false}
          input_activations: {num_bits: 8, type: float, strategy: token, dynamic: true}
        mlp:
          targets: [Linear]
          weights: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16}
"""


def build_seeds(root: str | None = None) -> str:
    """Make the seeds under ``root`` (default :func:`seeds_folder`) unless they are there; returns
    the folder. Made in a temporary folder beside it and renamed into place, so that several
    processes may call it at once."""
    root = root or seeds_folder()
    if os.path.isdir(root):
        return root
    tmp = f"{root}.{os.getpid()}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(55)
    tensors = _llama(rng)
    # plain checkpoints (the package's own safetensors writer) and the package's quantised layouts
    _plain_checkpoint(os.path.join(tmp, "plain"), tensors, 1)
    _plain_checkpoint(os.path.join(tmp, "sharded"), tensors, 2)
    _cli("quantize", "plain", "ct-nvfp4", "--format", "nvfp4", cwd=tmp)
    _cli("quantize", "sharded", "ct-mxfp4", "--format", "mxfp4_e2m1", "--max-shard-size", "20KB", cwd=tmp)
    _cli("quantize", "plain", "ct-fp8", "--format", "fp8_channel", cwd=tmp)
    _cli("quantize", "plain", "modelopt-fp8", "--format", "fp8_channel", "--layout", "modelopt", cwd=tmp)
    only = ("--only", "*gate_proj*", "--only", "*up_proj*")  # fused with 128 rows: whole 128 x 128 tiles
    _cli("quantize", "plain", "fp8-block", "--format", "fp8_block", "--layout", "fp8", *only, cwd=tmp)
    _cli("quantize", "plain", "layout.npz", "--format", "mxfp8_e4m3", "--layout", "npz", cwd=tmp)
    _cli("quantize", "plain", "ct-fp8-block", "--format", "fp8_block", *only, cwd=tmp)  # config_groups' blocks
    # array files: .npy (the package's, numpy's big-endian Fortran one), .npz stored and deflated, .safetensors
    x = rng.standard_normal((16, 64)).astype(np.float32)
    np.save(os.path.join(tmp, "numpy.npy"), x)
    np.save(os.path.join(tmp, "fortran.npy"), np.asfortranarray(x[:, :40].astype(">f4")))
    np.savez(os.path.join(tmp, "numpy.npz"), a=x, b=np.arange(12, dtype=np.int16).reshape(3, 4))
    np.savez_compressed(os.path.join(tmp, "deflated.npz"), a=x)
    _cli("cast", "numpy.npy", "x.npy", "--to", "bfloat16", cwd=tmp)
    np.savez(os.path.join(tmp, "floats.npz"), a=x, b=x[:4, :32].astype(np.float16))
    _cli("cast", "floats.npz", "x.safetensors", "--to", "bfloat16", cwd=tmp)
    _cli("cast", "numpy.npz", "x.npz", "--to", "float16", cwd=tmp)
    # block files: one array, several arrays, NVFP4's two levels, FP8 with float scales
    _cli("quantize", "numpy.npy", "mx.npz", "--format", "mxfp4_e2m1", cwd=tmp)
    _cli("quantize", "x.safetensors", "many.npz", "--format", "mxfp8_e4m3", "--block-size", "4", cwd=tmp)
    _cli("quantize", "numpy.npy", "nv.npz", "--format", "nvfp4", cwd=tmp)
    _cli("quantize", "numpy.npy", "fp8.npz", "--format", "fp8_block", "--block-shape", "8x8", cwd=tmp)
    # GGUF: gguf-py's files and the package's quantised ones
    _gguf(os.path.join(tmp, "model.gguf"), rng)
    _gguf(os.path.join(tmp, "moe.gguf"), rng, experts=4)
    _cli("quantize", "model.gguf", "nvfp4.gguf", "--format", "nvfp4", cwd=tmp)
    _cli("quantize", "moe.gguf", "moe-nvfp4.gguf", "--format", "nvfp4", cwd=tmp)
    _cli("quantize", "model.gguf", "mxfp4.gguf", "--format", "mxfp4_e2m1", cwd=tmp)
    # two producers' own checkpoints, as the tests keep them
    fixtures = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
    shutil.copytree(os.path.join(fixtures, "modelopt", "nvfp4"), os.path.join(tmp, "modelopt-nvfp4"))
    shutil.copytree(os.path.join(fixtures, "llmcompressor", "nvfp4"), os.path.join(tmp, "llmcompressor-nvfp4"))
    # several schemes: the command's compressed-tensors and ModelOpt mixed-precision, llm-compressor's own,
    # DeepSeek-V4's FP4 experts beside FP8 blocks, and a recipe file beside a plain checkpoint
    attention = ("--scheme", "*.self_attn.*=fp8_channel")
    _cli("quantize", "plain", "ct-mixed", "--format", "nvfp4", *attention, cwd=tmp)
    _cli("quantize", "plain", "modelopt-mixed", "--layout", "modelopt", "--format", "nvfp4", "--scheme",
         "*.self_attn.*=mxfp8_e4m3", cwd=tmp)  # fmt: skip
    shutil.copytree(os.path.join(fixtures, "llmcompressor", "mixed"), os.path.join(tmp, "llmcompressor-mixed"))
    make_deepseek_v4(os.path.join(tmp, "deepseek-v4"))
    # integers: llm-compressor's W4A16_ASYM, W3A16 (codes across words) and W8A8, AutoGPTQ's act-order
    # and AutoAWQ's GEMM checkpoints, and the command's integer groups beside FP8 attention
    for name, folder in (("w4a16_asym", "llmcompressor-w4a16-asym"), ("w3a16", "llmcompressor-w3a16"),
                         ("w8a8", "llmcompressor-w8a8")):  # fmt: skip
        shutil.copytree(os.path.join(fixtures, "llmcompressor", name), os.path.join(tmp, folder))
    shutil.copytree(os.path.join(fixtures, "gptq", "autogptq_int4_actorder"), os.path.join(tmp, "gptq-int4"))
    shutil.copytree(os.path.join(fixtures, "awq", "autoawq_gemm_int4"), os.path.join(tmp, "awq-int4"))
    _cli("quantize", "plain", "ct-int-mixed", "--format", "fp8_channel", "--scheme",
         "*.mlp.*=int4_group_asym,block_size=32", cwd=tmp)  # fmt: skip
    # block files of integers: zero points, and act-order's group index (version 2)
    _cli("quantize", "numpy.npy", "int-asym.npz", "--format", "int4_group_asym", "--block-size", "8", cwd=tmp)
    with BlockFileWriter(os.path.join(tmp, "act-order.npz")) as writer:
        for name, array in load_checkpoint(os.path.join(tmp, "gptq-int4")).items():
            if getattr(array, "group_index", None) is not None:
                writer.add(name, array)
    # NxD Inference's layout (Trn1/Trn2): FP8 within 240 per channel, settings beside the shards
    _cli("quantize", "plain", "neuron", "--layout", "neuron", "--format", "fp8_e4m3_channel", cwd=tmp)
    _neuron_experts(os.path.join(tmp, "neuron-experts"), np.random.default_rng(7))
    shutil.copytree(os.path.join(tmp, "plain"), os.path.join(tmp, "recipe"))
    with open(os.path.join(tmp, "recipe", "recipe.yaml"), "w") as fh:
        fh.write(_RECIPE)
    try:
        os.rename(tmp, root)
    except OSError:  # another process made them first
        shutil.rmtree(tmp, ignore_errors=True)
    return root
