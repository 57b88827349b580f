"""The in-process runner of the command (``cli_runner.run``) behaves as a subprocess would for the
tests: exit status, stdout and stderr, and nothing left behind in the test process."""

import os
import signal
import sys

import pytest

from neuron_kernels.cli.commands import COMMANDS

from .cli_runner import run


def test_status_and_streams(tmp_path):
    r = run("promote", "uint8", "int8", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "int16\n", "")
    r = run("promote", "int8", cwd=tmp_path, check=False)  # the command's own error
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.count("\n") == 1 and "needs two dtypes" in r.stderr
    r = run("frobnicate", cwd=tmp_path, check=False)  # argparse's exit
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.count("\n") == 1 and "invalid choice" in r.stderr
    r = run("--help", cwd=tmp_path)
    assert r.returncode == 0 and "usage: neuron-kernels" in r.stdout
    with pytest.raises(AssertionError, match="exit 2: .*needs two dtypes"):
        run("promote", "int8", cwd=tmp_path)


def test_nothing_left_behind(tmp_path, monkeypatch):
    """The working directory, the signal handlers and the streams are the test's again, after a
    run that fails and after a bug that escapes ``main``."""
    here, handlers = os.getcwd(), (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    streams = (sys.stdout, sys.stderr)
    run("promote", "float9", "int8", cwd=tmp_path, check=False)

    def broken(args):
        assert os.getcwd() == str(tmp_path)
        raise ValueError("a bug inside the package")

    monkeypatch.setitem(COMMANDS, "formats", broken)
    with pytest.raises(ValueError, match="a bug inside the package"):
        run("formats", cwd=tmp_path)
    assert (os.getcwd(), (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))) == (here, handlers)
    assert (sys.stdout, sys.stderr) == streams
