"""What a conversion did to each tensor (:class:`TensorReport`), and the error statistics of a
weight computed while its pieces are written (:func:`pipelined_stats`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..blocks.array import BlockArray
from ..blocks.stats import ErrorStats, QuantizationStats
from ..io.file_jobs import Progress

__all__ = ["TensorReport", "exact_stats", "pipelined_stats"]


@dataclass
class TensorReport:
    """What happened to one tensor: ``action`` is ``quantised``, ``converted`` (a quantised weight
    written into another layout as its bytes), ``dequantised``, ``kept`` or ``dropped`` (a tensor
    the output cannot hold, a KV-cache scale in a plain checkpoint); ``reason`` why it was kept or
    dropped, or how it was converted; ``stats`` the error of a quantised one; ``fused_with``: the shards
    of its fused layer (itself included) whose per-tensor scale it shares, if any; ``format``: the block
    format it was written in (quantised or converted)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    action: str
    reason: str = ""
    stats: QuantizationStats | None = None
    outputs: tuple[str, ...] = ()
    fused_with: tuple[str, ...] = ()
    format: str = ""
    #: Of a converted weight, the elements whose values changed (FP8 brought into a smaller range).
    inexact: int = 0

    @property
    def exact(self) -> bool | None:
        """Whether every value came out as it went in: a converted weight unless some ``inexact``;
        a quantised one when its error is zero everywhere (None for a tensor kept or dequantised)."""
        if self.action == "converted":
            return self.inexact == 0
        if self.action != "quantised" or self.stats is None:
            return None
        return exact_stats(self.stats)


def exact_stats(st: QuantizationStats) -> bool:
    return st.max_abs_error == 0 and st.mse == 0


def pipelined_stats(
    pieces: Iterator[tuple[np.ndarray, BlockArray]],
    write: Callable[[BlockArray], None],
    progress: Progress,
    stats: bool = True,
) -> QuantizationStats | None:
    """Write each quantised piece and fold it into the error statistics, the statistics of one
    piece running on a worker thread while the next is read and quantised. At most one piece
    waits for them. Without ``stats``: the pieces written only (None)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    if not stats:
        for arr, mx in pieces:
            write(mx)
            progress(arr.nbytes)
        return None
    acc = ErrorStats()
    with ThreadPoolExecutor(1, thread_name_prefix="nk-stats") as pool:
        pending: Future[None] | None = None
        for arr, mx in pieces:
            write(mx)
            if pending is not None:
                pending.result()
            pending = pool.submit(acc.add, arr, mx)
            progress(arr.nbytes)
        if pending is not None:
            pending.result()
    return acc.result()
