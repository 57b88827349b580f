"""The command line's parser: the subcommands and their options, the option types, the error of an
option combination that does not make sense, and the options of a quantisation read back from
the parsed arguments."""

from __future__ import annotations

import argparse
from typing import Any

from ..blocks.scheme import OPTIONS, Scheme
from ..errors import NeuronKernelsError
from ..formats import FLOAT_SCALE_DTYPES, INPUT_DTYPES
from .quantities import parse_bytes, parse_size

__all__ = ["UsageError", "block_options_of", "build_parser", "scheme_from_args"]


class UsageError(NeuronKernelsError):
    """A combination of command-line options that does not make sense."""


def scheme_from_args(args: argparse.Namespace) -> Scheme:
    """The :class:`~neuron_kernels.blocks.scheme.Scheme` the command line gives: ``--format`` and
    each option of :data:`~neuron_kernels.blocks.scheme.OPTIONS` given under its own name, but
    ``--no-pack`` (``pack``) and ``--per-tensor-scale`` (amax, none or a number)."""
    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None}
    given["pack"] = not args.no_pack
    if args.per_tensor_scale is not None:
        per_tensor: Any = {"amax": "amax", "none": None}.get(args.per_tensor_scale.lower(), args.per_tensor_scale)
        if isinstance(per_tensor, str) and per_tensor != "amax":
            try:
                per_tensor = float(per_tensor)
            except ValueError:
                raise UsageError(
                    f"--per-tensor-scale must be amax, none or a positive number, not {args.per_tensor_scale!r}"
                ) from None
        given["per_tensor_scale"] = per_tensor
    return Scheme(args.format, **given)


