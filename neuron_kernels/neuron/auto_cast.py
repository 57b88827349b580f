"""``auto_cast``: two operands cast to the dtype the Neuron compiler promotes them to
(:func:`~.promotion.promote_type`), through the cast registry (:func:`neuron_kernels.casting.cast`'s
kernels)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..casting import CastPlan, source_format
from ..dtypes import DTypeLike, get_format
from ..errors import InvalidValueError
from ..formats import Format
from ..registry import CastOptions
from .promotion import get_x4_from_x1, is_x4_dtype, launder_x4_dtype, promote_type

__all__ = ["auto_cast"]


def _logical_format(arr: np.ndarray, declared: DTypeLike | None, which: str) -> Format:
    if declared is None:
        return source_format(arr)
    fmt = get_format(declared)
    if arr.dtype.newbyteorder("=") != fmt.result_dtype:
        raise InvalidValueError(
            f"{which} is declared {fmt.name}, whose arrays have dtype "
            f"{fmt.result_dtype}, but {which} has dtype {arr.dtype}"
        )
    return fmt


def auto_cast(
    a: Any, b: Any, *, a_dtype: DTypeLike | None = None, b_dtype: DTypeLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cast two operands to the dtype the Neuron compiler promotes them to.

    The result dtype is ``promote_type`` of the operands' element types; when either operand is a
    packed ``*_x4`` container and the promoted element has a packed form, the result is packed
    too. An operand already of the result dtype (in native byte order) is returned as it is (no
    copy).

    ``a_dtype``/``b_dtype`` declare what an array holds when its numpy dtype cannot say:
    ``"tfloat32"``/``"float32r"`` for float32 arrays, ``"float8_e4m3fn_x4"`` and friends for
    their uint32/uint16 containers.
    """
    arrs = [np.asarray(x) for x in (a, b)]
    fmts = [_logical_format(arrs[0], a_dtype, "a"), _logical_format(arrs[1], b_dtype, "b")]
    elements = [launder_x4_dtype(f.dtype) for f in fmts]
    result: Any = promote_type(elements[0], elements[1])
    if any(is_x4_dtype(f.dtype) for f in fmts):
        try:
            result = get_x4_from_x1(result)
        except TypeError:
            pass
    target = get_format(result)
    options = CastOptions()
    outs = [
        arr if fmt is target and arr.dtype.isnative else CastPlan.make(fmt, target, options).run(arr)
        for arr, fmt in zip(arrs, fmts)
    ]
    return outs[0], outs[1]
