"""The ``modelopt`` layout (NVIDIA ModelOpt's Hugging Face checkpoints, the published FP4 ones
among them): NVFP4 (W4A4 and W4A16), MXFP8, the FP8 family (per tensor, per channel, per
128x128 block) and MIXED_PRECISION read; FP8 per channel and per block, W4A16 NVFP4, MXFP8 and
MIXED_PRECISION written, as vLLM loads them.

Recognised by ``hf_quant_config.json`` (``{"producer": {"name": "modelopt"}, "quantization":
{"quant_algo": ..., "group_size": ..., "exclude_modules": [...]}}``) or by config.json's
``quantization_config`` with ``quant_method: "modelopt"`` (the same facts: ``quant_algo``,
``config_groups``, ``ignore``). Per quantised ``NAME.weight``:

- ``NVFP4`` / ``W4A16_NVFP4``: ``NAME.weight`` uint8 [..., out, in/2] (two codes per byte, the
  even element in the low nibble), ``NAME.weight_scale`` float8_e4m3fn [..., out, in/16],
  ``NAME.weight_scale_2`` one float32, the per-tensor scale (a multiplier: a value is
  ``code * float32(weight_scale) * weight_scale_2``), and for W4A4 ``NAME.input_scale`` one
  float32 (the activations', not the weight's: a dequantised or converted checkpoint drops it);
- ``MXFP8``: ``NAME.weight`` float8_e4m3fn [..., out, in], ``NAME.weight_scale`` uint8 (e8m0)
  [..., out, in/32];
- ``FP8`` / ``FP8_PER_CHANNEL_PER_TOKEN`` / ``FP8_PB_WO`` (ModelOpt writes the last in lowercase):
  ``NAME.weight`` float8_e4m3fn [..., out, in] and ``NAME.weight_scale`` float32, a multiplier
  (``code * weight_scale``): one value for ``FP8``, one per output row ([out]) for the per-channel
  form, and one per 128 x 128 block for ``FP8_PB_WO``, exported 4-D as [ceil(out / 128), 1,
  ceil(in / 128), 1] (the config records no block size: 128 is ModelOpt's preset, and what vLLM's
  ``ModelOptFp8PbWoLinearMethod`` assumes); ``FP8``'s ``NAME.input_scale`` is the activations'.

KV-cache scales (``ATTN.k_proj.k_scale``, ``ATTN.v_proj.v_scale``, multipliers as
compressed-tensors' ``ATTN.k_scale`` are) are the attention's: read, carried and written under these
names with ``kv_cache_quant_algo: FP8``. Any other ``quant_algo`` (the AWQ and SVDQuant variants,
the ``FP8_PB_REAL`` form, ...) is refused by name.

``MIXED_PRECISION`` (several schemes): each module's ``{"quant_algo", "group_size"}`` in
``quantized_layers`` (``hf_quant_config.json``'s, or config.json's ``quantization_config``'s), a
module taking its own entry or its nearest enclosing module's (``experts`` for one expert), as
vLLM's ``ModelOptMixedPrecisionConfig`` resolves it; every entry must be a ``quant_algo`` above.

Written: ``fp8_channel`` as ``FP8_PER_CHANNEL_PER_TOKEN`` and ``fp8_block`` as ``fp8_pb_wo`` (the
weights only: vLLM quantises the activations per token as it runs), float32 scales; ``nvfp4`` as
``W4A16_NVFP4`` (weights only) and ``mxfp8_e4m3`` as ``MXFP8``, with their ``group_size``; several
of those two as ``MIXED_PRECISION`` (each module's ``quantized_layers`` entry; vLLM's mixed config
runs no Linear with ModelOpt's FP8 per channel or per block, so those are refused there); in
``hf_quant_config.json`` and in config.json's ``quantization_config`` as ModelOpt writes both, the
Linear modules left plain as ``exclude_modules`` / ``ignore``. What vLLM would not load is
refused before anything is written (:func:`_fits`): ``fp8_tensor`` (ModelOpt's ``FP8`` needs
calibrated activation scales), MoE experts (vLLM's ModelOpt FP8 MoE reads per-tensor weight and
activation scales only), ``fp8_pb_wo`` weights whose rows or columns are not a multiple of 128,
scales other than float32, and a module left plain whose name is part of a quantised one's (vLLM
matches ``exclude_modules`` as substrings too).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
from typing import Any

import numpy as np

from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.safetensors import TensorSpec
from ..architecture import module_of
from ..folder import Checkpoint, json_file
from ..selection import module_decision
from .records import (
    FP8_CODES,
    CheckpointLayout,
    Output,
    StoredWeight,
    Weight,
    check_fused_blocks,
    check_fused_whole,
    expect_tensor,
    kv_cache_name,
    scaled_weight,
    scales_and_codes,
    stored_codes_dtype,
    stored_scales_dtype,
    uint8_view,
)

__all__ = ["LAYOUT", "HF_QUANT_CONFIG", "modelopt_config"]

HF_QUANT_CONFIG = "hf_quant_config.json"

#: The block format of each ``quant_algo`` the package reads.
_ALGORITHMS = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "MXFP8": "mxfp8_e4m3"}
#: The FP8 ``quant_algo``s: each weight_scale entry's block of [rows, cols], by its name.
_FP8_ALGORITHMS = {"FP8": "tensor", "FP8_PER_CHANNEL_PER_TOKEN": "channel", "FP8_PB_WO": "block"}
#: FP8_PB_WO's block (ModelOpt's preset; vLLM assumes it too, the config does not say).
_FP8_PB_WO_BLOCK = (128, 128)
#: The ``quant_algo`` each written format is stored as (``fp8_pb_wo`` in ModelOpt's lowercase).
_WRITTEN = {
    "fp8_channel": "FP8_PER_CHANNEL_PER_TOKEN", "fp8_block": "fp8_pb_wo", "nvfp4": "W4A16_NVFP4", "mxfp8_e4m3": "MXFP8",
}  # fmt: skip
#: The ``quant_algo``s vLLM's ``ModelOptMixedPrecisionConfig.get_quant_method`` runs a Linear with
#: (any other it builds unquantised: the stored codes loaded as plain weights); of them, those that
#: need no calibration, by format.
_MIXED_LINEAR = ("FP8", "NVFP4", "W4A16_NVFP4", "MXFP8")
_MIXED_WRITTEN = {"nvfp4": "W4A16_NVFP4", "mxfp8_e4m3": "MXFP8"}
#: The producer this package names in hf_quant_config.json.
_PRODUCER = "neuron_kernels"
#: Tensors a ModelOpt quantised module holds besides ``weight``.
_PARTS = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale", "pre_quant_scale", "output_scale")


def modelopt_config(ckpt: Checkpoint) -> dict[str, Any] | None:
    """ModelOpt's facts of a checkpoint, in hf_quant_config.json's form (``quant_algo``,
    ``group_size``, ``exclude_modules``, ``kv_cache_quant_algo``), from ``hf_quant_config.json`` or
    from config.json's ``quantization_config``; None for a checkpoint ModelOpt did not write."""
    path = os.path.join(ckpt.folder, HF_QUANT_CONFIG) if ckpt.folder else None
    if path is not None and os.path.isfile(path):
        raw = json_file(path)
        producer = raw.get("producer") if isinstance(raw, dict) else None
        if not isinstance(producer, dict) or str(producer.get("name", "")).lower() not in ("modelopt", _PRODUCER):
            raise FileFormatError(
                f"{path}: not written by ModelOpt (producer {producer!r}); not a layout this package reads"
            )
        quant = raw.get("quantization")
        if not isinstance(quant, dict):
            raise FileFormatError(f"{path}: no 'quantization' object")
        return quant
    qc = ckpt.quantization_config
    if qc is None or qc.get("quant_method") != "modelopt":
        return None
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = groups[0].get("weights") if groups else None
    return {
        "quant_algo": qc.get("quant_algo"),
        "group_size": (weights or {}).get("group_size") if isinstance(weights, dict) else None,
        "exclude_modules": qc.get("ignore") or [],
        "kv_cache_quant_algo": qc.get("kv_cache_scheme"),
        "quantized_layers": qc.get("quantized_layers"),
    }


