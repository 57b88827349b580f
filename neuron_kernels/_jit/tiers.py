"""The compiled tiers: kernels compiled ahead of time for an x86-64 level and shipped in the wheel,
read-only at run time."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import sysconfig
import threading
from typing import Any

import numba

from .source_digest import PACKAGE_ROOT

#: The folder of the package's compiled tier (see :func:`compiled_tiers`).
COMPILED_FOLDER = "_compiled"

#: The x86-64 micro-architecture levels a compiled tier may be built for (LLVM's CPU names),
#: best first, with the host features (LLVM's names) each adds to the levels after it.
CPU_LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    "x86-64-v3": ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"),
    "x86-64-v2": ("cx16", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3"),
}

#: The manifest of a tier folder: what its kernels were compiled for.
MANIFEST = "manifest.json"


def compiled_tag() -> str:
    """The folder of the compiled tier for this numba, Python and platform: kernels compiled for
    another of them are never looked at."""
    return f"numba-{numba.__version__}-{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def compiled_root() -> str:
    """Where the compiled tiers live: ``NEURON_KERNELS_COMPILED_DIR`` if set, else the package's
    ``_compiled`` folder."""
    return os.environ.get("NEURON_KERNELS_COMPILED_DIR") or os.path.join(PACKAGE_ROOT, COMPILED_FOLDER)


def host_levels() -> list[str]:
    """The levels of :data:`CPU_LEVELS` this machine runs, best first."""
    from llvmlite import binding

    try:
        features = {k for k, v in binding.get_host_cpu_features().items() if v}
    except RuntimeError:  # pragma: no cover - LLVM cannot tell on this platform
        return []
    levels = list(CPU_LEVELS)
    return [lv for i, lv in enumerate(levels) if all(f in features for later in levels[i:] for f in CPU_LEVELS[later])]


@functools.cache
def compiled_tiers() -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    """(level, folder, numba's CPU key of the code there) of each compiled tier this process can
    use, best first: a folder under :func:`compiled_root` / :func:`compiled_tag` for a level the
    host runs, whose manifest is readable. Read-only: nothing is ever written there at run time.
    None where ``NUMBA_CPU_NAME`` is set (a build of a tier) or ``NEURON_KERNELS_COMPILED=0``
    (``neuron-kernels warmup``, which compiles host-tuned kernels into the local cache)."""
    if numba.config.CPU_NAME or os.environ.get("NEURON_KERNELS_COMPILED", "").strip() == "0":
        return ()
    base = os.path.join(compiled_root(), compiled_tag())
    tiers = []
    for level in host_levels():
        folder = os.path.join(base, level)
        try:
            with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
                magic = tuple(json.load(f)["magic"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        tiers.append((level, folder, magic))
    return tuple(tiers)


_compiled_off = threading.local()


def tiers_off() -> bool:
    """Whether this thread is within :func:`local_cache_only`."""
    return bool(getattr(_compiled_off, "active", False))


@contextlib.contextmanager
def local_cache_only() -> Any:
    """Within the block, this thread and the processes it starts neither load from the compiled
    tier nor see it (``NEURON_KERNELS_COMPILED=0``): what they lack is compiled for this host and
    saved to the local cache (``neuron-kernels warmup``)."""
    before = os.environ.get("NEURON_KERNELS_COMPILED")
    os.environ["NEURON_KERNELS_COMPILED"] = "0"
    _compiled_off.active = True
    try:
        yield
    finally:
        _compiled_off.active = False
        if before is None:
            os.environ.pop("NEURON_KERNELS_COMPILED", None)
        else:
            os.environ["NEURON_KERNELS_COMPILED"] = before
