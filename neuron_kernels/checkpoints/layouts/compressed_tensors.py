"""The ``compressed-tensors`` layout (vLLM, transformers).

Per quantised ``NAME.weight``, ``NAME.weight_packed`` uint8 [..., out, in/2],
``NAME.weight_scale`` float8_e4m3fn [..., out, in/16] and ``NAME.weight_global_scale`` float32
[1] (= 1 / per-tensor scale) for ``nvfp4``; ``NAME.weight_packed`` and ``NAME.weight_scale``
uint8 (e8m0) [..., out, in/32] for ``mxfp4_e2m1``; ``NAME.weight`` float8_e4m3fn [..., out, in]
and ``NAME.weight_scale`` uint8 [..., out, in/32] for ``mxfp8_e4m3``; ``float-quantized`` FP8
with float scales, as llm-compressor's presets write them: ``NAME.weight`` float8_e4m3fn and
``NAME.weight_scale`` in the weight's dtype (or ``--scale-dtype``) of shape [ceil(out / 128),
ceil(in / 128)] for ``fp8_block`` (FP8_BLOCK: dynamic activations in groups of 128), [out, 1]
for ``fp8_channel`` (FP8_DYNAMIC: dynamic per-token activations) and [1] for ``fp8_tensor``
(dynamic per-token activations: FP8's static ones need calibration). Which tensors are
quantised: :func:`neuron_kernels.checkpoints.selection.module_decision`.

Read also: ``float-quantized`` of the group strategy (``fp8_channel`` in groups), and the W4A4
form of NVFP4, whose ``input_global_scale`` is the activations' (dropped with the weight).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS, INTEGER_FORMATS, WHOLE, BlockFormat
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.safetensors import TensorSpec
from ..architecture import module_of
from ..folder import Checkpoint
from ..runtimes import LARGEST_DIVISOR, expert_notes, integer_notes, mixed_notes
from ..scheme_map import OWN
from ..selection import module_decision
from ..targets import Refused, ct_group, ct_matches, vllm_group
from .integer_weights import BYTES, DENSE, PADDED, integer_weight, packed_width
from .records import (
    KV_SCALES,
    CheckpointLayout,
    Output,
    StoredWeight,
    Weight,
    check_fused_blocks,
    check_fused_whole,
    expect_tensor,
    scaled_weight,
    scales_and_codes,
    stored_codes_dtype,
    stored_scales_dtype,
    uint8_view,
)

__all__ = ["LAYOUT"]

#: compressed-tensors' format strings by block format.
_CT_FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp4_e2m1": "mxfp4-pack-quantized", "mxfp8_e4m3": "mxfp8-quantized"}

#: FP8 with float scales (``float-quantized``): the weights' strategy of each format, and the
#: dynamic activations of llm-compressor's preset that goes with it (none needs calibration).
_CT_FP8 = {
    "fp8_block": ("block", {"strategy": "group", "group_size": 128}),
    "fp8_channel": ("channel", {"strategy": "token", "group_size": None}),
    "fp8_tensor": ("tensor", {"strategy": "token", "group_size": None}),
}


def _ct_codes(bf: BlockFormat) -> str:
    """The tensor that holds a weight's codes: ``weight_packed`` for codes packed two per byte
    (4-bit elements), ``weight`` for codes in the element's own dtype."""
    return "weight_packed" if bf.packable else "weight"