def _algo_format(ckpt: Checkpoint, cfg: dict[str, Any], where: str) -> str:
    """The FP8 ``quant_algo``'s name, or the block format, of one ``{"quant_algo", "group_size"}``
    (``where``: what it is, for messages); any other refused by name."""
    algo = str(cfg.get("quant_algo") or "").upper()
    if algo in _FP8_ALGORITHMS:
        return algo
    if algo not in _ALGORITHMS:
        raise FileFormatError(
            f"{ckpt.path}: ModelOpt {where} {cfg.get('quant_algo')!r} is not one this package reads "
            f"({', '.join([*_ALGORITHMS, *_FP8_ALGORITHMS, _MIXED])})"
        )
    fmt = _ALGORITHMS[algo]
    group = cfg.get("group_size")
    if group is not None and group != BLOCK_FORMATS[fmt].block_size:
        raise FileFormatError(
            f"{ckpt.path}: ModelOpt {algo} with group_size {group!r}; this package reads group_size "
            f"{BLOCK_FORMATS[fmt].block_size}"
        )
    return fmt


#: ModelOpt's ``quant_algo`` of a checkpoint of several schemes, each module's in ``quantized_layers``.
_MIXED = "MIXED_PRECISION"


def _layers(ckpt: Checkpoint, quant: dict[str, Any]) -> dict[str, str]:
    """``quantized_layers`` of a ``MIXED_PRECISION`` checkpoint: module -> its format (as
    :func:`_algo_format`), every entry checked."""
    layers = quant.get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        raise FileFormatError(f"{ckpt.path}: ModelOpt {_MIXED} without a quantized_layers object of modules")
    out = {}
    for module, cfg in layers.items():
        if not isinstance(cfg, dict):
            raise FileFormatError(f"{ckpt.path}: quantized_layers[{module!r}] is not an object with a quant_algo")
        out[str(module)] = _algo_format(ckpt, cfg, f"quant_algo of {module}")
    return out


