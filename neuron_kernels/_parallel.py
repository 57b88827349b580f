"""Running a kernel on large arrays with several threads.

The kernels release the GIL (``nogil=True``), so plain Python threads run them in parallel. This
avoids numba's threading layers: the default OpenMP layer stalls for milliseconds per call on
some machines and can clash with the OpenMP runtime torch brings. Results never depend on the
thread count: chunks are disjoint and every kernel is told where its chunk starts.

The thread bound comes from ``set_num_threads(n)``, else the ``NEURON_KERNELS_NUM_THREADS``
environment variable, else the CPUs this process may use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .errors import InvalidValueError

__all__ = ["set_num_threads", "get_num_threads", "PARALLEL_MIN_ELEMENTS", "run_chunked", "run_tasks", "read_only"]

#: Arrays with fewer elements than this run on the calling thread alone: below it, handing work
#: to a second thread costs more than it saves (measured with ``benchmarks/``).
PARALLEL_MIN_ELEMENTS = 1 << 21

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_num_threads: int | None = None


_cpus: int | None = None


def _available_cpus() -> int:
    global _cpus
    if _cpus is None:
        try:
            _cpus = max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            _cpus = max(1, os.cpu_count() or 1)
    return _cpus


def _from_env() -> int | None:
    raw = os.environ.get("NEURON_KERNELS_NUM_THREADS", "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidValueError(f"NEURON_KERNELS_NUM_THREADS must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise InvalidValueError(f"NEURON_KERNELS_NUM_THREADS must be a positive integer, got {raw!r}")
    return value


def set_num_threads(n: int | None) -> None:
    """Bound the threads one kernel call may use (``None`` restores the default)."""
    global _num_threads
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidValueError(f"the thread count must be a positive int or None, got {n!r}")
    _num_threads = n


def get_num_threads() -> int:
    """The thread bound in force (see the module docstring for where it comes from)."""
    if _num_threads is not None:
        return _num_threads
    return _from_env() or _available_cpus()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        # A pool inherited through fork has no live threads: make a new one in the child.
        if _pool is None or _pool_pid != os.getpid() or _pool._max_workers < workers:
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neuron_kernels")
            _pool_pid = os.getpid()
        return _pool


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of a kernel's input. numba compiles a kernel once per argument type, and a
    read-only array (a piece of a memory-mapped file, a buffer of ``np.nditer``) is a type of its
    own: inputs passed read-only always compile each kernel once, not once per kind of caller."""
    view = a.view()
    view.flags.writeable = False
    return view


def run_chunked(
    kernel: Callable[[Any, Any, Any, int], None],
    src: Any,
    dst: Any,
    options: Any,
    src_group: int = 1,
    dst_group: int = 1,
    elements_per_item: int = 1,
    base: int = 0,
) -> None:
    """Run ``kernel(src_chunk, dst_chunk, options, start)`` over 1-D ``src``/``dst``.

    ``src_group`` source items correspond to ``dst_group`` destination items (4:1 when packing
    into ``*_x4`` containers, 1:4 when unpacking); chunks never split a group. ``start`` is the
    index of the chunk's first element in the whole array, counting ``elements_per_item``
    elements per source item (4 for packed sources), plus ``base``.
    """
    threads = (
        1
        if src.size < PARALLEL_MIN_ELEMENTS
        else min(get_num_threads(), max(1, src.size // (PARALLEL_MIN_ELEMENTS // 2)))
    )
    if threads <= 1:
        kernel(src, dst, options, base)
        return
    units = src.size // src_group
    bounds = [units * k // threads for k in range(threads + 1)]
    pieces = [
        (
            src[a * src_group : b * src_group],
            dst[a * dst_group : b * dst_group],
            base + a * src_group * elements_per_item,
        )
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    pool = _executor(threads - 1)
    futures = [pool.submit(kernel, s, d, options, off) for s, d, off in pieces[1:]]
    try:
        s, d, off = pieces[0]
        kernel(s, d, options, off)
    finally:
        _join(futures)


def run_tasks(kernel: Callable[..., None], ntasks: int, elements: int, args: tuple[Any, ...], align: int = 1) -> None:
    """Run ``kernel(*args, t0, t1)`` over the independent tasks ``[0, ntasks)``.

    Large jobs (``elements`` at least :data:`PARALLEL_MIN_ELEMENTS`) are split into contiguous
    task ranges, one per thread, whose boundaries are multiples of ``align``.
    """
    threads = (
        1
        if elements < PARALLEL_MIN_ELEMENTS
        else min(get_num_threads(), max(1, elements // (PARALLEL_MIN_ELEMENTS // 2)), max(1, ntasks // align))
    )
    if threads <= 1:
        kernel(*args, 0, ntasks)
        return
    bounds = [min(ntasks, (ntasks * k // threads) // align * align) for k in range(threads)] + [ntasks]
    ranges = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    pool = _executor(len(ranges) - 1)
    futures = [pool.submit(kernel, *args, a, b) for a, b in ranges[1:]]
    try:
        kernel(*args, *ranges[0])
    finally:
        _join(futures)


def _join(futures: list[Any]) -> None:
    """Wait for every task: an interrupt (Ctrl-C) while waiting is raised once all have finished,
    so that no thread is still writing into the arrays of a run that is being unwound."""
    interrupted: BaseException | None = None
    for f in futures:
        while True:
            try:
                f.result()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
    if interrupted is not None:
        raise interrupted
