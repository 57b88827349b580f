"""A model's weights in memory: :func:`quantize_state_dict` and :func:`dequantize_state_dict`.

The same selection, fused-layer scales, layout tensors and ``quantization_config`` as
``neuron-kernels quantize`` on a checkpoint (:func:`~.convert.quantize_checkpoint`), applied to a
state dict (name -> torch tensor or NumPy array) and giving one back: ``save_file`` of the result,
with the config, is the checkpoint the command writes, without a plain copy on disk first. Torch
tensors are read as views of their memory (:mod:`neuron_kernels.interop`); a state dict with any
torch tensor gives torch tensors back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..blocks.scheme import Scheme, block_format, scheme_of
from ..casting import cast
from ..dtypes import get_format
from ..errors import InvalidTypeError, InvalidValueError
from ..formats import INPUT_DTYPES
from ..interop import from_torch, is_torch, to_torch
from ..io.arrays import ArrayEntry, FileFormatError
from .architecture import from_model
from .convert import plan_quantization, stored_weights
from .folder import Checkpoint
from .layouts import DEFAULT_LAYOUT, LAYOUTS, StoredWeight, detect_layout
from .scheme_map import Group, SchemeMap

__all__ = ["quantize_state_dict", "dequantize_state_dict"]

WHERE = "<state dict>"


def _arrays(state_dict: Any) -> tuple[dict[str, np.ndarray], bool]:
    """Every value as a NumPy array (torch tensors as views), and whether any was a tensor; a
    value that is neither, or a key that is not a string, is refused before anything is done."""
    if not isinstance(state_dict, Mapping):
        raise InvalidTypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    out, torch_in = {}, False
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise InvalidTypeError(f"state_dict keys must be tensor names (str), got {name!r}")
        if is_torch(value):
            torch_in = True
            out[name] = from_torch(value, f"state_dict[{name!r}]")
        elif isinstance(value, np.ndarray):
            out[name] = value
        else:
            raise InvalidTypeError(
                f"state_dict[{name!r}] is a {type(value).__name__}, not a tensor or array; nothing was converted"
            )
    return out, torch_in


def _entry(name: str, a: np.ndarray) -> ArrayEntry:
    flat = np.ascontiguousarray(a).reshape(-1)
    return ArrayEntry(WHERE, name, a.shape, a.dtype, lambda start, stop: flat[start:stop])


def _checkpoint(arrays: dict[str, np.ndarray], config: dict[str, Any] | None) -> Checkpoint:
    return Checkpoint(WHERE, None, {n: _entry(n, a) for n, a in arrays.items()}, config)


class _Sink:
    """One output tensor, filled in C order (what a shard writer's tensor sink does, in memory)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.array = np.empty(spec.shape, spec.dtype)
        self._flat = self.array.reshape(-1).view(np.uint8)
        self._pos = 0

    def write(self, values: Any) -> None:
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
        self._flat[self._pos : self._pos + raw.size] = raw
        self._pos += raw.size


def _schemes(fmt: str | None, schemes: Mapping[str, Any] | None, options: dict[str, Any]) -> Scheme | SchemeMap:
    """The scheme of ``fmt`` and ``options``, or the :class:`SchemeMap` of ``schemes`` beside it."""
    if not schemes:
        if fmt is None:
            raise InvalidValueError("give a block format, or schemes= (pattern -> format) for several")
        return scheme_of(fmt, options)
    if not isinstance(schemes, Mapping):
        raise InvalidTypeError(f"schemes must be a dict of pattern -> format, got {type(schemes).__name__}")
    groups = []
    for pattern, scheme in schemes.items():
        if not isinstance(pattern, str) or not isinstance(scheme, (str, Scheme)):
            raise InvalidTypeError(
                f"schemes takes shell patterns -> block formats or Schemes, got {pattern!r}: {scheme!r}"
            )
        own = scheme if isinstance(scheme, Scheme) else Scheme(block_format(scheme).name)
        groups.append(Group((pattern,), own, options=own.options() if isinstance(scheme, Scheme) else {}))
    default = scheme_of(fmt, options) if fmt is not None else None
    return SchemeMap(tuple(groups), default, source="schemes=").under(options)


def quantize_state_dict(
    state_dict: Mapping[str, Any],
    fmt: str | None,
    layout: str = DEFAULT_LAYOUT,
    *,
    ignore: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    fuse: bool = True,
    model: Any = None,
    config: Mapping[str, Any] | None = None,
    modules: str = "auto",
    towers: bool = False,
    schemes: Mapping[str, Any] | None = None,
    **options: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the quantised state dict, its ``quantization_config``): each weight the checkpoint rule
    selects as ``layout``'s tensors, every other tensor as it was, in the input's order; the
    values torch tensors if any input was one (sharing the input's memory for the tensors kept),
    else NumPy arrays. ``layout``, ``ignore``, ``only``, ``fuse``, ``towers`` and ``options`` are those of
    ``neuron-kernels quantize`` (:func:`~.convert.quantize_checkpoint`); the package's ``npz``
    layout is a file, not a state dict. NVFP4's exact per-tensor scales, which the command keeps in
    the shard's metadata, are not part of the result (``1 / weight_global_scale`` reads back).

    Which tensors are Linear weights comes from ``model`` (the torch module whose state dict this
    is: its modules' types), else from ``config`` (the model's config.json as a dict, through
    transformers or the package's table, ``modules`` as the command's ``--modules``); with
    neither, ``only`` must say which tensors to quantise.

    ``schemes``: several schemes in one checkpoint, as the command's ``--scheme``: pattern (a shell
    pattern, as ``only``'s) -> block format, or :class:`~neuron_kernels.blocks.scheme.Scheme`, the
    first pattern that matches a weight giving its scheme (``options`` under each format's own),
    ``fmt`` the rest (None: kept); docs/checkpoints.md "Several schemes in one checkpoint"."""
    target = LAYOUTS.get(layout)
    if target is None or target.single_file or not target.formats:
        writable = [n for n, lay in LAYOUTS.items() if lay.formats and not lay.single_file]
        raise FileFormatError(f"layout {layout!r} is not one a state dict can take ({', '.join(writable)})")
    chosen = _schemes(fmt, schemes, options)
    arrays, torch_out = _arrays(state_dict)
    if config is not None and not isinstance(config, Mapping):
        raise InvalidTypeError(f"config must be a dict (config.json's contents), got {type(config).__name__}")
    arch = from_model(model, arrays, f"the model given ({type(model).__name__})") if model is not None else None
    ckpt = _checkpoint(arrays, None if config is None else dict(config))
    plan = plan_quantization(ckpt, None, target, chosen, ignore, only, fuse, 256 << 20, modules, arch, towers)
    out: dict[str, Any] = {}
    for item in plan.items(lambda _: None):
        if item.kept is not None:  # as it was: the caller's own tensor
            out[item.specs[0].name] = state_dict[item.kept] if torch_out else arrays[item.kept]
            continue
        sinks = {spec.name: _Sink(spec) for spec in item.specs}
        item.prepare()
        item.fill(sinks)
        for name, sink in sinks.items():
            out[name] = to_torch(sink.array) if torch_out else sink.array
    return out, plan.config


def dequantize_state_dict(
    state_dict: Mapping[str, Any], quantization_config: dict[str, Any], dtype: Any = "bfloat16"
) -> dict[str, Any]:
    """The inverse of :func:`quantize_state_dict`: the plain state dict of one in any layout the
    package reads (named by ``quantization_config``, as config.json holds it), each quantised
    weight dequantised to ``dtype`` under its plain name, every other tensor as it was (the
    activations' and KV cache's scales dropped, as ``neuron-kernels dequantize`` does)."""
    if not isinstance(quantization_config, dict):
        raise InvalidTypeError(f"quantization_config must be a dict, got {type(quantization_config).__name__}")
    out_fmt = get_format(dtype)
    if out_fmt.name not in INPUT_DTYPES:
        raise FileFormatError(f"dequantisation gives float32, float16, bfloat16 or float64, not {dtype}")
    arrays, torch_out = _arrays(state_dict)
    ckpt = _checkpoint(arrays, {"quantization_config": quantization_config})
    source = detect_layout(ckpt)
    weights = stored_weights(ckpt, source)
    by_part = {p: w for w in weights for p in w.parts}
    out: dict[str, Any] = {}
    for name in arrays:
        w = by_part.get(name)
        if w is None:
            out[name] = state_dict[name] if torch_out else arrays[name]
        elif w.out_name not in out:
            values = (
                w.block_array().dequantize(out_fmt.name)
                if isinstance(w, StoredWeight)
                else cast(w.values(), out_fmt.name)
            )
            out[w.out_name] = to_torch(values) if torch_out else values
    return out
