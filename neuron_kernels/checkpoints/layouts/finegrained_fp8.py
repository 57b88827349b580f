"""The ``fp8`` layout (fine-grained FP8: DeepSeek-V3/R1, Qwen3-*-FP8, GLM, MiniMax, Kimi).

Recognised by config.json's ``quantization_config`` with ``quant_method: "fp8"`` and
``weight_block_size: [rows, cols]`` (128 x 128 in the published checkpoints; read from the config,
never derived from the shapes). Per quantised ``NAME.weight``: ``NAME.weight`` float8_e4m3fn
[..., out, in] and ``NAME.weight_scale_inv`` float32, bfloat16 or float16 [..., ceil(out / rows),
ceil(in / cols)], a multiplier despite its name: a value is ``code * scale_inv[i // rows, j //
cols]``, partial edge blocks included (DeepSeek's 576-row ``kv_a_proj_with_mqa``). A static
``activation_scheme``'s ``NAME.input_scale`` goes with its weight (dropped on conversion).

DeepSeek-V4's form (``expert_dtype``, ``scale_fmt: ue8m0``; vLLM's ``models/deepseek_v4``) is read
too: its scales are ``NAME.scale``; a routed expert's ``NAME.weight`` is int8 holding FP4 (E2M1)
pairs [..., out, in/2] (the even element in the low nibble) with e8m0 scales [..., out, in/32], the
package's ``mxfp4_e2m1``; a dense ``NAME.weight`` is float8_e4m3fn with one scale per block, e8m0
(``2^(e - 127)``, exact in float32) or float32, ``fp8_block``.

Written for ``fp8_block`` (128 x 128 tiles): ``NAME.weight`` and ``NAME.weight_scale_inv`` (float32,
or ``--scale-dtype``), and ``quant_method: fp8``, ``activation_scheme: dynamic``, ``fmt: e4m3``,
``weight_block_size: [128, 128]`` and the Linear modules left plain as ``modules_to_not_convert``
(transformers' key, which vLLM reads where ``ignored_layers`` is absent). Which tensors are
quantised: :func:`neuron_kernels.checkpoints.selection.module_decision`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.safetensors import TensorSpec
from ..architecture import module_of
from ..folder import Checkpoint
from ..runtimes import partial_blocks_notes
from ..selection import module_decision
from .records import (
    FP8_CODES,
    CheckpointLayout,
    Output,
    StoredWeight,
    Weight,
    check_fused_blocks,
    expect_tensor,
    scaled_weight,
    scales_and_codes,
    stored_codes_dtype,
    stored_scales_dtype,
    uint8_view,
)

__all__ = ["LAYOUT"]


def _block(ckpt: Checkpoint) -> tuple[int, int]:
    qc = ckpt.quantization_config or {}
    block = qc.get("weight_block_size")
    if (
        not isinstance(block, (list, tuple))
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise FileFormatError(
            f"{ckpt.path}: quantization_config (quant_method fp8) needs weight_block_size, two positive integers "
            f"(the block of each weight_scale_inv entry), found {block!r}"
        )
    return block[0], block[1]


def _detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    return qc is not None and qc.get("quant_method") == "fp8"


def _weights(ckpt: Checkpoint) -> list[Weight]:
    block = _block(ckpt)
    t = ckpt.tensors
    found: list[Weight] = []
    for module, scale, codes in scales_and_codes(ckpt, "weight_scale_inv"):
        base, name = f"{module}.weight", f"{module}.weight_scale_inv"
        parts = (base, name) + tuple(f"{module}.{p}" for p in ("input_scale",) if f"{module}.{p}" in t)
        found.append(
            scaled_weight(base, codes, scale, block, parts, f"fp8 ({block[0]}x{block[1]} blocks)", "fp8_block")
        )
    found += _v4_weights(ckpt, block)
    claimed = {p for w in found for p in w.parts}
    for name, entry in t.items():
        if name not in claimed and (entry.dtype == FP8_CODES or name.endswith(("_scale_inv", "input_scale"))):
            raise FileFormatError(
                f"{ckpt.path}: {name} ({entry.dtype}) belongs to no FP8 weight with its weight_scale_inv; a runtime "
                f"would not read it"
            )
    return found


#: DeepSeek-V4's experts: FP4 codes stored as int8 (or uint8) pairs.
_FP4_PAIRS = ("int8", "uint8")


def _v4_weights(ckpt: Checkpoint, block: tuple[int, int]) -> list[Weight]:
    """DeepSeek-V4's weights (see the module docstring): each ``NAME.scale`` beside an FP4-pair or
    FP8 ``NAME.weight``; a ``.scale`` beside anything else is not a weight's and is left alone."""
    t = ckpt.tensors
    found: list[Weight] = []
    for name, scale in t.items():
        if not name.endswith(".scale"):
            continue
        module = name[: -len(".scale")]
        codes = t.get(f"{module}.weight")
        if codes is None or codes.dtype.name not in (*_FP4_PAIRS, FP8_CODES.name):
            continue
        parts = (f"{module}.weight", name)
        if codes.dtype.name in _FP4_PAIRS:
            if not codes.shape:
                raise FileFormatError(f"{codes.where}: a 0-d tensor cannot hold FP4 pairs")
            bf = BLOCK_FORMATS["mxfp4_e2m1"]
            shape = codes.shape[:-1] + (codes.shape[-1] * 2,)
            layout = BlockLayout(bf.name, shape, len(shape) - 1, bf.block_size, 1, True)
            expect_tensor(scale, scale.dtype.name, layout.scales_shape, "the e8m0 scales of FP4 experts")
            if scale.dtype.itemsize != 1:
                raise FileFormatError(
                    f"{scale.where}: FP4 experts' scales must be e8m0 (one byte), found {scale.dtype}"
                )
            label = "DeepSeek-V4 FP4 (e8m0 scales per 32)"
            found.append(
                StoredWeight(
                    parts[0], layout, None, uint8_view(codes), uint8_view(scale), parts, parts[0], False, label
                )
            )
            continue
        if scale.dtype.itemsize == 1:  # e8m0: each a power of two, exact in float32
            scale = _e8m0_as_float32(scale)
        label = f"DeepSeek-V4 FP8 ({block[0]}x{block[1]} blocks)"
        found.append(scaled_weight(parts[0], codes, scale, block, parts, label, "fp8_block"))
    return found