def _layer_format(module: str, layers: dict[str, str]) -> str | None:
    """The format (the value of ``layers``) ``quantized_layers`` gives the checkpoint module ``module``, as vLLM's
    ``ModelOptMixedPrecisionConfig`` resolves a layer: its own key, else the nearest enclosing
    module's (a MoE's ``experts`` for one expert's Linear), each with and without a
    ``language_model.`` component; None where none has one."""
    names = [module]
    if ".language_model." in module:
        names.append(module.replace(".language_model.", ".", 1))
    else:
        names.append(module.replace("model.", "model.language_model.", 1))
    for name in names:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            hit = layers.get(".".join(parts[:end]))
            if hit is not None:
                return hit
    return None


def _detect(ckpt: Checkpoint) -> bool:
    return modelopt_config(ckpt) is not None


def _scalar(ckpt: Checkpoint, name: str) -> float:
    """The one positive finite float32 of the tensor ``name``."""
    entry = ckpt.tensors[name]
    if entry.dtype.name != "float32" or entry.size != 1:
        raise FileFormatError(f"{entry.where}: must be one float32, found {entry.dtype} of shape {entry.shape}")
    value = np.float32(entry.read_flat(0, 1)[0])
    if not (np.isfinite(value) and value > 0):
        raise FileFormatError(f"{entry.where}: the scale {value} is not a positive finite number")
    return float(value)


