"""vLLM's loading rule for ModelOpt FP8 checkpoints, written from its source (vLLM needs a GPU):
``vllm/model_executor/layers/quantization/modelopt.py`` with ``utils/quant_utils.py``'s
``is_layer_skipped`` and ``model_loader/weight_utils.py``'s ``get_quant_config`` (see
tests/test_checkpoints_modelopt_fp8.py), and the Llama-shaped checkpoints the tests make."""

import fnmatch
import json

import ml_dtypes
import numpy as np

from .checkpoint_helpers import read_dir, write_safetensors

BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
QUANT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4")  # vLLM's ModelOpt QUANT_ALGOS
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}  # Llama's mapping
ALGO = {"fp8_channel": "FP8_PER_CHANNEL_PER_TOKEN", "fp8_block": "FP8_PB_WO"}


def make_llama(folder, hidden=256, intermediate=384, layers=2, vocab=512, seed=0):
    """A Llama checkpoint in bfloat16 (untied lm_head); returns its tensors."""
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (hidden,), f"{p}.post_attention_layernorm.weight": (hidden,)}
        shapes |= {f"{p}.self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"}
        shapes |= {
            f"{p}.mlp.gate_proj.weight": (intermediate, hidden),
            f"{p}.mlp.up_proj.weight": (intermediate, hidden),
        }
        shapes[f"{p}.mlp.down_proj.weight"] = (hidden, intermediate)
    shapes["lm_head.weight"] = (vocab, hidden)
    tensors = {n: (rng.standard_normal(s) * 0.02).astype(BF16) for n, s in shapes.items()}
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", tensors)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": vocab, "tie_word_embeddings": False}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


def vllm_config(folder):
    """vLLM's ModelOpt config of a checkpoint: (QUANT_ALGO, exclude_modules), from config.json's
    quantization_config, checked to say what hf_quant_config.json says."""
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "modelopt"
    algo, exclude = str(qc["quant_algo"]).upper(), qc.get("ignore", [])
    legacy = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
    assert {"quant_algo", "kv_cache_quant_algo", "exclude_modules"} <= set(legacy)  # the keys vLLM's parsers need
    assert (str(legacy["quant_algo"]).upper(), legacy["exclude_modules"]) == (algo, exclude)
    assert algo in QUANT_ALGOS and isinstance(exclude, list)
    return algo, exclude


def excluded(prefix, exclude):
    """``ModelOptQuantConfigBase.is_layer_excluded`` for a vLLM Linear named ``prefix``."""
    proj = prefix.rpartition(".")[2]
    shards = [prefix.replace(proj, s) for s in PACKED.get(proj, (proj,))]
    skipped = {s in exclude for s in shards}
    assert len(skipped) == 1, f"is_layer_skipped raises: the shards of {prefix} disagree"
    if skipped.pop():
        return True
    if any(e != prefix and e in prefix for e in exclude):
        return True
    return any(fnmatch.fnmatch(prefix, e) for e in exclude)


def vllm_load(folder, dense):
    """The weights vLLM loads from ``folder`` (the Linear modules of ``dense``, a plain checkpoint
    of the model), each as float32 values: FP8 codes times their scales as vLLM applies them."""
    algo, exclude = vllm_config(folder)
    tensors = read_dir(folder)[0]
    loaded, claimed = {}, set()
    linears = [n[: -len(".weight")] for n in dense if n.endswith("_proj.weight") or n == "lm_head.weight"]
    for module in linears:
        vllm_name = module
        for fused, shards in PACKED.items():
            for s in shards:
                vllm_name = vllm_name.replace(f".{s}", f".{fused}") if module.endswith(f".{s}") else vllm_name
        names = {n for n in tensors if n.rpartition(".")[0] == module}
        claimed |= names
        w = tensors[f"{module}.weight"]
        if excluded(vllm_name, exclude):
            assert names == {f"{module}.weight"} and w.dtype == BF16, module
            loaded[module] = w.astype(np.float32)
            continue
        assert names == {f"{module}.weight", f"{module}.weight_scale"}, (module, names)
        scale = tensors[f"{module}.weight_scale"]
        out, cols = dense[f"{module}.weight"].shape
        assert w.dtype == F8 and w.shape == (out, cols) and scale.dtype == np.float32, module
        if algo == "FP8_PER_CHANNEL_PER_TOKEN":
            assert scale.shape == (out,), module
            per_element = np.repeat(scale[:, None], cols, axis=1)
        else:
            assert out % 128 == 0 and cols % 128 == 0, module  # create_weights' checks
            assert scale.shape == (out // 128, 1, cols // 128, 1), module
            grid = scale.squeeze(1).squeeze(-1)  # process_weights_after_loading
            per_element = np.repeat(np.repeat(grid, 128, axis=0), 128, axis=1)
        loaded[module] = w.astype(np.float32) * per_element
    unexpected = set(tensors) - claimed - {n for n in dense if not n.endswith("_proj.weight")}
    assert not unexpected, unexpected
    return loaded
