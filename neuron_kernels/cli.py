"""The ``neuron-kernels`` command (also ``python -m neuron_kernels``).

Subcommands: ``bench`` (throughput of every compiled cast on built-in data), ``promote``
(the promotion lattice: one pair, ``--explain``, or ``--table``) and ``formats`` (the format
table). Bad input prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

__all__ = ["main"]

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]i?)?\s*$")
_UNITS = {"": 1, "k": 1000, "ki": 1 << 10, "m": 10**6, "mi": 1 << 20, "g": 10**9, "gi": 1 << 30}


def parse_size(text: str) -> int:
    """``"64Mi"`` -> 67108864; plain integers, k/M/G (powers of 10) and Ki/Mi/Gi (powers of 2)."""
    m = _SIZE.match(text)
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: give a positive element count such as 1048576, 1Mi or 64Mi")
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench_casts, format_table

    def progress(msg: str) -> None:
        if not args.quiet and sys.stderr.isatty():
            print(f"  measuring {msg} ...", file=sys.stderr)

    rows = bench_casts(args.size, repeat=args.repeat, progress=progress)
    print(f"{args.size:,} float32 elements, median of {args.repeat} runs, "
          f"{os.environ.get('NEURON_KERNELS_NUM_THREADS') or 'all available'} threads")
    print(format_table(rows))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump([r.as_dict() for r in rows], fh, indent=2)
        os.replace(tmp, args.json)
    return 0


def _cmd_promote(args: argparse.Namespace) -> int:
    from .promotion import explain_promotion, promotion_table

    if args.table:
        print(promotion_table())
        return 0
    if not (args.a and args.b):
        raise _UsageError("promote needs two dtypes (or --table)")
    p = explain_promotion(args.a, args.b)
    if p.error is not None:
        print(f"{type(p.error).__name__}: {p.error}")
        return 1
    print(str(p) if args.explain else p.result.name)
    return 0


def _cmd_formats(args: argparse.Namespace) -> int:
    from .formats import FORMATS, format_info

    head = (f"{'name':<20}{'bits':>5}{'E':>4}{'M':>4}{'bias':>6}{'max':>14}{'min normal':>14}"
            f"{'min subnorm':>14}{'eps':>10}  inf nan  array dtype")
    print(head)
    for name in FORMATS:
        i = format_info(name)
        if i.kind == "int":
            print(f"{name:<20}{i.bits:>5}{'':>4}{'':>4}{'':>6}{i.max:>14.6g}{'':>14}{'':>14}{'':>10}"
                  f"  {'':3} {'':3}  {i.container}")
            continue
        print(f"{name:<20}{i.bits:>5}{i.ebits:>4}{i.mbits:>4}{i.bias:>6}{i.max:>14.6g}"
              f"{i.smallest_normal:>14.6g}{i.smallest_subnormal:>14.6g}{i.eps:>10.4g}  "
              f"{'yes' if i.has_inf else 'no':3} {'yes' if i.has_nan else 'no':3}  {i.container}"
              + (f" (4 x {i.element})" if i.kind == "packed" else ""))
    return 0


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neuron-kernels", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="throughput of every compiled cast on a built-in array")
    b.add_argument("--size", type=parse_size, default=64 << 20, help="elements (default 64Mi)")
    b.add_argument("--repeat", type=int, default=5, help="timed runs per measurement (default 5)")
    b.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    b.add_argument("--quiet", action="store_true", help="no progress messages")
    b.set_defaults(func=_cmd_bench)
    pr = sub.add_parser("promote", help="promote_type of two dtypes, or the whole grid")
    pr.add_argument("a", nargs="?")
    pr.add_argument("b", nargs="?")
    pr.add_argument("--explain", action="store_true", help="say which rule decided")
    pr.add_argument("--table", action="store_true", help="print the whole promotion grid")
    pr.set_defaults(func=_cmd_promote)
    f = sub.add_parser("formats", help="the format table, finfo-style")
    f.set_defaults(func=_cmd_formats)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "repeat", 1) < 1:
        parser.error("--repeat must be a positive integer")
    try:
        return int(args.func(args))
    except (_UsageError, TypeError, ValueError) as exc:
        print(f"neuron-kernels {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
