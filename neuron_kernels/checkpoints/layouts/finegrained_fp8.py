"""The ``fp8`` layout (fine-grained FP8: DeepSeek-V3/R1, Qwen3-*-FP8, GLM, MiniMax, Kimi).

Recognised by config.json's ``quantization_config`` with ``quant_method: "fp8"`` and
``weight_block_size: [rows, cols]`` (128 x 128 in the published checkpoints; read from the config,
never derived from the shapes). Per quantised ``NAME.weight``: ``NAME.weight`` float8_e4m3fn
[..., out, in] and ``NAME.weight_scale_inv`` float32, bfloat16 or float16 [..., ceil(out / rows),
ceil(in / cols)], a multiplier despite its name: a value is ``code * scale_inv[i // rows, j //
cols]``, partial edge blocks included (DeepSeek's 576-row ``kv_a_proj_with_mqa``). A static
``activation_scheme``'s ``NAME.input_scale`` goes with its weight (dropped on conversion).

Written for ``fp8_block`` (128 x 128 tiles): ``NAME.weight`` and ``NAME.weight_scale_inv`` (float32,
or ``--scale-dtype``), and ``quant_method: fp8``, ``activation_scheme: dynamic``, ``fmt: e4m3``,
``weight_block_size: [128, 128]`` and the Linear modules left plain as ``modules_to_not_convert``
(transformers' key, which vLLM reads where ``ignored_layers`` is absent). Which tensors are
quantised: :func:`neuron_kernels.checkpoints.selection.module_decision`.
"""

from __future__ import annotations

from typing import Any

from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.safetensors import TensorSpec
from ..folder import Checkpoint
from ..runtimes import partial_blocks_notes
from ..selection import module_decision
from .records import (
    FP8_CODES,
    CheckpointLayout,
    Output,
    Weight,
    check_fused_blocks,
    scaled_weight,
    scales_and_codes,
    stored_codes_dtype,
    stored_scales_dtype,
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
    claimed = {p for w in found for p in w.parts}
    for name, entry in t.items():
        if name not in claimed and (entry.dtype == FP8_CODES or name.endswith(("_scale_inv", "input_scale"))):
            raise FileFormatError(
                f"{ckpt.path}: {name} ({entry.dtype}) belongs to no FP8 weight with its weight_scale_inv; a runtime "
                f"would not read it"
            )
    return found


def _outputs(name: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    base = name[: -len(".weight")] if name.endswith(".weight") else name
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
