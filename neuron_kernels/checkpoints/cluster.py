"""A checkpoint conversion on a Dask cluster (``quantize_checkpoint(..., client=)``, the command's
``--scheduler ADDRESS`` / ``--workers N``).

Two passes, as in one process: first the reads that per-tensor scales need (every shard of a fused
group's amax, wherever the shards lie; the extremes of weights re-laid exactly), one task per
tensor, settled here; then one task per output shard, in which a worker reads that shard's inputs
and writes its file. A worker writes under a temporary name in the output folder and renames the
file when it is complete, so a worker that dies mid-shard leaves a partial file under a name that
is no shard's; the scheduler runs its task again on another worker, and the leftovers are removed
before the index, written last with the config, names the shards. Every shard is the same bytes
as the one-process command writes. Workers must see the input and the output folder at the same
paths (a shared filesystem).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from .shards import Shard, write_index, write_shard

__all__ = ["PARTIAL_SUFFIX", "write_on_cluster"]

#: The suffix of a shard being written (a leftover if its worker died).
PARTIAL_SUFFIX = ".partial"


def _call(fn: Any) -> Any:
    return fn()


class _Stopped(Exception):
    """Another task failed: a shard not written."""


def _write_one(folder: str, shard: Shard, stop: str) -> tuple[int, list[Any]] | None:
    """Write one shard (on a worker): under a temporary name, renamed when complete. Returns the
    bytes its items read and their reports (the error statistics found while writing); None if
    the Dask event ``stop`` was set (another task failed) before it started or between its items,
    its partial file then removed."""
    from distributed import Event

    event = Event(stop)

    def check() -> None:
        if event.is_set():
            raise _Stopped

    tmp = os.path.join(folder, f".{shard.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        check()
        write_shard(tmp, shard, check)
        os.replace(tmp, os.path.join(folder, shard.name))
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, _Stopped):
            return None
        raise
    return shard.progress.count, [item.report for item in shard.items]


def write_on_cluster(client: Any, folder: str, shards: list[Shard], resolve: Any, progress: Any) -> None:
    """The shards in ``folder`` with their index (as :func:`.shards.write_shards` writes them),
    written by the workers of ``client``'s cluster: ``resolve`` (the per-tensor scales' resolver
    the items' jobs ask) settled first from one task per tensor of its ``passes()``, then one task
    per shard. Each shard's items report their progress to its ``progress``, a
    :class:`~.shards.Tally` that travels with it (``progress`` here is told each shard's count as
    it completes); their reports are updated from the workers' copies. An error in a task (or
    here) stops the others, at their next item, and is raised once none is writing any more."""
    from distributed import Event, as_completed, wait

    run = uuid.uuid4().hex[:8]
    passes = resolve.passes()
    calls = [(group, fn) for group, fns in passes for fn in fns]
    futures = client.map(_call, [fn for _, fn in calls], key=[f"nk-amax-{run}-{i}" for i in range(len(calls))])
    try:
        results = client.gather(futures)
    finally:
        client.cancel(futures)
    start = 0
    for group, fns in passes:  # the results in the order of the calls: each group's a slice
        resolve.settle(group, results[start : start + len(fns)])
        start += len(fns)

    stop = Event(f"nk-stop-{run}", client=client)
    futures = [
        client.submit(_write_one, folder, shard, stop.name, key=f"nk-shard-{run}-{k}", pure=False)
        for k, shard in enumerate(shards)
    ]
    by_future = dict(zip(futures, shards))
    try:
        for future in as_completed(futures):
            done = future.result()
            assert done is not None  # the stop event is only set below
            count, reports = done
            for item, report in zip(by_future[future].items, reports):
                if item.report is not None:
                    vars(item.report).update(vars(report))
            progress(count)
    except BaseException:
        stop.set()
        wait(futures)  # the others return at their next item
        raise
    finally:
        for entry in os.scandir(folder):
            if entry.name.endswith(PARTIAL_SUFFIX):
                os.remove(entry.path)
        stop.clear()
    write_index(folder, shards)
