"""The kinds of input of ``quantize`` and ``dequantize`` (a GGUF file, an array file, a
checkpoint folder, a Zarr store), told apart by one table, and the command of each kind."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping

__all__ = ["INPUT_KINDS", "by_input_kind"]


def _gguf_job(args: argparse.Namespace) -> bool:
    """Whether a command reads or writes a GGUF file (llama.cpp's)."""
    from .gguf import is_gguf_job

    return is_gguf_job(args)


def _zarr_job(args: argparse.Namespace) -> bool:
    """Whether a command reads or writes a Zarr store, or runs on a Dask cluster what is not a
    checkpoint (the Zarr command then says what a cluster runs)."""
    from ...lazy.stores import is_zarr

    output = getattr(args, "output", "") or ""
    on_cluster = getattr(args, "workers", None) is not None or getattr(args, "scheduler", None) is not None
    return is_zarr(args.input) or is_zarr(output) or (on_cluster and not _checkpoint_input(args))


def _checkpoint_input(args: argparse.Namespace) -> bool:
    """Whether a command works on a checkpoint (a folder, a layout asked for, or an output that is
    no array file) rather than on array files."""
    from ...io.arrays import ARRAY_FILES

    output = getattr(args, "output", "") or ""
    return (
        os.path.isdir(args.input)
        or getattr(args, "layout", None) is not None
        or (bool(output) and os.path.splitext(output)[1].lower() not in ARRAY_FILES)
    )


def _array_file(args: argparse.Namespace) -> bool:
    """Any input the kinds before it are not: the array file commands report what is wrong with it."""
    return True


#: The kinds of input, in the order they are told apart: an input is of the first kind whose
#: test holds (among the kinds its command takes).
INPUT_KINDS: tuple[tuple[str, Callable[[argparse.Namespace], bool]], ...] = (
    ("gguf", _gguf_job),
    ("zarr", _zarr_job),
    ("checkpoint", _checkpoint_input),
    ("file", _array_file),
)


def by_input_kind(commands: Mapping[str, Callable[[argparse.Namespace], int]], args: argparse.Namespace) -> int:
    """Run the command of ``commands`` (kind of input -> command) for the kind of ``args.input``."""
    kind = next(kind for kind, test in INPUT_KINDS if kind in commands and test(args))
    _check_schemes(args, kind)
    if getattr(args, "follow_links", False):  # --follow-links: a checkpoint's links followed wherever they lead
        from ...checkpoints.folder import follow_links

        with follow_links():
            return commands[kind](args)
    return commands[kind](args)


def _check_schemes(args: argparse.Namespace, kind: str) -> None:
    """``quantize`` needs ``--format``, but of a checkpoint, where ``--scheme`` or ``--recipe-file`` may
    say the formats instead (and into GGUF with ``--template``, which carries every weight it can);
    those two are for checkpoints only, and not together."""
    from ..parser import UsageError

    if args.command != "quantize":
        return
    per_module = bool(getattr(args, "scheme", None)) or getattr(args, "recipe_file", None) is not None
    if per_module and kind != "checkpoint":
        raise UsageError("--scheme and --recipe-file choose the schemes of a checkpoint's modules (a folder)")
    if args.scheme and args.recipe_file is not None:
        raise UsageError("give --scheme PATTERN=FORMAT options or a --recipe-file, not both")
    carry = getattr(args, "template", None) is not None  # into GGUF: every weight it can carry, or --format's
    if args.format is None and not per_module and not carry:
        raise UsageError(
            "--format is required (of a checkpoint, --scheme PATTERN=FORMAT or --recipe-file may say the formats; "
            "into GGUF with --template, every weight it holds by default)"
        )
