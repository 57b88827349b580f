"""``bench`` (throughput of every compiled cast and block format) and ``warmup`` (compiling the
common kernels ahead of their first use)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..progress import progress_bar, warm
from .charts import check_png

__all__ = ["cmd_bench", "cmd_warmup"]


def cmd_bench(args: argparse.Namespace) -> int:
    from ...tools.bench import BLOCK_CASES, bench_blocks, bench_casts, default_cases, format_block_table, format_table

    if args.plot:
        check_png(args.plot, force=True)
    sources = ("float32", "bfloat16")
    warm(
        args,
        [("quantize", s, f) for _, f, _ in BLOCK_CASES for s in sources]
        + [("cast", s, t) for s, t, r in default_cases() if r == "nearest_even"],
        "bench",
    )
    total = len(default_cases()) + len(BLOCK_CASES)
    with progress_bar(args, total, "bench", unit="pair") as step:
        rows = bench_casts(args.size, repeat=args.repeat, progress=step)
        mx_rows = bench_blocks(args.size, repeat=args.repeat, progress=step)
    print(
        f"{args.size:,} float32 elements, median of {args.repeat} runs, "
        f"{os.environ.get('NEURON_KERNELS_NUM_THREADS') or 'all available'} threads"
    )
    print(format_table(rows))
    print()
    print(format_block_table(mx_rows))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"casts": [r.as_dict() for r in rows], "mx": [r.as_dict() for r in mx_rows]}, fh, indent=2)
        os.replace(tmp, args.json)
    if args.plot:
        from ...tools.plots import bench_chart

        bench_chart(rows, mx_rows, args.plot)
        print(f"chart written to {args.plot}")
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    from ...tools.warmup import WARMUP_SOURCES, warmup, warmup_tasks

    formats = args.formats.split(",") if args.formats else None
    if args.build_compiled:
        return _build_compiled(args, formats)
    sources = args.sources.split(",") if args.sources else list(WARMUP_SOURCES)
    tasks = warmup_tasks(formats, sources)
    if args.status:
        return _status(tasks)
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


def _status(tasks: list[Any]) -> int:
    """``warmup --status``: each task's kernels and where they came from."""
    from ..._jit import compiled_tiers
    from ...tools.warmup import describe, task_origins

    tiers = compiled_tiers()
    print("compiled tier: " + (", ".join(f"{level} ({folder})" for level, folder, _ in tiers) or "none for this host"))
    counts: dict[str, int] = {}
    for task, origins in task_origins(tasks):
        where = sorted(set(origins.values())) or ["already loaded"]
        for origin in origins.values():
            counts[origin] = counts.get(origin, 0) + 1
        print(f"{describe(task):40s} {', '.join(where)}")
    print("kernels: " + (", ".join(f"{n} {origin}" for origin, n in sorted(counts.items())) or "none"))
    return 0


def _build_compiled(args: argparse.Namespace, formats: list[str] | None) -> int:
    """``warmup --build-compiled DIR``: a compiled tier for ``--level``."""
    from ...tools.warmup import COMPILED_SOURCES, build_compiled_tier, warmup_tasks

    sources = args.sources.split(",") if args.sources else list(COMPILED_SOURCES)
    manifest = build_compiled_tier(args.build_compiled, args.level, warmup_tasks(formats, sources), args.jobs)
    print(f"{args.build_compiled}: {manifest['kernels']} kernel(s) for {manifest['level']} ({manifest['tag']})")
    return 0
