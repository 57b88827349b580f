"""The ``neuron-kernels`` command (also ``python -m neuron_kernels``).

Subcommands:

- ``bench``: throughput of every compiled cast and MX format on built-in data;
- ``quantize``, ``dequantize``, ``cast``: files (``.npy``, ``.npz``, ``.safetensors``) of any size,
  processed in bounded memory, written atomically; ``quantize`` and ``dequantize`` also take model
  checkpoint folders (to and from the layouts runtimes load, :mod:`neuron_kernels.checkpoints`);
  ``quantize`` also reads a Zarr store into a Zarr store, chunk by chunk on Dask (``--workers N``:
  a local cluster, ``--scheduler ADDRESS``: an existing one; :mod:`neuron_kernels.lazy.stores`);
- ``error``: which block format, scale mode and scale policy suits an array (SQNR table, histogram);
- ``promote``: the promotion lattice (one pair, ``--explain``, or ``--table``);
- ``formats``: the format table.

Bad input prints one line on stderr and exits with status 2; an interrupted run exits with 130.
Neither leaves an output behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import ClusterError, NeuronKernelsError

__all__ = ["main"]

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]i?)?\s*$")
_UNITS = {"": 1, "k": 1000, "ki": 1 << 10, "m": 10**6, "mi": 1 << 20, "g": 10**9, "gi": 1 << 30}


def parse_size(text: str) -> int:
    """``"64Mi"`` -> 67108864; plain integers, k/M/G (powers of 10) and Ki/Mi/Gi (powers of 2)."""
    m = _SIZE.match(text)
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: give a positive element count such as 1048576, 1Mi or 64Mi"
        )
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?\s*$")
_BYTE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
               "ti": 1 << 40}  # fmt: skip


def parse_bytes(text: str) -> int:
    """``"5GB"`` -> 5000000000, ``"500MB"``, ``"2GiB"``, plain byte counts."""
    m = _BYTES.match(text)
    value = int(float(m.group(1)) * _BYTE_UNITS[(m.group(2) or "").lower()]) if m else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a size such as 5GB, 500MB or 2GiB")
    return value


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import BLOCK_CASES, bench_casts, bench_mx, default_cases, format_mx_table, format_table

    if args.plot:
        _check_png(args.plot, force=True)
    sources = ("float32", "bfloat16")
    _warm(
        args,
        [("quantize", s, f) for _, f, _ in BLOCK_CASES for s in sources]
        + [("cast", s, t) for s, t, r in default_cases() if r == "nearest_even"],
        "bench",
    )
    total = len(default_cases()) + len(BLOCK_CASES)
    with _progress_bar(args, total, "bench", unit="pair") as step:
        rows = bench_casts(args.size, repeat=args.repeat, progress=step)
        mx_rows = bench_mx(args.size, repeat=args.repeat, progress=step)
    print(
        f"{args.size:,} float32 elements, median of {args.repeat} runs, "
        f"{os.environ.get('NEURON_KERNELS_NUM_THREADS') or 'all available'} threads"
    )
    print(format_table(rows))
    print()
    print(format_mx_table(mx_rows))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"casts": [r.as_dict() for r in rows], "mx": [r.as_dict() for r in mx_rows]}, fh, indent=2)
        os.replace(tmp, args.json)
    if args.plot:
        from .plots import bench_chart

        bench_chart(rows, mx_rows, args.plot)
        print(f"chart written to {args.plot}")
    return 0


def _warm(args: argparse.Namespace, tasks: list[Any], what: str) -> None:
    """Compile what a command will need first, on every core (see :mod:`neuron_kernels.warmup`),
    saying so on a terminal when it compiles anything."""
    from .warmup import warmup

    shown = not getattr(args, "quiet", False) and sys.stderr.isatty()

    def progress(done: int, total: int, task: Any) -> None:
        if shown:
            print(f"\r{what}: preparing kernels {done}/{total}", end="", file=sys.stderr, flush=True)

    compiled, seconds = warmup(tasks, getattr(args, "jobs", None), progress)
    if shown:
        note = f"{compiled} compiled in {seconds:.0f} s, cached for next time" if compiled else "cached"
        print(f"\r{what}: kernels ready ({note})".ljust(60), file=sys.stderr)


def _cmd_warmup(args: argparse.Namespace) -> int:
    from .warmup import WARMUP_SOURCES, warmup, warmup_tasks

    formats = args.formats.split(",") if args.formats else None
    sources = args.sources.split(",") if args.sources else list(WARMUP_SOURCES)
    tasks = warmup_tasks(formats, sources)
    shown = not args.quiet and sys.stderr.isatty()

    def progress(done: int, total: int, task: Any) -> None:
        if shown:
            print(f"\rwarmup: {done}/{total} tasks", end="", file=sys.stderr, flush=True)

    compiled, seconds = warmup(tasks, args.jobs, progress)
    if shown:
        print(file=sys.stderr)
    print(
        f"{len(tasks)} task(s) for {', '.join(sources)}: {compiled} kernel(s) compiled in {seconds:.1f} s "
        f"({'already cached' if not compiled else 'now cached on disk'})"
    )
    return 0


def _check_png(path: str, force: bool) -> None:
    from .io.files import check_output_path

    if not path.lower().endswith(".png"):
        raise _UsageError(f"--plot writes a PNG image; give a file name ending in .png, not {path!r}")
    check_output_path(path, force)
    from .plots import require_matplotlib

    require_matplotlib()


@contextlib.contextmanager
def _progress_bar(args: argparse.Namespace, total: int, desc: str, unit: str = "B") -> Iterator[Callable[[Any], None]]:
    """A tqdm bar on stderr when it is a terminal and --quiet is not given. The callback takes a
    byte count (``unit="B"``, shown with its throughput) or, for other units, the name of the
    step that starts."""
    if args.quiet or not sys.stderr.isatty():
        yield lambda _: None
        return
    from tqdm import tqdm

    with tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024,
        file=sys.stderr,
        dynamic_ncols=True,
    ) as bar:
        if unit == "B":
            yield bar.update
            return
        started = [False]

        def step(name: Any) -> None:
            if started[0]:
                bar.update(1)
            started[0] = True
            bar.set_postfix_str(str(name))

        yield step
        bar.update(1)


def _entries(args: argparse.Namespace) -> list[Any]:
    from .io.files import open_arrays
    from .io.stream import select_arrays

    return select_arrays(open_arrays(args.input), args.name)


def _percent(v: float) -> str:
    return f"{100 * v:.3g}%"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> str:
    """Columns as wide as their widest cell, two spaces apart: the first ``left`` aligned left
    (names), the others right (numbers), so that no two cells run together."""
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if k < left else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def _checkpoint_input(args: argparse.Namespace) -> bool:
    """Whether a command works on a checkpoint (a folder, a layout asked for, or an output that is
    no array file) rather than on array files."""
    from .io.files import ARRAY_FILES

    output = getattr(args, "output", "") or ""
    return (
        os.path.isdir(args.input)
        or getattr(args, "layout", None) is not None
        or (bool(output) and os.path.splitext(output)[1].lower() not in ARRAY_FILES)
    )


def _block_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`neuron_kernels.quantize` given on the command line."""
    from .blocks.job import DEFAULT

    per_tensor: Any = DEFAULT
    if args.per_tensor_scale is not None:
        per_tensor = {"amax": "amax", "none": None}.get(args.per_tensor_scale.lower(), args.per_tensor_scale)
        if isinstance(per_tensor, str) and per_tensor != "amax":
            try:
                per_tensor = float(per_tensor)
            except ValueError:
                raise _UsageError(
                    f"--per-tensor-scale must be amax, none or a positive number, not {args.per_tensor_scale!r}"
                ) from None
    return {
        "block_size": DEFAULT if args.block_size is None else args.block_size,
        "block_shape": args.block_shape,
        "axis": args.axis,
        "scale_mode": DEFAULT if args.scale_mode is None else args.scale_mode,
        "rounding": args.rounding,
        "seed": args.seed,
        "pack": not args.no_pack,
        "per_tensor_scale": per_tensor,
        "four_over_six": args.four_over_six,
        "scale_search": args.scale_search,
        "rht": args.rht,
    }


