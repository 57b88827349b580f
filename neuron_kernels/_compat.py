"""Earlier forms of the public API, kept working for one more minor release with a
``DeprecationWarning`` that names the form to use instead. Each goes in release :data:`REMOVED_IN`.
Renamed names are here (:func:`renamed`); the block array's earlier constructor arguments are in
:mod:`neuron_kernels.blocks.earlier_forms`, beside the class."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

__all__ = ["REMOVED_IN", "RENAMED", "MOVED", "renamed", "find_moved_modules"]

#: The release that removes every form below.
REMOVED_IN = "0.3.0"

#: Names that changed, by module: the old name and the new one (MX -> block, where any block format
#: is meant).
RENAMED: dict[str, dict[str, str]] = {
    "neuron_kernels.tools.bench": {
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


#: Modules that moved into a room of their own, by old name: their new name.
MOVED: dict[str, str] = {
    "neuron_kernels.promotion": "neuron_kernels.neuron.promotion",
    "neuron_kernels.bench": "neuron_kernels.tools.bench",
    "neuron_kernels.plots": "neuron_kernels.tools.plots",
    "neuron_kernels.warmup": "neuron_kernels.tools.warmup",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import`` of an old module name of :data:`MOVED`: the module under its new name, with a
    warning (the module itself is not copied: it is one object under both names)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} is now {new}; the old name goes in {REMOVED_IN}", DeprecationWarning, stacklevel=2
        )
        sys.modules[module.__name__] = importlib.import_module(new)


def find_moved_modules() -> None:
    """Let the old names of :data:`MOVED` be imported (once per process)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())  # before any other finder of the old names
