"""The ``neuron-kernels`` command run in the test process: :func:`run` calls
:func:`neuron_kernels.cli.main` as ``python -m neuron_kernels ARGS`` would (same arguments, working
directory, exit status, stdout and stderr) without paying a new interpreter's and numba's start-up.

What a run could leave behind in this process is put back: the working directory, ``sys.stdout``
and ``sys.stderr``, the SIGINT and SIGTERM handlers. stderr is a ``StringIO`` (not a terminal), so
the command shows no progress bar and no compile notice, as in a subprocess with a pipe. An
exception that ``main`` lets through (a bug: it would show a traceback and exit 1) is raised here,
so the test fails with its traceback. Tests that need a process of their own (signals, exit
status of the installed script, resource limits, environment read at import, peak memory) start
one and say why.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
from dataclasses import dataclass

from neuron_kernels.cli import main

__all__ = ["CliResult", "run"]


@dataclass(frozen=True)
class CliResult:
    """What ``subprocess.run(..., capture_output=True, text=True)`` returns, as far as tests read it."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run(*args: object, cwd: str | os.PathLike[str], check: bool = True) -> CliResult:
    """``neuron-kernels ARGS`` in ``cwd``, in this process. ``check``: a non-zero exit status raises
    AssertionError with the stderr (pass ``check=False`` to look at a failure)."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse: 0 after --help, 2 after a usage error
                status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        os.chdir(here)
        for signum, handler in handlers.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(signum, handler)
    result = CliResult(argv, status, out.getvalue(), err.getvalue())
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {result.stderr}")
    return result
