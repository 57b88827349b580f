"""Elementwise casts as NumPy ufuncs, made with numba's ``@vectorize`` from the generic codec.

A cast ufunc takes the source's items and gives the target's, one element at a time, with every
ufunc keyword (``out=``, ``where=``, broadcasting, ``__array_ufunc__`` objects such as Dask arrays):

- in: float32 for float32 (and tfloat32 / float32r) sources, float64, the integer dtypes, and the
  unsigned integer codes of every other format (uint16 for bfloat16 and float16, uint8 for FP8 and
  smaller): numba has no ml_dtypes types, so arrays of those are passed as ``a.view(np.uint16)``;
- out: the target's codes in the same way (uint8 / uint16), float32 for float32, tfloat32 and
  float32r, float64, or the integer dtype.

The scalar function is the codec's loader then its storer (:func:`~.loaders.loader`,
:func:`~.cast_loops.storer`), the very functions the array kernels run, specialised by the same
constants (:func:`make_cast_ufunc`), so every ufunc gives the array kernel's bits. Stochastic
rounding needs an element's index in the whole array, which a ufunc does not see: it has no ufunc.
Each ufunc is built on its first use (``@vectorize`` costs 0.05-0.1 s even when cached) and kept.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .._jit import f32_bits, f32_from_bits, vectorize
from .cast_loops import Store, storer
from .codec import Codec
from .loaders import loader

__all__ = ["make_cast_ufunc", "make_copy_ufunc"]


def _scalar(f32_in: bool, f32_out: bool, source: int, src_codec: Codec, how: Store) -> Any:
    """The scalar function: load, store, and the bitcasts of float32 items at either end."""
    rnd = np.uint32(0)
    load, store = loader(source), storer(how)
    if f32_in and f32_out:

        def cast_item(x):  # pragma: no cover - compiled
            u = f32_bits(x)
            return f32_from_bits(store(u, load(u, src_codec), rnd, how))

    elif f32_in:

        def cast_item(x):  # pragma: no cover - compiled
            u = f32_bits(x)
            return store(u, load(u, src_codec), rnd, how)

    elif f32_out:

        def cast_item(x):  # pragma: no cover - compiled
            return f32_from_bits(store(x, load(x, src_codec), rnd, how))

    else:

        def cast_item(x):  # pragma: no cover - compiled
            return store(x, load(x, src_codec), rnd, how)

    return cast_item


@cache
def make_cast_ufunc(
    name: str,
    in_dtype: str,
    out_dtype: str,
    source: int,
    src_codec: Codec,
    target: int,
    dst_codec: Codec,
    mode: int,
    saturate: bool,
) -> np.ufunc:
    """The ufunc ``out_dtype(in_dtype)`` of a cast whose array kernel is
    :func:`~.cast_loops.make_cast_kernel` ``(source, src_codec, target, dst_codec, mode, saturate)``
    (any mode but stochastic). float32 items are bitcast to the patterns the codec takes (and
    float32 results back); other items go in and out as they are."""
    how = Store(source, target, dst_codec, mode, bool(saturate))
    fn = _scalar(in_dtype == "float32", out_dtype == "float32", source, src_codec, how)
    fn.__name__ = name
    fn.__doc__ = f"{name}: the elementwise cast as a ufunc ({out_dtype} <- {in_dtype})."
    return vectorize(fn, f"{out_dtype}({in_dtype})")


@cache
def make_copy_ufunc(name: str, in_dtype: str, out_dtype: str) -> np.ufunc:
    """The ufunc of a cast that moves items unchanged (the same format in and out: NaN payloads
    kept) or converts integers with C semantics (wrapping, as numpy does)."""

    def copy_item(x):  # pragma: no cover - compiled
        return x

    copy_item.__name__ = name
    copy_item.__doc__ = f"{name}: the elementwise cast as a ufunc ({out_dtype} <- {in_dtype})."
    return vectorize(copy_item, f"{out_dtype}({in_dtype})")
