"""Earlier forms of the public API, kept working for one more minor release with a
``DeprecationWarning`` that names the form to use instead. Each goes in release :data:`REMOVED_IN`.
Renamed names are here (:func:`renamed`); the block array's earlier constructor arguments are in
:mod:`neuron_kernels.blocks.earlier_forms`, beside the class."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["REMOVED_IN", "RENAMED", "renamed"]

#: The release that removes every form below.
REMOVED_IN = "0.3.0"

#: Names that changed, by module: the old name and the new one (MX -> block, where any block format
#: is meant).
RENAMED: dict[str, dict[str, str]] = {
    "neuron_kernels.bench": {
        "bench_mx": "bench_blocks",
        "format_mx_table": "format_block_table",
        "MXBenchRow": "BlockBenchRow",
    },
}


def renamed(module: str, name: str, namespace: dict[str, Any]) -> Any:
    """A module's ``__getattr__``: the new name's object for an old name of :data:`RENAMED`, with a
    warning; an ``AttributeError`` for any other missing name."""
    new = RENAMED.get(module, {}).get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is now {module}.{new}; the old name goes in {REMOVED_IN}", DeprecationWarning, stacklevel=3
    )
    return namespace[new]