def _zarr_job(args: argparse.Namespace) -> bool:
    """Whether a command reads or writes a Zarr store, or runs on a Dask cluster."""
    from .lazy.stores import is_zarr

    output = getattr(args, "output", "") or ""
    return is_zarr(args.input) or is_zarr(output) or args.workers is not None or args.scheduler is not None


def _quantize_zarr(args: argparse.Namespace) -> int:
    """``quantize`` of a Zarr store (or on a Dask cluster) to a Zarr store."""
    from . import quantization_error, quantize
    from .lazy.stores import ZARR_SUFFIX, is_zarr, open_zarr_arrays, quantize_to_zarr, scheduler

    if args.workers is not None and args.scheduler is not None:
        raise _UsageError("give --workers N (a local cluster) or --scheduler ADDRESS (an existing one), not both")
    if args.layout is not None or args.only or args.ignore:
        raise _UsageError("--layout, --only and --ignore are for checkpoint folders, not Zarr stores")
    if not is_zarr(args.input):
        raise _UsageError(
            f"Zarr jobs (and --workers / --scheduler) read a Zarr store (a {ZARR_SUFFIX} folder), not {args.input!r}"
        )
    if not args.output.rstrip("/\\").lower().endswith(ZARR_SUFFIX):
        raise _UsageError(f"OUTPUT of a Zarr job must be a Zarr store ending in {ZARR_SUFFIX}, not {args.output!r}")
    options = _block_options_of(args)
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
    print(
        f"{'array':<32}{'shape':>20}{'SQNR dB':>9}{'MSE':>11}{'max abs':>11}{'max rel':>11}{'saturated':>11}"
        f"{'flushed':>9}"
    )
    for entry in entries:
        print(f"{entry.label:<32}{str(entry.array.shape):>20}" + _stats_columns(stats[entry.label]))
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    from .io.files import array_file_kind, atomic_output
    from .io.stream import quantize_file

    if _zarr_job(args):
        return _quantize_zarr(args)
    if _checkpoint_input(args):
        return _quantize_checkpoint(args)
    if array_file_kind(args.output, "output").name != "npz":
        raise _UsageError(f"OUTPUT must be a .npz file (the package's MX file), not {args.output!r}")
    options = _block_options_of(args)
    entries = _entries(args)
    with (
        _progress_bar(args, sum(e.nbytes for e in entries), f"quantize {args.format}") as progress,
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
    print(
        f"{'array':<32}{'shape':>20}{'SQNR dB':>9}{'MSE':>11}{'max abs':>11}{'max rel':>11}{'saturated':>11}"
        f"{'flushed':>9}"
    )
    shapes = {e.label: e.shape for e in entries}
    for label, st in stats.items():
        print(f"{label:<32}{str(shapes[label]):>20}" + _stats_columns(st))
    return 0


def _stats_columns(st: Any) -> str:
    return (
        f"{st.sqnr_db:>9.2f}{st.mse:>11.3g}{st.max_abs_error:>11.3g}{st.max_rel_error:>11.3g}"
        f"{_percent(st.saturated):>11}{_percent(st.flushed):>9}"
    )


def _quantize_checkpoint(args: argparse.Namespace) -> int:
    from .checkpoints import LAYOUTS, open_checkpoint, quantize_checkpoint
    from .io.files import atomic_output, check_output_path

    if args.name is not None:
        raise _UsageError("--name picks an array of a file; for a checkpoint use --only / --ignore")
    layout = LAYOUTS[args.layout or "compressed-tensors"]
    layout.check_format(args.format)
    if layout.suffix and not args.output.lower().endswith(layout.suffix):
        raise _UsageError(
            f"the {layout.name} layout writes one {layout.suffix} file; OUTPUT must end in {layout.suffix}, "
            f"not {args.output!r}"
        )
    options = _block_options_of(args)
    check_output_path(args.output, args.force, (args.input,), directory=not layout.single_file)
    ckpt = open_checkpoint(args.input)
    with (
        _progress_bar(args, ckpt.nbytes, f"quantize {args.format}") as progress,
        atomic_output(args.output, args.force, (args.input,), directory=not layout.single_file) as tmp,
    ):
        reports = quantize_checkpoint(
            args.input,
            tmp,
            layout.name,
            args.format,
            ignore=tuple(args.ignore or ()),
            only=tuple(args.only or ()),
            fuse=not args.no_fuse,
            max_shard_bytes=args.max_shard_size,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
            **options,
        )
    done = [r for r in reports if r.action == "quantised"]
    kept = [r for r in reports if r.action != "quantised"]
    print(f"{args.output}: {layout.name} layout, {args.format}: {len(done)} tensor(s) quantised, {len(kept)} kept")
    width = max([32] + [len(r.name) + 2 for r in reports])
    if done:
        print(
            f"{'quantised':<{width}}{'shape':>20}{'dtype':>10}{'SQNR dB':>9}{'MSE':>11}{'max abs':>11}{'max rel':>11}"
            f"{'saturated':>11}{'flushed':>9}"
        )
        for r in done:
            print(f"{r.name:<{width}}{str(r.shape):>20}{r.dtype:>10}" + _stats_columns(r.stats))
    if kept:
        print(f"{'kept':<{width}}{'shape':>20}{'dtype':>10}  why")
        for r in kept:
            print(f"{r.name:<{width}}{str(r.shape):>20}{r.dtype:>10}  {r.reason}")
    fused = list(dict.fromkeys(r.fused_with for r in reports if r.fused_with))
    for group in fused:
        print(f"one per-tensor scale (fused in the runtime): {', '.join(group)}")
    for name, why in ckpt.skipped:
        print(f"not copied: {name}: {why}")
    return 0


def _dequantize_checkpoint(args: argparse.Namespace) -> int:
    from .checkpoints import dequantize_checkpoint
    from .io.files import atomic_output

    if args.name is not None:
        raise _UsageError("--name picks an array of a file; a checkpoint is dequantised whole")
    dtype = args.dtype or "bfloat16"
    source = args.input
    total = (
        sum(e.stat().st_size for e in os.scandir(source) if e.name.endswith(".safetensors"))
        if os.path.isdir(source)
        else os.path.getsize(source)
        if os.path.isfile(source)
        else 0
    )
    with (
        _progress_bar(args, total, "dequantize") as progress,
        atomic_output(args.output, args.force, (args.input,), directory=True) as tmp,
    ):
        reports = dequantize_checkpoint(
            args.input,
            tmp,
            dtype=dtype,
            max_shard_bytes=args.max_shard_size,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
        )
    done = [r for r in reports if r.action == "dequantised"]
    print(f"{args.output}: {len(done)} weight(s) dequantised to {dtype}, {len(reports) - len(done)} tensor(s) copied")
    for r in done:
        print(f"  {r.name} ({r.dtype}, {r.shape}) -> {', '.join(r.outputs)}")
    return 0


def _cmd_dequantize(args: argparse.Namespace) -> int:
    from .io.blockfile import read_block_file
    from .io.files import atomic_output
    from .io.stream import dequantize_file

    if _checkpoint_input(args):
        return _dequantize_checkpoint(args)
    args.dtype = args.dtype or "float32"
    stored = read_block_file(args.input)
    total = sum(s.codes.nbytes + s.scales.nbytes for k, s in stored.items() if args.name in (None, k))
    with (
        _progress_bar(args, total, "dequantize") as progress,
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
    from .dtypes import get_format
    from .io.stream import stored_dtype

    dtype = get_format(dtype_name).result_dtype
    stored = stored_dtype(dtype, output)
    return f" (stored as {stored} codes: the file type has no {dtype_name} dtype)" if stored != dtype else ""


def _cmd_cast(args: argparse.Namespace) -> int:
    from .io.files import atomic_output
    from .io.stream import cast_file

    entries = _entries(args)
    with (
        _progress_bar(args, sum(e.nbytes for e in entries), f"cast to {args.to}") as progress,
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


def _cmd_error(args: argparse.Namespace) -> int:
    from .formats import BLOCK_FORMATS
    from .io.stream import error_table

    if args.plot:
        _check_png(args.plot, args.force)
    formats = args.formats.split(",") if args.formats else None
    modes = args.scale_modes.split(",") if args.scale_modes else None
    policies = args.policies.split(",") if args.policies else None
    entries = _entries(args)
    total = sum(e.nbytes for e in entries)
    if args.axis == -1:  # the table's one-pass kernels, one per format and dtype
        dtypes = {e.dtype.name for e in entries if e.dtype.name in ("float32", "float16", "bfloat16", "float64")}
        known = [f for f in formats or BLOCK_FORMATS if f in BLOCK_FORMATS]
        _warm(args, [("error", d, f) for f in known for d in sorted(dtypes)], "error")
    with _progress_bar(args, total, "error") as progress:
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
    header = ("array", "format", "scale", "policy", "SQNR dB", "max abs", "max rel", "saturated", "flushed")
    cells = [
        (label, fmt, mode, policy, f"{st.sqnr_db:.2f}", f"{st.max_abs_error:.3g}", f"{st.max_rel_error:.3g}")
        + (_percent(st.saturated), _percent(st.flushed))
        for label, fmt, mode, policy, st in rows
    ]
    print(_table(header, cells, left=4))
    if args.plot:
        _error_plot(args, entries[0], rows)
        print(f"histogram written to {args.plot}")
    return 0


def _error_plot(args: argparse.Namespace, entry: Any, rows: list[Any]) -> None:
    """Relative-error histograms of the first array (its first million elements), one curve per
    format at its best scale mode and policy."""
    import numpy as np

    from .api import fake_quantize
    from .io.stream import POLICIES
    from .plots import error_histogram, relative_errors

    best: dict[str, tuple[str, str]] = {}
    for label, fmt, mode, policy, _ in rows:  # rows are best first within an array
        if label == entry.label and fmt not in best:
            best[fmt] = (mode, policy)
    per_row = int(np.prod(entry.shape[1:], dtype=np.int64))
    x = entry.read(0, max(1, min(entry.shape[0], (1 << 20) // max(per_row, 1))))
    samples = {
        f"{fmt} {mode} {policy}": relative_errors(
            x,
            fake_quantize(x, fmt, block_size=args.block_size, axis=args.axis, scale_mode=mode, **POLICIES[policy]),
        )
        for fmt, (mode, policy) in best.items()
    }
    error_histogram(samples, args.plot, f"{entry.label}: relative error of each format (best scale mode, policy)")


def _cmd_promote(args: argparse.Namespace) -> int:
    from .promotion import explain_promotion, promotion_table

    if args.table:
        print(promotion_table())
        return 0
    if not (args.a and args.b):
        raise _UsageError("promote needs two dtypes (or --table)")
    p = explain_promotion(args.a, args.b)
    if p.error is not None:
        raise p.error  # one line on stderr, exit status 2, as for any other user error
    print(str(p) if args.explain else p.result.name)
    return 0


def _cmd_formats(args: argparse.Namespace) -> int:
    from .dtypes import format_info
    from .formats import FORMATS

    head = (
        f"{'name':<20}{'bits':>5}{'E':>4}{'M':>4}{'bias':>6}{'max':>14}{'min normal':>14}"
        f"{'min subnorm':>14}{'eps':>10}  inf nan  array dtype"
    )
    print(head)
    for name in FORMATS:
        i = format_info(name)
        if i.kind == "int":
            print(
                f"{name:<20}{i.bits:>5}{'':>4}{'':>4}{'':>6}{i.max:>14.6g}{'':>14}{'':>14}{'':>10}"
                f"  {'':3} {'':3}  {i.container}"
            )
            continue
        print(
            f"{name:<20}{i.bits:>5}{i.ebits:>4}{i.mbits:>4}{i.bias:>6}{i.max:>14.6g}"
            f"{i.smallest_normal:>14.6g}{i.smallest_subnormal:>14.6g}{i.eps:>10.4g}  "
            f"{'yes' if i.has_inf else 'no':3} {'yes' if i.has_nan else 'no':3}  {i.container}"
            + (f" (4 x {i.element})" if i.kind == "packed" else "")
        )
    return 0


class _UsageError(NeuronKernelsError):
    """A combination of command-line options that does not make sense."""


def _file_command(
    sub: Any, name: str, help_: str, func: Callable[[argparse.Namespace], int], source: str, output: str | None
) -> argparse.ArgumentParser:
    """A subcommand on files: INPUT [OUTPUT] and the options every file command has."""
    p = sub.add_parser(name, help=help_)
    p.add_argument("input", help=source)
    if output:
        p.add_argument("output", help=output)
    p.add_argument("--name", help="only the array of this name (.npz/.safetensors/MX files of several)")
    p.add_argument(
        "--chunk-mb",
        type=_positive_int,
        default=256,
        metavar="MB",
        help="memory for one piece of the input (default 256)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=func)
    return p


def _shard_option(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--max-shard-size",
        type=parse_bytes,
        default=default,
        metavar="SIZE",
        help="largest .safetensors shard of a checkpoint output (default 5GB; 500MB, 2GiB, ...)",
    )


def _block_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--block-size", type=_positive_int, default=None, help="elements per block (default: the format's, 32 or 16)"
    )
    p.add_argument("--axis", type=int, default=-1, help="the block axis (default -1, the last)")


def _block_shape(text: str) -> tuple[int, ...]:
    parts = text.replace("x", ",").split(",")
    try:
        dims = tuple(int(v) for v in parts)
    except ValueError:
        dims = ()
    if len(dims) != 2 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"invalid block shape {text!r}: give ROWSxCOLS such as 16x16 or 8x4")
    return dims


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: give a positive integer")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``--help`` still shows the usage)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from .formats import BLOCK_FORMATS
    from .io.stream import POLICIES
    from .modes import BLOCK_ROUNDING_MODES, FOUR_OVER_SIX, ROUNDING_MODES, SCALE_MODES, SCALE_SEARCHES

    p = _Parser(prog="neuron-kernels", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    b = sub.add_parser("bench", help="throughput of every compiled cast and MX format on a built-in array")
    b.add_argument("--size", type=parse_size, default=64 << 20, help="elements (default 64Mi)")
    b.add_argument("--repeat", type=_positive_int, default=5, help="timed runs per measurement (default 5)")
    b.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    b.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart (needs neuron_kernels[plot])")
    b.add_argument("--quiet", action="store_true", help="no progress messages")
    b.set_defaults(func=_cmd_bench)

    from .checkpoints import DEFAULT_MAX_SHARD_BYTES, LAYOUTS

    arrays = ".npy, .npz or .safetensors file"
    q = _file_command(
        sub,
        "quantize",
        "quantise the arrays of a file (to the package's .npz file) or a checkpoint (to a layout runtimes load)",
        _cmd_quantize,
        arrays + ", a checkpoint folder of .safetensors shards, or a Zarr store (.zarr)",
        "the MX file to write (.npz), the checkpoint folder to write, or the Zarr store (.zarr)",
    )
    q.add_argument("--format", required=True, choices=list(BLOCK_FORMATS))
    q.add_argument(
        "--layout",
        choices=list(LAYOUTS),
        help="checkpoint layout: "
        + "; ".join(f"{k}: {v.help}" for k, v in LAYOUTS.items())
        + " (default for a checkpoint folder: compressed-tensors)",
    )
    q.add_argument(
        "--ignore", action="append", metavar="PATTERN", help="also keep tensors matching this pattern (repeatable)"
    )
    q.add_argument(
        "--only", action="append", metavar="PATTERN", help="quantise only tensors matching this pattern (repeatable)"
    )
    q.add_argument(
        "--no-fuse",
        action="store_true",
        help="a per-tensor scale of its own for each shard of a layer runtimes fuse (q/k/v, gate/up, ...); "
        "by default they share one, as the runtimes keep one for the fused layer",
    )
    _block_options(q)
    q.add_argument("--block-shape", type=_block_shape, metavar="RxC", help="2-D tiles over the last two axes")
    q.add_argument("--scale-mode", default=None, choices=list(SCALE_MODES), help="default: the format's")
    q.add_argument("--rounding", default="nearest_even", choices=list(BLOCK_ROUNDING_MODES))
    q.add_argument("--seed", type=int, help="seed of stochastic rounding")
    q.add_argument("--no-pack", action="store_true", help="store 4-bit codes one per byte")
    q.add_argument("--per-tensor-scale", metavar="amax|none|X", help="NVFP4's per-tensor scale (default amax)")
    q.add_argument(
        "--four-over-six", choices=list(FOUR_OVER_SIX), help="NVFP4: keep the better of the /6 and /4 scales"
    )
    q.add_argument("--scale-search", choices=list(SCALE_SEARCHES), help="try the neighbouring scales of each block")
    q.add_argument("--rht", action="store_true", help="NVFP4: random Hadamard rotation of 16-element groups")
    q.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="run a Zarr job on a local Dask cluster of N worker processes (needs neuron_kernels[dask])",
    )
    q.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run a Zarr job on the Dask cluster at ADDRESS (tcp://host:8786; needs neuron_kernels[dask])",
    )
    _shard_option(q, DEFAULT_MAX_SHARD_BYTES)

    d = _file_command(
        sub,
        "dequantize",
        "an MX file back to float arrays, or a quantised checkpoint back to a plain one",
        _cmd_dequantize,
        "an MX .npz file, or a quantised checkpoint folder (any --layout of quantize)",
        ".npy (one array), .npz or .safetensors; or a checkpoint folder",
    )
    d.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float64", "float16", "bfloat16"],
        help="default: float32 for files, bfloat16 for checkpoints",
    )
    _shard_option(d, DEFAULT_MAX_SHARD_BYTES)

    c = _file_command(
        sub,
        "cast",
        "cast the arrays of a file to another dtype",
        _cmd_cast,
        arrays,
        ".npy (one array), .npz or .safetensors",
    )
    c.add_argument("--to", required=True, metavar="DTYPE", help="target dtype (see `neuron-kernels formats`)")
    c.add_argument("--rounding", default="nearest_even", choices=list(ROUNDING_MODES))
    c.add_argument("--saturate", action="store_true", help="clamp overflow to the largest finite value")
    c.add_argument("--seed", type=int, help="seed of stochastic rounding")

    e = _file_command(
        sub,
        "error",
        "every block format x scale mode x policy on the arrays of a file, best first",
        _cmd_error,
        arrays,
        None,
    )
    e.add_argument("--formats", help=f"comma-separated subset of {','.join(BLOCK_FORMATS)}")
    e.add_argument("--scale-modes", help=f"comma-separated subset of {','.join(SCALE_MODES)}")
    e.add_argument("--policies", help=f"comma-separated subset of {','.join(POLICIES)}")
    _block_options(e)
    e.add_argument("--plot", metavar="FILE.png", help="histogram of relative errors (needs neuron_kernels[plot])")

    w = sub.add_parser("warmup", help="compile the common kernels ahead of their first use, on every core")
    w.add_argument("--formats", help="comma-separated block formats and cast targets (default: all)")
    w.add_argument("--sources", help="comma-separated source dtypes (default: float32,bfloat16)")
    w.add_argument("--jobs", type=_positive_int, help="compiling processes (default: one per core)")
    w.add_argument("--quiet", action="store_true", help="no progress messages")
    w.set_defaults(func=_cmd_warmup)

    pr = sub.add_parser("promote", help="promote_type of two dtypes, or the whole grid")
    pr.add_argument("a", nargs="?")
    pr.add_argument("b", nargs="?")
    pr.add_argument("--explain", action="store_true", help="say which rule decided")
    pr.add_argument("--table", action="store_true", help="print the whole promotion grid")
    pr.set_defaults(func=_cmd_promote)
    f = sub.add_parser("formats", help="the format table, finfo-style")
    f.set_defaults(func=_cmd_formats)
    return p


@contextlib.contextmanager
def _compile_notice(args: argparse.Namespace) -> Iterator[None]:
    """One line on a terminal when the command first compiles a kernel (the library's own
    one-time log message is left out: a command's stderr is its errors)."""
    if args.command in ("promote", "formats"):  # nothing to compile: no numba import
        yield
        return
    from ._jit import on_compile

    shown = [not getattr(args, "quiet", False) and sys.stderr.isatty()]

    def callback(what: str, name: str, seconds: float) -> None:
        if shown[0] and what == "start":
            shown[0] = False
            print(
                "neuron-kernels: compiling kernels for their first use (once: they are cached on disk; "
                "`neuron-kernels warmup` prepares them ahead)",
                file=sys.stderr,
                flush=True,
            )

    with on_compile(callback):
        yield


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    previous = signal.getsignal(signal.SIGTERM)
    with contextlib.suppress(ValueError):  # not the main thread: leave SIGTERM alone
        signal.signal(signal.SIGTERM, _terminate)  # clean up partial outputs as on Ctrl-C
    try:
        with _compile_notice(args):
            return int(args.func(args))
    except (NeuronKernelsError, OSError) as exc:  # the caller's mistakes (_UsageError too); else a bug
        message = (
            str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.filename}: {exc.strerror or exc}"
        )
        print(f"neuron-kernels {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"neuron-kernels {args.command}: interrupted; no output written", file=sys.stderr)
        return 130
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