def _e8m0_as_float32(entry: ArrayEntry) -> ArrayEntry:
    """e8m0 scales (one byte each, ``2^(e - 127)``, 0xff NaN) read as float32, exactly."""
    base = entry._reader

    def read(a: int, b: int) -> np.ndarray:
        e = np.asarray(base(a, b)).view(np.uint8).astype(np.int32)
        out = np.ldexp(np.float32(1), e - 127).astype(np.float32)
        out[e == 255] = np.nan
        return out

    return dataclasses.replace(entry, dtype=np.dtype(np.float32), _reader=read, offset=None)


def _outputs(name: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    base = module_of(name)
    bf = BLOCK_FORMATS[layout.fmt]
    codes = TensorSpec(f"{base}.weight", stored_codes_dtype(bf), layout.codes_shape)
    scales = TensorSpec(f"{base}.weight_scale_inv", stored_scales_dtype(bf, scale_dtype), layout.scales_shape)
    return [(codes, "codes"), (scales, "scales")]


def _config(fmt: str, kept: list[tuple[str, ArrayEntry]], ignore: list[str]) -> dict[str, Any]:
    bf = BLOCK_FORMATS[fmt]
    return {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [bf.block_rows, bf.block_size],
        "modules_to_not_convert": ignore,
    }


LAYOUT = CheckpointLayout(
    "fp8",
    "fine-grained FP8 (quant_method fp8; weight, weight_scale_inv per 128 x 128 block: DeepSeek, Qwen3-FP8)",
    ("fp8_block",),
    _outputs,
    _config,
    _detect,
    _weights,
    decide=module_decision,
    fits=lambda ckpt, quantised, fmt, **context: check_fused_blocks(ckpt, quantised, fmt, context.get("arch")),
    parts=("weight_scale_inv", "input_scale"),
    notes=partial_blocks_notes,
)
