"""The compile log: numba's compile events for the package's kernels, counted, passed on to
subscribers and told once per process when a first call compiles for long."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from numba.core import event

#: Seconds a first call may compile before the library says so (once per process).
NOTICE_AFTER = 1.0

_log = logging.getLogger("neuron_kernels")


class _CompileWatch(event.Listener):  # type: ignore[misc]
    """Numba's compile events (cache misses only; loads from the disk cache send none), outermost
    only: counts the package's compiled kernels, tells the subscribers of :func:`on_compile`, and
    logs one notice per process when a compile runs past :data:`NOTICE_AFTER` seconds."""

    def __init__(self) -> None:
        self.depth = 0
        self.count = 0
        self.noticed = False
        self.subscribers: list[Callable[[str, str, float], None]] = []
        self._timer: threading.Timer | None = None
        self._start = 0.0

    @staticmethod
    def _name(ev: Any) -> str | None:
        fn = getattr(ev.data.get("dispatcher"), "py_func", None) if isinstance(ev.data, dict) else None
        module = getattr(fn, "__module__", "") or ""
        return getattr(fn, "__qualname__", "?") if module.startswith("neuron_kernels") else None

    def on_start(self, ev: Any) -> None:
        self.depth += 1
        name = self._name(ev)
        if self.depth != 1 or name is None:
            return
        self._start = time.perf_counter()
        if not self.noticed and _log.isEnabledFor(logging.WARNING) and not self.subscribers:
            self._timer = threading.Timer(NOTICE_AFTER, self._notice)
            self._timer.daemon = True
            self._timer.start()
        for callback in list(self.subscribers):
            callback("start", name, 0.0)

    def on_end(self, ev: Any) -> None:
        self.depth -= 1
        name = self._name(ev)
        if self.depth != 0 or name is None:
            return
        self.count += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for callback in list(self.subscribers):
            callback("end", name, time.perf_counter() - self._start)

    def _notice(self) -> None:
        if not self.noticed:
            self.noticed = True
            _log.warning(
                "neuron_kernels: compiling kernels for their first use (a few seconds each, once: "
                "they are cached on disk; `neuron-kernels warmup` compiles them ahead of time)"
            )


_WATCH = _CompileWatch()
event.register("numba:compile", _WATCH)


def compiles() -> int:
    """How many of the package's kernels this process has compiled (not loaded from the cache)."""
    return _WATCH.count


@contextlib.contextmanager
def on_compile(callback: Callable[[str, str, float], None]) -> Any:
    """Call ``callback("start" | "end", kernel name, seconds)`` around every compile of a package
    kernel while the block runs (the command line's progress line; the one-time notice is then
    left to it)."""
    _WATCH.subscribers.append(callback)
    try:
        yield
    finally:
        _WATCH.subscribers.remove(callback)
