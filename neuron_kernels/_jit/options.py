"""The package's kernel decorators: ``jit`` and ``vectorize`` with the package's options and cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba

from .cache import TolerantCache, closure_digest
from .numba_internals import build_ufunc, install_cache

#: The options of every kernel: cached on disk, GIL released, no fastmath (it breaks NaN and
#: signed-zero handling).
JIT_OPTIONS: dict[str, Any] = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}


def _name_by_closure(f: Callable[..., Any]) -> None:
    """Give a compiled closure a qualified name of its own per closure value (a digest of them).

    A compiled function calls another, not inlined, by its symbol, which numba makes of the callee's
    qualified name, its argument types and a number counted per process. Two closures of one factory
    (one name) with the same argument types compiled in two processes can get the same symbol: a
    kernel that one process saved to the disk cache and the other loads would then be linked to the
    other closure's code. Closures named by their values cannot be confused."""
    try:
        digest = closure_digest(f)[:16]
    except Exception:  # noqa: BLE001 - a value that cannot be pickled: the cache key cannot hold it either
        return
    f.__qualname__ = f"{f.__qualname__}_{digest}"


def jit(fn: Callable[..., Any] | None = None, **overrides: Any) -> Any:
    """``numba.njit`` with the package's options; compiles lazily on the first call."""
    options = {**JIT_OPTIONS, **overrides}

    def make(f: Callable[..., Any]) -> Any:
        if f.__closure__ and options.get("inline") != "always":
            _name_by_closure(f)
        dispatcher = numba.njit(**options)(f)
        if options.get("cache"):
            install_cache(dispatcher, TolerantCache)
        return dispatcher

    return make if fn is None else make(fn)


def vectorize(fn: Callable[..., Any], signature: str) -> Any:
    """A NumPy ufunc of the scalar function ``fn`` for one signature (``"uint16(float32)"``), made by
    numba's ``@vectorize`` machinery with the package's cache (see :class:`~.cache.TolerantCache`).

    Unlike :func:`jit`, this compiles (or loads from the cache) at once: a ufunc holds a pointer to
    its compiled loop. Call it lazily, on first use.
    """
    return build_ufunc(fn, signature, TolerantCache if JIT_OPTIONS.get("cache") else None)
