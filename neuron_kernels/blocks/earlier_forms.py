"""The block array's earlier constructor arguments (``BlockArray(codes, scales, fmt, block_size,
axis, shape, ...)`` and ``from_parts`` of the same), kept working until release
:data:`~neuron_kernels._compat.REMOVED_IN` with a ``DeprecationWarning`` that names the form to use:
a :class:`~.layout.BlockLayout`."""

from __future__ import annotations

import warnings
from typing import Any

from .._compat import REMOVED_IN
from ..errors import InvalidTypeError
from .layout import BlockLayout

__all__ = ["block_array_fields", "from_parts_fields"]

_BLOCK_ARRAY_FIELDS = ("block_size", "axis", "shape", "packed", "block_rows", "per_tensor_scale", "rotation")


def block_array_fields(
    fmt: Any, fields: tuple[Any, ...], named: dict[str, Any], per_tensor_scale: Any, rotation: Any
) -> tuple[Any, Any, Any]:
    """(layout, per_tensor_scale, rotation) from ``BlockArray``'s earlier arguments ``(codes,
    scales, fmt, block_size, axis, shape, packed=False, block_rows=1, per_tensor_scale=None,
    rotation=None)``, with a warning."""
    if len(fields) > len(_BLOCK_ARRAY_FIELDS):
        raise InvalidTypeError(f"BlockArray takes at most {3 + len(_BLOCK_ARRAY_FIELDS)} positional arguments")
    values: dict[str, Any] = {"packed": False, "block_rows": 1}
    values.update(zip(_BLOCK_ARRAY_FIELDS, fields))
    for name, value in named.items():
        if name not in _BLOCK_ARRAY_FIELDS or name in values and _BLOCK_ARRAY_FIELDS.index(name) < len(fields):
            raise InvalidTypeError(f"BlockArray got an unexpected or repeated argument {name!r}")
        values[name] = value
    missing = [n for n in ("block_size", "axis", "shape") if n not in values]
    if missing:
        raise InvalidTypeError(f"BlockArray is missing {', '.join(missing)}")
    warnings.warn(
        "BlockArray(codes, scales, fmt, block_size, axis, shape, ...) is deprecated and goes in "
        f"{REMOVED_IN}: pass a layout, BlockArray(codes, scales, BlockLayout(fmt, shape, axis, block_size, "
        "block_rows, packed), per_tensor_scale=..., rotation=...)",
        DeprecationWarning,
        stacklevel=4,
    )
    layout = BlockLayout(
        fmt, values["shape"], values["axis"], values["block_size"], values["block_rows"], values["packed"]
    )
    return layout, values.get("per_tensor_scale", per_tensor_scale), values.get("rotation", rotation)


def from_parts_fields(fmt: Any, fields: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, str]:
    """(layout, where) from ``BlockArray.from_parts``'s earlier arguments ``(codes, scales, fmt,
    block_size, axis, shape, packed, where="BlockArray", *, block_rows=1, ...)``, with a warning."""
    names = ("block_size", "axis", "shape", "packed", "where")
    if len(fields) > len(names) or set(named) - {"block_rows"}:
        raise InvalidTypeError("from_parts takes (codes, scales, layout, where, per_tensor_scale=None, rotation=None)")
    values = dict(zip(names, fields))
    missing = [n for n in names[:4] if n not in values]
    if missing:
        raise InvalidTypeError(f"from_parts is missing {', '.join(missing)}")
    warnings.warn(
        "BlockArray.from_parts(codes, scales, fmt, block_size, axis, shape, packed, ...) is deprecated and goes "
        f"in {REMOVED_IN}: pass a layout, from_parts(codes, scales, BlockLayout(fmt, shape, axis, block_size, "
        "block_rows, packed), where, per_tensor_scale=..., rotation=...)",
        DeprecationWarning,
        stacklevel=4,
    )
    layout = BlockLayout(
        fmt, values["shape"], values["axis"], values["block_size"], named.get("block_rows", 1), values["packed"]
    )
    return layout, values.get("where", "BlockArray")
