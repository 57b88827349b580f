"""The configuration fields the package reads from a checkpoint's ``config.json`` and
``hf_quant_config.json``, and their types, checked once when the checkpoint is opened: every
layout then reads a field of the type it expects, or the field is absent (or null).

A field is declared by what the code reading it takes: a type (``str``, ``int``: not a bool,
``dict``: any object, :class:`Positive`: an integer of at least 1), :class:`ListOf` an item's
type, :class:`MapOf` the type of each value of an object of any keys, or a nested dict of fields.
Fields not declared are not read and not checked. A value of another type is refused in one line
naming the file, the field and the type that is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..io.arrays import FileFormatError

__all__ = ["CONFIG_FIELDS", "FILE_FIELDS", "HF_QUANT_CONFIG_FIELDS", "ListOf", "MapOf", "Positive", "check_fields"]


@dataclass(frozen=True)
class ListOf:
    """A JSON array whose every item is of ``item``."""

    item: Any


class Positive:
    """An integer of at least 1 (a block's or a group's size)."""


@dataclass(frozen=True)
class MapOf:
    """A JSON object of any keys whose every value is of ``value``."""

    value: Any


#: A list of names or patterns (``ignore``, ``targets``, ``modules_to_not_convert``, ...).
_NAMES = ListOf(str)

#: compressed-tensors' ``quantization_config`` (``compressed_tensors/config``), ModelOpt's as
#: config.json carries it, transformers' fine-grained FP8 and MXFP4 ones: the fields the layouts
#: read (:mod:`.layouts`).
_QUANTIZATION_CONFIG = {
    "quant_method": str,
    "format": str,
    "config_groups": MapOf(
        {
            "targets": _NAMES,
            "format": str,
            "weights": {
                "num_bits": int,
                "type": str,
                "strategy": str,
                "block_structure": ListOf(Positive),
                "group_size": Positive,
            },
        }
    ),
    "ignore": _NAMES,
    "modules_to_not_convert": _NAMES,
    "weight_block_size": ListOf(Positive),
    "quant_algo": str,
}

#: ``config.json``: the model's type and classes (the architecture), and the quantisation.
CONFIG_FIELDS = {
    "model_type": str,
    "architectures": ListOf(str),
    "quantization_config": _QUANTIZATION_CONFIG,
}

#: ModelOpt's ``hf_quant_config.json``.
HF_QUANT_CONFIG_FIELDS = {
    "producer": {"name": str, "version": str},
    "quantization": {"quant_algo": str, "group_size": int, "exclude_modules": _NAMES},
}

#: The top-level files of a checkpoint folder whose fields are declared here.
FILE_FIELDS = {"config.json": CONFIG_FIELDS, "hf_quant_config.json": HF_QUANT_CONFIG_FIELDS}

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", dict: "an object", list: "an array"}


def _kind(value: Any) -> str:
    """An array or an object by its type, any other value as it is."""
    return _TYPE_NAMES[type(value)] if isinstance(value, (dict, list)) else f"{json.dumps(value)[:40]}"


def _wanted(spec: Any) -> str:
    if spec is Positive:
        return "a positive integer"
    if isinstance(spec, ListOf):
        return f"an array of {_wanted(spec.item).removeprefix('a ').removeprefix('an ')}s"
    if isinstance(spec, (MapOf, dict)):
        return "an object"
    return _TYPE_NAMES.get(spec, "anything")


def _fits(value: Any, spec: Any) -> bool:
    if spec is int or spec is Positive:
        return isinstance(value, int) and not isinstance(value, bool) and (spec is int or value >= 1)
    if isinstance(spec, type):
        return isinstance(value, spec)
    if isinstance(spec, ListOf):
        return isinstance(value, list)
    return isinstance(value, dict)


def check_fields(value: Any, spec: dict[str, Any], where: str) -> None:
    """Refuse a field of the object ``value`` (of the file ``where``) whose type is not the one
    ``spec`` declares. A field that is null counts as absent; an item of an array may not be null."""
    stack: list[tuple[Any, Any, str, bool]] = [(value, spec, "", True)]
    while stack:
        item, kind, name, optional = stack.pop()
        if item is None and optional:
            continue
        if not _fits(item, kind):
            raise FileFormatError(f"{where}: {name or 'the document'} is {_kind(item)}; {_wanted(kind)} is read")
        if isinstance(kind, ListOf):  # pushed last first: the first field at fault is reported
            stack += reversed([(v, kind.item, f"{name}[{i}]", False) for i, v in enumerate(item)])
        elif isinstance(kind, MapOf):
            stack += reversed([(v, kind.value, f"{name}.{k}", True) for k, v in item.items()])
        elif isinstance(kind, dict):
            stack += reversed([(item.get(k), s, f"{name}.{k}" if name else k, True) for k, s in kind.items()])
