"""The command against bad input: :func:`fails` runs it and checks that it failed cleanly (exit 2,
one line naming the problem, nothing written, the inputs unchanged); :func:`run_limited` runs it in
a process of its own with limits set (a full disk), :func:`snapshot` hashes a folder's files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from .cli_runner import run
from .helpers import child_env

ENV = child_env(PYTHONWARNINGS="error")


def run_limited(*args, cwd, preexec):
    """``python -m neuron_kernels ARGS`` in ``cwd``, with ``preexec`` run in the child first."""
    # A process of its own: the limits ``preexec`` sets (RLIMIT_FSIZE) must not bind the test process.
    return subprocess.run(
        [sys.executable, "-m", "neuron_kernels", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
        preexec_fn=preexec,
    )


def snapshot(folder) -> dict:
    """Every file under ``folder`` and a hash of its bytes."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def fails(*args, cwd, message, preexec=None):
    """Exit 2, one line naming the problem, no new entry in ``cwd``, inputs unchanged."""
    before, files = set(os.listdir(cwd)), snapshot(cwd)
    r = run(*args, cwd=cwd, check=False) if preexec is None else run_limited(*args, cwd=cwd, preexec=preexec)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in lines[0], lines[0]
    assert set(os.listdir(cwd)) == before
    assert snapshot(cwd) == files
    return lines[0]
