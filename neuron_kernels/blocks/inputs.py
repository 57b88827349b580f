"""What block formats quantise from: the input dtypes, and arrays made ready for the kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import get_format
from ..errors import InvalidTypeError
from ..formats import INPUT_DTYPES, Format

__all__ = ["INPUT_DTYPES", "input_array", "input_format"]


def input_array(x: Any) -> tuple[np.ndarray, Format]:
    """``x`` as a native-order C-contiguous array of a dtype block formats quantise, and its row."""
    arr = np.asarray(x)  # subclasses (matrix, memmap) as plain arrays
    fmt = input_format(arr.dtype)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.asarray(arr, order="C"), fmt


def input_format(dtype: Any) -> Format:
    """The table row of a dtype block formats quantise, or a TypeError naming those dtypes."""
    try:
        fmt = get_format(dtype)
    except TypeError:
        fmt = None
    if fmt is None or fmt.name not in INPUT_DTYPES:
        raise InvalidTypeError(
            f"block quantisation takes float32, float16, bfloat16 or float64 arrays; got dtype {dtype}"
        )
    return fmt
