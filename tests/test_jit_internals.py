"""numba's private parts the package relies on (``neuron_kernels/_jit/numba_internals.py``): the
release they were reviewed against, and every attribute used there, on a real cache and a real
ufunc builder. A new numba fails here first, before a cache that silently misses or a ufunc
without its cache."""

from __future__ import annotations

import numba
import pytest
from numba.core.caching import FunctionCache

from neuron_kernels._jit import numba_internals as internals


def _square(x):  # pragma: no cover - compiled
    return x * x


def test_numba_is_the_reviewed_release():
    minor = ".".join(numba.__version__.split(".")[:2])
    assert minor == internals.REVIEWED_NUMBA, (
        f"numba {numba.__version__} is installed, but neuron_kernels/_jit/numba_internals.py was reviewed "
        f"against numba {internals.REVIEWED_NUMBA}: check each private attribute it uses against this "
        "release, then update REVIEWED_NUMBA and the bound in pyproject.toml"
    )


def test_the_bound_in_pyproject_admits_only_the_reviewed_release():
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    bound = re.search(r'"numba>=([0-9.]+),<([0-9.]+)"', text)
    assert bound, "pyproject.toml's numba requirement has no upper bound"
    major, minor = (int(v) for v in internals.REVIEWED_NUMBA.split("."))
    assert bound.group(1) == internals.REVIEWED_NUMBA  # no release below the reviewed one either
    assert bound.group(2) == f"{major}.{minor + 1}"
    floors = (pathlib.Path(__file__).parents[1] / ".ci" / "floors.txt").read_text()
    assert f"numba=={internals.REVIEWED_NUMBA}." in floors


def test_the_private_attributes_of_numbas_cache_exist():
    dispatcher = numba.njit(cache=True)(_square)
    assert isinstance(dispatcher._cache, FunctionCache)
    assert callable(getattr(FunctionCache, "_index_key", None))

    class Probe(internals.KeyedCache):
        def index_key(self, sig, magic):
            return (sig, magic)

    cache = Probe(_square)
    assert cache.py_func is _square
    assert cache.enabled is True
    assert cache.source_file == __file__
    stamp = cache._cache_file._source_stamp
    cache.add_to_stamp("digest")
    assert cache._cache_file._source_stamp == (stamp, "digest")
    assert isinstance(cache._impl.filename_base, str)
    assert callable(cache._impl.rebuild)
    assert isinstance(cache._cache_file._index_path, str)

    internals.install_cache(dispatcher, Probe)
    assert isinstance(dispatcher._cache, Probe)


def test_an_entry_saved_by_numba_is_found_by_load_from(tmp_path, monkeypatch):
    """The round trip the compiled tiers rest on: numba saves an entry under our key, and
    :meth:`KeyedCache.load_from` finds and rebuilds it from the folder by that key."""
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    def cube(x):  # pragma: no cover - compiled
        return x * x * x

    class Keyed(internals.KeyedCache):
        def index_key(self, sig, magic):
            return ("test", sig, magic)

    dispatcher = numba.njit(cache=True)(cube)
    internals.install_cache(dispatcher, Keyed)
    assert dispatcher(3) == 27
    cache = dispatcher._cache
    sig = dispatcher.signatures[0]
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    magic = internals.host_magic()
    assert magic == context.codegen().magic_tuple()
    rebuilt = cache.load_from(cache.cache_path, cache.index_key(sig, magic), context)
    assert rebuilt is not None
    assert cache.load_from(cache.cache_path, cache.index_key(sig, ("another cpu",)), context) is None


def test_a_ufunc_is_built_with_the_given_cache(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    made = []

    class Plain(internals.KeyedCache):
        def index_key(self, sig, magic):
            return (sig, magic)

    def cache(fn):
        made.append(fn)
        return Plain(fn)

    ufunc = internals.build_ufunc(_square, "float64(float64)", cache)
    assert made == [_square]
    np.testing.assert_array_equal(ufunc(np.array([2.0, 3.0])), [4.0, 9.0])


def test_cache_subpath_is_where_numba_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    dispatcher = numba.njit(cache=True)(_square)
    assert dispatcher._cache.cache_path == str(tmp_path / internals.cache_subpath(__file__))


@pytest.mark.parametrize("value", [(1, "a"), ("compiled", "m", "f", ())])
def test_dumps_gives_bytes(value):
    assert isinstance(internals.dumps(value), bytes)


def test_no_other_module_touches_numbas_internals():
    import pathlib
    import re

    import neuron_kernels

    package = pathlib.Path(neuron_kernels.__file__).parent
    private = re.compile(
        r"numba\.core\.(caching|registry)|ufuncbuilder|\._(cache_file|impl|py_func|cache|enabled|index_key)\b"
    )
    found = [
        f"{path.relative_to(package)}:{n}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "numba_internals.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert found == []