def _fp8_weights(ckpt: Checkpoint, algo: str, modules: Any = None) -> list[Weight]:
    """The weights of an FP8 ``quant_algo`` (of ``modules``, if given): float8_e4m3fn codes times a
    float32 multiplier per tensor, output row or 128 x 128 block."""
    found: list[Weight] = []
    for base, scale, codes in scales_and_codes(ckpt, "weight_scale", "weight", modules):
        name = f"{base}.weight_scale"
        expect_tensor(scale, "float32", scale.shape, "the FP8 scales")
        rows, cols = codes.shape[-2:] if len(codes.shape) >= 2 else (0, 0)
        strategy = _FP8_ALGORITHMS[algo]
        if strategy == "tensor":
            block = (rows, cols)
        elif strategy == "channel":
            # [..., out] per output row: the grid [..., out, 1] in the same order.
            block = (1, cols)
            if scale.shape == codes.shape[:-1]:
                scale = dataclasses.replace(scale, shape=(*scale.shape, 1))
        else:
            # [out/128, 1, in/128, 1] as exported: the grid [out/128, in/128] in the same order.
            block = _FP8_PB_WO_BLOCK
            if len(scale.shape) == 4 and scale.shape[1] == scale.shape[3] == 1:
                scale = dataclasses.replace(scale, shape=(scale.shape[0], scale.shape[2]))
        parts = (f"{base}.weight", name, *_not_weight_parts(ckpt, base))
        fmt = {"tensor": "fp8_tensor", "channel": "fp8_channel"}.get(strategy, "fp8_block")
        found.append(scaled_weight(f"{base}.weight", codes, scale, block, parts, f"ModelOpt {algo}", fmt))
    return found


def _not_weight_parts(ckpt: Checkpoint, base: str) -> list[str]:
    """The activations' scale of the module ``base`` (dropped with its weight)."""
    return [f"{base}.{p}" for p in ("input_scale",) if f"{base}.{p}" in ckpt.tensors]


def _check_rest(ckpt: Checkpoint, found: list[Weight], what: str) -> None:
    """Refuse a ModelOpt tensor (by its name) or an FP8 tensor that belongs to no weight read."""
    claimed = {p for w in found for p in w.parts}
    for name, entry in ckpt.tensors.items():
        if name in claimed or kv_cache_name(name) is not None:  # a KV-cache scale: the attention's
            continue
        if name.rpartition(".")[2] in _PARTS or entry.dtype == FP8_CODES:
            raise FileFormatError(
                f"{ckpt.path}: {name} ({entry.dtype}) belongs to no quantised weight this package reads (ModelOpt "
                f"{what}); a module with it is quantised in a way it does not read"
            )


def _weights(ckpt: Checkpoint) -> list[Weight]:
    """Every quantised weight: of the one ``quant_algo``, or, for ``MIXED_PRECISION``, each module's
    in the format ``quantized_layers`` gives it (:func:`_layer_format`)."""
    quant = modelopt_config(ckpt)
    assert quant is not None
    if str(quant.get("quant_algo") or "").upper() != _MIXED:
        fmt = _algo_format(ckpt, quant, "quant_algo")
        found = _fp8_weights(ckpt, fmt) if fmt in _FP8_ALGORITHMS else _block_weights(ckpt, fmt)
        _check_rest(ckpt, found, fmt)
        return found
    layers = _layers(ckpt, quant)
    by_format: dict[str, set[str]] = {}
    for name in ckpt.tensors:
        if name.endswith(".weight_scale"):
            module = name[: -len(".weight_scale")]
            fmt = _layer_format(module, layers)
            if fmt is None:
                raise FileFormatError(
                    f"{ckpt.path}: {name} is stored, but quantized_layers has no entry for {module} (ModelOpt "
                    f"{_MIXED}); its format is unknown"
                )
            by_format.setdefault(fmt, set()).add(module)
    found = []
    for fmt, modules in by_format.items():
        found += _fp8_weights(ckpt, fmt, modules) if fmt in _FP8_ALGORITHMS else _block_weights(ckpt, fmt, modules)
    _check_rest(ckpt, found, _MIXED)
    return found


