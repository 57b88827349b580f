"""Lazy arrays: the package's casts and block formats on Dask arrays (and ufuncs on any array-like
that implements ``__array_ufunc__``), and the Zarr stores they read and write.

The public functions (:func:`neuron_kernels.cast`, :func:`neuron_kernels.quantize` and friends)
come here when they are given a lazy array; nothing here is imported before that, and Dask, its
``distributed`` scheduler and Zarr are an optional extra (``pip install "neuron_kernels[dask]"``).

- :mod:`.chunks`: chunks aligned to blocks, and the pieces of a chunk that are contiguous in the
  whole array (the C-order offsets stochastic rounding depends on);
- :mod:`.casts`: ``cast`` of lazy arrays (the registry's ufuncs, or the array kernel chunk by chunk);
- :mod:`.block_arrays`: quantise / dequantise / fake-quantise / error statistics of Dask arrays, and
  :class:`~.block_arrays.LazyBlockArray`;
- :mod:`.stores`: Zarr stores in and out of the block formats, and the Dask scheduler of a job (an
  existing cluster, or a local one).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np

from ..errors import MissingExtraError

__all__ = ["EXTRA", "is_lazy", "is_dask", "is_lazy_blocks", "require"]

#: How to install what the lazy paths need.
EXTRA = 'pip install "neuron_kernels[dask]"'


def require(module: str, what: str) -> Any:
    """``import module``, or an ImportError saying that ``what`` needs the ``dask`` extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs {module.split('.')[0]} (the neuron_kernels[dask] extra): {EXTRA}"
        ) from exc


def is_lazy(x: Any) -> bool:
    """Whether ``x`` is an array-like that stays lazy: a Dask collection (``__dask_graph__``: a Dask
    array, an xarray object) implementing ``__array_ufunc__``, and not a NumPy array. Other
    array-likes (lists, pandas objects, memmaps) are read into NumPy arrays as before."""
    kind = type(x)
    return (
        not isinstance(x, (np.ndarray, np.generic))
        and getattr(kind, "__array_ufunc__", None) is not None
        and hasattr(kind, "__dask_graph__")
    )


def is_dask(x: Any) -> bool:
    """Whether ``x`` is a ``dask.array.Array`` (without importing Dask: if it is not imported, no
    Dask array exists)."""
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(x, module.Array)


def is_lazy_blocks(q: Any) -> bool:
    """Whether ``q`` is a :class:`~.block_arrays.LazyBlockArray`."""
    module = sys.modules.get(__name__ + ".block_arrays")
    return module is not None and isinstance(q, module.LazyBlockArray)
