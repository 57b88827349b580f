"""Compiling ahead of the first call: the warmup tasks, the ``warmup`` command (in worker
processes, into the on-disk cache), and the one-time notice of a first call that compiles.

The subprocesses get an empty cache folder of their own (``NUMBA_CACHE_DIR``), so that what they
compile and load is theirs, whatever the test run has cached already.
"""

import subprocess
import sys

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.tools.warmup import describe, run_task, warmup, warmup_tasks

from .helpers import child_env


def test_tasks_cover_block_formats_and_casts_both_ways():
    tasks = warmup_tasks(["mxfp8_e4m3", "float8_e5m2"], ["float32", "bfloat16"])
    assert tasks[0][0] == "quantize"  # the longest compiles first
    assert set(tasks) == {
        *((kind, s, "mxfp8_e4m3") for kind in ("quantize", "fake_quantize", "error") for s in ("float32", "bfloat16")),
        ("cast", "float32", "float8_e5m2"),
        ("cast", "bfloat16", "float8_e5m2"),
        ("cast", "float8_e5m2", "float32"),
    }
    every = warmup_tasks()
    assert {f for kind, _, f in every if kind == "quantize"} == set(nk.BLOCK_FORMATS)
    assert {t for kind, s, t in every if kind == "cast" and s == "float32"} >= {"bfloat16", "float4_e2m1fn", "tfloat32"}
    assert describe(("cast", "float32", "bfloat16")) == "float32 -> bfloat16"


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((["mxfp9"], ["float32"]), "cannot warm up 'mxfp9': neither a block format"),
        ((None, ["int8"]), "warmup sources are float arrays"),
        ((None, ["float32"], ["compile"]), "unknown warmup kind 'compile'"),
    ],
)
def test_bad_tasks_are_refused(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        warmup_tasks(*args)


def test_in_process_warmup_makes_the_calls_a_real_use_makes():
    tasks = warmup_tasks(["mxfp4_e2m1", "float8_e4m3fn"], ["float32"])
    seen = []
    warmup(tasks, processes=1, progress=lambda done, total, task: seen.append((done, total, task)))
    assert [s[0] for s in seen] == list(range(1, len(tasks) + 1)) and {s[2] for s in seen} == set(tasks)
    compiled, _ = warmup(tasks, processes=1)
    assert compiled == 0  # all in this process now
    with pytest.raises(ValueError, match="processes must be a positive int"):
        warmup(tasks, processes=0)
    with pytest.raises(ValueError, match="unknown warmup kind"):
        run_task(("compile", "float32", "bfloat16"))


def _run(code_or_args, cache, cli=False):
    argv = [sys.executable, "-m", "neuron_kernels", *code_or_args] if cli else [sys.executable, "-c", code_or_args]
    # A process of its own: numba reads NUMBA_CACHE_DIR at import, and a new process compiles or loads afresh.
    r = subprocess.run(argv, env=child_env(NUMBA_CACHE_DIR=str(cache)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


def test_warmup_command_fills_the_cache_from_worker_processes(tmp_path):
    args = ["warmup", "--formats", "mxfp8_e4m3,bfloat16", "--sources", "float32", "--jobs", "2"]
    first = _run(args, tmp_path, cli=True)
    compiled = int(first.stdout.split("kernel(s) compiled")[0].split(":")[-1])
    assert compiled >= 4 and "now cached on disk" in first.stdout
    again = _run(args, tmp_path, cli=True)
    assert "0 kernel(s) compiled" in again.stdout and "already cached" in again.stdout
    # a later process that makes the same calls loads them all: it compiles nothing
    code = (
        "import numpy as np, neuron_kernels as nk\n"
        "from neuron_kernels._jit import compiles\n"
        "x = np.ones((4, 64), np.float32)\n"
        "nk.dequantize(nk.quantize(x, 'mxfp8_e4m3')); nk.fake_quantize(x, 'mxfp8_e4m3')\n"
        "nk.cast(nk.cast(x, 'bfloat16'), 'float32')\n"
        "print(compiles())\n"
    )
    assert _run(code, tmp_path).stdout.strip() == "0"


def test_a_first_call_that_compiles_says_so_once(tmp_path):
    code = (
        "import numpy as np, neuron_kernels as nk, neuron_kernels._jit.log as J\n"
        "J.NOTICE_AFTER = 0.0  # every compile is long enough to be told\n"
        "x = np.ones(8, np.float32)\n"
        "nk.cast(x, 'float8_e5m2'); nk.cast(x, 'float6_e3m2fn')\n"
    )
    r = _run(code, tmp_path)
    assert r.stderr.count("compiling kernels for their first use") == 1, r.stderr
    assert _run(code, tmp_path).stderr == ""  # cached: nothing to say


def test_compiles_counts_only_real_compiles():
    from neuron_kernels._jit import compiles

    x = np.ones(8, np.float32)
    nk.cast(x, "float8_e4m3fn")
    before = compiles()
    nk.cast(x, "float8_e4m3fn")
    assert compiles() == before
