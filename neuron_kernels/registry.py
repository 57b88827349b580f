"""The dispatch registry: cast kernels keyed on (source, target) canonical format names.

It is the only dispatch in the package: :func:`neuron_kernels.cast` and
:func:`neuron_kernels.auto_cast` look their kernel up here and nowhere else.

A kernel is a plain function ``kernel(src, dst, options, start)`` on 1-D C-contiguous arrays:
``src`` holds the source values (in the source format's array dtype), ``dst`` receives the
target's (one container per four elements for packed ``*_x4`` targets); ``start`` is the index
of ``src[0]`` in the whole flattened input, for kernels whose result depends on the position
(stochastic rounding). Large arrays are split into disjoint pieces that run on several threads
at once, so a kernel must not keep state between calls. Kernels do not validate; the public
functions do (a kernel only ever sees the options it declared).

Beside its array kernel, each of the package's elementwise casts has a NumPy ufunc
(:meth:`CastKernel.ufunc`, made with numba's ``@vectorize`` on first use): the cast applied to
anything that implements ``__array_ufunc__``. :func:`neuron_kernels.cast` runs the array kernel on
NumPy arrays and the ufunc on array-likes that stay lazy (Dask arrays, xarray objects).

The package's own kernels are loaded on first use (the first lookup or registration), which
imports no numba. :func:`register_cast` adds a kernel for a pair the package does not have, or
with ``replace=True`` puts one in place of the kernel a pair has; because registering loads the
package's kernels first, the outcome is the same whether it happens before or after the first
cast.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from .dtypes import DTypeLike, canonical_name
from .errors import InvalidTypeError, InvalidValueError, NeuronKernelsError
from .modes import ROUNDING_MODES

__all__ = [
    "ROUNDING_MODES",
    "CastFunction",
    "CastKernel",
    "CastOptions",
    "UnsupportedCastError",
    "register_cast",
    "lookup_cast",
    "supported_casts",
    "block_kernels",
]


@dataclass(frozen=True)
class CastOptions:
    """What a kernel is asked to do besides the plain cast."""

    rounding: str = "nearest_even"
    saturate: bool = False
    seed: int | None = None


#: The signature of a kernel: ``fn(src, dst, options, start)`` (see the module docstring).
CastFunction = Callable[[np.ndarray, np.ndarray, CastOptions, int], None]

#: ``ufuncs(rounding, saturate)``: the NumPy ufunc of a cast for those options.
UfuncFactory = Callable[[str, bool], np.ufunc]

_F = TypeVar("_F", bound=CastFunction)


@dataclass(frozen=True)
class CastKernel:
    """One registered cast.

    ``function`` is called as ``function(src, dst, options, start)``. ``roundings`` and
    ``saturate`` say which options it implements. ``builtin`` is True for the package's own
    compiled kernels, False for a kernel registered with :func:`register_cast`. ``ufuncs`` makes
    the cast's NumPy ufunc (see :meth:`ufunc`); None where there is none (packed containers, and
    kernels registered with :func:`register_cast`); ``has_ufunc`` says which.
    """

    source: str
    target: str
    function: CastFunction = field(repr=False)
    roundings: frozenset[str] = frozenset({"nearest_even"})
    saturate: bool = False
    builtin: bool = False
    ufuncs: UfuncFactory | None = field(default=None, repr=False, compare=False)
    has_ufunc: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "has_ufunc", self.ufuncs is not None)

    def ufunc(self, rounding: str = "nearest_even", saturate: bool = False) -> np.ufunc:
        """The cast as a NumPy ufunc, made with numba's ``@vectorize`` on first use and kept.

        It takes the source's items and gives the target's: float32, float64 and integer items as
        they are, every other format as its unsigned integer codes (``a.view(np.uint16)`` of a
        bfloat16 array; a float8 result ``.view(ml_dtypes.float8_e4m3fn)``); tfloat32 and float32r
        are float32. It accepts every ufunc keyword (``out=``, ``where=``, broadcasting) and any
        object implementing ``__array_ufunc__``, and gives the array kernel's bits. Two limits
        are numba's, not the cast's: numba-made ufuncs refuse a ``where=`` mask (0.68 with NumPy
        2.4: "An iterator operand was flagged as the ARRAYMASK ..."; even ``where=False``: only the
        default ``where=True`` works); and like NumPy's own loops the ufunc reports the
        floating-point exceptions its arithmetic raises (``invalid`` for signalling NaN inputs) as
        warnings, which ``np.errstate`` controls; the array kernels and
        :func:`neuron_kernels.cast` report none.

        Raises ``NotImplementedError`` for an option the cast does not implement, for
        ``rounding="stochastic"`` (an element's random bits depend on its index in the whole array,
        which a ufunc does not see) and for casts without a ufunc (packed ``*_x4`` containers,
        kernels registered with :func:`register_cast`).
        """
        self.check_options(CastOptions(rounding, bool(saturate)))
        if self.ufuncs is None:
            why = "packed containers are not elementwise" if self.builtin else "it was registered as an array kernel"
            raise NotImplementedError(f"{self.source} -> {self.target} has no ufunc ({why})")
        if rounding == "stochastic":
            raise NotImplementedError(
                "stochastic rounding has no ufunc: an element's random bits depend on its index in the whole "
                "array; neuron_kernels.cast applies it to NumPy and Dask arrays"
            )
        return self.ufuncs(rounding, bool(saturate))

    def check_options(self, options: CastOptions) -> None:
        """Raise ``NotImplementedError`` for an option this kernel does not implement."""
        if options.rounding not in self.roundings:
            raise NotImplementedError(
                f"rounding={options.rounding!r} is not implemented for {self.source} -> "
                f"{self.target}; implemented: {', '.join(sorted(self.roundings))}"
            )
        if options.saturate and not self.saturate:
            raise NotImplementedError(f"saturate=True is not implemented for {self.source} -> {self.target}")


class UnsupportedCastError(NeuronKernelsError, TypeError):
    """No kernel is registered for a (source, target) pair."""


_REGISTRY: dict[tuple[str, str], CastKernel] = {}
_loaded = False
_lock = threading.RLock()


def _ensure_loaded() -> None:
    """Put the package's kernels in the registry, once (before any registration of a user's)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        from .kernels.compiled import builtin_kernels

        kernels = {
            (source, target): CastKernel(source, target, fn, frozenset(roundings), saturate, True, ufuncs)
            for source, target, fn, roundings, saturate, ufuncs in builtin_kernels()
        }
        _REGISTRY.update(kernels)
        _loaded = True


