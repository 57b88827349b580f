"""Every use of numba's private attributes and internal modules, in one place.

The package's cache (:mod:`.cache`) extends numba's on-disk function cache, and its ufuncs are
built by numba's ``@vectorize`` machinery with that cache: both reach into parts of numba that are
not its public API. They do it only through this module, which was reviewed against numba
:data:`REVIEWED_NUMBA`; ``tests/test_jit_internals.py`` fails on any other numba release and checks
that every attribute used here exists, so that a new numba is reviewed before it is trusted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.caching import dumps as _dumps

#: The numba release (major.minor) this module's uses of numba's internals were checked against.
REVIEWED_NUMBA = "0.68"


def host_magic() -> tuple[Any, ...]:
    """numba's key of the CPU its code is compiled for in this process (part of each cache key)."""
    from numba.core.registry import cpu_target

    return tuple(cpu_target.target_context.codegen().magic_tuple())


def cache_subpath(py_file: str) -> str:
    """The folder, under ``NUMBA_CACHE_DIR``, where numba caches the kernels of source file ``py_file``."""
    from numba.core.caching import UserProvidedCacheLocator

    return str(UserProvidedCacheLocator.get_suitable_cache_subpath(py_file))


def dumps(value: Any) -> bytes:
    """numba's own pickling of a cache key's values (what its cache hashes)."""
    return bytes(_dumps(value))


class KeyedCache(FunctionCache):  # type: ignore[misc]
    """numba's on-disk cache of one function, with what the package needs of its private parts
    under names of its own. A subclass gives the index key (:meth:`index_key`)."""

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        # numba's hook, called by both load_overload and save_overload.
        return self.index_key(sig, codegen.magic_tuple())

    def index_key(self, sig: Any, magic: tuple[Any, ...]) -> Any:
        """The key of the entry of signature ``sig`` compiled for the CPU whose key is ``magic``."""
        raise NotImplementedError

    @property
    def py_func(self) -> Callable[..., Any]:
        """The Python function whose compilations this cache holds."""
        return self._py_func  # type: ignore[no-any-return]

    @property
    def enabled(self) -> bool:
        return bool(self._enabled)

    @property
    def source_file(self) -> str | None:
        """The source file of :attr:`py_func`, where numba locates its cache by it."""
        return getattr(self._impl.locator, "_py_file", None)

    def add_to_stamp(self, extra: Any) -> None:
        """Make ``extra`` part of the stamp numba checks an index against: an index saved under
        another stamp is ignored, and overwritten at the next save."""
        self._cache_file._source_stamp = (self._cache_file._source_stamp, extra)

    def load_from(self, folder: str, key: Any, target_context: Any) -> Any:
        """The entry ``key`` of this function's index in ``folder`` (another cache's folder, laid
        out as numba lays out its own), rebuilt; None where the index has no such entry."""
        entries = IndexDataCacheFile(folder, self._impl.filename_base, self._cache_file._source_stamp)
        data = entries.load(key)
        return None if data is None else self._impl.rebuild(target_context, data)

    def remove_index(self) -> None:
        """Delete this function's index file (so that the next save writes a new one)."""
        os.remove(self._cache_file._index_path)


#: What makes a function's cache from the function.
CacheFactory = Callable[[Callable[..., Any]], KeyedCache]


def install_cache(dispatcher: Any, cache: CacheFactory) -> None:
    """Give a ``numba.njit(cache=True)`` dispatcher the cache ``cache(py_func)`` in place of its own."""
    if isinstance(getattr(dispatcher, "_cache", None), FunctionCache):
        dispatcher._cache = cache(dispatcher.py_func)


def build_ufunc(fn: Callable[..., Any], signature: str, cache: CacheFactory | None) -> Any:
    """The NumPy ufunc of the scalar function ``fn`` for one signature, by numba's ``@vectorize``
    machinery, its compilation held in ``cache(fn)`` (none where ``cache`` is None)."""
    from numba.np.ufunc.ufuncbuilder import UFuncBuilder

    builder = UFuncBuilder(fn, cache=False, targetoptions={"nopython": True})
    if cache is not None:
        builder.nb_func.cache = cache(fn)
    builder.add(signature)
    return builder.build_ufunc()
