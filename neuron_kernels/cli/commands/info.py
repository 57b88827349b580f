"""``promote`` (the promotion lattice) and ``formats`` (the format table): no kernel, no numba."""

from __future__ import annotations

import argparse

from ..parser import UsageError

__all__ = ["cmd_formats", "cmd_promote"]


def cmd_promote(args: argparse.Namespace) -> int:
    from ...neuron.promotion import explain_promotion, promotion_table

    if args.table:
        print(promotion_table())
        return 0
    if not (args.a and args.b):
        raise UsageError("promote needs two dtypes (or --table)")
    p = explain_promotion(args.a, args.b)
    if p.error is not None:
        raise p.error  # one line on stderr, exit status 2, as for any other user error
    print(str(p) if args.explain else p.result.name)
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    from ...dtypes import format_info
    from ...formats import FORMATS

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
