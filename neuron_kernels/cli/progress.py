"""What a command shows on a terminal while it runs (stderr, and only when it is a terminal): the
progress bar of a long job, the preparation of its kernels, the notice of a first compile."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["compile_notice", "progress_bar", "warm"]


def warm(args: argparse.Namespace, tasks: list[Any], what: str) -> None:
    """Compile what a command will need first, on every core (see :mod:`neuron_kernels.tools.warmup`),
    saying so on a terminal when it compiles anything; what the compiled tier holds is loaded
    from it."""
    from ..tools.warmup import warmup

    shown = not getattr(args, "quiet", False) and sys.stderr.isatty()

    def progress(done: int, total: int, task: Any) -> None:
        if shown:
            print(f"\r{what}: preparing kernels {done}/{total}", end="", file=sys.stderr, flush=True)

    compiled, seconds = warmup(tasks, getattr(args, "jobs", None), progress, host_tuned=False)
    if shown:
        note = f"{compiled} compiled in {seconds:.0f} s, cached for next time" if compiled else "cached"
        print(f"\r{what}: kernels ready ({note})".ljust(60), file=sys.stderr)


@contextlib.contextmanager
def progress_bar(args: argparse.Namespace, total: int, desc: str, unit: str = "B") -> Iterator[Callable[[Any], None]]:
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


@contextlib.contextmanager
def compile_notice(args: argparse.Namespace) -> Iterator[None]:
    """One line on a terminal when the command first compiles a kernel (the library's own
    one-time log message is left out: a command's stderr is its errors)."""
    if args.command in ("promote", "formats"):  # nothing to compile: no numba import
        yield
        return
    from .._jit import on_compile

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
