"""``check`` (what would make a checkpoint's runtime refuse it or load it wrong; ``--repair OUT``)
and ``diff`` (two checkpoints tensor by tensor): :mod:`neuron_kernels.checkpoints.doctor` and
:mod:`neuron_kernels.checkpoints.diff`."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from ..report import table

__all__ = ["cmd_check", "cmd_diff"]


def _number(x: float) -> Any:
    """A float as JSON takes it (inf and NaN as strings)."""
    return x if math.isfinite(x) else str(x)


def _json(obj: Any) -> Any:
    if isinstance(obj, float):
        return _number(obj)
    if isinstance(obj, dict):
        return {k: _json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json(v) for v in obj]
    return obj


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0: nothing found; 1: findings (errors or warnings); 2: unreadable (or bad usage)."""
    from ...checkpoints.folder import follow_links

    with follow_links(args.follow_links):
        return _check(args)


def _check(args: argparse.Namespace) -> int:
    from ...checkpoints.doctor import check_checkpoint, repair_checkpoint
    from ...io.outputs import atomic_output

    checkup = check_checkpoint(args.input, args.chunk_mb << 20)
    repairs = []
    if args.repair is not None:
        with atomic_output(args.repair, args.force, (args.input,), directory=True) as tmp:
            repairs = repair_checkpoint(args.input, tmp, args.chunk_mb << 20)
    if args.json:
        report = checkup.as_dict() | ({"repairs": [r.__dict__ for r in repairs]} if args.repair else {})
        print(json.dumps(_json(report), indent=2))
        return 0 if checkup.clean else 1
    what = f"{checkup.layout} layout" if checkup.layout else "plain"
    by = f", made by {checkup.producer}" if checkup.producer else ""
    counts = {s: sum(f.severity == s for f in checkup.findings) for s in ("error", "warning")}
    print(f"{checkup.path}: {what}{by}, {checkup.weights} quantised weight(s): {counts['error']} error(s), "
          f"{counts['warning']} warning(s)")  # fmt: skip
    for f in checkup.findings:
        print(f"{f.severity}: {f.kind}: {f.message}")
        for name, db in f.sqnr_db.items():
            print(f"    {name}: {db:.1f} dB under the runtime's rule")
    for r in repairs:
        print(f"repair {'done' if r.done else 'not done'}: {r.kind}: {', '.join(r.tensors)}: {r.why}")
        for name in r.before_db:
            print(f"    {name}: {r.before_db[name]:.1f} dB -> {r.after_db.get(name, math.nan):.1f} dB")
    if args.repair is not None:
        done = sum(r.done for r in repairs)
        print(f"{args.repair}: written, {done} repair(s) made, {len(repairs) - done} not; every other byte copied")
    return 0 if checkup.clean else 1


def cmd_diff(args: argparse.Namespace) -> int:
    """Exit 0: the same values everywhere; 1: they differ somewhere; 2: unreadable."""
    from ...checkpoints.diff import diff_checkpoints
    from ...checkpoints.folder import follow_links

    with follow_links(args.follow_links):
        d = diff_checkpoints(args.a, args.b, args.chunk_mb << 20)
    if args.json:
        report = {"tensors": [t.__dict__ for t in d.tensors], "only_a": d.only_a, "only_b": d.only_b,
                  "same_values": d.same_values}  # fmt: skip
        print(json.dumps(_json(report), indent=2))
        return 0 if d.same_values else 1
    same_bytes = sum(t.bytes_equal is True for t in d.tensors)
    same_values = sum(t.values_equal for t in d.tensors)
    print(f"{len(d.tensors)} tensor(s) in both: {same_bytes} with equal bytes, {same_values} with equal values; "
          f"{len(d.only_a)} only in {args.a}, {len(d.only_b)} only in {args.b}")  # fmt: skip
    differ = [t for t in d.tensors if not t.values_equal]
    if differ:
        rows = [(t.name, t.a, t.b, f"{t.sqnr_db:.2f}", f"{t.max_abs_diff:.3g}") for t in differ]
        lines = table(("differ", "A", "B", "SQNR dB", "max |diff|"), rows, 3).splitlines()
        print(lines[0])
        for line, t in zip(lines[1:], differ):
            print(line + (f"\n    {t.why}" if t.why else ""))
    for name in d.only_a:
        print(f"only in {args.a}: {name}")
    for name in d.only_b:
        print(f"only in {args.b}: {name}")
    return 0 if d.same_values else 1
