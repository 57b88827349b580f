"""Numbers and documents read from a file, checked before anything is computed from them.

A checkpoint, a GGUF file or an ``.npz`` may come from anyone. Every reader of the package takes
its header fields through these functions: a JSON document is parsed with its nesting bounded
(:func:`parse_json`), a shape's element count is a Python int, never an int64 product that can
wrap (:func:`element_count`), and a byte range is checked against the bytes the file holds
(:func:`check_span`) before anything is allocated, mapped or written for it. Each refusal is one
:class:`~.arrays.FileFormatError` naming the file, the field and what is accepted (:func:`parse_json`
says why in a ``ValueError``, which its caller words for its file).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from .arrays import FileFormatError

__all__ = ["MAX_DIMS", "MAX_JSON_DEPTH", "check_span", "element_count", "json_depth", "parse_json"]

#: The deepest nesting of arrays and objects accepted in a JSON document: serde_json's default
#: recursion limit, with which safetensors' own reader parses a header (``serde_json::from_str``
#: in ``safetensors/src/tensor.rs``). Configuration files nest a few levels.
MAX_JSON_DEPTH = 128


def json_depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (0 for a scalar), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unsigned_zero(text: str) -> int:
    if text == "-0":  # Python reads it as 0; serde_json reads no negative number as an unsigned one
        raise ValueError("-0 is not an unsigned integer")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def parse_json(data: bytes | str, *, strict: bool = False) -> Any:
    """The JSON document ``data``, nested at most :data:`MAX_JSON_DEPTH` deep; ``ValueError``
    saying why not (the caller names the file).

    ``strict``: as serde_json reads it (safetensors' headers): no NaN or Infinity, no ``-0``, no
    ``\\u`` escape of half a surrogate pair (Python's ``json`` reads one into a string that is not
    Unicode), no key twice in an object. Otherwise as Python's ``json`` (and so transformers) reads
    a configuration file."""
    deep = f"is JSON nested deeper than {MAX_JSON_DEPTH} levels, the most accepted"
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if strict:
            value = json.loads(
                text, parse_constant=_no_constant, parse_int=_unsigned_zero, object_pairs_hook=_unique_keys
            )
            json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate does not encode
        else:
            value = json.loads(text)
    except RecursionError:
        raise ValueError(deep) from None
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise ValueError(f"is not UTF-8 ({exc})") from None
    except ValueError as exc:
        raise ValueError(f"is not JSON ({exc})") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(deep)
    return value


#: numpy's bounds on an array: at most 32 dimensions (numpy 1's; numpy 2 holds 64), and its
#: dimensions but those of length 0, times its item size, below 2^63 bytes (``npy_intp``).
MAX_DIMS = 32
_NUMPY_BYTES = 1 << 63


def element_count(
    shape: Sequence[Any], where: str, what: str = "shape", limit: int | None = None, itemsize: int = 1
) -> int:
    """The number of elements of ``shape`` as a Python int (no wrapping), every dimension an int
    (not a bool) >= 0 and, with ``limit``, below it (the format's own bound on a dimension); and a
    shape numpy can hold with items of ``itemsize`` bytes (even with no element: numpy refuses an
    empty array whose other dimensions would overflow)."""
    for d in shape:
        if type(d) is not int or d < 0 or (limit is not None and d >= limit):
            bound = f"below {limit}" if limit is not None else "non-negative"
            raise FileFormatError(f"{where}: {what} {_short(shape)} is not a list of {bound} integers")
    if len(shape) > MAX_DIMS or math.prod(d or 1 for d in shape) * max(itemsize, 1) >= _NUMPY_BYTES:
        raise FileFormatError(
            f"{where}: {what} {_short(shape)} is not one numpy holds (at most {MAX_DIMS} dimensions and 2^63 bytes)"
        )
    return math.prod(shape)


def check_span(where: str, what: str, start: int, nbytes: int, size: int) -> None:
    """Refuse ``nbytes`` at byte ``start`` of a file of ``size`` bytes that it does not hold."""
    if start < 0 or nbytes < 0 or start + nbytes > size:
        raise FileFormatError(
            f"{where}: truncated or corrupt: {what} needs bytes [{start}, {start + nbytes}) and the file holds {size}"
        )


def _short(value: Any, most: int = 80) -> str:
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= most else text[: most - 3] + "..."
