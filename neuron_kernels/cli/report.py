"""What the commands print: tables of names and numbers, percentages, and the error statistics
of quantised arrays (one definition of their columns for every table that shows them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["STATS_COLUMNS", "name_columns", "percent", "stats_cells", "stats_header", "stats_row", "table"]


def percent(v: float) -> str:
    return f"{100 * v:.3g}%"


#: The error statistics of a quantisation (:class:`neuron_kernels.QuantizationStats`), as the
#: tables show them: header -> (width in the fixed-width tables, the cell of a stats record).
_STATS: dict[str, tuple[int, Callable[[Any], str]]] = {
    "SQNR dB": (9, lambda st: f"{st.sqnr_db:.2f}"),
    "MSE": (11, lambda st: f"{st.mse:.3g}"),
    "max abs": (11, lambda st: f"{st.max_abs_error:.3g}"),
    "max rel": (11, lambda st: f"{st.max_rel_error:.3g}"),
    "saturated": (11, lambda st: percent(st.saturated)),
    "flushed": (9, lambda st: percent(st.flushed)),
}

#: The headers of the error statistics, in their order.
STATS_COLUMNS = tuple(_STATS)


def stats_cells(st: Any, columns: Sequence[str] = STATS_COLUMNS) -> tuple[str, ...]:
    """The cells of ``columns`` (some of :data:`STATS_COLUMNS`) for the stats record ``st``."""
    return tuple(_STATS[c][1](st) for c in columns)


def name_columns(name: str, shape: str, width: int = 32, dtype: str | None = None) -> str:
    """The first columns of a fixed-width row: a name ``width`` wide (aligned left), a shape and,
    where given, a dtype (aligned right)."""
    return f"{name:<{width}}{shape:>20}" + ("" if dtype is None else f"{dtype:>10}")


def stats_header(name: str, width: int = 32, dtype: bool = False) -> str:
    """The header of a table of quantised arrays: ``name`` over the names, then shape, [dtype,]
    and the error statistics."""
    head = name_columns(name, "shape", width, "dtype" if dtype else None)
    return head + "".join(f"{c:>{w}}" for c, (w, _) in _STATS.items())


def stats_row(name: str, shape: Any, st: Any, width: int = 32, dtype: str | None = None) -> str:
    """A row of :func:`stats_header`'s table: an array's name, shape, [dtype,] and error statistics."""
    return name_columns(name, str(shape), width, dtype) + "".join(
        f"{cell:>{w}}" for cell, (w, _) in zip(stats_cells(st), _STATS.values())
    )


def table(header: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> str:
    """Columns as wide as their widest cell, two spaces apart: the first ``left`` aligned left
    (names), the others right (numbers), so that no two cells run together."""
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if k < left else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)
