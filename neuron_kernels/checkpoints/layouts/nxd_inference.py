"""The ``neuron`` layout: NxD Inference's quantized checkpoint, which Trn1 and Trn2 load.

Per quantised Linear ``MODULE`` (docs/neuron.md says where each fact comes from):

- ``MODULE.weight``: the codes, float8_e4m3fn holding values within +-240 (these chips' FP8 E4M3
  is the IEEE-style format, max 240, whose bit patterns equal float8_e4m3fn's up to 240; NxD's
  ``DtypeBound`` bounds float8_e4m3fn at 240), or int8;
- ``MODULE.scale``: float32, a multiplier (``value = code * scale``): [out, 1] per channel, [1] per
  tensor, or [ceil(out / 128), ceil(in / 128)] per 128 x 128 block (NxD's ``blockwise_symmetric``).

The settings NxDI needs are not in config.json (NxDI takes them as ``NeuronConfig`` arguments):
the command writes them beside the shards, as ``neuron_quantization.json`` (``quantized``,
``quantization_type``, ``quantization_dtype``, ``modules_to_not_convert``, and the block's size and
axes for blocks), for ``NeuronConfig(**settings, quantized_checkpoints_path=FOLDER)``.

Written for ``fp8_e4m3_channel``, ``fp8_e4m3_tensor``, ``fp8_e4m3_block`` (quantised with a
maximum of 240) and ``int8_channel`` (float32 scales). An FP8 checkpoint of OCP float8_e4m3fn
(values to 448) is brought into the range by halving every code and doubling its scale, where a
value exceeds 240 (:mod:`..fp8_range`). Read: the same tensors, and NxDI's own checkpoints
(int8 per tensor included), recognised by that file or, without it, by their ``.scale`` tensors
beside int8 or FP8 weights in a checkpoint without a ``quantization_config``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS, FORMATS, WHOLE
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.safetensors import TensorSpec
from ..architecture import module_of
from ..folder import Checkpoint, json_file
from ..selection import module_decision, stacked_expert
from .integer_weights import BYTES, integer_weight
from .records import FP8_CODES, CheckpointLayout, Output, StoredWeight, Weight, scaled_weight, uint8_view

__all__ = ["LAYOUT", "SETTINGS_FILE", "NEURON_FP8_MAX", "NEURON_FORMATS"]

#: The file of NxDI's settings, beside the shards.
SETTINGS_FILE = "neuron_quantization.json"

#: The largest FP8 value Trn1 and Trn2 hold (NxD's ``DtypeBound`` for float8_e4m3fn).
NEURON_FP8_MAX = FORMATS["float8_e4m3"].max

#: The formats the layout writes, and NxD's ``quantization_type`` and ``quantization_dtype` of each.
NEURON_FORMATS: dict[str, tuple[str, str]] = {
    "fp8_e4m3_channel": ("per_channel_symmetric", "f8e4m3"),
    "fp8_e4m3_tensor": ("per_tensor_symmetric", "f8e4m3"),
    "fp8_e4m3_block": ("blockwise_symmetric", "f8e4m3"),
    "int8_channel": ("per_channel_symmetric", "int8"),
}

#: NxD's ``quantization_type`` of a model with quantised stacked experts (Llama 4's, as
#: NxDI's ``preprocess_llama4_FP8.py`` writes them): FP8 per expert and output column.
EXPERT_WISE = "expert_wise_per_channel_symmetric"

_INT8 = np.dtype(np.int8)
_F32 = np.dtype(np.float32)


def _grid(layout: BlockLayout) -> tuple[int, ...]:
    """The ``.scale`` tensor's shape: [out, 1], [1] or the blocks' grid."""
    bf = layout.format
    rows, cols = layout.shape[-2], layout.shape[-1]
    if bf.per_matrix:
        return (1,)
    if bf.block_rows == 1:
        return (rows, 1)
    return (-(-rows // layout.block_rows), -(-cols // layout.block_size))


def _outputs(name: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    bf = layout.format
    if len(layout.shape) == 3:  # stacked experts: the parameter's own name, a scale per expert and column
        return [
            (TensorSpec(name, np.dtype(FP8_CODES), layout.codes_shape), "codes"),
            (TensorSpec(f"{name}.scale", _F32, layout.scales_shape), "scales"),
        ]
    base = module_of(name)
    codes = TensorSpec(f"{base}.weight", _INT8 if bf.integer else np.dtype(FP8_CODES), layout.codes_shape)
    return [(codes, "codes"), (TensorSpec(f"{base}.scale", _F32, _grid(layout)), "scales")]


#: The leading parts of the checkpoint's names that NxDI strips before it matches them with its
#: modules: ``model.`` (``get_state_dict`` in models/application_base.py), and Llama 4's
#: ``language_model.model.`` and ``language_model.`` (``convert_hf_to_neuron_state_dict`` in
#: models/llama4/modeling_llama4_text.py), longest first.
_NXDI_PREFIXES = ("language_model.model.", "language_model.", "model.")


def _not_converted(ignore: list[str]) -> list[str]:
    """The modules kept plain as NxD matches them: substrings of its module paths, which have none
    of the prefixes NxDI strips from the checkpoint's names."""
    out: dict[str, None] = {}
    for name in ignore:
        prefix = next((p for p in _NXDI_PREFIXES if name.startswith(p)), "")
        out[name[len(prefix) :]] = None
    return list(out)