def _ct_integer_outputs(base: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    """``pack-quantized``: the codes as int32 words (``packed_codes``), the scales, the weight's
    shape and, with zero points, those packed along the output dimension (``packed_zeros``)."""
    bf = BLOCK_FORMATS[layout.fmt]
    out, cols = layout.shape
    bits = bf.element_bits
    words = (out, packed_width(cols, bits, DENSE))
    specs: list[Output] = [
        (TensorSpec(f"{base}.weight_packed", np.dtype(np.int32), words), "packed_codes"),
        (TensorSpec(f"{base}.weight_scale", stored_scales_dtype(bf, scale_dtype), layout.scales_shape), "scales"),
        (TensorSpec(f"{base}.weight_shape", np.dtype(np.int64), (2,)), "shape"),
    ]
    if bf.zero_points:
        zeros = (packed_width(out, bits, DENSE), layout.scales_shape[-1])
        specs.append((TensorSpec(f"{base}.weight_zero_point", np.dtype(np.int32), zeros), "packed_zeros"))
    return specs


def _ct_outputs(name: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    base = module_of(name)
    bf = BLOCK_FORMATS[layout.fmt]
    if bf.integer:
        return _ct_integer_outputs(base, layout, scale_dtype)
    codes = TensorSpec(f"{base}.{_ct_codes(bf)}", stored_codes_dtype(bf), layout.codes_shape)
    grid = (1,) if bf.per_matrix else layout.scales_shape  # one scale per tensor: [1]
    scales = TensorSpec(f"{base}.weight_scale", stored_scales_dtype(bf, scale_dtype), grid)
    out = [(codes, "codes"), (scales, "scales")]
    if bf.per_tensor_scale:
        out.append((TensorSpec(f"{base}.weight_global_scale", np.dtype(np.float32), (1,)), "per_tensor"))
    return out


def _ct_fp8_group(fmt: str) -> dict[str, Any]:
    """The config group of FP8 with float scales (llm-compressor's preset of each strategy)."""
    strategy, activations = _CT_FP8[fmt]
    float8 = {"num_bits": 8, "type": "float", "symmetric": True}
    weights = {**float8, "group_size": None, "strategy": strategy, "dynamic": False}
    weights["block_structure"] = [128, 128] if strategy == "block" else None
    return {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": {**float8, **activations, "dynamic": True},
        "output_activations": None,
        "format": None,
    }


def _ct_integer_group(fmt: str, group_size: int | None) -> dict[str, Any]:
    """The config group of an integer format as llm-compressor's W{b}A16 presets write it
    (tests/fixtures/llmcompressor/w4a16*): groups of ``group_size`` columns, or per channel."""
    bf = BLOCK_FORMATS[fmt]
    channel = bf.block_size == WHOLE
    weights = {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": None if channel else (group_size or bf.block_size),
        "num_bits": bf.element_bits,
        "observer": None,
        "observer_kwargs": {},
        "scale_dtype": None,
        "strategy": "channel" if channel else "group",
        "symmetric": not bf.zero_points,
        "type": "int",
        "zp_dtype": "torch.int8" if bf.zero_points else None,
    }
    return {
        "format": _PACK_QUANTIZED,
        "input_activations": None,
        "output_activations": None,
        "targets": ["Linear"],
        "weights": weights,
    }


def _ct_group(fmt: str, group_size: int | None = None) -> dict[str, Any]:
    """The config group of a block format, targeting every Linear module (``format``: None for FP8
    with float scales, as llm-compressor's presets write it; the format's string for the others;
    ``group_size``: the integer formats' groups, where not the format's own)."""
    if fmt in _CT_FP8:
        return _ct_fp8_group(fmt)
    if BLOCK_FORMATS[fmt].integer:
        return _ct_integer_group(fmt, group_size)
    bf = BLOCK_FORMATS[fmt]
    weights = {
        "num_bits": bf.element_bits,
        "type": "float",
        "symmetric": True,
        "strategy": "tensor_group" if bf.per_tensor_scale else "group",
        "group_size": bf.block_size,
        "dynamic": False,
        "scale_dtype": f"torch.{stored_scales_dtype(bf).name}",
        "actorder": None,
        "block_structure": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": None,
        "output_activations": None,
        "format": _CT_FORMATS[fmt],
    }


def _ct_format(fmt: str) -> str:
    if BLOCK_FORMATS[fmt].integer:
        return _PACK_QUANTIZED
    return _FLOAT_QUANTIZED if fmt in _CT_FP8 else _CT_FORMATS[fmt]


def _ct_config(
    fmt: str, kept: list[tuple[str, ArrayEntry]], ignore: list[str], group_size: int | None = None
) -> dict[str, Any]:
    group = _ct_group(fmt, group_size)
    return _ct_document(_ct_format(fmt), {"group_0": group}, ignore, _kv_cache_scheme(kept))


def _ct_activations(config: dict[str, Any], given: Any) -> dict[str, Any]:
    """The one-scheme config with the input activations a recipe gives its group."""
    group = config["config_groups"]["group_0"]
    return {**config, "config_groups": {"group_0": {**group, "input_activations": given}}}


def _ct_mixed(
    parts: list[tuple[str, tuple[str, ...], Any]],
    kept: list[tuple[str, ArrayEntry]],
    ignore: list[str],
    modules: Any,
    group_sizes: list[int | None] | None = None,
) -> dict[str, Any]:
    """A ``mixed-precision`` config: a group per scheme, each with its ``format`` (vLLM reads a
    group's own) and targets that name its modules alone (:func:`_mixed_targets`), so that
    compressed-tensors and vLLM, whose orders of matching differ (:mod:`..targets`), give every
    module the same group; checked on a module of each target before anything is written.
    ``group_sizes``: the integer schemes' groups, by the position of their part."""
    targets = _mixed_targets([names for _, names, _ in parts], modules)
    sizes = group_sizes or [None] * len(parts)
    groups: dict[str, Any] = {}
    for i, ((fmt, _, acts), mine) in enumerate(zip(parts, targets)):
        group = {**_ct_group(fmt, sizes[i]), "targets": mine, "format": _ct_format(fmt)}
        if acts is not OWN:
            group["input_activations"] = acts
        groups[f"group_{i}"] = group
    _check_targets(parts, targets, ignore, modules)
    return _ct_document("mixed-precision", groups, ignore, _kv_cache_scheme(kept))


#: The names of a module as a target: numeric components (layers', experts') as ``\d+``; the first
#: of them kept where that alone does not single out one scheme; the name itself where neither does.
def _target_forms(name: str) -> tuple[str, str]:
    pieces = re.split(r"((?:^|(?<=\.))\d+(?=\.|$))", name)
    general = "".join(r"\d+" if p.isdigit() else re.escape(p) for p in pieces)
    seen = False
    first = []
    for p in pieces:
        if p.isdigit() and not seen:
            first.append(re.escape(p))
            seen = True
        else:
            first.append(r"\d+" if p.isdigit() else re.escape(p))
    return f"re:{general}$", f"re:{''.join(first)}$"


def _mixed_targets(parts: list[tuple[str, ...]], modules: Any) -> list[list[str]]:
    """Each scheme's targets: the modules it quantises under their checkpoint names, their names in
    the model and, for experts, the names vLLM looks their fused MoE up by, each as the most general
    ``re:`` form (:func:`_target_forms`) that names only modules of that scheme."""
    owner: dict[str, int] = {}
    for i, names in enumerate(parts):
        for n in names:
            m = module_of(n)
            owner.update(dict.fromkeys((m, modules.model_name(m), *modules.moe_probes(m)), i))
    claims: tuple[dict[str, set[int]], dict[str, set[int]]] = ({}, {})
    for name, i in owner.items():
        for level, form in enumerate(_target_forms(name)):
            claims[level].setdefault(form, set()).add(i)
    out: list[dict[str, None]] = [{} for _ in parts]
    for name, i in owner.items():
        forms = _target_forms(name)
        chosen = next((f for level, f in enumerate(forms) if claims[level][f] == {i}), name)
        out[i][chosen] = None
    return [list(t) for t in out]


def _check_targets(
    parts: list[tuple[str, tuple[str, ...], Any]], targets: list[list[str]], ignore: list[str], modules: Any
) -> None:
    """Every module of each scheme (one per target it is named by: the others match alike) goes to
    its group in compressed-tensors' order and in vLLM's, its fused layer and MoE included."""
    everything = [n for _, names, _ in parts for n in names]
    fused = modules.fused(everything)
    seen: set[tuple[int, str]] = set()
    for i, (_, names, _) in enumerate(parts):
        for n in names:
            m = module_of(n)
            key = (i, next((t for t in targets[i] if ct_matches(m, [t])), m))
            if key in seen:
                continue
            seen.add(key)
            shards, layer = fused.get(n, ((), None))
            shard_modules = [module_of(s) for s in shards]
            ct = ct_group((m, modules.model_name(m)), targets, ignore)
            try:
                vllm = vllm_group(m, targets, ignore, shard_modules, layer, modules.moe_probes(m))
            except Refused as e:
                raise FileFormatError(f"{m}: {e}") from None
            if ct != i or vllm != i:
                raise FileFormatError(
                    f"{m}: the mixed-precision config would give it group {ct} in compressed-tensors and {vllm} in "
                    f"vLLM, not {i}; choose patterns that separate the schemes by module name"
                )


def _kv_cache_scheme(kept: list[tuple[str, ArrayEntry]]) -> dict[str, Any] | None:
    """The ``kv_cache_scheme`` the KV-cache scales carried into the checkpoint need, or None where
    none is carried: FP8, per tensor (one scale each) or per head ([heads, 1, 1]), the schemes
    vLLM's compressed-tensors KV-cache method reads (``CompressedTensorsKVCacheMethod``); without
    it vLLM drops the scales and runs the KV cache at a scale of 1."""
    shapes = {e.shape for name, e in kept if name.rpartition(".")[2] in KV_SCALES[:2]}  # the cache's: k and v
    if not shapes:
        return None
    strategy = "tensor" if all(math.prod(s) == 1 for s in shapes) else "attn_head"
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False}


def _ct_document(fmt: str, groups: dict[str, Any], ignore: list[str], kv: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ignore,
        "kv_cache_scheme": kv,
        "global_compression_ratio": None,
    }


def _ct_fits(ckpt: Checkpoint, quantised: dict[str, tuple[int, ...]], fmt: str, **context: Any) -> None:
    """vLLM refuses a fused layer whose shards are quantised in part (``should_ignore_layer``), and
    FP8 blocks that do not fit a fused layer (:func:`~.records.check_fused_blocks`); integer weights
    are matrices whose columns are whole groups (compressed-tensors' decompression reshapes them
    into groups, and vLLM's ``CompressedTensorsWNA16`` needs ``in % group_size == 0``)."""
    if BLOCK_FORMATS[fmt].integer:
        size = context.get("block_size") or BLOCK_FORMATS[fmt].block_size
        for name, shape in quantised.items():
            if len(shape) != 2 or (size != WHOLE and shape[1] % size):
                raise FileFormatError(
                    f"{name}: {fmt} in compressed-tensors takes matrices whose columns are whole groups of {size}; "
                    f"its shape is {list(shape)} (choose another --block-size, or --ignore it)"
                )
    check_fused_whole(ckpt, quantised, context.get("arch"))
    check_fused_blocks(ckpt, quantised, fmt, context.get("arch"))


def _ct_detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    return qc is not None and qc.get("quant_method") == "compressed-tensors"


@dataclass(frozen=True)
class _Group:
    """One of a config's ``config_groups``: its name, its ``targets``, the package's name of its
    format (a block format, or ``float-quantized``) and its ``weights`` arguments."""

    name: str
    targets: tuple[str, ...]
    format: str
    weights: dict[str, Any]


def _ct_groups(ckpt: Checkpoint) -> list[_Group]:
    """The config's groups in their order, each with its format: its own ``format``, else the top
    level's (compressed-tensors writes one in every group of a ``mixed-precision`` checkpoint, and
    vLLM reads a group's own first)."""
    qc = ckpt.quantization_config or {}
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise FileFormatError(f"{ckpt.path}: quantization_config.config_groups is not an object of groups")
    top = qc.get("format")
    known = {v: k for k, v in _CT_FORMATS.items()} | {f: f for f in (_FLOAT_QUANTIZED, *_INTEGER_FORMATS)}
    if top is not None and top != "mixed-precision" and (not isinstance(top, str) or top not in known):
        raise FileFormatError(
            f"{ckpt.path}: compressed-tensors format {top!r} is not one this package reads "
            f"({', '.join(known)}, or mixed-precision with one of them in each config group)"
        )
    found = []
    for name, g in groups.items():
        if not isinstance(g, dict):
            raise FileFormatError(f"{ckpt.path}: quantization_config.config_groups.{name} is not an object")
        fmt = g.get("format") or top
        if top not in (None, "mixed-precision") and fmt != top:
            raise FileFormatError(
                f"{ckpt.path}: config group {name!r} has format {fmt!r} under a top-level format {top!r}; a "
                f"checkpoint of several formats says mixed-precision at the top level"
            )
        if fmt == "mixed-precision":
            raise FileFormatError(
                f"{ckpt.path}: config group {name!r} has no format of its own, and the top level's is mixed-precision "
                f"(compressed-tensors writes one in every group of such a checkpoint; vLLM needs it)"
            )
        if not isinstance(fmt, str) or fmt not in known:
            raise FileFormatError(
                f"{ckpt.path}: compressed-tensors format {fmt!r} of config group {name!r} is not one this package "
                f"reads ({', '.join(known)})"
            )
        targets = g.get("targets") or []
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise FileFormatError(f"{ckpt.path}: config_groups.{name}.targets is not a list of strings")
        weights = g.get("weights")
        found.append(_Group(str(name), tuple(targets), known[fmt], weights if isinstance(weights, dict) else {}))
    if not found:
        raise FileFormatError(f"{ckpt.path}: a compressed-tensors config with no config_groups quantises nothing")
    return found


def _ct_group_of(module: str, groups: list[_Group], ignore: Any) -> _Group | None:
    """The group compressed-tensors gives ``module`` (a Linear's name), by its own precedence
    (:func:`~..targets.ct_group`)."""
    index = ct_group((module,), [g.targets for g in groups], ignore)
    return None if index is None else groups[index]


#: compressed-tensors' FP8 format (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK), read only.
_FLOAT_QUANTIZED = "float-quantized"


#: compressed-tensors' integer formats (W4A16, W8A16: codes packed in int32; W8A8: int8), read only.
_PACK_QUANTIZED, _INT_QUANTIZED = "pack-quantized", "int-quantized"
_INTEGER_FORMATS = (_PACK_QUANTIZED, _INT_QUANTIZED)

#: The first compressed-tensors release known to pack 3, 5, 6 and 7-bit codes densely (the fixture
#: tests/fixtures/llmcompressor/w3a16, written by 0.19.0); releases before 0.19 that packed those
#: widths kept 32 // b codes per word.
_DENSE_SINCE = (0, 19)


def _version(value: Any) -> tuple[int, ...] | None:
    parts = str(value).split(".")[:2] if isinstance(value, str) else []
    return tuple(int(p) for p in parts) if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def _ct_packing(ckpt: Checkpoint, codes: ArrayEntry, bits: int, cols: int) -> str:
    """How ``codes`` pack ``cols`` codes of ``bits`` bits a row: by the width where only one packing
    gives it, else by the config's ``version``; refused where neither tells."""
    dense, padded = packed_width(cols, bits, DENSE), packed_width(cols, bits, PADDED)
    if bits in (2, 4, 8) or cols <= 32 // bits:  # the two packings place every code alike
        return DENSE
    if dense != padded:
        return PADDED if codes.shape and codes.shape[-1] == padded else DENSE
    version = _version((ckpt.quantization_config or {}).get("version"))
    if version is not None and version >= _DENSE_SINCE:
        return DENSE
    raise FileFormatError(
        f"{codes.where}: {bits}-bit codes of {cols} columns take {dense} int32 words packed densely and as many "
        f"packed {32 // bits} to a word, and the config's version ({version}) does not say which (0.19 and later: "
        f"densely); this package does not guess"
    )


def _ct_integer_weights(ckpt: Checkpoint, fmt: str, modules: dict[str, _Group]) -> list[Weight]:
    """The integer weights of ``modules``: ``pack-quantized`` (``weight_packed`` int32 words,
    ``weight_shape``) or ``int-quantized`` (``weight`` int8), ``weight_scale``, and, as the group's
    arguments say, ``weight_zero_point`` (asymmetric) and ``weight_g_idx`` (act-order)."""
    t = ckpt.tensors
    packed = fmt == _PACK_QUANTIZED
    found: list[Weight] = []
    for base, scale, codes in scales_and_codes(ckpt, "weight_scale", "weight_packed" if packed else "weight", modules):
        w = modules[base].weights
        bits, strategy, group_size = w.get("num_bits"), w.get("strategy"), w.get("group_size")
        if w.get("type") != "int" or not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 8:
            raise FileFormatError(
                f"{ckpt.path}: {fmt} weights of {bits!r} bits, type {w.get('type')!r}; integers of 2 to 8 bits are read"
            )
        if strategy not in ("group", "channel", "tensor") or (strategy == "group" and not isinstance(group_size, int)):
            raise FileFormatError(
                f"{ckpt.path}: {fmt} strategy {strategy!r} (group_size {group_size!r}) is not one this package reads "
                f"(group with a group_size, channel, tensor)"
            )
        codes_name = f"{base}.{'weight_packed' if packed else 'weight'}"
        parts = [codes_name, f"{base}.weight_scale"]
        if packed:
            shape = _weight_shape(ckpt, f"{base}.weight_shape")
            parts.append(f"{base}.weight_shape")
        elif len(codes.shape) == 2:
            shape = (codes.shape[0], codes.shape[1])
        else:
            raise FileFormatError(f"{codes.where}: int-quantized weights of {len(codes.shape)} axes; 2 are read")
        zname, gname = f"{base}.weight_zero_point", f"{base}.weight_g_idx"
        symmetric = w.get("symmetric", True) is not False
        if symmetric and zname in t:
            raise FileFormatError(f"{ckpt.path}: {zname} is stored, but the config's group quantises symmetrically")
        if not symmetric and zname not in t:
            raise FileFormatError(f"{ckpt.path}: {codes_name} is asymmetric in the config but has no {zname}")
        parts += [n for n in (zname, gname) if n in t]
        parts += [f"{base}.{p}" for p in ("input_scale", "input_zero_point") if f"{base}.{p}" in t]
        packing = _ct_packing(ckpt, codes, bits, shape[1]) if packed else BYTES
        found.append(
            integer_weight(
                f"{base}.weight",
                codes,
                scale,
                bits=bits,
                shape=shape,
                group_size=group_size if strategy == "group" else None,
                packing=packing,
                zeros=t.get(zname),
                g_idx=t.get(gname),
                parts=tuple(parts),
                label=f"int{bits} ({fmt}{', asymmetric' if not symmetric else ''})",
            )  # fmt: skip
        )
    return found


def _weight_shape(ckpt: Checkpoint, name: str) -> tuple[int, int]:
    entry = ckpt.tensors.get(name)
    if entry is None:
        raise FileFormatError(f"{ckpt.path}: a pack-quantized weight has no {name} beside it")
    if entry.dtype.kind != "i" or entry.shape != (2,):
        raise FileFormatError(f"{entry.where}: weight_shape must be 2 integers, found {entry.dtype} of {entry.shape}")
    out, cols = (int(v) for v in entry.read())
    return out, cols


def _ct_fp8_block(ckpt: Checkpoint, w: dict[str, Any], rows: int, cols: int) -> tuple[tuple[int, int], str]:
    """The block of one ``weight_scale`` entry of an FP8 weight of [rows, cols], by its group's
    ``weights`` (``w``: strategy tensor, channel, block of ``block_structure``, group of
    ``group_size``), and the block format that holds it."""
    if w.get("num_bits") != 8 or w.get("type") != "float":
        raise FileFormatError(
            f"{ckpt.path}: float-quantized weights of {w.get('num_bits')} bits, {w.get('type')}; 8-bit float is read"
        )
    strategy = w.get("strategy")
    if strategy == "tensor":
        return (rows, cols), "fp8_tensor"
    if strategy == "channel":
        return (1, cols), "fp8_channel"
    if strategy == "block" and isinstance(w.get("block_structure"), list) and len(w["block_structure"]) == 2:
        return (int(w["block_structure"][0]), int(w["block_structure"][1])), "fp8_block"
    if strategy == "group" and isinstance(w.get("group_size"), int):
        return (1, w["group_size"]), "fp8_channel"
    raise FileFormatError(
        f"{ckpt.path}: float-quantized strategy {strategy!r} (block_structure {w.get('block_structure')!r}, "
        f"group_size {w.get('group_size')!r}) is not one this package reads (tensor, channel, block, group)"
    )


def _ct_fp8_weights(ckpt: Checkpoint, modules: dict[str, _Group]) -> list[Weight]:
    t = ckpt.tensors
    found: list[Weight] = []
    for base, scale, codes in scales_and_codes(ckpt, "weight_scale", "weight", modules):
        name = f"{base}.weight_scale"
        rows, cols = codes.shape[-2:] if len(codes.shape) >= 2 else (0, 0)
        block, fmt = _ct_fp8_block(ckpt, modules[base].weights, rows, cols)
        parts = (f"{base}.weight", name) + tuple(f"{base}.{p}" for p in ("input_scale",) if f"{base}.{p}" in t)
        found.append(scaled_weight(f"{base}.weight", codes, scale, block, parts, "fp8 (float-quantized)", fmt))
    return found


def _ct_weights(ckpt: Checkpoint) -> list[Weight]:
    """Every quantised weight, each read in the format of the group compressed-tensors gives its
    module (:func:`_ct_group_of`): one format, or several (``mixed-precision``). A weight stored
    quantised in a module no group quantises is read in the one format of a checkpoint of one (the
    doctor reports the config); in a checkpoint of several, its format is unknown: refused."""
    groups = _ct_groups(ckpt)
    ignore = (ckpt.quantization_config or {}).get("ignore")
    by_format: dict[str, dict[str, _Group]] = {}
    for name in ckpt.tensors:
        if not name.endswith(".weight_scale"):
            continue
        module = name[: -len(".weight_scale")]
        group = _ct_group_of(module, groups, ignore)
        if group is None and len({g.format for g in groups}) == 1:
            group = groups[0]  # of the one format there is; the doctor says its config does not quantise it
        if group is None:
            raise FileFormatError(
                f"{ckpt.path}: {name} is stored, but no config group quantises {module} (it matches no target, or "
                f"an ignore entry); a runtime would not load it"
            )
        by_format.setdefault(group.format, {})[module] = group
    found: list[Weight] = []
    for fmt, modules in by_format.items():
        if fmt == _FLOAT_QUANTIZED:
            found += _ct_fp8_weights(ckpt, modules)
        elif fmt in _INTEGER_FORMATS:
            found += _ct_integer_weights(ckpt, fmt, modules)
        else:
            found += _ct_block_weights(ckpt, fmt, modules)
    _ct_check_rest(ckpt, {p for w in found for p in w.parts})
    return found


def _ct_block_weights(ckpt: Checkpoint, fmt: str, modules: dict[str, _Group]) -> list[Weight]:
    bf = BLOCK_FORMATS[fmt]
    t = ckpt.tensors
    exact = ckpt.exact_scales
    found: list[Weight] = []
    for base, scale, codes in scales_and_codes(ckpt, "weight_scale", _ct_codes(bf), modules):
        name, codes_name = f"{base}.weight_scale", f"{base}.{_ct_codes(bf)}"
        if not codes.shape:
            raise FileFormatError(f"{codes.where}: a 0-d tensor cannot hold block codes")
        shape = codes.shape[:-1] + (codes.shape[-1] * (2 if bf.packable else 1),)
        layout = BlockLayout(fmt, shape, len(shape) - 1, bf.block_size, 1, bf.packable)
        expect_tensor(scale, stored_scales_dtype(bf).name, layout.scales_shape, "the block scales")
        parts = [codes_name, name]
        pts = None
        if bf.per_tensor_scale:
            gname = f"{base}.weight_global_scale"
            if gname not in t:
                raise FileFormatError(f"{ckpt.path}: {codes_name} has no {gname} beside it")
            gs = _global_scale(t[gname])
            pts = float(np.float32(1) / gs)
            kept = exact.get(gname)
            if isinstance(kept, float) and np.float32(1) / np.float32(kept) == gs:
                pts = kept
            parts.append(gname)
        iname = f"{base}.input_global_scale"
        if iname in t:  # W4A4: the activations' global scale, not the weight's (dropped with it)
            _global_scale(t[iname])
            parts.append(iname)
        weight = f"{base}.weight"
        found.append(StoredWeight(weight, layout, pts, uint8_view(codes), uint8_view(scale), tuple(parts), weight))
    return found


def _global_scale(g: ArrayEntry) -> np.float32:
    """The one positive finite float32 of a global scale tensor."""
    if g.dtype.name != "float32" or g.size != 1:
        raise FileFormatError(f"{g.where}: must be one float32, found {g.dtype} of shape {g.shape}")
    gs = np.float32(g.read_flat(0, 1)[0])
    if not (np.isfinite(gs) and gs > 0):
        raise FileFormatError(f"{g.where}: the global scale {gs} is not a positive finite number")
    with np.errstate(over="ignore"):  # its per-tensor scale 1 / gs must be a float32 too
        if not np.isfinite(np.float32(1) / gs):
            raise FileFormatError(f"{g.where}: the global scale {gs} makes a per-tensor scale 1 / {gs} beyond float32")
    return gs


#: Suffixes of the tensors compressed-tensors adds to a quantised module.
_CT_PARTS = (
    "weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_shape", "weight_g_idx",
    "input_scale", "input_global_scale", "input_zero_point", "output_scale", "k_scale", "v_scale",
)  # fmt: skip


def _ct_check_rest(ckpt: Checkpoint, claimed: set[str]) -> None:
    """Refuse quantisation tensors that no quantised weight claims: a runtime would not load them
    (an unexpected key). Whether the config quantises what is stored plain, and the reverse, is
    judged from the model's modules by :func:`_ct_quantises` (the doctor)."""
    for name in ckpt.tensors:
        if name in claimed or name.rpartition(".")[2] in KV_SCALES:
            continue
        if name.rpartition(".")[2] in _CT_PARTS:
            raise FileFormatError(
                f"{ckpt.path}: {name} belongs to no quantised weight of the layout (its module has no complete "
                f"set of tensors); a runtime would not load it"
            )


def _ct_quantises(ckpt: Checkpoint, names: tuple[str, ...]) -> bool | None:
    """Whether the config quantises the module called ``names`` (its checkpoint name and the model's):
    targeted by a group (a name, ``re:``, or ``Linear``: the caller asks of Linear modules only) and
    ignored under none of its names; None where a target names another module class."""
    qc = ckpt.quantization_config or {}
    targets = [
        t for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict) for t in g.get("targets") or ()
    ]
    if any(ct_matches(n, qc.get("ignore")) for n in names):
        return False
    hits = [ct_matches(n, targets) for n in names]
    return True if any(hits) else None if None in hits else False


