"""The package's exceptions: one class for each kind of mistake a caller can make.

Each is also the built-in exception that kind of mistake raised before (a ``ValueError`` or a
``TypeError``), so ``except ValueError`` goes on catching what it caught. The command line reports
these, and only these (with ``OSError``: a full disk, a missing file), as one line on stderr and
exit status 2; anything else is a bug of the package and shows its traceback.
"""

from __future__ import annotations

__all__ = [
    "NeuronKernelsError",
    "InvalidValueError",
    "InvalidTypeError",
    "UnknownFormatError",
    "NotApplicableError",
    "MissingExtraError",
    "ClusterError",
]


class NeuronKernelsError(Exception):
    """Base of every error the package raises about its caller's input."""


class InvalidValueError(NeuronKernelsError, ValueError):
    """An argument of an accepted type whose value is not accepted (the message says what is)."""


class InvalidTypeError(NeuronKernelsError, TypeError):
    """An argument of a type that is not accepted (the message says which are)."""


class UnknownFormatError(NeuronKernelsError, ValueError, TypeError):
    """A dtype, format or block format the package does not know (the message lists those it does).
    Both a ``ValueError`` and a ``TypeError``: casts raised the one, block formats the other."""


class NotApplicableError(InvalidValueError):
    """An option the package knows that does not apply to the format asked for, e.g. a scale mode
    of MX given for NVFP4: "not valid for nvfp4 (valid: ...)"."""


class MissingExtraError(NeuronKernelsError, ImportError):
    """A feature whose optional dependencies are not installed (the message names the extra)."""


class ClusterError(NeuronKernelsError, RuntimeError):
    """A Dask scheduler that cannot be reached, or a cluster that lost a job."""
