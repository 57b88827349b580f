"""The ``--plot`` images of ``bench`` and ``error``: the check of the image's name (before the
work), and the error histogram."""

from __future__ import annotations

import argparse
from typing import Any

from ..parser import UsageError

__all__ = ["check_png", "error_plot"]


def check_png(path: str, force: bool) -> None:
    from ...io.outputs import check_output_path

    if not path.lower().endswith(".png"):
        raise UsageError(f"--plot writes a PNG image; give a file name ending in .png, not {path!r}")
    check_output_path(path, force)
    from ...tools.plots import require_matplotlib

    require_matplotlib()


def error_plot(args: argparse.Namespace, entry: Any, rows: list[Any]) -> None:
    """Relative-error histograms of the first array (its first million elements), one curve per
    format at its best scale mode and policy."""
    import numpy as np

    from ...api import fake_quantize
    from ...io.file_jobs import POLICIES
    from ...tools.plots import error_histogram, relative_errors

    best: dict[str, tuple[str, str]] = {}
    for label, fmt, mode, policy, _ in rows:  # rows are best first within an array
        if label == entry.label and fmt not in best:
            best[fmt] = (mode, policy)
    per_row = int(np.prod(entry.shape[1:], dtype=np.int64))
    x = entry.read(0, max(1, min(entry.shape[0], (1 << 20) // max(per_row, 1))))
    samples = {
        f"{fmt} {mode} {policy}": relative_errors(
            x,
            fake_quantize(x, fmt, block_size=args.block_size, axis=args.axis, scale_mode=mode, **POLICIES[policy]),
        )
        for fmt, (mode, policy) in best.items()
    }
    error_histogram(samples, args.plot, f"{entry.label}: relative error of each format (best scale mode, policy)")
