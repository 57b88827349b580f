"""Zarr stores in and out of the block formats, and the Dask scheduler a file job runs on.

- :func:`open_zarr_arrays`: the arrays of a Zarr store (an array, or a group of arrays), v3 and
  the v2 stores zarr-python reads, as Dask arrays chunked for bounded memory;
- :func:`quantize_to_zarr`: quantise them into a new Zarr store, one group per array with
  ``codes`` (uint8: Zarr has no FP8 / FP4 / E8M0 types), ``scales`` (their raw bytes, uint8) and
  the format, block layout, per-tensor scale and statistics in the group's attributes; written
  under a temporary name and renamed when complete (never a partial store under the final name);
- :func:`open_quantized`: a group written so, as a :class:`~.block_arrays.LazyBlockArray` (``compute()``
  gives the ml_dtypes-typed BlockArray);
- :func:`scheduler`: the Dask scheduler of a job: an existing cluster (``--scheduler ADDRESS``), a
  local one of N worker processes (``--workers N``), or Dask's threads in this process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..blocks.layout import BlockLayout
from ..blocks.stats import QuantizationStats
from ..errors import ClusterError
from ..io.arrays import FileFormatError
from ..io.outputs import atomic_output
from . import require

__all__ = ["ZARR_SUFFIX", "is_zarr", "open_zarr_arrays", "quantize_to_zarr", "open_quantized", "scheduler"]

ZARR_SUFFIX = ".zarr"
#: The attribute holding the package's record in a group it wrote.
ATTRIBUTE = "neuron_kernels"
_METADATA = ("zarr.json", ".zarray", ".zgroup")


def is_zarr(path: str) -> bool:
    """Whether ``path`` names a Zarr store: a ``.zarr`` path, or a folder with Zarr metadata."""
    if path.rstrip("/\\").lower().endswith(ZARR_SUFFIX):
        return True
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, m)) for m in _METADATA)


@dataclass(frozen=True)
class ZarrEntry:
    """One array of a store: its name (``""`` for a store that is one array) and the Dask array."""

    name: str
    array: Any

    @property
    def label(self) -> str:
        return self.name or "array"

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def _dask_of(array: Any, chunk_bytes: int) -> Any:
    """A Zarr array as a Dask array whose chunks are multiples of the store's, about ``chunk_bytes``."""
    da = require("dask.array", "reading a Zarr store")
    dask = require("dask", "reading a Zarr store")
    limit = max(int(chunk_bytes), 1024)
    with dask.config.set({"array.chunk-size": f"{limit}B"}):
        chunks = da.core.normalize_chunks(
            "auto", array.shape, dtype=array.dtype, previous_chunks=array.chunks, limit=limit
        )
    return da.from_zarr(array, chunks=chunks)


def open_zarr_arrays(path: str, name: str | None, chunk_bytes: int) -> list[ZarrEntry]:
    """The arrays of the Zarr store ``path`` (the store itself if it is an array, else the arrays of
    its top-level group; ``name``: only that one) as Dask arrays of about ``chunk_bytes`` a chunk."""
    zarr = require("zarr", "a Zarr store")
    if not os.path.isdir(path):
        raise FileFormatError(f"{path}: no such Zarr store (a folder with zarr.json, .zarray or .zgroup)")
    try:
        node = zarr.open(path, mode="r")
    except Exception as exc:  # zarr raises several kinds for a folder that is no store
        raise FileFormatError(f"{path}: not a Zarr store zarr-python can read ({exc})") from None
    if isinstance(node, zarr.Array):
        if name is not None:
            raise FileFormatError(f"{path}: the store is one array; --name selects an array of a group")
        return [ZarrEntry("", _dask_of(node, chunk_bytes))]
    arrays = dict(node.arrays())
    if name is not None:
        if name not in arrays:
            raise FileFormatError(f"{path}: no array {name!r}; the group holds {', '.join(sorted(arrays)) or 'none'}")
        arrays = {name: arrays[name]}
    if not arrays:
        raise FileFormatError(f"{path}: the group holds no arrays (nested groups are not read)")
    return [ZarrEntry(n, _dask_of(a, chunk_bytes)) for n, a in sorted(arrays.items())]


