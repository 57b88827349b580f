"""``cast`` of lazy arrays: the registry's ufunc where the cast has one, else the array kernel
chunk by chunk (Dask arrays only).

A Dask array is cast chunk by chunk with the pair's ufunc (every rounding mode but stochastic, no
packed container); stochastic rounding and the packed ``*_x4`` containers go through the array
kernel, each chunk cut into pieces contiguous in the whole array and given their C-order offsets
(:func:`~.chunks.contiguous_runs`), so the result is the in-memory ``cast`` bit for bit. Packing
needs whole groups of four along the last axis: chunks that split one are rechunked. Other
``__array_ufunc__`` objects (xarray) take the ufunc directly. The tasks carry names, not kernels:
each worker process looks the kernel up in its own registry (a kernel registered with
``register_cast`` applies where it was registered).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import get_format
from ..errors import InvalidTypeError, InvalidValueError
from ..formats import Format
from ..registry import CastOptions, lookup_cast
from . import is_dask
from .chunks import contiguous_runs, rechunk_for

__all__ = ["cast_lazy", "retype"]

#: ``piece(x, source, target, options, index0)``: the in-memory cast of one contiguous piece
#: (``neuron_kernels.casting.cast_piece``), handed down by the caller.
Piece = Callable[[np.ndarray, str, str, CastOptions, int], np.ndarray]


def retype(a: Any, dtype: np.dtype) -> Any:
    """``a`` with its items read as ``dtype`` (of the same size): ``a.view(dtype)``, or for objects
    that wrap an array in ``.data`` without a ``view`` (xarray), a copy around the viewed data."""
    if a.dtype == dtype:
        return a
    view = getattr(a, "view", None)
    if callable(view):
        try:
            return view(dtype)
        except TypeError:
            pass
    data = getattr(a, "data", None)
    if data is not None and data is not a and callable(getattr(a, "copy", None)):
        return a.copy(data=retype(data, dtype))
    raise InvalidTypeError(f"cannot view a {type(a).__name__} as {dtype}: it has no view(dtype)")


def _native(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _ufunc_block(block: np.ndarray, source: str, target: str, rounding: str, saturate: bool) -> np.ndarray:
    """One chunk through the pair's ufunc (looked up in this process's registry)."""
    ufunc = lookup_cast(source, target).ufunc(rounding, saturate)
    arg = np.dtype(ufunc.types[0].split("->")[0])
    with np.errstate(all="ignore"):  # as the array kernel: no warnings for signalling NaN inputs
        return ufunc(_native(np.asarray(block)).view(arg)).view(get_format(target).result_dtype)


def _kernel_block(
    block: np.ndarray,
    piece: Piece,
    source: str,
    target: str,
    options: CastOptions,
    shape: tuple[int, ...],
    lanes: int,
    block_info: Any = None,
) -> np.ndarray:
    """One chunk through the array kernel: whole, or in contiguous pieces with their C-order offsets
    (stochastic rounding; ``lanes`` elements per source item)."""
    arr = _native(np.asarray(block))
    if options.rounding != "stochastic":
        return piece(arr, source, target, options, 0)
    location = block_info[0]["array-location"]
    runs = list(contiguous_runs(shape, location))
    if runs == [((), runs[0][1])]:
        return piece(arr, source, target, options, runs[0][1] * lanes)
    first = piece(arr[runs[0][0]], source, target, options, runs[0][1] * lanes)
    out = np.empty(arr.shape[: len(runs[0][0])] + first.shape, first.dtype)
    out[runs[0][0]] = first
    for idx, start in runs[1:]:
        out[idx] = piece(arr[idx], source, target, options, start * lanes)
    return out


def _source(x: Any) -> Format:
    try:
        return get_format(x.dtype)
    except (TypeError, AttributeError):
        raise InvalidTypeError(
            f"cannot cast a {type(x).__name__} of dtype {getattr(x, 'dtype', None)}: the sources are float "
            "and integer arrays (float16/32/64, bfloat16, the float8/6/4 types, int8..int64, uint8..uint64)"
        ) from None


def cast_lazy(x: Any, target: Format, options: CastOptions, piece: Piece) -> Any:
    """``cast`` of a lazy array-like: a lazy result of the target's dtype (see the module docstring)."""
    source = _source(x)
    kernel = lookup_cast(source.name, target.name)
    kernel.check_options(options)
    elementwise = kernel.has_ufunc and options.rounding != "stochastic"
    if not is_dask(x):
        if not elementwise:
            raise NotImplementedError(
                f"{type(x).__name__} inputs are cast with the pair's ufunc, and {source.name} -> {target.name}"
                f"{' with stochastic rounding' if options.rounding == 'stochastic' else ''} has none; pass a "
                "Dask array or a NumPy array"
            )
        ufunc = kernel.ufunc(options.rounding, options.saturate)
        arg = np.dtype(ufunc.types[0].split("->")[0])
        return retype(ufunc(retype(x, arg)), target.result_dtype)
    dtype = target.result_dtype
    if elementwise:
        return x.map_blocks(
            _ufunc_block,
            source.name,
            target.name,
            options.rounding,
            options.saturate,
            dtype=dtype,
            meta=np.empty((0,) * x.ndim, dtype),
        )
    chunks = list(x.chunks)
    if source.kind == "packed" and target.kind != "packed":
        if not x.ndim:
            raise InvalidValueError(f"a 0-d array of {source.name} containers cannot be unpacked")
        chunks[-1] = tuple(4 * c for c in x.chunks[-1])
    elif target.kind == "packed" and source.kind != "packed":
        if not x.ndim or x.shape[-1] % 4:
            raise InvalidValueError(
                f"casting to {target.name} packs 4 consecutive elements of the last axis into one container, "
                f"so the last axis must be a multiple of 4; got shape {x.shape}"
            )
        x = rechunk_for(x, {x.ndim - 1: 4})
        chunks = list(x.chunks)
        chunks[-1] = tuple(c // 4 for c in x.chunks[-1])
    return x.map_blocks(
        _kernel_block,
        piece,
        source.name,
        target.name,
        options,
        x.shape,
        source.lanes,
        chunks=tuple(chunks),
        dtype=dtype,
        meta=np.empty((0,) * x.ndim, dtype),
    )
