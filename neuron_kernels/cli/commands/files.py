"""``quantize``, ``dequantize``, ``cast`` and ``error`` of array files (``.npy``, ``.npz``,
``.safetensors``, and the package's block ``.npz`` file), in pieces of bounded memory, written
atomically."""

from __future__ import annotations

import argparse
from typing import Any

from ...formats import INPUT_DTYPES
from ..parser import UsageError, block_options_of
from ..progress import progress_bar, warm
from ..report import STATS_COLUMNS, stats_cells, stats_header, stats_row, table
from .charts import check_png, error_plot

__all__ = ["cmd_cast", "cmd_dequantize", "cmd_error", "cmd_quantize"]


def _entries(args: argparse.Namespace) -> list[Any]:
    from ...io.arrays import open_arrays
    from ...io.file_jobs import select_arrays

    return select_arrays(open_arrays(args.input), args.name)


def cmd_quantize(args: argparse.Namespace) -> int:
    from ...io.arrays import array_file_kind
    from ...io.file_jobs import quantize_file
    from ...io.outputs import atomic_output

    if not array_file_kind(args.output, "output").block_file:
        raise UsageError(f"OUTPUT must be a .npz file (the package's block file), not {args.output!r}")
    if args.require_exact or args.no_stats:
        flag = "--require-exact" if args.require_exact else "--no-stats"
        raise UsageError(
            f"{flag} is for converting checkpoint folders, not array files (their summary is the statistics)"
        )
    if args.quantize_towers:
        raise UsageError("--quantize-towers is for checkpoint folders of multimodal models, not array files")
    options = block_options_of(args)
    entries = _entries(args)
    with (
        progress_bar(args, sum(e.nbytes for e in entries), f"quantize {args.format}") as progress,
        atomic_output(args.output, args.force, (args.input,)) as tmp,
    ):
        stats = quantize_file(
            args.input,
            tmp,
            args.format,
            name=args.name,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
            **options,
        )
    blocks = "x".join(map(str, args.block_shape)) if args.block_shape else str(args.block_size or "default")
    policy = f", four_over_six {args.four_over_six}" if args.four_over_six else ""
    policy += f", scale_search {args.scale_search}" if args.scale_search else ""
    print(
        f"{args.output}: {args.format}, block {blocks}, scale {args.scale_mode or 'default'}{policy}, {args.rounding}"
    )
    print(stats_header("array"))
    shapes = {e.label: e.shape for e in entries}
    for label, st in stats.items():
        print(stats_row(label, shapes[label], st))
    return 0


def cmd_dequantize(args: argparse.Namespace) -> int:
    from ...io.blockfile import read_block_file
    from ...io.file_jobs import dequantize_file
    from ...io.outputs import atomic_output

    args.dtype = args.dtype or "float32"
    stored = read_block_file(args.input)
    total = sum(s.nbytes for k, s in stored.items() if args.name in (None, k))
    with (
        progress_bar(args, total, "dequantize") as progress,
        atomic_output(args.output, args.force, (args.input,)) as tmp,
    ):
        names = dequantize_file(
            args.input,
            tmp,
            dtype=args.dtype,
            name=args.name,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
            shown=args.output,
        )
    print(f"{args.output}: {len(names)} array(s) of {args.dtype}{_stored_note(args.dtype, args.output)}")
    return 0


def _stored_note(dtype_name: str, output: str) -> str:
    from ...dtypes import get_format
    from ...io.file_jobs import stored_dtype

    dtype = get_format(dtype_name).result_dtype
    stored = stored_dtype(dtype, output)
    return f" (stored as {stored} codes: the file type has no {dtype_name} dtype)" if stored != dtype else ""


def cmd_cast(args: argparse.Namespace) -> int:
    from ...io.file_jobs import cast_file
    from ...io.outputs import atomic_output

    entries = _entries(args)
    with (
        progress_bar(args, sum(e.nbytes for e in entries), f"cast to {args.to}") as progress,
        atomic_output(args.output, args.force, (args.input,)) as tmp,
    ):
        names = cast_file(
            args.input,
            tmp,
            args.to,
            name=args.name,
            rounding=args.rounding,
            saturate=args.saturate,
            seed=args.seed,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
            shown=args.output,
        )
    note = _stored_note(args.to, args.output)
    print(f"{args.output}: {len(names)} array(s) cast to {args.to}{note}")
    return 0


#: The error statistics of the ``error`` table (all but the MSE).
_ERROR_COLUMNS = tuple(c for c in STATS_COLUMNS if c != "MSE")


def cmd_error(args: argparse.Namespace) -> int:
    from ...formats import BLOCK_FORMATS
    from ...io.file_jobs import error_table

    if args.plot:
        check_png(args.plot, args.force)
    formats = args.formats.split(",") if args.formats else None
    modes = args.scale_modes.split(",") if args.scale_modes else None
    policies = args.policies.split(",") if args.policies else None
    entries = _entries(args)
    total = sum(e.nbytes for e in entries)
    if args.axis == -1:  # the table's one-pass kernels, one per format and dtype
        dtypes = {e.dtype.name for e in entries if e.dtype.name in INPUT_DTYPES}
        known = [f for f in formats or BLOCK_FORMATS if f in BLOCK_FORMATS]
        warm(args, [("error", d, f) for f in known for d in sorted(dtypes)], "error")
    with progress_bar(args, total, "error") as progress:
        rows = error_table(
            args.input,
            name=args.name,
            formats=formats,
            scale_modes=modes,
            policies=policies,
            block_size=args.block_size,
            axis=args.axis,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
        )
    header = ("array", "format", "scale", "policy", *_ERROR_COLUMNS)
    cells = [(label, fmt, mode, policy, *stats_cells(st, _ERROR_COLUMNS)) for label, fmt, mode, policy, st in rows]
    print(table(header, cells, left=4))
    if args.plot:
        error_plot(args, entries[0], rows)
        print(f"histogram written to {args.plot}")
    return 0
