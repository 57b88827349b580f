"""PNG charts of ``neuron-kernels bench`` results and of block quantisation errors.

matplotlib is an optional dependency (``pip install 'neuron_kernels[plot]'``). It is imported only
when a chart is drawn, and drawn with the Agg backend on a standalone figure (pyplot's global
state and the session's backend are left alone); without it the functions raise
:class:`PlotUnavailable`. Files are written to a temporary name in the target's folder and
renamed into place once complete: a failure leaves no file behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidValueError, NeuronKernelsError

if TYPE_CHECKING:
    from .bench import BenchRow, BlockBenchRow

__all__ = ["PlotUnavailable", "require_matplotlib", "bench_chart", "error_histogram", "relative_errors"]

_INSTALL_HINT = "plotting needs matplotlib: pip install 'neuron_kernels[plot]'"


class PlotUnavailable(NeuronKernelsError, RuntimeError):
    """matplotlib cannot be imported."""


def require_matplotlib() -> None:
    """Raise :class:`PlotUnavailable` unless matplotlib (and its Agg backend) can be imported."""
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailable(_INSTALL_HINT) from exc


def _new_figure(width: float, height: float) -> Any:
    """A matplotlib Figure attached to an Agg canvas."""
    require_matplotlib()
    import matplotlib.backends.backend_agg
    import matplotlib.figure

    fig = matplotlib.figure.Figure(figsize=(width, height), layout="constrained")
    matplotlib.backends.backend_agg.FigureCanvasAgg(fig)
    return fig


def _save_png(fig: Any, path: str | os.PathLike[str]) -> None:
    """Write ``fig`` to ``path`` as a PNG, atomically."""
    path = os.fspath(path)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{base}.{secrets.token_hex(4)}.partial")
    try:
        with open(tmp, "xb") as fh:
            fig.savefig(fh, format="png", dpi=110)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _elements(n: int) -> str:
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit} ({n:,})"
    return f"{n:,}"


def _bars(ax: Any, labels: list[str], series: list[tuple[str, str, list[float]]], copy_gbs: list[float]) -> None:
    """Grouped horizontal bars, one group per label, the first row on top, with the copy baseline."""
    k = len(series)
    height = 0.8 / k
    y = np.arange(len(labels), dtype=np.float64)
    top = max([max(values) for _, _, values in series] + copy_gbs)
    for i, (name, color, values) in enumerate(series):
        pos = y - 0.4 + height * (i + 0.5)
        bars = ax.barh(pos, values, height=height, color=color, label=name)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], padding=2, fontsize=7)
    copy = statistics.median(copy_gbs)
    ax.axvline(copy, color="black", linestyle="--", linewidth=1.2, label=f"np.copyto baseline ({copy:.3g} GB/s)")
    ax.set_yticks(y, labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, max(top, 1e-6) * 1.12)
    ax.set_xlabel("GB/s (bytes read + written per second; longer is faster)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)


def bench_chart(cast_rows: Sequence[BenchRow], mx_rows: Sequence[BlockBenchRow], path: str | os.PathLike[str]) -> None:
    """A PNG of bench results: GB/s per cast pair (ours with ``out=``, the peer) and per MX format
    (quantise, dequantise, fake-quantise, the peer), each against the copy baseline."""
    if not cast_rows and not mx_rows:
        raise InvalidValueError("bench_chart: no rows to draw")
    panels = [(len(cast_rows) * 0.32, "cast")] if cast_rows else []
    if mx_rows:
        panels.append((len(mx_rows) * 0.75, "mx"))
    fig = _new_figure(10, sum(h + 1.2 for h, _ in panels) + 0.6)
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=[h + 1.2 for h, _ in panels])[:, 0]
    for ax, (_, kind) in zip(axes, panels):
        if kind == "cast":
            _bars(
                ax,
                [r.label for r in cast_rows],
                [
                    ("ours (out=)", "tab:blue", [r.ours_out_gbs for r in cast_rows]),
                    ("peer (ml_dtypes astype, or numpy)", "tab:gray", [r.peer_gbs for r in cast_rows]),
                ],
                [r.copy_gbs for r in cast_rows],
            )
            ax.set_title("Casts", loc="left", fontweight="bold")
        else:
            _bars(
                ax,
                [f"{r.label}\nSQNR {r.sqnr_db:.1f} dB" for r in mx_rows],
                [
                    ("quantise", "tab:blue", [r.quantize_gbs for r in mx_rows]),
                    ("dequantise (out=)", "tab:orange", [r.dequantize_gbs for r in mx_rows]),
                    ("fake-quantise (out=)", "tab:green", [r.fake_gbs for r in mx_rows]),
                    ("peer (numpy + ml_dtypes)", "tab:gray", [r.peer_gbs for r in mx_rows]),
                ],
                [r.copy_gbs for r in mx_rows],
            )
            ax.set_title(
                "Block formats (MX: floor scale, blocks of 32; NVFP4: blocks of 16)", loc="left", fontweight="bold"
            )
    n = cast_rows[0].elements if cast_rows else mx_rows[0].elements
    fig.suptitle(f"neuron_kernels bench: {_elements(n)} float32 elements")
    _save_png(fig, path)


def relative_errors(x: Any, dq: Any, limit: int = 1_000_000) -> np.ndarray:
    """|x - dq| / |x| over the non-zero finite elements of ``x``, as float64; at most ``limit`` of
    them (an evenly strided sample in C order when there are more). Where ``dq`` is not finite the
    error is inf or NaN."""
    if limit < 1:
        raise InvalidValueError(f"limit must be positive, got {limit}")
    xf = np.asarray(x).reshape(-1)
    df = np.asarray(dq).reshape(-1)
    if xf.shape != df.shape:
        raise InvalidValueError(f"x and dq differ in size ({np.shape(x)} vs {np.shape(dq)})")
    valid = np.isfinite(xf) & (xf != 0)
    step = max(1, -(-int(np.count_nonzero(valid)) // limit))
    keep = valid[::step]
    xs = xf[::step][keep][:limit].astype(np.float64)
    ds = df[::step][keep][:limit].astype(np.float64)
    return np.abs(xs - ds) / np.abs(xs)


def _percent(fraction: float) -> str:
    if fraction == 0 or fraction >= 0.001:
        return f"{fraction:.1%}"
    return f"{100 * fraction:.2g}%"


def error_histogram(samples: Mapping[str, Any], path: str | os.PathLike[str], title: str) -> None:
    """A PNG of overlaid step histograms of relative errors (:func:`relative_errors`), one per label,
    on log-spaced bins; exact (zero) and non-finite errors are counted in the legend instead."""
    if not samples:
        raise InvalidValueError("error_histogram: no samples to draw")
    data = {label: np.asarray(v, dtype=np.float64).reshape(-1) for label, v in samples.items()}
    positive = [v[np.isfinite(v) & (v > 0)] for v in data.values()]
    lo = min((float(p.min()) for p in positive if p.size), default=1e-8)
    hi = max((float(p.max()) for p in positive if p.size), default=1.0)
    lo, hi = 2.0 ** np.floor(np.log2(lo)), 2.0 ** (np.floor(np.log2(hi)) + 1)
    bins = np.geomspace(lo, hi, 90)
    fig = _new_figure(9, 5)
    ax = fig.subplots()
    for (label, v), p in zip(data.items(), positive):
        total = max(v.size, 1)
        note = f"{_percent(np.count_nonzero(v == 0) / total)} exact"
        bad = np.count_nonzero(~np.isfinite(v))
        if bad:
            note += f", {_percent(bad / total)} non-finite"
        ax.hist(
            p,
            bins=bins,
            weights=np.full(p.size, 1 / total),
            histtype="step",
            linewidth=1.5,
            label=f"{label} (n={v.size:,}; {note})",
        )
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("relative error |x - dq| / |x|")
    ax.set_ylabel("fraction of elements per bin")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    _save_png(fig, path)