def _config(
    fmt: str, kept: list[tuple[str, ArrayEntry]], ignore: list[str], experts: Any = (), **_: Any
) -> dict[str, Any]:
    kind, dtype = NEURON_FORMATS[fmt]
    if experts:  # NxD takes one quantization_type for the whole model: the experts' (its Linear layers per channel)
        kind = EXPERT_WISE
    settings: dict[str, Any] = {
        "quantized": True,
        "quantization_type": kind,
        "quantization_dtype": dtype,
        "modules_to_not_convert": _not_converted(ignore),
    }
    if kind == "blockwise_symmetric":
        bf = BLOCK_FORMATS[fmt]
        settings["quantization_block_size"] = [bf.block_rows, bf.block_size]
        settings["quantization_block_axis"] = [0, 1]
    return settings


def _settings(ckpt: Checkpoint) -> dict[str, Any] | None:
    if ckpt.folder is None or SETTINGS_FILE not in ckpt.extra_files:
        return None
    settings = json_file(os.path.join(ckpt.folder, SETTINGS_FILE))
    if not isinstance(settings, dict):
        raise FileFormatError(f"{ckpt.folder}/{SETTINGS_FILE}: not a JSON object of NxDI's settings")
    return settings


def _pairs(ckpt: Checkpoint) -> list[tuple[str, ArrayEntry, ArrayEntry]]:
    """(module, codes, scale) of each ``MODULE.scale`` beside an int8 or float8_e4m3fn ``MODULE.weight``,
    or (parameter, codes, scale) of a ``PARAM.scale`` beside a 3-D float8_e4m3fn ``PARAM`` (stacked experts)."""
    t = ckpt.tensors
    found = []
    for name, scale in t.items():
        if not name.endswith(".scale"):
            continue
        module = name[: -len(".scale")]
        codes = t.get(f"{module}.weight")
        if codes is not None and codes.dtype in (_INT8, FP8_CODES):
            found.append((module, codes, scale))
        elif module in t and t[module].dtype == FP8_CODES and len(t[module].shape) == 3:
            found.append((module, t[module], scale))
    return found


def _experts(name: str, codes: ArrayEntry, scale: ArrayEntry) -> Weight:
    """Stacked experts [E, in, out] with a float32 scale [E, 1, out] (NxDI's Llama 4 experts)."""
    experts, rows, cols = codes.shape
    if scale.dtype != _F32 or scale.shape != (experts, 1, cols):
        raise FileFormatError(
            f"{scale.where}: the scale of stacked experts {list(codes.shape)} is float32 [{experts}, 1, {cols}] "
            f"(one per expert and output column), found {scale.dtype} {list(scale.shape)}"
        )
    layout = BlockLayout("fp8_channel", codes.shape, 1, rows, 1, False)
    label = "neuron fp8 experts (per expert and column)"
    return StoredWeight(name, layout, None, uint8_view(codes), scale, (name, f"{name}.scale"), name, False, label)


def _detect(ckpt: Checkpoint) -> bool:
    if ckpt.quantization_config is not None:
        return False
    return _settings(ckpt) is not None or bool(_pairs(ckpt))


