"""``quantize`` and ``dequantize`` of model checkpoint folders, to and from the layouts runtimes
load (:mod:`neuron_kernels.checkpoints`)."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import Any

from ..parser import UsageError, block_options_of, scheme_from_args
from ..progress import progress_bar
from ..report import name_columns, stats_header, stats_row

__all__ = ["cmd_dequantize", "cmd_quantize"]


def cmd_quantize(args: argparse.Namespace) -> int:
    from ...checkpoints import quantize_checkpoint
    from ...checkpoints.layouts import open_any
    from ...io.outputs import atomic_output
    from ...lazy.stores import scheduler

    layout = _checked_layout(args)
    schemes = _schemes(args, layout)
    on_cluster = args.workers is not None or args.scheduler is not None
    ckpt, _ = open_any(os.path.abspath(args.input) if on_cluster else args.input)  # once: its size, its files
    with (
        scheduler(args.scheduler, args.workers) as client,
        progress_bar(args, ckpt.nbytes, f"quantize {_formats_said(args)}") as progress,
        atomic_output(args.output, args.force, (args.input,), directory=not layout.single_file) as tmp,
    ):
        reports = quantize_checkpoint(
            ckpt,
            tmp,
            layout.name,
            args.format,
            ignore=tuple(args.ignore or ()),
            only=tuple(args.only or ()),
            fuse=not args.no_fuse,
            modules=args.modules,
            towers=args.quantize_towers,
            max_shard_bytes=args.max_shard_size,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
            require_exact=args.require_exact,
            stats=not args.no_stats,
            client=client,
            schemes=schemes,
            **(block_options_of(args) if schemes is None else {}),
        )
    _print_summary(args, layout, reports, ckpt)
    return 0


def _schemes(args: argparse.Namespace, layout: Any) -> Any:
    """The :class:`~...checkpoints.scheme_map.SchemeMap` of ``--scheme`` / ``--recipe-file``, every
    scheme taking the command line's options (a ``--scheme``'s own over them), ``--format`` the
    default scheme; None for ``--format`` alone."""
    from ...checkpoints.scheme_map import SchemeMap, parse_scheme_option, read_recipe_file

    default = scheme_from_args(args) if args.format is not None else None
    base = scheme_from_args(argparse.Namespace(**{**vars(args), "format": None})).options()
    if args.recipe_file is not None:
        if layout.group_format is None:
            raise UsageError(f"the {layout.name} layout takes no --recipe-file (its config has no config groups)")
        recipe = read_recipe_file(args.recipe_file, layout.group_format)
        return SchemeMap(recipe.groups, default, recipe.order, recipe.ignore, recipe.source).under(base)
    if not args.scheme:
        return None
    groups = tuple(parse_scheme_option(text) for text in args.scheme)
    return SchemeMap(groups, default, source="--scheme").under(base)


def _formats_said(args: argparse.Namespace, reports: Any = ()) -> str:
    """The formats of a conversion, as the summary says them: ``--format``'s, or each one written with
    the number of its tensors."""
    if not args.scheme and args.recipe_file is None:
        return str(args.format)
    counts = Counter(r.format for r in reports if r.format)
    return ", ".join(f"{fmt} ({n})" for fmt, n in counts.items()) or "schemes per module"


def _checked_layout(args: argparse.Namespace) -> Any:
    """The layout to write, once the options that do not fit a checkpoint conversion are refused."""
    from ...checkpoints import LAYOUTS
    from ...checkpoints.layouts import DEFAULT_LAYOUT
    from ...io.outputs import check_output_path

    if args.name is not None:
        raise UsageError("--name picks an array of a file; for a checkpoint use --only / --ignore")
    layout = LAYOUTS[args.layout or DEFAULT_LAYOUT]
    if args.format is not None:
        layout.check_format(args.format)
    if layout.suffix and not args.output.lower().endswith(layout.suffix):
        raise UsageError(
            f"the {layout.name} layout writes one {layout.suffix} file; OUTPUT must end in {layout.suffix}, "
            f"not {args.output!r}"
        )
    if args.workers is not None and args.scheduler is not None:
        raise UsageError("give --workers N (a local cluster) or --scheduler ADDRESS (an existing one), not both")
    if (args.workers is not None or args.scheduler is not None) and layout.single_file:
        raise UsageError(f"the {layout.name} layout is one file; --workers / --scheduler write checkpoint folders")
    check_output_path(args.output, args.force, (args.input,), directory=not layout.single_file)
    return layout


def _how_converted(converted: list[Any]) -> str:
    """How the weights converted as their codes kept their values: every one exactly, or not."""
    changed = sum(1 for r in converted if not r.exact)
    return "exactly (codes copied)" if not changed else f"({changed} with elements changed: see how)"


def _print_summary(args: argparse.Namespace, layout: Any, reports: Any, ckpt: Any) -> None:
    """What the conversion did: each tensor quantised (with its statistics), converted or kept (with
    why), the towers kept, the fused layers, the files not copied, the runtimes' notes."""
    from ...checkpoints.selection import TOWER_KEPT

    done = [r for r in reports if r.action == "quantised"]
    converted = [r for r in reports if r.action == "converted"]
    kept = [r for r in reports if r.action == "kept"]
    print(
        f"{args.output}: {layout.name} layout, {_formats_said(args, reports)}{_where(args)}: {len(done)} tensor(s) "
        "quantised, "
        + (f"{len(converted)} converted {_how_converted(converted)}, " if converted else "")
        + f"{len(kept)} kept"
    )
    width = max([32] + [len(r.name) + 2 for r in reports])
    measured = all(r.stats is not None for r in done)  # not with --no-stats
    if done:
        print(
            stats_header("quantised", width, dtype=True)
            if measured
            else name_columns("quantised", "shape", width, "dtype")
        )
        for r in done:
            print(
                stats_row(r.name, r.shape, r.stats, width, r.dtype)
                if measured
                else name_columns(r.name, str(r.shape), width, r.dtype)
            )
        for how, count in Counter(r.reason for r in done if r.reason).items():
            print(f"{count} of them {how}, then quantised")
        from_stored = [r for r in done if r.reason.startswith("dequantised from")]
        if from_stored and measured:
            exact = sum(bool(r.exact) for r in from_stored)
            print(f"exact: {exact} of the {len(from_stored)} converted by quantising anew keep every value")
    if not layout.config_in_json:  # the runtime's settings, which config.json does not hold
        for name in layout.config_files:
            print(f"the runtime's settings: {os.path.join(args.output, name)} ({layout.help})")
    if converted:
        fw = max([10] + [len(r.dtype) + 2 for r in converted])
        print(name_columns("converted", "shape", width) + f"{'format':>{fw}}  how")
        for r in converted:
            print(name_columns(r.name, str(r.shape), width) + f"{r.dtype:>{fw}}  {r.reason}")
    if kept:
        print(name_columns("kept", "shape", width, "dtype") + "  why")
        for r in kept:
            print(name_columns(r.name, str(r.shape), width, r.dtype) + f"  {r.reason}")
    for r in reports:
        if r.action == "dropped":
            print(f"dropped: {r.name} ({r.dtype}, {r.shape}): {r.reason}")
    towers = _towers([r.name for r in kept if r.reason == TOWER_KEPT])
    if towers:
        print(f"towers kept in higher precision (as producers' recipes keep them): {', '.join(towers)}; "
              "--quantize-towers quantises them")  # fmt: skip
    fused = list(dict.fromkeys(r.fused_with for r in reports if r.fused_with))
    for group in fused:
        print(f"one per-tensor scale (fused in the runtime): {', '.join(group)}")
    for name, why in ckpt.skipped:
        print(f"not copied: {name}: {why}")
    if reports.architecture is not None:
        print(f"Linear modules from {reports.architecture.source}")
    for note in reports.notes:
        print(f"note: {note}")


