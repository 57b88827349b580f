"""vLLM's loading rule for ModelOpt checkpoints, written from its source (vLLM needs a GPU):
``vllm/model_executor/layers/quantization/modelopt.py`` with ``utils/quant_utils.py``'s
``is_layer_skipped`` and ``model_loader/weight_utils.py``'s ``get_quant_config`` (see
tests/test_checkpoints_modelopt_fp8.py), and the Llama-shaped checkpoints the tests make. The
NVFP4 (W4A16_NVFP4), MXFP8 and MIXED_PRECISION rules are from a 2026 version of modelopt.py:
``ModelOptNvFp4Config`` (its quant_algos, the hf_quant_config.json keys it requires),
``ModelOptMixedPrecisionConfig._resolve_quant_algo`` and ``get_quant_method`` (the quant_algos
it runs a Linear with; any other unquantised)."""

import fnmatch
import json

import ml_dtypes
import numpy as np

from .checkpoint_helpers import read_dir, write_safetensors

BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
QUANT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION")
MIXED_LINEAR = ("FP8", "NVFP4", "W4A16_NVFP4", "MXFP8")  # ModelOptMixedPrecisionConfig.get_quant_method's
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
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
    if "NVFP4" in algo:  # ModelOptNvFp4Config._from_config requires these in hf_quant_config.json
        assert {"group_size", "kv_cache_quant_algo", "exclude_modules"} <= set(legacy)
    return algo, exclude


def resolve_quant_algo(prefix, layers):
    """``ModelOptMixedPrecisionConfig._resolve_quant_algo`` for a Llama's vLLM Linear ``prefix``: its
    own key, else its packed shards' (which must agree), else a key below it; None where none."""
    if prefix in layers:
        return layers[prefix]["quant_algo"].upper()
    base, _, proj = prefix.rpartition(".")
    if proj in PACKED:
        algos = {layers[f"{base}.{s}"]["quant_algo"].upper() for s in PACKED[proj] if f"{base}.{s}" in layers}
        assert len(algos) <= 1, f"vLLM raises: mixed quant_algo within fused layer {prefix}"
        if algos:
            return algos.pop()
    return next((v["quant_algo"].upper() for k, v in layers.items() if k.startswith(prefix + ".")), None)


def _decode(algo, tensors, module, shape):
    """A quantised Linear's values as vLLM's method for ``algo`` reads them (float32)."""
    w, scale = tensors[f"{module}.weight"], tensors[f"{module}.weight_scale"]
    out, cols = shape
    if algo in ("NVFP4", "W4A16_NVFP4"):
        assert w.dtype == np.uint8 and w.shape == (out, cols // 2) and scale.shape == (out, cols // 16), module
        second = tensors[f"{module}.weight_scale_2"]
        assert second.dtype == np.float32 and second.size == 1, module
        codes = np.stack([w & 0xF, w >> 4], axis=-1).reshape(out, cols)  # the even element in the low nibble
        return E2M1[codes] * np.repeat(scale.astype(np.float32), 16, axis=1) * second.reshape(())
    if algo == "MXFP8":
        assert w.dtype == F8 and w.shape == (out, cols) and scale.dtype == np.uint8, module
        assert scale.shape == (out, cols // 32), module
        return w.astype(np.float32) * np.repeat(np.exp2(scale.astype(np.float32) - 127), 32, axis=1)
    assert w.dtype == F8 and w.shape == (out, cols) and scale.dtype == np.float32, module
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
        assert scale.shape == (out,), module
        return w.astype(np.float32) * np.repeat(scale[:, None], cols, axis=1)
    assert out % 128 == 0 and cols % 128 == 0, module  # create_weights' checks
    assert scale.shape == (out // 128, 1, cols // 128, 1), module
    grid = scale.squeeze(1).squeeze(-1)  # process_weights_after_loading
    return w.astype(np.float32) * np.repeat(np.repeat(grid, 128, axis=0), 128, axis=1)


#: The tensors each quant_algo's Linear method loads besides ``weight``.
PARTS = {"NVFP4": ("weight_scale", "weight_scale_2"), "W4A16_NVFP4": ("weight_scale", "weight_scale_2")}


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
    of the model), each as float32 values: the codes times their scales as vLLM applies them; a
    MIXED_PRECISION checkpoint's each by its quantized_layers entry."""
    algo, exclude = vllm_config(folder)
    layers = json.loads((folder / "config.json").read_text())["quantization_config"].get("quantized_layers")
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
        mine = algo
        if algo == "MIXED_PRECISION":
            mine = resolve_quant_algo(vllm_name, layers)
            assert mine is None or mine in MIXED_LINEAR, f"{module}: {mine} runs unquantised in vLLM"
        if excluded(vllm_name, exclude) or mine is None:
            assert names == {f"{module}.weight"} and w.dtype == BF16, module
            loaded[module] = w.astype(np.float32)
            continue
        assert names == {f"{module}.weight", *(f"{module}.{p}" for p in PARTS.get(mine, ("weight_scale",)))}, names
        loaded[module] = _decode(mine, tensors, module, dense[f"{module}.weight"].shape)
    unexpected = set(tensors) - claimed - {n for n in dense if not n.endswith("_proj.weight")}
    assert not unexpected, unexpected
    return loaded
