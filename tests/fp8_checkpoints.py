"""FP8 checkpoints of the tiny bfloat16 Llama of tests/fixtures/modelopt, made by encoders written
from the producers' formulas (transformers' FP8 quantiser; compressed-tensors' observer) with the
values each quantised weight is expected to read back as, from a decoder written from the layout's
definition (each code times its block's scale), not from the package."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from .checkpoint_helpers import read_safetensors, write_safetensors

#: ModelOpt's checkpoints of the tiny Llama (and the Llama itself, in bf16/).
MODELOPT = Path(__file__).parent / "fixtures" / "modelopt"
LLAMA = MODELOPT / "bf16"
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def tiles(x: np.ndarray, bm: int, bn: int) -> np.ndarray:
    """The |x| amax of each bm x bn block (partial edge blocks included), as a grid."""
    rows, cols = x.shape
    grid = np.zeros((-(-rows // bm), -(-cols // bn)), np.float32)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            grid[i, j] = np.abs(x[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]).max()
    return grid


def per_element(grid: np.ndarray, bm: int, bn: int, shape) -> np.ndarray:
    return np.repeat(np.repeat(grid, bm, axis=0), bn, axis=1)[: shape[0], : shape[1]]


def encode(x: np.ndarray, bm: int, bn: int, scale_dtype) -> tuple[np.ndarray, np.ndarray]:
    """transformers' FP8 quantiser: scale = 448 / amax (1 for an all-zero block), stored as its
    float32 reciprocal; codes = clamp(x * scale, +-448) as float8_e4m3fn."""
    amax = tiles(x, bm, bn)
    scale = np.where(amax == 0, np.float32(1), np.float32(448) / np.where(amax == 0, 1, amax)).astype(np.float32)
    inv = (np.float32(1) / scale).astype(scale_dtype)
    codes = np.clip(x * per_element(scale, bm, bn, x.shape), -448, 448).astype(E4M3)
    return codes, inv


def decode(codes: np.ndarray, scales: np.ndarray, bm: int, bn: int) -> np.ndarray:
    """The layout's definition: each code (float32) times its block's scale (float32)."""
    return codes.astype(np.float32) * per_element(scales.astype(np.float32), bm, bn, codes.shape)


def llama() -> dict[str, np.ndarray]:
    return read_safetensors(LLAMA / "model.safetensors")[0]


def make_fp8(folder: Path, block=(128, 128), scale_dtype=np.float32, config_extra=None) -> dict[str, np.ndarray]:
    """A fine-grained FP8 checkpoint of the Llama; returns each quantised weight's expected values."""
    folder.mkdir()
    tensors, expected = {}, {}
    for name, value in llama().items():
        if name.endswith("_proj.weight"):
            codes, inv = encode(value.astype(np.float32), *block, scale_dtype)
            tensors[name], tensors[name + "_scale_inv"] = codes, inv
            expected[name] = decode(codes, inv, *block)
        else:
            tensors[name] = value
    write_safetensors(folder / "model.safetensors", tensors)
    config = json.loads((LLAMA / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": list(block), **(config_extra or {})}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return expected


STRATEGIES = {  # strategy -> (block of a [rows, cols] weight, config keys)
    "tensor": (lambda r, c: (r, c), {}),
    "channel": (lambda r, c: (1, c), {}),
    "block": (lambda r, c: (128, 128), {"block_structure": [128, 128]}),
    "group": (lambda r, c: (1, 32), {"group_size": 32}),
}


def make_ct_fp8(folder: Path, strategy: str, scale_dtype=BF16) -> dict[str, np.ndarray]:
    """A compressed-tensors float-quantized checkpoint (compressed-tensors' observer: scale =
    amax / 448 in the scale's dtype; codes = clamp(x / scale, +-448))."""
    folder.mkdir()
    block_of, keys = STRATEGIES[strategy]
    tensors, expected = {}, {}
    for name, value in llama().items():
        if name.endswith("_proj.weight"):
            x = value.astype(np.float32)
            bm, bn = block_of(*x.shape)
            scale = (tiles(x, bm, bn) / np.float32(448)).astype(scale_dtype)
            scale = np.where(scale.astype(np.float32) == 0, scale_dtype.type(2.0**-7), scale).astype(scale_dtype)
            codes = np.clip(x / per_element(scale.astype(np.float32), bm, bn, x.shape), -448, 448).astype(E4M3)
            tensors[name] = codes
            tensors[name[: -len("weight")] + "weight_scale"] = scale.reshape(1) if strategy == "tensor" else scale
            expected[name] = decode(codes, scale, bm, bn)
        else:
            tensors[name] = value
    write_safetensors(folder / "model.safetensors", tensors)
    config = json.loads((LLAMA / "config.json").read_text())
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False,
               "block_structure": None, "group_size": None, **keys}  # fmt: skip
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "format": "float-quantized"}
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized",
                                     "config_groups": {"group_0": group}, "ignore": ["lm_head"],
                                     "quantization_status": "compressed"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return expected