def _block_weights(ckpt: Checkpoint, fmt: str, modules: Any = None) -> list[Weight]:
    """The weights of a block format (NVFP4, MXFP8) of ``modules``, if given."""
    bf = BLOCK_FORMATS[fmt]
    t = ckpt.tensors
    found: list[Weight] = []
    for base, scale, codes in scales_and_codes(ckpt, "weight_scale", "weight", modules):
        name = f"{base}.weight_scale"
        expect_tensor(codes, stored_codes_dtype(bf).name, codes.shape, "the codes")
        if len(codes.shape) < 2:
            raise FileFormatError(f"{codes.where}: quantised codes need 2 or more axes, found shape {codes.shape}")
        shape = codes.shape[:-1] + (codes.shape[-1] * (2 if bf.packable else 1),)
        layout = BlockLayout(fmt, shape, len(shape) - 1, bf.block_size, 1, bf.packable)
        expect_tensor(scale, stored_scales_dtype(bf).name, layout.scales_shape, "the block scales")
        parts = [f"{base}.weight", name]
        pts = None
        if bf.per_tensor_scale:
            second = f"{base}.weight_scale_2"
            if second not in t:
                raise FileFormatError(f"{ckpt.path}: {base}.weight has no {second} beside it")
            pts = _scalar(ckpt, second)
            parts.append(second)
        parts += _not_weight_parts(ckpt, base)
        weight = f"{base}.weight"
        found.append(StoredWeight(weight, layout, pts, uint8_view(codes), uint8_view(scale), tuple(parts), weight))
    return found