def _regular(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return tuple(max(c[0], 1) if c else 1 for c in chunks)


def _record(q: Any, source: str, stats: QuantizationStats | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "format": q.fmt,
        "shape": list(q.shape),
        "block_size": q.block_size,
        "block_rows": q.block_rows,
        "axis": q.axis,
        "packed": bool(q.packed),
        "per_tensor_scale": q.per_tensor_scale,
        "rotation": list(q.rotation) if q.rotation is not None else None,
        "source_dtype": source,
        "scale_dtype": q.format.scale_format.name,
        "chunks": list(_regular(q.chunks)),
        "codes": "uint8 codes of the format's elements (two 4-bit codes a byte where packed)",
        "scales": f"uint8 bytes of {q.format.scale_format.name} scales",
    }
    if stats is not None:
        record["error"] = {k: float(v) for k, v in vars(stats).items()}
    return record


def _target(group: Any, key: str, a: Any) -> tuple[Any, Any]:
    """A Zarr array ``key`` of ``group`` for the Dask array ``a``, chunked as ``a`` (rechunked to
    its first chunk sizes if they are irregular); (the Dask array, the Zarr array)."""
    chunks = _regular(a.chunks)
    if a.chunks != a.rechunk(chunks).chunks:
        a = a.rechunk(chunks)
    out = group.create_array(key, shape=a.shape, chunks=chunks, dtype=a.dtype, fill_value=0)
    return a, out


def quantize_to_zarr(
    entries: list[ZarrEntry],
    output: str,
    fmt: str,
    *,
    force: bool = False,
    inputs: tuple[str, ...] = (),
    quantize: Callable[..., Any],
    error: Callable[[Any, Any], Any],
    **options: Any,
) -> dict[str, QuantizationStats]:
    """Quantise every entry to ``fmt`` into the Zarr store ``output`` (see the module docstring),
    chunk by chunk on the current Dask scheduler; the statistics of each array.

    ``quantize`` / ``error``: :func:`neuron_kernels.quantize` and
    :func:`neuron_kernels.quantization_error` (handed down by the caller)."""
    zarr = require("zarr", "a Zarr output")
    da = require("dask.array", "a Zarr output")
    dask = require("dask", "a Zarr output")
    stats: dict[str, QuantizationStats] = {}
    with atomic_output(output, force, inputs, directory=True) as tmp:
        root = zarr.open_group(tmp, mode="w")
        sources, targets, delayed, records = [], [], [], []
        for entry in entries:
            q = quantize(entry.array, fmt, **options)
            group = root.require_group(entry.name) if entry.name else root
            for key, a in (("codes", q.codes), ("scales", q.scales)):
                a, out = _target(group, key, a)
                sources.append(a)
                targets.append(out)
            delayed.append(error(entry.array, q))
            records.append((entry, group, q))
        results = dask.compute(da.store(sources, targets, lock=False, compute=False), *delayed)[1:]
        names = []
        for (entry, group, q), result in zip(records, results):
            stats[entry.label] = result
            group.attrs[ATTRIBUTE] = _record(q, str(entry.array.dtype), result)
            names.append(entry.name)
        if any(names):
            root.attrs[ATTRIBUTE] = {"arrays": names, "format": fmt}
    return stats


def open_quantized(path: str, name: str | None = None) -> Any:
    """The quantised array ``name`` (``None``: the store's only one) of a Zarr store written by
    :func:`quantize_to_zarr`, as a :class:`~.block_arrays.LazyBlockArray`."""
    zarr = require("zarr", "a Zarr store")
    da = require("dask.array", "a Zarr store")
    from .block_arrays import LazyBlockArray

    root = zarr.open_group(path, mode="r")
    group = root if name is None or name == "" else root[name]
    record = group.attrs.get(ATTRIBUTE)
    if not isinstance(record, dict) or "format" not in record or "codes" not in group:
        names = root.attrs.get(ATTRIBUTE, {}).get("arrays") if isinstance(root.attrs.get(ATTRIBUTE), dict) else None
        hint = f"; its arrays: {', '.join(names)}" if names else ""
        raise FileFormatError(f"{path}: {name or 'the store'} is no array quantised by neuron-kernels{hint}")
    shape = tuple(record["shape"])
    chunks = da.core.normalize_chunks(tuple(record["chunks"]), shape)
    rotation = record.get("rotation")
    return LazyBlockArray(
        da.from_zarr(group["codes"]),
        da.from_zarr(group["scales"]),
        BlockLayout(
            record["format"],
            shape,
            int(record["axis"]),
            int(record["block_size"]),
            int(record["block_rows"]),
            bool(record["packed"]),
        ),
        record["per_tensor_scale"],
        tuple(rotation) if rotation is not None else None,
        chunks,
    )


@contextlib.contextmanager
def scheduler(address: str | None = None, workers: int | None = None) -> Iterator[Any]:
    """Run the block on a Dask cluster: the one at ``address``, or a local one of ``workers``
    worker processes (one thread each), made the default scheduler; without either, Dask's
    threads in this process. Yields the ``distributed.Client`` (or None)."""
    if address is None and workers is None:
        yield None
        return
    distributed = require("distributed", "--scheduler / --workers")
    with contextlib.ExitStack() as stack:
        if address is not None:
            try:
                client = stack.enter_context(distributed.Client(address, timeout="20s"))
            except OSError as exc:
                raise ClusterError(f"cannot reach the Dask scheduler at {address!r}: {exc}") from None
        else:
            cluster = stack.enter_context(
                distributed.LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
                )
            )
            client = stack.enter_context(distributed.Client(cluster))
        yield client