def block_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`neuron_kernels.quantize` given on the command line (:func:`scheme_from_args`'s)."""
    return scheme_from_args(args).options()


def _file_command(sub: Any, name: str, help_: str, source: str, output: str | None) -> argparse.ArgumentParser:
    """A subcommand on files: INPUT [OUTPUT] and the options every file command has."""
    p = sub.add_parser(name, help=help_)
    p.add_argument("input", help=source)
    if output:
        p.add_argument("output", help=output)
    p.add_argument("--name", help="only the array of this name (.npz/.safetensors/block files of several)")
    p.add_argument(
        "--chunk-mb",
        type=_positive_int,
        default=256,
        metavar="MB",
        help="memory for one piece of the input (default 256)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _shard_option(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--max-shard-size",
        type=parse_bytes,
        default=default,
        metavar="SIZE",
        help="largest .safetensors shard of a checkpoint output (default 5GB; 500MB, 2GiB, ...)",
    )


def _links_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--follow-links",
        action="store_true",
        help="follow the files of a checkpoint folder that are symbolic links leading outside it; by default "
        "only links inside the folder or into its Hugging Face cache repository's blobs/ are followed, and "
        "another is refused (docs/checkpoints.md)",
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


def build_parser(description: str) -> argparse.ArgumentParser:
    """The ``neuron-kernels`` parser; the subcommand's name is the ``command`` of the arguments."""
    p = _Parser(prog="neuron-kernels", description=description)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _bench_command(sub)
    _quantize_command(sub)
    _dequantize_command(sub)
    _cast_command(sub)
    _error_command(sub)
    _warmup_command(sub)
    _check_commands(sub)
    _info_commands(sub)
    return p


#: What the file commands read.
_ARRAYS = ".npy, .npz or .safetensors file"


def _bench_command(sub: Any) -> None:
    b = sub.add_parser("bench", help="throughput of every compiled cast and block format on a built-in array")
    b.add_argument("--size", type=parse_size, default=64 << 20, help="elements (default 64Mi)")
    b.add_argument("--repeat", type=_positive_int, default=5, help="timed runs per measurement (default 5)")
    b.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    b.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart (needs neuron_kernels[plot])")
    b.add_argument("--quiet", action="store_true", help="no progress messages")


def _quantize_command(sub: Any) -> None:
    """``quantize``: its input and output, then the options of a checkpoint conversion, of the
    scheme (:func:`_scheme_options`) and of where it runs."""
    from ..checkpoints import DEFAULT_MAX_SHARD_BYTES, LAYOUTS
    from ..checkpoints.layouts import DEFAULT_LAYOUT, WRITABLE
    from ..formats import BLOCK_FORMATS

    q = _file_command(
        sub,
        "quantize",
        "quantise the arrays of a file (to the package's .npz file) or a checkpoint (to a layout runtimes load)",
        _ARRAYS + ", a checkpoint folder of .safetensors shards, a GGUF file (.gguf), or a Zarr store (.zarr)",
        "the block file to write (.npz), the checkpoint folder to write, the GGUF file (.gguf; docs/gguf.md), "
        "or the Zarr store (.zarr)",
    )
    q.add_argument(
        "--format",
        choices=list(BLOCK_FORMATS),
        help="the block format (of a checkpoint: of every weight no --scheme or --recipe-file group takes)",
    )
    q.add_argument(
        "--scheme",
        action="append",
        metavar="PATTERN=FORMAT[,OPTION=VALUE...]",
        help="a checkpoint's weights matching PATTERN (as --only's) in FORMAT, with these options (as "
        "neuron_kernels.quantize's: scale_dtype=bfloat16, scale_search=mse, ...); repeatable, the first that "
        "matches wins; several formats make a mixed-precision checkpoint (docs/checkpoints.md)",
    )
    q.add_argument(
        "--recipe-file",
        metavar="RECIPE.yaml",
        help="a checkpoint's schemes from a YAML or JSON file of config_groups in the shape of llm-compressor's "
        "(a recipe, a QuantizationModifier's arguments or a quantization_config), matched as compressed-tensors "
        "matches them (docs/checkpoints.md)",
    )
    q.add_argument(
        "--layout",
        choices=list(WRITABLE),
        help="checkpoint layout: "
        + "; ".join(f"{k}: {LAYOUTS[k].help}" for k in WRITABLE)
        + f" (default for a checkpoint folder: {DEFAULT_LAYOUT})",
    )
    q.add_argument(
        "--ignore", action="append", metavar="PATTERN", help="also keep tensors matching this pattern (repeatable)"
    )
    q.add_argument(
        "--only", action="append", metavar="PATTERN", help="quantise only tensors matching this pattern (repeatable)"
    )
    q.add_argument(
        "--modules",
        choices=["auto", "transformers", "table"],
        default="auto",
        help="where a checkpoint's modules (which tensors are Linear weights) come from: its model built by "
        "transformers on the meta device, or the package's table of architectures; auto: the table for the "
        "model types it holds, else transformers where installed (docs/checkpoints.md)",
    )
    q.add_argument(
        "--quantize-towers",
        action="store_true",
        help="also quantise the vision and audio towers of a multimodal model and their projectors, which are kept "
        "in higher precision by default, as producers' recipes keep them (where the runtime builds them "
        "unquantised, as vLLM does Llama 4's, they are kept still)",
    )
    q.add_argument(
        "--no-fuse",
        action="store_true",
        help="a per-tensor scale of its own for each shard of a layer runtimes fuse (q/k/v, gate/up, ...); "
        "by default they share one, as the runtimes keep one for the fused layer",
    )
    q.add_argument(
        "--no-stats",
        action="store_true",
        help="a checkpoint's summary without the error statistics of each weight, which take about 40%% of a "
        "conversion's time (--require-exact computes them still)",
    )
    q.add_argument(
        "--require-exact",
        action="store_true",
        help="refuse (exit 2, nothing written) a checkpoint conversion that would change a value; converting "
        'keeps every value where it can (docs/checkpoints.md "Exact conversions")',
    )
    q.add_argument(
        "--template",
        metavar="MODEL.gguf",
        help="carry a quantised checkpoint folder's NVFP4 / MXFP4 weights into a GGUF OUTPUT without re-quantising, "
        "the metadata, names and other tensors from this GGUF file of the same model (docs/gguf.md)",
    )
    _scheme_options(q)
    q.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="run a Zarr job or a checkpoint conversion on a local Dask cluster of N worker processes "
        "(needs neuron_kernels[dask])",
    )
    q.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run a Zarr job or a checkpoint conversion on the Dask cluster at ADDRESS (tcp://host:8786; its "
        "workers must see the input and output paths; needs neuron_kernels[dask])",
    )
    _shard_option(q, DEFAULT_MAX_SHARD_BYTES)
    _links_option(q)


def _scheme_options(q: argparse.ArgumentParser) -> None:
    """The options of a block quantisation (the fields of :class:`~neuron_kernels.blocks.scheme.Scheme`
    that :func:`scheme_from_args` reads by name)."""
    from ..modes import BLOCK_ROUNDING_MODES, FOUR_OVER_SIX, SCALE_MODES, SCALE_SEARCHES
    from ..recipes import RECIPES

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
        "--scale-dtype",
        choices=list(FLOAT_SCALE_DTYPES),
        help="FP8 with float scales: the dtype of the scales (default: float32, or the layout's)",
    )
    q.add_argument(
        "--recipe",
        choices=list(RECIPES),
        help="quantise as this producer does, bit for bit (docs/recipes.md); it fixes the scale rule, rounding "
        "and per-tensor scale (default: the package's own rules)",
    )


