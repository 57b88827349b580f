"""Checkpoint folders read and decoded without the package: the readers and the decoder that
``test_checkpoints.py``, ``test_checkpoints_fused.py`` and ``test_checkpoints_gptoss.py`` share.

The decoder is written from the layouts' description alone (E2M1 table, nibble order, e8m0 and
float8_e4m3fn scales, compressed-tensors' ``w = fp4 * scale / global_scale``, gpt-oss's
``_blocks`` / ``_scales``), not from the package's code; the reader parses the .safetensors format
itself and checks what it finds against the safetensors package.
"""

import json
import os

import ml_dtypes
import numpy as np
from safetensors import safe_open

BF16 = np.dtype(ml_dtypes.bfloat16)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


# ---- a decoder written from the layouts' description --------------------------------------------


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Byte k holds element 2k in the low nibble and 2k+1 in the high nibble."""
    lo, hi = packed & 0x0F, packed >> 4
    return np.stack([E2M1[lo], E2M1[hi]], axis=-1).reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def e8m0(b: np.ndarray) -> np.ndarray:
    return np.exp2(b.astype(np.float64) - 127)


def per_block(scales: np.ndarray, block: int) -> np.ndarray:
    return np.repeat(scales, block, axis=-1)


def decode_ct(tensors: dict, base: str, fmt: str) -> np.ndarray:
    if fmt == "nvfp4":
        p, s, g = (
            tensors[f"{base}.weight_packed"],
            tensors[f"{base}.weight_scale"],
            tensors[f"{base}.weight_global_scale"],
        )
        scale = s.astype(np.float32) / g[0]  # float32 arithmetic, as the runtimes
        return unpack_fp4(p) * per_block(scale, 16)
    if fmt == "mxfp4_e2m1":
        p, s = tensors[f"{base}.weight_packed"], tensors[f"{base}.weight_scale"]
        return (unpack_fp4(p) * per_block(e8m0(s), 32)).astype(np.float32)
    w, s = tensors[f"{base}.weight"], tensors[f"{base}.weight_scale"]
    return (w.astype(np.float64) * per_block(e8m0(s), 32)).astype(np.float32)


def decode_gptoss(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., out, G, 16] bytes and [..., out, G] e8m0 -> [..., out, G * 32]."""
    values = unpack_fp4(blocks) * e8m0(scales)[..., None]
    return values.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 32,)).astype(np.float32)


#: safetensors dtype names (the safetensors package's numpy loader has no FP8 dtypes).
ST_DTYPES = {"BF16": BF16, "F16": np.float16, "F32": np.float32, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E8M0": ml_dtypes.float8_e8m0fnu, "U8": np.uint8, "I8": np.int8, "I32": np.int32,
             "I64": np.int64}  # fmt: skip


def read_safetensors(path) -> tuple[dict, dict]:
    """(tensors, __metadata__) of a .safetensors file: an 8-byte little-endian header length, a
    JSON header of dtype / shape / data_offsets, then the data."""
    with open(path, "rb") as fh:
        raw = fh.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n :]
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(data[b:e], ST_DTYPES[v["dtype"]]).reshape(v["shape"])
    assert sum(v.nbytes for v in out.values()) == len(data)
    return out, meta


def write_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """The reverse of :func:`read_safetensors` (any dtype of :data:`ST_DTYPES`), tensors in order."""
    names = {np.dtype(v): k for k, v in ST_DTYPES.items()}
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    start = 0
    for k, v in tensors.items():
        header[k] = {"dtype": names[v.dtype], "shape": list(v.shape), "data_offsets": [start, start + v.nbytes]}
        start += v.nbytes
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        for v in tensors.values():
            fh.write(np.ascontiguousarray(v).tobytes())


def read_dir(path) -> dict:
    """Every tensor of a checkpoint folder and the shard it is in (also opened by the safetensors package)."""
    out, where = {}, {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            tensors, meta = read_safetensors(os.path.join(path, name))
            assert meta.get("format") == "pt"
            with safe_open(os.path.join(path, name), framework="numpy") as f:
                assert sorted(f.keys()) == sorted(tensors)
            out.update(tensors)
            where.update(dict.fromkeys(tensors, name))
    return out, where


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


# ---- DeepSeek-V4 ---------------------------------------------------------------------------------

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
DEEPSEEK_V4_CONFIG = {
    "model_type": "deepseek_v4",
    "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
}  # fmt: skip


def _fp4_values(pairs: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    codes = np.stack([pairs & 0xF, pairs >> 4], axis=-1).reshape(pairs.shape[0], -1)  # low nibble first
    return E2M1[codes] * np.repeat(np.exp2(exponents.astype(np.float32) - 127), 32, axis=1)


def make_deepseek_v4(folder, seed: int = 4) -> dict:
    """A checkpoint in DeepSeek-V4's form (vLLM's ``models/deepseek_v4``): three routed experts' FP4
    pairs stored as int8 with e8m0 scales per 32, a dense FP8 weight with e8m0 scales per 128 x 128
    block (``NAME.scale`` each), a bfloat16 embedding; codes and scales drawn at random (the
    exponents within NVFP4's reach). Returns each weight's values, decoded from that description."""
    rng = np.random.default_rng(seed)
    tensors, values = {}, {}
    for w in ("w1", "w2", "w3"):
        name = f"layers.0.ffn.experts.0.{w}"
        pairs = rng.integers(0, 256, (64, 32), dtype=np.uint8)
        exponents = rng.integers(118, 130, (64, 2), dtype=np.uint8)
        tensors[f"{name}.weight"], tensors[f"{name}.scale"] = pairs.view(np.int8), exponents.view(E8M0)
        values[f"{name}.weight"] = _fp4_values(pairs, exponents).astype(np.float32)
    codes = rng.integers(0, 256, (256, 128), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    exponents = rng.integers(115, 125, (2, 1), dtype=np.uint8)
    tensors["layers.0.attn.wq_a.weight"], tensors["layers.0.attn.wq_a.scale"] = codes.view(E4M3), exponents.view(E8M0)
    values["layers.0.attn.wq_a.weight"] = codes.view(E4M3).astype(np.float32) * np.repeat(
        np.exp2(exponents.astype(np.float32) - 127), 128, axis=0)  # fmt: skip
    tensors["embed.weight"] = rng.standard_normal((32, 128)).astype(BF16)
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(DEEPSEEK_V4_CONFIG, fh)
    return values
