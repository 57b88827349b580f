"""The ``neuron-kernels`` command (also ``python -m neuron_kernels``).

Subcommands:

- ``bench``: throughput of every compiled cast and block format on built-in data;
- ``quantize``, ``dequantize``, ``cast``: files (``.npy``, ``.npz``, ``.safetensors``) of any size,
  processed in bounded memory, written atomically; ``quantize`` and ``dequantize`` also take model
  checkpoint folders (to and from the layouts runtimes load, :mod:`neuron_kernels.checkpoints`);
  ``quantize`` also reads a Zarr store into a Zarr store, chunk by chunk on Dask (``--workers N``:
  a local cluster, ``--scheduler ADDRESS``: an existing one; :mod:`neuron_kernels.lazy.stores`);
- ``check``: what would make a quantised checkpoint's runtime refuse it or load it wrong
  (``--repair OUT``); ``diff``: two checkpoints compared tensor by tensor
  (:mod:`neuron_kernels.checkpoints.doctor`, :mod:`neuron_kernels.checkpoints.diff`);
- ``error``: which block format, scale mode and scale policy suits an array (SQNR table, histogram);
- ``promote``: the promotion lattice (one pair, ``--explain``, or ``--table``);
- ``formats``: the format table.

Bad input prints one line on stderr and exits with status 2; an interrupted run exits with 130.
Neither leaves an output behind. A reader of stdout that stops early (``| head``) ends the command
quietly with status 141, its output files complete.

The modules, each importing only those listed after it: :mod:`.commands` (one function per
subcommand, by kind of input), :mod:`.progress` (what a terminal shows meanwhile), :mod:`.parser`
(the options), :mod:`.report` (the tables printed), :mod:`.quantities` (sizes with units).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import NeuronKernelsError
from .commands import COMMANDS
from .parser import build_parser
from .progress import compile_notice

__all__ = ["main"]


def _in_compiler() -> bool:
    """Whether this thread is inside numba's compiler (compiling a kernel or loading one from the
    cache), which holds its lock throughout."""
    lock = sys.modules.get("numba.core.compiler_lock")
    return lock is not None and bool(lock.global_compiler_lock.is_locked())


#: The signals to be sent again once numba's compiler is left (cancelled when the run ends first).
_AGAIN: list[threading.Timer] = []


def _stop(signum: int, frame: Any) -> None:
    """SIGINT or SIGTERM: stop the run. Not inside numba's compiler: an exception raised there can
    leave native objects (LLVM modules, a library being finalised) half-built, whose release may
    crash the process; the signal is sent again 20 ms later, until the compiler is left. Python
    objects the interrupt leaves half-built (a cache file being written) fail in their finalisers as
    the stack unwinds and at exit; the run is over and its output removed, so they are not reported."""
    if _in_compiler():
        again = threading.Timer(0.02, os.kill, (os.getpid(), signum))
        again.daemon = True
        _AGAIN[:] = [t for t in _AGAIN if t.is_alive()] + [again]
        again.start()
        return
    sys.unraisablehook = _ignore
    raise KeyboardInterrupt


def _ignore(unraisable: Any) -> None:
    pass


def _one_line(message: str) -> str:
    """``message`` on one line: a name read from a file (a tensor's, a key's) may hold line breaks or
    other control characters, shown escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with contextlib.suppress(ValueError):  # not the main thread: leave the signals alone
        for signum in previous:
            signal.signal(signum, _stop)  # clean up partial outputs, quietly
    try:
        with compile_notice(args):
            return int(COMMANDS[args.command](args))
    except BrokenPipeError:  # the reader of stdout stopped early (`| head`): the output is complete
        with contextlib.suppress(OSError, ValueError):  # nothing more to flush into the closed pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command ended by SIGPIPE
    except (NeuronKernelsError, OSError) as exc:  # the caller's mistakes (UsageError too); else a bug
        message = (
            str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.filename}: {exc.strerror or exc}"
        )
        print(f"neuron-kernels {args.command}: error: {_one_line(message)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        sys.unraisablehook = _ignore  # as _stop does (a KeyboardInterrupt raised another way)
        print(f"neuron-kernels {args.command}: interrupted; no output written", file=sys.stderr)
        return 130
    finally:
        for again in _AGAIN:  # the run ended before a deferred signal was sent again: it came too late
            again.cancel()
        _AGAIN.clear()
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)