def _dequantize_command(sub: Any) -> None:
    from ..checkpoints import DEFAULT_MAX_SHARD_BYTES

    d = _file_command(
        sub,
        "dequantize",
        "a block file back to float arrays, or a quantised checkpoint back to a plain one",
        "a block file (.npz), a quantised checkpoint folder (any --layout of quantize), or a GGUF file",
        ".npy (one array), .npz or .safetensors; a checkpoint folder; or a GGUF file (from a GGUF file)",
    )
    d.add_argument(
        "--dtype",
        default=None,
        choices=list(INPUT_DTYPES),
        help="default: float32 for files and GGUF files, bfloat16 for checkpoints",
    )
    _shard_option(d, DEFAULT_MAX_SHARD_BYTES)
    _links_option(d)


def _cast_command(sub: Any) -> None:
    from ..modes import ROUNDING_MODES

    c = _file_command(
        sub,
        "cast",
        "cast the arrays of a file to another dtype",
        _ARRAYS,
        ".npy (one array), .npz or .safetensors",
    )
    c.add_argument("--to", required=True, metavar="DTYPE", help="target dtype (see `neuron-kernels formats`)")
    c.add_argument("--rounding", default="nearest_even", choices=list(ROUNDING_MODES))
    c.add_argument("--saturate", action="store_true", help="clamp overflow to the largest finite value")
    c.add_argument("--seed", type=int, help="seed of stochastic rounding")


def _error_command(sub: Any) -> None:
    from ..formats import BLOCK_FORMATS
    from ..io.file_jobs import POLICIES
    from ..modes import SCALE_MODES

    e = _file_command(
        sub,
        "error",
        "every block format x scale mode x policy on the arrays of a file, best first",
        _ARRAYS,
        None,
    )
    e.add_argument("--formats", help=f"comma-separated subset of {','.join(BLOCK_FORMATS)}")
    e.add_argument("--scale-modes", help=f"comma-separated subset of {','.join(SCALE_MODES)}")
    e.add_argument("--policies", help=f"comma-separated subset of {','.join(POLICIES)}")
    _block_options(e)
    e.add_argument("--plot", metavar="FILE.png", help="histogram of relative errors (needs neuron_kernels[plot])")


def _warmup_command(sub: Any) -> None:
    w = sub.add_parser("warmup", help="compile the common kernels ahead of their first use, on every core")
    w.add_argument("--formats", help="comma-separated block formats and cast targets (default: all)")
    w.add_argument("--sources", help="comma-separated source dtypes (default: float32,bfloat16)")
    w.add_argument("--jobs", type=_positive_int, help="compiling processes (default: one per core)")
    w.add_argument("--quiet", action="store_true", help="no progress messages")
    w.add_argument(
        "--status",
        action="store_true",
        help="make each task's calls and say where their kernels come from (local cache, compiled tier, jit)",
    )
    w.add_argument(
        "--build-compiled",
        metavar="DIR",
        help="compile a read-only tier for a CPU level into DIR (the package's _compiled folder in a wheel)",
    )
    w.add_argument("--level", default="x86-64-v3", help="the CPU level of --build-compiled (default x86-64-v3)")


def _check_commands(sub: Any) -> None:
    """``check`` (and ``--repair``) and ``diff``: what a checkpoint holds, against its runtime's rules
    or another checkpoint."""
    c = sub.add_parser(
        "check",
        help="what would make a quantised checkpoint's runtime refuse it or load it wrong (exit 0 clean, 1 findings, "
        "2 unreadable); --repair OUT writes a corrected copy",
    )
    c.add_argument("input", help="a checkpoint folder or .safetensors file, in any layout the package reads")
    c.add_argument("--json", action="store_true", help="the report as JSON")
    c.add_argument("--repair", metavar="OUT", help="write a corrected copy to the folder OUT (docs/checkpoints.md)")
    c.add_argument("--force", action="store_true", help="overwrite an existing OUT")
    c.add_argument("--chunk-mb", type=_positive_int, default=64, metavar="MB", help="memory for one piece (default 64)")
    _links_option(c)
    df = sub.add_parser("diff", help="two checkpoints of one model compared tensor by tensor, in any layouts")
    df.add_argument("a", help="a checkpoint folder or .safetensors file")
    df.add_argument("b", help="another of the same model")
    df.add_argument("--json", action="store_true", help="the comparison as JSON")
    df.add_argument("--chunk-mb", type=_positive_int, default=64, metavar="MB", help="memory for a piece (default 64)")
    _links_option(df)


def _info_commands(sub: Any) -> None:
    pr = sub.add_parser("promote", help="promote_type of two dtypes, or the whole grid")
    pr.add_argument("a", nargs="?")
    pr.add_argument("b", nargs="?")
    pr.add_argument("--explain", action="store_true", help="say which rule decided")
    pr.add_argument("--table", action="store_true", help="print the whole promotion grid")
    sub.add_parser("formats", help="the format table, finfo-style")
