"""The package's on-disk kernel cache: numba's, keyed on the package's kernel sources as well,
looking in the compiled tiers after the host's own cache, and tolerant of unreadable entries."""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Callable
from typing import Any

from numba.core.dispatcher import Dispatcher

from .numba_internals import KeyedCache, dumps
from .source_digest import PACKAGE_ROOT, cache_lock, sources_digest
from .tiers import compiled_tiers, tiers_off

#: Where each kernel this process loaded or compiled came from, by qualified name: ``"local"``
#: (the host's cache), ``"compiled x86-64-vN"`` (the compiled tier) or ``"jit"`` (compiled now).
ORIGINS: dict[str, str] = {}


def closure_key(fn: Callable[..., Any]) -> list[Any]:
    """The values of ``fn``'s closure as a cache key: compiled functions as (module, qualified
    name, their own closure's key), everything else as it is."""
    key: list[Any] = []
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, Dispatcher):
            py = value.py_func
            value = ("compiled", py.__module__, py.__qualname__, tuple(closure_key(py)))
        key.append(value)
    return key


def closure_digest(fn: Callable[..., Any]) -> str:
    """SHA-256 of :func:`closure_key` (raises where a value cannot be pickled)."""
    return hashlib.sha256(dumps(tuple(closure_key(fn)))).hexdigest()


class TolerantCache(KeyedCache):
    """numba's on-disk cache, keyed on the package's kernel source_digest as well (see
    :data:`~.source_digest.KERNEL_SOURCES`), and tolerant: an unreadable entry (a corrupted or truncated
    file) is a miss with a warning, not an exception in the user's call: the kernel is recompiled
    and the bad index removed so that the new compilation can be saved."""

    def __init__(self, py_func: Callable[..., Any]) -> None:
        super().__init__(py_func)
        digest = sources_digest()
        if digest is None:
            self.disable()
        # numba ignores an index whose stamp is not the current one and overwrites it at the next
        # save: with the digest in the stamp, an edit of any kernel source empties the indexes
        # instead of leaving entries behind that no key will match again.
        self.add_to_stamp(digest)

    def index_key(self, sig: Any, magic: tuple[Any, ...]) -> Any:
        # Both loads and saves look entries up by this key: numba's own (the signature, the CPU,
        # digests of the bytecode and of the closure's values), except that a compiled function
        # in the closure is described by its name and its own closure, not pickled (its pickle
        # holds an id that is new in every process, so the key would never match again), and the
        # digest of the kernel sources, which holds the functions' code.
        digests = (hashlib.sha256(self.py_func.__code__.co_code).hexdigest(), closure_digest(self.py_func))
        return (sig, magic, digests, sources_digest())

    def _load_compiled(self, sig: Any, target_context: Any) -> Any:
        """The kernel from a compiled tier (:func:`~.tiers.compiled_tiers`), best level first, or
        None: looked up with the tier's CPU key in place of the host's, in the folder of the
        kernel's source file relative to the package. A missing or unreadable entry is a miss."""
        py_file = self.source_file
        if not self.enabled or py_file is None or tiers_off():
            return None
        relative = os.path.relpath(os.path.dirname(os.path.abspath(py_file)), PACKAGE_ROOT)
        for level, folder, magic in compiled_tiers():
            try:
                data = self.load_from(os.path.join(folder, relative), self.index_key(sig, magic), target_context)
            except Exception:  # noqa: BLE001 - a tier that cannot be read is a miss, never an error
                continue
            if data is not None:
                ORIGINS[self._qualname()] = f"compiled {level}"
                return data
        return None

    def _qualname(self) -> str:
        return getattr(self.py_func, "__qualname__", "a kernel")

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The host's cache first (host-tuned code, once compiled here or by ``neuron-kernels
        warmup``), then the compiled tier; None (compile) where neither has the kernel."""
        data = self._load_local(sig, target_context)
        if data is not None:
            ORIGINS[self._qualname()] = "local"
            return data
        data = self._load_compiled(sig, target_context)
        if data is None:
            ORIGINS[self._qualname()] = "jit"
        return data

    def _load_local(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:  # noqa: BLE001 - any unreadable cache entry is a miss
            warnings.warn(
                f"neuron_kernels: ignoring an unreadable compilation cache entry of "
                f"{self._qualname()} ({type(exc).__name__}: {exc}); compiling it again",
                RuntimeWarning,
                stacklevel=2,
            )
            with contextlib.suppress(OSError, AttributeError):
                self.remove_index()
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            with cache_lock(self.cache_path):
                super().save_overload(sig, data)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written only costs time
            warnings.warn(
                f"neuron_kernels: cannot save {self._qualname()} to the compilation cache "
                f"({type(exc).__name__}: {exc})",
                RuntimeWarning,
                stacklevel=2,
            )
