"""Dtype descriptions to rows of the format table: the names, aliases and dtype objects users pass.

:func:`as_dtype` accepts numpy dtypes, anything ``numpy.dtype()`` accepts, ml_dtypes scalar types,
canonical name strings, aliases and the package's own :class:`~neuron_kernels.formats.NKDType`
objects; :func:`get_format` gives the row; :func:`format_info` describes a format. No kernel compiles
anything of this module (the table itself is :mod:`neuron_kernels.formats`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from .errors import InvalidTypeError, UnknownFormatError
from .formats import FORMATS, Format, NKDType

__all__ = ["ALIASES", "DTypeLike", "FormatInfo", "as_dtype", "canonical_name", "format_info", "get_format"]

#: Extra spellings accepted by :func:`as_dtype` (never ones that numpy reads differently).
ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
    "tf32": "tfloat32",
    "fp32r": "float32r",
    "fp8_e4m3": "float8_e4m3",
    "fp8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "fp4_e2m1fn": "float4_e2m1fn",
    "e8m0": "float8_e8m0fnu",
}

#: What the functions taking a dtype accept: a numpy dtype, the package's own dtype object, a
#: name (canonical, an alias, or anything ``numpy.dtype()`` reads) or a scalar type such as
#: ``np.float32`` or ``ml_dtypes.bfloat16``.
DTypeLike = Union[np.dtype[Any], NKDType, str, type[Any]]


def _unknown(name: str) -> UnknownFormatError:
    known = sorted(set(FORMATS) | set(ALIASES))
    close = difflib.get_close_matches(name.lower(), known, n=4, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownFormatError(f"unknown dtype {name!r}.{hint} Known names: {', '.join(sorted(FORMATS))}.")


def as_dtype(t: DTypeLike) -> np.dtype | NKDType:
    """Normalise a dtype description.

    Accepts a ``numpy.dtype``, anything ``numpy.dtype()`` accepts, an ml_dtypes scalar type, a
    canonical name or alias string, or an :class:`NKDType`. Formats in the table come back as their
    canonical dtype object (native byte order); other numpy dtypes (bool, complex, ...) come back
    unchanged so that callers can reject them with their own message. Unknown names raise
    ``TypeError`` listing the closest known names.
    """
    if isinstance(t, NKDType):
        return t
    if t is None:  # numpy reads None as float64; a missing dtype here is a mistake
        raise InvalidTypeError(
            f"dtype is None; pass a numpy dtype, an ml_dtypes type or one of: {', '.join(sorted(FORMATS))}"
        )
    if isinstance(t, str):
        key = t.strip()
        key = ALIASES.get(key.lower(), key)
        fmt = FORMATS.get(key)
        if fmt is not None:
            return fmt.dtype
        try:
            dt = np.dtype(key)
        except TypeError:
            raise _unknown(t) from None
    else:
        try:
            dt = np.dtype(t)
        except (TypeError, ValueError) as exc:
            raise InvalidTypeError(
                f"not a dtype: {t!r} ({exc}); pass a numpy dtype, an ml_dtypes type "
                f"or one of: {', '.join(sorted(FORMATS))}"
            ) from None
    fmt = FORMATS.get(dt.name)
    if fmt is not None and fmt.numpy_name is not None and dt.newbyteorder("=") == fmt.result_dtype:
        return fmt.result_dtype
    return dt


_FORMAT_CACHE: dict[Any, Format] = {}


def get_format(t: DTypeLike) -> Format:
    """The table row for a dtype description; ``TypeError`` for anything not in the table."""
    try:
        return _FORMAT_CACHE[t]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    fmt = _resolve_format(t)
    if len(_FORMAT_CACHE) < 4096:
        try:
            _FORMAT_CACHE[t] = fmt
        except TypeError:
            pass
    return fmt


def _resolve_format(t: DTypeLike) -> Format:
    dt = as_dtype(t)
    if isinstance(dt, NKDType):
        return dt.format
    fmt = FORMATS.get(dt.name)
    if fmt is None or fmt.numpy_name is None or dt.newbyteorder("=") != fmt.result_dtype:
        raise UnknownFormatError(
            f"unsupported dtype {dt!r}: expected a numeric format, one of {', '.join(sorted(FORMATS))}"
        )
    return fmt


def canonical_name(t: DTypeLike) -> str:
    """The canonical name of a supported dtype (``TypeError`` for anything else)."""
    return get_format(t).name


@dataclass(frozen=True)
class FormatInfo:
    """finfo-like facts about one format (``None`` where a field does not apply)."""

    name: str
    kind: str
    bits: int
    itemsize: int
    container: np.dtype
    dtype: Any
    ebits: int | None
    mbits: int | None
    bias: int | None
    max: float
    min: float
    smallest_normal: float | None
    smallest_subnormal: float | None
    eps: float | None
    has_inf: bool
    has_nan: bool
    has_negative_zero: bool
    element: str | None = None
    lanes: int = 1


def format_info(t: DTypeLike) -> FormatInfo:
    """Describe a format: bits, exponent/mantissa widths, bias, range, eps, special values.

    >>> format_info("float8_e4m3fn").max
    448.0
    """
    f = get_format(t)
    if f.kind == "packed":
        e = FORMATS[f.element]  # type: ignore[index]
        return FormatInfo(
            f.name,
            f.kind,
            f.bits,
            f.itemsize,
            np.dtype(f.container),
            f.dtype,
            e.ebits,
            e.mbits,
            e.bias,
            e.max,
            e.lowest,
            e.smallest_normal,
            e.smallest_subnormal,
            e.eps,
            e.has_inf,
            e.has_nan,
            e.has_negative_zero,
            f.element,
            f.lanes,
        )
    if f.kind == "int":
        return FormatInfo(
            f.name,
            f.kind,
            f.bits,
            f.itemsize,
            f.result_dtype,
            f.dtype,
            None,
            None,
            None,
            f.max,
            f.lowest,
            None,
            None,
            None,
            False,
            False,
            False,
        )
    return FormatInfo(
        f.name,
        f.kind,
        f.bits,
        f.itemsize,
        f.result_dtype,
        f.dtype,
        f.ebits,
        f.mbits,
        f.bias,
        f.max,
        f.lowest,
        f.smallest_normal,
        f.smallest_subnormal,
        f.eps,
        f.has_inf,
        f.has_nan,
        f.has_negative_zero,
    )