def _ct_targets(ckpt: Checkpoint) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Each group's targets by its name, in config order, and the ignore entries (strings only)."""
    ignore = (ckpt.quantization_config or {}).get("ignore") or []
    entries = [e for e in ignore if isinstance(e, str)] if isinstance(ignore, list) else []
    return {g.name: g.targets for g in _ct_groups(ckpt)}, entries


#: The weights' arguments that tell the formats apart (the others have defaults every format shares).
_DEFINING = ("num_bits", "type", "strategy", "group_size", "block_structure")


def _ct_group_format(group: dict[str, Any]) -> str | None:
    """The block format of a config group as a recipe gives it (``weights``, and ``format`` if
    said): the format whose group this layout writes has the same bits, type, strategy, group
    size, block structure and (where the recipe says one) scale dtype; None for any other."""
    w = group.get("weights") or {}
    if w.get("dynamic") not in (None, False):
        return None
    if w.get("type") == "int":
        return _ct_integer_format(group)
    if w.get("symmetric") is False:
        return None
    for fmt in LAYOUT.formats:
        if BLOCK_FORMATS[fmt].integer:
            continue
        own = _ct_group(fmt)["weights"]
        if any(w.get(k) != own.get(k) for k in _DEFINING if k in own or w.get(k) is not None):
            continue
        scale = w.get("scale_dtype")
        if scale is not None and own.get("scale_dtype") is not None and str(scale) != own["scale_dtype"]:
            continue
        if group.get("format") not in (None, _ct_format(fmt)):
            continue
        return fmt
    return None


