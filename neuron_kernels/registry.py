"""The dispatch registry: cast kernels keyed on (source, target) canonical format names.

It is the only dispatch in the package: :func:`neuron_kernels.cast` and
:func:`neuron_kernels.auto_cast` look their kernel up here and nowhere else.

A kernel is a plain function ``kernel(src, dst, options, start)`` on 1-D C-contiguous arrays:
``src`` holds the source values (in the source format's array dtype), ``dst`` receives the
target's (one container per four elements for packed ``*_x4`` targets); ``start`` is the index
of ``src[0]`` in the whole flattened input, for kernels whose result depends on the position
(stochastic rounding). Kernels do not validate; the public functions do.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .formats import DTypeLike, canonical_name

__all__ = [
    "ROUNDING_MODES",
    "CastKernel",
    "CastOptions",
    "UnsupportedCastError",
    "register_cast",
    "lookup_cast",
    "supported_casts",
]

#: The rounding modes the package knows (one vocabulary everywhere).
ROUNDING_MODES: tuple[str, ...] = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
)

Impl = Literal["numba", "fallback"]


@dataclass(frozen=True)
class CastOptions:
    """What a kernel is asked to do besides the plain cast."""

    rounding: str = "nearest_even"
    saturate: bool = False
    seed: int | None = None


@dataclass(frozen=True)
class CastKernel:
    """One registered cast.

    ``impl`` is ``"numba"`` for the package's compiled kernels and ``"fallback"`` for an explicitly
    registered numpy/ml_dtypes implementation. ``roundings`` and ``saturate`` say which options the
    kernel implements; ``parallel`` that it may be run on disjoint chunks at once.
    """

    source: str
    target: str
    impl: Impl
    function: Callable[[Any, Any, CastOptions, int], None] = field(repr=False)
    roundings: frozenset[str] = frozenset({"nearest_even"})
    saturate: bool = False
    parallel: bool = True

    def check_options(self, options: CastOptions) -> None:
        """Raise ``NotImplementedError`` for an option this kernel does not implement."""
        if options.rounding not in self.roundings:
            raise NotImplementedError(
                f"rounding={options.rounding!r} is not implemented for {self.source} -> "
                f"{self.target}; implemented: {', '.join(sorted(self.roundings))}"
            )
        if options.saturate and not self.saturate:
            raise NotImplementedError(f"saturate=True is not implemented for {self.source} -> {self.target}")


class UnsupportedCastError(TypeError):
    """No kernel is registered for a (source, target) pair."""


_REGISTRY: dict[tuple[str, str], CastKernel] = {}


def register_cast(
    source: DTypeLike,
    target: DTypeLike,
    *,
    impl: Impl = "numba",
    roundings: tuple[str, ...] = ("nearest_even",),
    saturate: bool = False,
    parallel: bool = True,
    replace: bool = False,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator registering ``fn(src, dst, options, start)`` as the cast ``source -> target``.

    A pair can be registered once; ``replace=True`` lets a compiled kernel take over a
    fallback's pair.
    """
    key = (canonical_name(source), canonical_name(target))
    unknown = set(roundings) - set(ROUNDING_MODES)
    if unknown:
        raise ValueError(f"unknown rounding modes {sorted(unknown)}; known: {', '.join(ROUNDING_MODES)}")

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        if key in _REGISTRY and not replace:
            raise ValueError(f"a cast {key[0]} -> {key[1]} is already registered")
        _REGISTRY[key] = CastKernel(key[0], key[1], impl, fn, frozenset(roundings), saturate, parallel)
        return fn

    return decorate


_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        from . import kernels  # noqa: F401  (registers every kernel on first import)

        _loaded = True


def lookup_cast(source: DTypeLike, target: DTypeLike) -> CastKernel:
    """The kernel for ``source -> target``; ``UnsupportedCastError`` names the pair and what exists."""
    _ensure_loaded()
    src, dst = canonical_name(source), canonical_name(target)
    entry = _REGISTRY.get((src, dst))
    if entry is not None:
        return entry
    targets = sorted(t for s, t in _REGISTRY if s == src)
    if targets:
        close = difflib.get_close_matches(dst, targets, n=3, cutoff=0.5)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise UnsupportedCastError(
            f"no cast from {src} to {dst}{hint}; from {src} the supported targets are: {', '.join(targets)}"
        )
    sources = sorted({s for s, _ in _REGISTRY})
    raise UnsupportedCastError(
        f"no cast from {src} to {dst}: nothing casts from {src}; supported sources: {', '.join(sources)}"
    )


def supported_casts(impl: Impl | None = None) -> list[CastKernel]:
    """Every registered cast (optionally only one implementation kind), sorted by pair."""
    _ensure_loaded()
    return [k for _, k in sorted(_REGISTRY.items()) if impl is None or k.impl == impl]