def _towers(names: list[str]) -> list[str]:
    """The towers of a multimodal model as the summary names them: each kept Linear's first name
    component (the first two under ``model.``), as a pattern."""
    heads = [".".join(n.split(".")[: 2 if n.startswith("model.") else 1]) for n in names]
    return [f"{h}.*" for h in dict.fromkeys(heads)]


def _where(args: argparse.Namespace) -> str:
    if args.scheduler is not None:
        return f" (on {args.scheduler})"
    return f" ({args.workers} local workers)" if args.workers is not None else ""


def cmd_dequantize(args: argparse.Namespace) -> int:
    from ...checkpoints import dequantize_checkpoint
    from ...io.outputs import atomic_output

    if args.name is not None:
        raise UsageError("--name picks an array of a file; a checkpoint is dequantised whole")
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
        progress_bar(args, total, "dequantize") as progress,
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
    dropped = [r for r in reports if r.action == "dropped"]
    copied = len(reports) - len(done) - len(dropped)
    print(
        f"{args.output}: {len(done)} weight(s) dequantised to {dtype}, {copied} tensor(s) copied"
        + (f", {len(dropped)} dropped" if dropped else "")
    )
    for r in done:
        print(f"  {r.name} ({r.dtype}, {r.shape}) -> {', '.join(r.outputs)}" + (f" {r.reason}" if r.reason else ""))
    for r in dropped:
        print(f"  {r.name} ({r.dtype}, {r.shape}) dropped: {r.reason}")
    return 0
