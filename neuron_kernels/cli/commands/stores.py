"""``quantize`` of a Zarr store to a Zarr store, chunk by chunk on Dask (``--workers N``: a local
cluster, ``--scheduler ADDRESS``: an existing one; :mod:`neuron_kernels.lazy.stores`)."""

from __future__ import annotations

import argparse

from ...errors import ClusterError
from ..parser import UsageError, block_options_of
from ..report import stats_header, stats_row

__all__ = ["cmd_quantize"]


def cmd_quantize(args: argparse.Namespace) -> int:
    """``quantize`` of a Zarr store (or on a Dask cluster) to a Zarr store."""
    from ... import quantization_error, quantize
    from ...lazy.stores import ZARR_SUFFIX, is_zarr, open_zarr_arrays, quantize_to_zarr, scheduler

    if args.workers is not None and args.scheduler is not None:
        raise UsageError("give --workers N (a local cluster) or --scheduler ADDRESS (an existing one), not both")
    if args.layout is not None or args.only or args.ignore or args.require_exact or args.no_stats:
        raise UsageError(
            "--layout, --only, --ignore, --require-exact and --no-stats are for checkpoint folders, not Zarr stores"
        )
    if not is_zarr(args.input):
        raise UsageError(
            f"--workers / --scheduler run Zarr jobs (a {ZARR_SUFFIX} folder) and checkpoint conversions (a checkpoint "
            f"folder), not {args.input!r}"
        )
    if not args.output.rstrip("/\\").lower().endswith(ZARR_SUFFIX):
        raise UsageError(f"OUTPUT of a Zarr job must be a Zarr store ending in {ZARR_SUFFIX}, not {args.output!r}")
    options = block_options_of(args)
    with scheduler(args.scheduler, args.workers):
        entries = open_zarr_arrays(args.input, args.name, args.chunk_mb << 20)
        try:
            stats = quantize_to_zarr(
                entries,
                args.output,
                args.format,
                force=args.force,
                inputs=(args.input,),
                quantize=quantize,
                error=quantization_error,
                **options,
            )
        except Exception as exc:
            if type(exc).__name__ == "KilledWorker":  # a task crashed every worker it ran on
                raise ClusterError(f"the Dask cluster lost the job: {exc}; no output written") from None
            raise
    where = f", on {args.scheduler}" if args.scheduler else (f", {args.workers} local workers" if args.workers else "")
    print(f"{args.output}: {args.format}, Zarr store{where}")
    print(stats_header("array"))
    for entry in entries:
        print(stats_row(entry.label, entry.array.shape, stats[entry.label]))
    return 0