def _ct_integer_format(group: dict[str, Any]) -> str | None:
    """The integer format of a recipe's group (``type: int``): its bits, ``strategy`` group (any
    group size: the scheme takes it) or channel, ``symmetric``; None for what this layout does not
    write (act-order, blocks, tensors, int8 activations beside)."""
    w = group["weights"]
    bits, strategy = w.get("num_bits"), w.get("strategy")
    if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 8 or w.get("actorder"):
        return None
    if strategy not in ("group", "channel") or group.get("format") not in (None, _PACK_QUANTIZED):
        return None
    name = f"int{bits}_{strategy}" + ("" if w.get("symmetric", True) is not False else "_asym")
    return name if name in BLOCK_FORMATS else None


def _ct_producer(ckpt: Checkpoint) -> str | None:
    """compressed-tensors with its version, where the config says it."""
    qc = ckpt.quantization_config or {}
    version = qc.get("version")
    return f"compressed-tensors {version}" if isinstance(version, str) and version else None


def _ct_scale_dtype(dtype: np.dtype) -> str:
    """llm-compressor keeps float scales in the weight's dtype (float32 for any other)."""
    return dtype.name if dtype.name in ("float32", "bfloat16", "float16") else "float32"


LAYOUT = CheckpointLayout(
    "compressed-tensors",
    "vLLM / transformers compressed-tensors (weight_packed, weight_scale, weight_global_scale; FP8 float-quantized; "
    "integers pack-quantized)",
    (*_CT_FORMATS, *_CT_FP8, *INTEGER_FORMATS),
    _ct_outputs,
    _ct_config,
    _ct_detect,
    _ct_weights,
    decide=module_decision,
    fits=_ct_fits,
    parts=("weight_packed", "weight_scale", "weight_global_scale", "input_scale", "input_global_scale",
           "weight_zero_point"),
    scale_dtype=_ct_scale_dtype,
    splits_experts=True,
    quantises=_ct_quantises,
    per_tensor_part="weight_global_scale",
    per_tensor_divides=True,
    fused_scale=LARGEST_DIVISOR,
    notes=lambda fmt, arch, quantised: expert_notes(fmt, arch, quantised) + integer_notes(fmt),
    producer=_ct_producer,
    ignore_key="ignore",
    mixed=_ct_mixed,
    mixed_notes=mixed_notes,
    targets=_ct_targets,
    group_format=_ct_group_format,
    kv_scale=lambda name: name,
    activations=_ct_activations,
)  # fmt: skip
