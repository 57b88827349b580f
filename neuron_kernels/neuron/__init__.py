"""Neuron's own pieces: the compiler's type promotion (:mod:`.promotion`), the casts it inserts
between operands (:mod:`.auto_cast`) and the operands of its MX matmul (:mod:`.operands`).

Nothing is imported here: the promotion lattice sits below the casts and the registry, the
operands above the block arrays, and each is imported from its own module. The operands' names
were this module's until 0.2 (``to_nc_matmul_mx`` and the rest): they still work, with a
``DeprecationWarning``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    import warnings

    from .._compat import REMOVED_IN
    from . import operands

    if name.startswith("__") or not hasattr(operands, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} is now {operands.__name__}.{name}; the old name goes in {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(operands, name)