def _weights(ckpt: Checkpoint) -> list[Weight]:
    settings = _settings(ckpt) or {}
    block = settings.get("quantization_block_size")
    found: list[Weight] = []
    for module, codes, scale in _pairs(ckpt):
        if codes.name == module:
            found.append(_experts(module, codes, scale))
            continue
        parts = (f"{module}.weight", f"{module}.scale")
        if len(codes.shape) != 2:
            raise FileFormatError(f"{codes.where}: a Neuron weight is [out, in]; found shape {list(codes.shape)}")
        if scale.dtype != _F32:
            raise FileFormatError(f"{scale.where}: NxD's scales are float32 multipliers, found {scale.dtype}")
        rows, cols = codes.shape
        size = int(np.prod(scale.shape, dtype=np.int64))
        if codes.dtype == _INT8:
            if size == 1:  # per tensor: the one scale, seen as every row's
                scale = _broadcast(scale, rows)
            elif scale.shape != (rows, 1):
                raise FileFormatError(
                    f"{scale.where}: the scale of an int8 weight [{rows}, {cols}] is [1] or [{rows}, 1], found "
                    f"{list(scale.shape)}"
                )
            found.append(
                integer_weight(
                    parts[0],
                    codes,
                    scale,
                    bits=8,
                    shape=(rows, cols),
                    group_size=None,
                    packing=BYTES,
                    zeros=None,
                    g_idx=None,
                    parts=parts,
                    label="neuron int8 " + ("per tensor" if size == 1 else "per channel"),
                )  # fmt: skip
            )
            continue
        if size == 1:
            grid, label = (rows, cols), "neuron fp8 per tensor"
        elif scale.shape == (rows, 1):
            grid, label = (1, cols), "neuron fp8 per channel"
        elif len(scale.shape) == 2 and _valid_block(block):
            grid, label = (block[0], block[1]), f"neuron fp8 ({block[0]}x{block[1]} blocks)"
        else:
            raise FileFormatError(
                f"{scale.where}: the scale of an FP8 weight [{rows}, {cols}] is [1], [{rows}, 1] or a grid of "
                f"blocks named by {SETTINGS_FILE}'s quantization_block_size; found {list(scale.shape)}"
            )
        fmt = "fp8_tensor" if size == 1 else "fp8_channel" if grid[0] == 1 else "fp8_block"
        found.append(scaled_weight(parts[0], codes, scale, grid, parts, label, fmt))
    return found


def _valid_block(block: Any) -> bool:
    return (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    )


def _broadcast(scale: ArrayEntry, rows: int) -> ArrayEntry:
    """A per-tensor scale read as one per row (its value repeated: exact)."""

    def read(a: int, b: int) -> np.ndarray:
        return np.full(b - a, np.asarray(scale.read_flat(0, 1))[0], np.float32)

    return dataclasses.replace(scale, shape=(rows, 1), _reader=read, offset=None)


def _fits(ckpt: Checkpoint, quantised: dict[str, tuple[int, ...]], fmt: str, **context: Any) -> None:
    bf = BLOCK_FORMATS[fmt]
    for name, shape in quantised.items():
        if stacked_expert(name, shape, context.get("arch")):
            if bf.integer or bf.block_rows != 1 or bf.block_size != WHOLE:  # FP8 per channel only
                raise FileFormatError(
                    f"{name}: NxD Inference holds stacked experts in FP8 per expert and output column only "
                    f"({EXPERT_WISE}); choose --format fp8_e4m3_channel, or --ignore the experts"
                )
            continue
        if len(shape) != 2:
            raise FileFormatError(
                f"{name}: the neuron layout holds [out, in] weights (NxD's Linear layers) and Llama 4's stacked "
                f"experts; this one is {list(shape)}"
            )
        if bf.block_rows not in (1, WHOLE) and (shape[0] % bf.block_rows or shape[1] % bf.block_size):
            raise FileFormatError(
                f"{name}: {list(shape)} is not whole {bf.block_rows}x{bf.block_size} blocks, which NxD's blockwise "
                f"scales need (it sizes them by floor division); choose fp8_e4m3_channel"
            )


LAYOUT = CheckpointLayout(
    "neuron",
    f"NxD Inference's quantized checkpoint (Trn1/Trn2: weight and float32 scale; settings in {SETTINGS_FILE})",
    tuple(NEURON_FORMATS),
    _outputs,
    _config,
    _detect,
    _weights,
    decide=module_decision,
    fits=_fits,
    config_files=(SETTINGS_FILE,),
    scale_dtype=lambda dtype: "float32",
    files=lambda config: {SETTINGS_FILE: config},
    config_in_json=False,
    fp8_max=NEURON_FP8_MAX,
    experts_in_place=True,
    refused={
        f: f"Trn1/Trn2 hold FP8 values within +-240 (float8_e4m3fn's go to 448); choose {f.replace('fp8', 'fp8_e4m3')}"
        for f in ("fp8_channel", "fp8_tensor", "fp8_block")
    },
)
