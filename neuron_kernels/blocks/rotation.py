"""The 16-point random Hadamard rotation (RHT) applied along a block axis before quantising.

Every group of 16 consecutive elements along the axis becomes ``y = (x * signs) @ H16 / 4``
(H16 the 16 x 16 Sylvester Hadamard matrix); the inverse is ``x = (y @ H16 / 4) * signs``. The
rotation is orthogonal, so it spreads a block's outliers over its group without changing the
products of two operands rotated along their common axis. Evaluation (reproducible, bit for bit):
in float64, the signs first (forward), then the fast Walsh-Hadamard butterfly in stages
h = 1, 2, 4, 8 (each pair (j, j + h), ``j & h == 0``, in increasing j, becoming (a + b, a - b)),
then times 0.25 (and the signs, inverse), rounded once to float32. That is the correctly rounded
result whenever a group's values lie within 2^25 float32 ulps of each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError
from ..registry import block_kernels
from .inputs import input_array

__all__ = ["DEFAULT_SIGNS", "rotation_signs", "rotate_array", "rotated_amax", "rotate"]

#: The default signs of the rotation (TransformerEngine's and torchao's).
DEFAULT_SIGNS: tuple[int, ...] = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def rotation_signs(rht: Any) -> tuple[int, ...] | None:
    """The 16 signs of ``rht=`` (False/None: no rotation; True: the default signs; or 16 values
    that are each 1 or -1), or ValueError/TypeError naming what is accepted."""
    if rht is None or rht is False:
        return None
    if rht is True:
        return DEFAULT_SIGNS
    if isinstance(rht, (str, bytes)) or not hasattr(rht, "__len__"):
        raise InvalidTypeError(f"rht must be True, False or a sequence of 16 signs (1 or -1), got {rht!r}")
    if isinstance(rht, np.ndarray) and rht.ndim != 1:
        raise InvalidValueError(f"rht must be 16 signs (a 1-D sequence), got an array of shape {rht.shape}")
    values = rht.tolist() if isinstance(rht, np.ndarray) else list(rht)
    if len(values) != 16 or any(isinstance(v, bool) or v not in (1, -1) for v in values):
        raise InvalidValueError(f"rht must be 16 signs, each 1 or -1; got {rht!r}")
    return tuple(int(v) for v in values)


def check_length(length: int, axis: int) -> None:
    if length % 16:
        raise InvalidValueError(
            f"rht= rotates groups of 16 along axis {axis}, whose length {length} is not a multiple of 16"
        )


def _rows(arr: np.ndarray, axis: int) -> np.ndarray:
    """``arr`` as (A, L) rows along ``axis`` (a C-contiguous copy unless the axis is the last)."""
    moved = np.moveaxis(arr, axis, -1)
    return np.ascontiguousarray(moved).reshape(-1, arr.shape[axis])


def rotate_array(arr: np.ndarray, source: str, axis: int, signs: tuple[int, ...], inverse: bool = False) -> np.ndarray:
    """The rotation (or its inverse) of ``arr`` (an input array of dtype ``source``) along
    ``axis``, as a new C-contiguous float32 array of the same shape."""
    kernels = block_kernels()
    check_length(arr.shape[axis], axis)
    rows = _rows(kernels.input_view(arr) if arr.dtype != np.float64 else arr, axis)
    out = np.empty(rows.shape, np.uint32)
    kernels.rotate_rows(rows, source, out, signs, inverse)
    moved_shape = np.moveaxis(np.empty(arr.shape, np.bool_), axis, -1).shape
    return np.ascontiguousarray(np.moveaxis(out.view(np.float32).reshape(moved_shape), -1, axis))


def rotate_in_place(values: np.ndarray, axis: int, signs: tuple[int, ...], inverse: bool) -> None:
    """Rotate a C-contiguous float32 array along its last axis in place (``axis`` must be last)."""
    rows = values.view(np.uint32).reshape(-1, values.shape[axis])
    block_kernels().rotate_rows(rows, "float32", rows, signs, inverse)


def rotated_amax(arr: np.ndarray, source: str, axis: int, signs: tuple[int, ...]) -> float:
    """The largest finite |y| of the rotation y of ``arr`` along ``axis`` (0 when there is none)."""
    kernels = block_kernels()
    check_length(arr.shape[axis], axis)
    rows = _rows(kernels.input_view(arr) if arr.dtype != np.float64 else arr, axis)
    amax: float = kernels.rotated_amax_rows(rows, source, signs)
    return amax


def rotate(x: Any, rht: Any = True, *, axis: int = -1, inverse: bool = False) -> np.ndarray:
    """The random Hadamard rotation of every 16-element group of ``x`` along ``axis`` (its length a
    multiple of 16), as a float32 array; ``inverse=True`` undoes it. ``rht``: True (the default
    signs) or 16 signs, as in :func:`neuron_kernels.quantize`."""
    arr, src = input_array(x)
    signs = rotation_signs(rht)
    if signs is None:
        raise InvalidValueError("rotate needs rht=True or 16 signs")
    if not isinstance(inverse, (bool, np.bool_)):
        raise InvalidTypeError(f"inverse must be True or False, got {inverse!r}")
    if arr.ndim == 0:
        raise InvalidValueError("cannot rotate a 0-d array: groups run along an axis")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -arr.ndim <= axis < arr.ndim:
        raise InvalidValueError(f"axis {axis!r} is out of range for an array of {arr.ndim} dimensions")
    return rotate_array(arr, src.name, int(axis) % arr.ndim, signs, bool(inverse))
