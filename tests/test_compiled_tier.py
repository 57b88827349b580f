"""The compiled tier (docs/performance.md, "Compiled kernels"): kernels compiled for a CPU level,
read-only, answering first calls in a process whose own cache is empty; the local cache first;
anything unreadable or foreign a miss, never an error.

Each test builds a small tier of its own (a few kernels, compiled in a subprocess for the level
``x86-64-v2``, which any x86-64 machine this suite runs on has) and starts fresh processes with an
empty ``NUMBA_CACHE_DIR``.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels._jit import CPU_LEVELS, MANIFEST, compiled_tag, host_levels
from neuron_kernels.errors import InvalidValueError
from neuron_kernels.tools.warmup import build_compiled_tier

from .helpers import child_env

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or "x86-64-v2" not in host_levels(),
    reason="the levels are x86-64's",
)

LEVEL = "x86-64-v2"
TASKS = [("cast", "float32", "bfloat16"), ("quantize", "float32", "mxfp8_e4m3")]

#: The calls of TASKS on data, in a fresh process: the compile count and the result's bytes.
CALLS = """
import json, sys
import numpy as np
import neuron_kernels as nk
from neuron_kernels import _jit
x = np.linspace(-300, 300, 4096, dtype=np.float32).reshape(64, 64)
q = nk.quantize(x, "mxfp8_e4m3")
out = {"cast": nk.cast(x, "bfloat16").view(np.uint16).tobytes().hex(),
       "codes": q.codes.tobytes().hex(), "scales": q.scales.view(np.uint8).tobytes().hex(),
       "values": q.dequantize().view(np.uint32).tobytes().hex(),
       "compiles": _jit.compiles(), "origins": sorted(set(_jit.ORIGINS.values()))}
print(json.dumps(out))
"""

#: The cast of CALLS alone (one kernel to compile where the tier misses).
CAST_CALL = """
import json
import numpy as np
import neuron_kernels as nk
from neuron_kernels import _jit
x = np.linspace(-300, 300, 4096, dtype=np.float32).reshape(64, 64)
out = {"cast": nk.cast(x, "bfloat16").view(np.uint16).tobytes().hex(),
       "compiles": _jit.compiles(), "origins": sorted(set(_jit.ORIGINS.values()))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    root = tmp_path_factory.mktemp("tier")
    manifest = build_compiled_tier(str(root), LEVEL, TASKS, processes=1)
    assert manifest["level"] == LEVEL and manifest["kernels"] > 0
    return root


def _fresh(tmp_path, tier_root, code=CALLS, **extra):
    cache = tmp_path / f"cache{len(list(tmp_path.iterdir()))}"
    env = child_env(
        NUMBA_CACHE_DIR=str(cache),
        NEURON_KERNELS_COMPILED_DIR=str(tier_root),
        **{"NEURON_KERNELS_COMPILED": "1", **extra},
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _jit_answer():
    x = np.linspace(-300, 300, 4096, dtype=np.float32).reshape(64, 64)
    q = nk.quantize(x, "mxfp8_e4m3")
    return {
        "cast": nk.cast(x, "bfloat16").view(np.uint16).tobytes().hex(),
        "codes": q.codes.tobytes().hex(),
        "scales": q.scales.view(np.uint8).tobytes().hex(),
        "values": q.dequantize().view(np.uint32).tobytes().hex(),
    }


def test_the_tier_answers_first_calls_without_compiling(tmp_path, tier):
    got, err = _fresh(tmp_path, tier)
    assert got["compiles"] == 0, got["origins"]
    assert got["origins"] == [f"compiled {LEVEL}"]
    want = _jit_answer()
    assert {k: got[k] for k in want} == want  # bit for bit what this process's JIT gives
    assert "compiling kernels" not in err


def test_the_local_cache_comes_first(tmp_path, tier):
    cache = tmp_path / "warm"
    env = child_env(NUMBA_CACHE_DIR=str(cache), NEURON_KERNELS_COMPILED_DIR=str(tier), NEURON_KERNELS_COMPILED="1")
    warm = [sys.executable, "-m", "neuron_kernels", "warmup", "--formats", "bfloat16", "--sources", "float32"]
    subprocess.run([*warm, "--jobs", "1", "--quiet"], env=env, check=True, capture_output=True, timeout=600)
    status = subprocess.run([*warm, "--status"], env=env, check=True, capture_output=True, text=True, timeout=600)
    assert f"compiled tier: {LEVEL}" in status.stdout
    assert "float32 -> bfloat16                      local" in status.stdout, status.stdout


@pytest.mark.parametrize("damage", ["truncated data", "another CPU key", "no manifest", "another numba"])
def test_a_tier_that_does_not_fit_is_a_miss(tmp_path, tier, damage):
    """Whatever is wrong with the tier, the calls compile and give the right bits, with no error."""
    copy = tmp_path / "tier"
    subprocess.run(["cp", "-r", str(tier), str(copy)], check=True)
    folder = copy / compiled_tag() / LEVEL
    if damage == "truncated data":
        for path in glob.glob(str(folder / "**" / "*.nbc"), recursive=True):
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
    elif damage == "another CPU key":
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["magic"][1] = "x86-64"
        (folder / MANIFEST).write_text(json.dumps(manifest))
    elif damage == "no manifest":
        (folder / MANIFEST).unlink()
    else:
        os.rename(copy / compiled_tag(), copy / "numba-0.0.0-cpython-311-linux-x86_64")
    got, _ = _fresh(tmp_path, copy, CAST_CALL)
    assert got["compiles"] > 0 and got["origins"] == ["jit"]
    assert got["cast"] == _jit_answer()["cast"]


def test_no_tier_where_turned_off(tmp_path, tier):
    got, _ = _fresh(tmp_path, tier, CAST_CALL, NEURON_KERNELS_COMPILED="0")
    assert got["compiles"] > 0 and got["origins"] == ["jit"]


def test_levels_and_bad_level(tmp_path):
    levels = host_levels()
    assert levels == [lv for lv in CPU_LEVELS if lv in levels]  # best first
    assert levels == list(CPU_LEVELS)[len(CPU_LEVELS) - len(levels) :]  # a level implies the ones after it
    with pytest.raises(InvalidValueError, match="unknown CPU level 'x86-64-v9'; accepted: x86-64-v4"):
        build_compiled_tier(str(tmp_path), "x86-64-v9", TASKS)