def block_kernels() -> Any:
    """The launcher of the block kernels (:mod:`neuron_kernels.kernels.launch`), loaded on first use:
    the one way the block containers reach their kernels, as casts reach theirs here."""
    from .kernels import launch

    return launch


def register_cast(
    source: DTypeLike,
    target: DTypeLike,
    *,
    roundings: tuple[str, ...] = ("nearest_even",),
    saturate: bool = False,
    replace: bool = False,
) -> Callable[[_F], _F]:
    """Decorator registering ``fn(src, dst, options, start)`` as the cast ``source -> target``.

    Parameters
    ----------
    source, target
        The pair, as any dtype description the package accepts (``"float32"``, ``np.float16``,
        ``ml_dtypes.bfloat16``, ``"float8_e4m3fn_x4"``, ...).
    roundings
        The rounding modes ``fn`` implements; a cast asking for another raises
        ``NotImplementedError`` before ``fn`` is called.
    saturate
        Whether ``fn`` implements ``saturate=True``.
    replace
        Put ``fn`` in place of the kernel the pair already has (the package's or one registered
        before), or add it if there is none. Without it, registering a pair that has a kernel
        raises ``ValueError`` and changes nothing.

    Returns
    -------
    Callable
        The decorator: it registers ``fn``, a plain function ``fn(src, dst, options, start)`` as
        the module docstring describes, and returns it unchanged. From then on
        :func:`~neuron_kernels.cast`, :func:`~neuron_kernels.auto_cast` and :func:`lookup_cast`
        use it for the pair, whether or not anything was cast before.
    """
    src, dst = canonical_name(source), canonical_name(target)
    unknown = set(roundings) - set(ROUNDING_MODES)
    if unknown:
        raise InvalidValueError(f"unknown rounding modes {sorted(unknown)}; known: {', '.join(ROUNDING_MODES)}")

    def decorate(fn: _F) -> _F:
        if not callable(fn):
            raise InvalidTypeError(f"a cast kernel must be a function fn(src, dst, options, start), got {fn!r}")
        _ensure_loaded()
        with _lock:
            if (src, dst) in _REGISTRY and not replace:
                raise InvalidValueError(
                    f"a cast {src} -> {dst} is already registered; pass replace=True to use yours instead"
                )
            _REGISTRY[src, dst] = CastKernel(src, dst, fn, frozenset(roundings), bool(saturate))
        return fn

    return decorate


def lookup_cast(source: DTypeLike, target: DTypeLike) -> CastKernel:
    """The kernel for ``source -> target``; ``UnsupportedCastError`` names the pair and what exists."""
    _ensure_loaded()
    src, dst = canonical_name(source), canonical_name(target)
    entry = _REGISTRY.get((src, dst))
    if entry is not None:
        return entry
    pairs = list(_REGISTRY.copy())  # a registration in another thread must not break the iteration
    targets = sorted(t for s, t in pairs if s == src)
    if targets:
        close = difflib.get_close_matches(dst, targets, n=3, cutoff=0.5)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise UnsupportedCastError(
            f"no cast from {src} to {dst}{hint}; from {src} the supported targets are: {', '.join(targets)}"
        )
    sources = sorted({s for s, _ in pairs})
    raise UnsupportedCastError(
        f"no cast from {src} to {dst}: nothing casts from {src}; supported sources: {', '.join(sources)}"
    )


def supported_casts() -> list[CastKernel]:
    """Every registered cast, the package's and the user's, sorted by (source, target)."""
    _ensure_loaded()
    return [k for _, k in sorted(_REGISTRY.copy().items())]