def _outputs(name: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    """As ModelOpt exports them: FP8's ``weight`` (float8_e4m3fn) and ``weight_scale`` (float32:
    [out] per channel, [out / 128, 1, in / 128, 1] per block); NVFP4's ``weight`` (uint8, two codes
    a byte), ``weight_scale`` (float8_e4m3fn) and ``weight_scale_2`` (one float32, a multiplier);
    MXFP8's ``weight`` (float8_e4m3fn) and ``weight_scale`` (uint8 e8m0)."""
    base = module_of(name)
    bf = BLOCK_FORMATS[layout.fmt]
    grid = layout.scales_shape
    if bf.float_scales:
        grid = grid[:-1] if bf.block_rows == 1 else (grid[0], 1, grid[1], 1)
    codes = TensorSpec(f"{base}.weight", stored_codes_dtype(bf), layout.codes_shape)
    scales = TensorSpec(f"{base}.weight_scale", stored_scales_dtype(bf, scale_dtype), grid)
    out = [(codes, "codes"), (scales, "scales")]
    if bf.per_tensor_scale:
        out.append((TensorSpec(f"{base}.weight_scale_2", np.dtype(np.float32), ()), "per_tensor"))
    return out


def _document(quant_algo: str, ignore: list[str], kept: list[tuple[str, ArrayEntry]]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "ignore": ignore,
        "quant_algo": quant_algo,
        "producer": {"name": _PRODUCER, "version": importlib.metadata.version("neuron_kernels")},
        "quant_method": "modelopt",
    }
    if any(kv_cache_name(name) is not None for name, _ in kept):  # FP8 KV cache, as ModelOpt declares it
        config["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "dynamic": False}
    return config


def _config(fmt: str, kept: list[tuple[str, ArrayEntry]], ignore: list[str]) -> dict[str, Any]:
    """config.json's ``quantization_config`` as ModelOpt's ``convert_hf_quant_config_format`` makes
    it (no config groups), with ``hf_quant_config.json``'s facts under ``quantization`` kept apart
    by :func:`_files`; NVFP4 and MXFP8 with their ``group_size``."""
    config = _document(_WRITTEN[fmt], ignore, kept)
    bf = BLOCK_FORMATS[fmt]
    if not bf.float_scales:
        config["group_size"] = bf.block_size
    return config


def _mixed(
    parts: list[tuple[str, tuple[str, ...], Any]], kept: list[tuple[str, ArrayEntry]], ignore: list[str], modules: Any
) -> dict[str, Any]:
    """``MIXED_PRECISION`` in both of ModelOpt's forms: each quantised module's ``{"quant_algo",
    "group_size"}`` in ``quantized_layers``, under its checkpoint name (vLLM maps the names as it
    maps the weights'). Only the ``quant_algo``s vLLM's mixed config runs a Linear with and that need
    no calibration: W4A16_NVFP4 and MXFP8."""
    layers: dict[str, Any] = {}
    for fmt, names, _ in parts:
        if fmt not in _MIXED_WRITTEN:
            raise FileFormatError(
                f"ModelOpt MIXED_PRECISION holds {', '.join(_MIXED_WRITTEN)} here: vLLM's "
                f"ModelOptMixedPrecisionConfig runs a Linear with {', '.join(_MIXED_LINEAR)} only (FP8 per tensor "
                f"needs calibrated input scales) and would load {fmt} ({_WRITTEN.get(fmt, fmt)}) unquantised; choose "
                f"--layout compressed-tensors"
            )
        cfg = {"quant_algo": _MIXED_WRITTEN[fmt], "group_size": BLOCK_FORMATS[fmt].block_size}
        layers.update({module_of(n): cfg for n in names})
    return {**_document(_MIXED, ignore, kept), "quantized_layers": dict(sorted(layers.items()))}


def _files(config: dict[str, Any]) -> dict[str, Any]:
    """``hf_quant_config.json`` beside config.json: the same facts in ModelOpt's own form (with the
    keys vLLM's NVFP4 parser requires: ``group_size``, ``kv_cache_quant_algo``, ``exclude_modules``)."""
    quantization = {
        "quant_algo": config["quant_algo"],
        "kv_cache_quant_algo": "FP8" if config.get("kv_cache_scheme") else None,
        "exclude_modules": config["ignore"],
    }
    for key in ("group_size", "quantized_layers"):
        if key in config:
            quantization[key] = config[key]
    return {HF_QUANT_CONFIG: {"producer": config["producer"], "quantization": quantization}}


def _kv_scale(name: str) -> str | None:
    """ModelOpt keeps the K and V caches' scales under their projections (``k_proj.k_scale``), where
    vLLM's ``maybe_remap_kv_scale_name`` finds them; a query scale it has no place for."""
    parent, _, last = name.rpartition(".")
    return f"{parent}.{last[0]}_proj.{last}" if last in ("k_scale", "v_scale") else None


def _scheme_checks(ckpt: Checkpoint, weights: list[Weight]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The doctor's findings on a ``MIXED_PRECISION`` checkpoint: a module whose ``quant_algo`` vLLM's
    ``ModelOptMixedPrecisionConfig.get_quant_method`` runs no Linear with (it builds the module
    unquantised and loads its codes as plain weights, silently)."""
    quant = modelopt_config(ckpt) or {}
    if str(quant.get("quant_algo") or "").upper() != _MIXED:
        return []
    raw = {
        str(k): str(v.get("quant_algo"))
        for k, v in (quant.get("quantized_layers") or {}).items()
        if isinstance(v, dict)
    }
    found = []
    for w in weights:
        module = w.name[: -len(".weight")]
        algo = _layer_format(module, raw) or ""
        if algo.upper() not in _MIXED_LINEAR:
            found.append(("error", "scheme-vllm", (
                f"{module}: quantized_layers gives it {algo}, which vLLM's ModelOptMixedPrecisionConfig runs no Linear "
                f"with ({', '.join(_MIXED_LINEAR)}): vLLM builds it unquantised and loads its codes as plain weights; "
                f"convert it to compressed-tensors (quantize --layout compressed-tensors)"), (w.name,)))  # fmt: skip
    return found


def _fits(
    ckpt: Checkpoint,
    quantised: dict[str, tuple[int, ...]],
    fmt: str,
    *,
    arch: Any = None,
    scale_dtype: str | None = None,
    ignored: tuple[str, ...] = (),
    block_size: int | None = None,
) -> None:
    """What vLLM (``model_executor/layers/quantization/modelopt.py``) would not load, refused:
    MoE experts (``ModelOptFp8MoEMethod`` reads per-tensor weight and input scales for every FP8
    ``quant_algo``), ``FP8_PB_WO`` weights whose rows or columns are not a multiple of 128
    (``ModelOptFp8PbWoLinearMethod.create_weights``), scales other than float32 (the package
    writes ModelOpt's), fused layers quantised in part (:func:`check_fused_whole`) or whose shards
    break the tiles (:func:`check_fused_blocks`), and a
    module left plain whose name is part of a quantised module's (``is_layer_excluded`` matches
    ``exclude_modules`` as substrings too, after exact names: vLLM would load the quantised
    module as a plain one). ``block_size``: the scheme's blocks, which ModelOpt's formats fix."""
    if scale_dtype not in (None, "float32"):
        raise FileFormatError(
            f"the modelopt layout stores float32 FP8 scales (ModelOpt's), not --scale-dtype {scale_dtype}"
        )
    experts = [n for n in quantised if arch is not None and arch.kind(n.rpartition(".")[0]) == "expert"]
    if experts:
        raise FileFormatError(
            f"{ckpt.path}: {len(experts)} MoE expert weight(s), e.g. {experts[0]}: vLLM loads ModelOpt FP8 experts "
            f"with per-tensor weight and activation scales only (ModelOptFp8MoEMethod), which need calibration; "
            f"choose --layout compressed-tensors, or --ignore the experts"
        )
    bf = BLOCK_FORMATS[fmt]
    if bf.block_rows > 1:
        for name, shape in quantised.items():
            if len(shape) != 2 or shape[0] % bf.block_rows or shape[1] % bf.block_size:
                raise FileFormatError(
                    f"{ckpt.path}: {name} of shape {shape}: vLLM loads ModelOpt {_WRITTEN[fmt].upper()} for matrices "
                    f"whose rows and columns are multiples of {bf.block_rows} x {bf.block_size} only; --ignore it, or "
                    f"choose --format fp8_channel or --layout fp8"
                )
    check_fused_whole(ckpt, quantised, arch)
    check_fused_blocks(ckpt, quantised, fmt, arch)
    for plain in ignored:
        for name in quantised:
            module = name.rpartition(".")[0]
            if plain != module and plain in module:
                raise FileFormatError(
                    f"{module} is quantised but vLLM would load it plain: it matches {plain}, which is left plain, as "
                    f"a substring (ModelOpt's exclude_modules); --ignore {module} too, or choose --layout "
                    f"compressed-tensors"
                )


LAYOUT = CheckpointLayout(
    "modelopt",
    "NVIDIA ModelOpt (hf_quant_config.json; NVFP4, MXFP8, FP8 per tensor, channel or block and MIXED_PRECISION "
    "read; FP8 per channel and block, W4A16_NVFP4, MXFP8 and MIXED_PRECISION of the last two written)",
    tuple(_WRITTEN),
    _outputs,
    _config,
    _detect,
    _weights,
    decide=module_decision,
    fits=_fits,
    parts=("weight_scale", "weight_scale_2", "input_scale"),
    config_files=(HF_QUANT_CONFIG,),
    scale_dtype=lambda dtype: "float32",
    files=_files,
    per_tensor_part="weight_scale_2",
    kv_scale=_kv_scale,
    mixed=_mixed,
    scheme_checks=_scheme_checks,
    refused={
        "fp8_tensor": "ModelOpt's FP8 per tensor needs calibrated activation scales (input_scale), which vLLM "
        "reads; choose --format fp8_channel (FP8_PER_CHANNEL_PER_TOKEN)"
    },
)
