"""``quantize`` and ``dequantize`` of GGUF files (llama.cpp's), GGUF in and GGUF out
(:mod:`neuron_kernels.checkpoints.gguf_convert`)."""

from __future__ import annotations

import argparse
import os

from ..parser import UsageError, block_options_of
from ..progress import progress_bar
from ..report import name_columns, stats_header, stats_row

__all__ = ["cmd_dequantize", "cmd_quantize", "is_gguf_job"]

_SUFFIX = ".gguf"


def is_gguf_job(args: argparse.Namespace) -> bool:
    """Whether a command reads or writes a GGUF file."""
    output = getattr(args, "output", "") or ""
    template = getattr(args, "template", None) is not None
    return template or args.input.lower().endswith(_SUFFIX) or output.lower().endswith(_SUFFIX)


def _check_paths(args: argparse.Namespace, what: str) -> None:
    if not (args.input.lower().endswith(_SUFFIX) and args.output.lower().endswith(_SUFFIX)):
        raise UsageError(
            f"a GGUF file is {what} into a GGUF file: INPUT and OUTPUT must both end in {_SUFFIX}"
            + (
                " (a quantised checkpoint folder goes into GGUF with --template MODEL.gguf)"
                if what == "quantised"
                else ""
            )
        )
    if args.name is not None:
        raise UsageError(f"--name picks an array of a file; a GGUF file is {what} whole")
    unused = [
        flag
        for flag, given in (
            ("--layout", getattr(args, "layout", None) is not None),
            ("--only", bool(getattr(args, "only", None))),
            ("--ignore", bool(getattr(args, "ignore", None))),
            ("--workers", getattr(args, "workers", None) is not None),
            ("--scheduler", getattr(args, "scheduler", None) is not None),
            ("--require-exact", bool(getattr(args, "require_exact", False))),
            ("--no-fuse", bool(getattr(args, "no_fuse", False))),
            ("--quantize-towers", bool(getattr(args, "quantize_towers", False))),
        )
        if given
    ]
    if unused:
        raise UsageError(f"{', '.join(unused)} apply to checkpoint folders, not to GGUF files")


def cmd_quantize(args: argparse.Namespace) -> int:
    from ...checkpoints.gguf_convert import GGUF_FORMATS, quantize_gguf

    if getattr(args, "template", None) is not None:
        return _carry(args)
    _check_paths(args, "quantised")
    if args.format not in GGUF_FORMATS:
        raise UsageError(f"GGUF stores {' and '.join(GGUF_FORMATS)} blocks; --format {args.format} is not one of them")
    with progress_bar(args, os.path.getsize(args.input), f"quantize {args.format}") as progress:
        reports = quantize_gguf(
            args.input,
            args.output,
            args.format,
            force=args.force,
            chunk_bytes=args.chunk_mb << 20,
            progress=progress,
            stats=not args.no_stats,
            **block_options_of(args),
        )
    done = [r for r in reports if r.action == "quantised"]
    kept = [r for r in reports if r.action == "kept"]
    spec = GGUF_FORMATS[args.format]
    print(f"{args.output}: GGUF {spec.ggml_type}: {len(done)} tensor(s) quantised, {len(kept)} kept")
    width = max([32] + [len(r.name) + 2 for r in reports])
    if done:
        measured = all(r.stats is not None for r in done)
        print(stats_header("quantised", width, dtype=True) if measured else name_columns("quantised", "shape", width))
        for r in done:
            scaled = " + .scale" if len(r.outputs) > 1 else ""
            row = (
                stats_row(r.name, r.shape, r.stats, width, r.dtype)
                if measured
                else name_columns(r.name, str(r.shape), width)
            )
            print(row + scaled)
    if kept:
        print(name_columns("kept", "shape", width, "type") + "  why")
        for r in kept:
            print(name_columns(r.name, str(r.shape), width, r.dtype) + f"  {r.reason}")
    return 0


def _carry(args: argparse.Namespace) -> int:
    """A quantised checkpoint folder carried into GGUF (docs/gguf.md "Carried over without loss")."""
    from ...checkpoints.gguf_carry import carry_into_gguf

    if not args.output.lower().endswith(_SUFFIX) or not args.template.lower().endswith(_SUFFIX):
        raise UsageError(f"--template and OUTPUT are GGUF files (ending in {_SUFFIX})")
    if not os.path.isdir(args.input) and not args.input.lower().endswith(".safetensors"):
        raise UsageError("with --template, INPUT is a quantised checkpoint folder (or .safetensors file)")
    with progress_bar(args, os.path.getsize(args.template), "carry into GGUF") as progress:
        reports = carry_into_gguf(
            args.input,
            args.template,
            args.output,
            args.format,
            force=args.force,
            progress=progress,
            require_exact=bool(getattr(args, "require_exact", False)),
        )
    carried = [r for r in reports if r.action == "converted"]
    print(f"{args.output}: {len(carried)} weight(s) carried from {args.input}, the rest from {args.template}")
    width = max([32] + [len(r.name) + 2 for r in reports])
    for r in carried:
        print(name_columns(r.name, str(r.shape), width, r.dtype) + f"  {r.reason}")
    for r in reports:
        if r.action == "kept" and r.reason != "the template's":
            print(name_columns(r.name, str(r.shape), width, r.dtype) + f"  kept: {r.reason}")
    return 0


def cmd_dequantize(args: argparse.Namespace) -> int:
    from ...checkpoints.gguf_convert import dequantize_gguf

    _check_paths(args, "dequantised")
    dtype = args.dtype or "float32"
    with progress_bar(args, os.path.getsize(args.input), "dequantize") as progress:
        reports = dequantize_gguf(args.input, args.output, dtype, force=args.force, progress=progress)
    done = [r for r in reports if r.action == "dequantised"]
    print(f"{args.output}: {len(done)} tensor(s) dequantised to {dtype}, {len(reports) - len(done)} copied or folded")
    for r in reports:
        if r.action == "kept" and r.reason != "copied as stored":
            print(f"  {r.name}: {r.reason}")
    return 0
