"""The subcommands: one function per command name (:data:`COMMANDS`), each taking the parsed
arguments and returning the exit status. ``quantize`` and ``dequantize`` run the function of
their kind of input (:mod:`.inputs`)."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

from . import bench, checkpoints, doctor, files, gguf, info, stores
from .inputs import by_input_kind

__all__ = ["COMMANDS"]

#: Command name -> the function that runs it.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "bench": bench.cmd_bench,
    "quantize": functools.partial(
        by_input_kind,
        {
            "gguf": gguf.cmd_quantize,
            "zarr": stores.cmd_quantize,
            "checkpoint": checkpoints.cmd_quantize,
            "file": files.cmd_quantize,
        },
    ),
    "dequantize": functools.partial(
        by_input_kind,
        {"gguf": gguf.cmd_dequantize, "checkpoint": checkpoints.cmd_dequantize, "file": files.cmd_dequantize},
    ),
    "check": doctor.cmd_check,
    "diff": doctor.cmd_diff,
    "cast": files.cmd_cast,
    "error": files.cmd_error,
    "warmup": bench.cmd_warmup,
    "promote": info.cmd_promote,
    "formats": info.cmd_formats,
}
