"""A file larger than the memory the command may use: ``quantize`` of a 1 GiB ``.npy`` with
``--chunk-mb 64`` must keep the child's peak RSS bounded and write what ``quantize_mx`` computes
in memory (marked slow; CI runs it).

The peak is the child's own ``VmHWM``, as ``tests/memory.py`` reports it (which says why not
``ru_maxrss``).
"""

import re
import subprocess
import sys

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.io.npy import NpyWriter

from .helpers import child_env
from .memory import REPORT_PEAK

ROWS, COLS = 1 << 15, 1 << 13  # 256 Mi float32 = 1 GiB
PEAK_LIMIT_MIB = 512  # the input alone is 1024 MiB, input + codes 1280 MiB; seen: 290 MiB


@pytest.mark.slow
def test_quantize_a_1gib_npy_in_bounded_memory(tmp_path):
    src = tmp_path / "big.npy"
    rng = np.random.default_rng(1)
    with NpyWriter(str(src), (ROWS, COLS), np.float32) as w:
        for _ in range(ROWS // 1024):
            rows = rng.standard_normal((1024, COLS), dtype=np.float32)
            rows *= np.exp2(rng.integers(-12, 12, (1024, 1), dtype=np.int8).astype(np.float32))
            w.write(rows)
    assert src.stat().st_size >= 1 << 30

    # A process of its own: its peak memory (VmHWM) is what is measured.
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            REPORT_PEAK,
            "quantize",
            "big.npy",
            "q.npz",
            "--format",
            "mxfp4_e2m1",
            "--rounding",
            "stochastic",
            "--seed",
            "7",
            "--chunk-mb",
            "64",
            "--quiet",
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert child.returncode == 0, child.stderr
    peak_mib = int(re.search(r"VmHWM:\s*(\d+) kB", child.stderr).group(1)) / 1024
    assert peak_mib < PEAK_LIMIT_MIB, f"peak RSS {peak_mib:.0f} MiB"
    out = child.stdout

    x = np.load(src, mmap_mode="r")
    want = nk.quantize_mx(x, "mxfp4_e2m1", rounding="stochastic", seed=7)
    got = nk.load_blocks(tmp_path / "q.npz")
    np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
    np.testing.assert_array_equal(got.codes, want.codes)
    assert "big.npy" in out
    print(f"peak RSS of the child: {peak_mib:.0f} MiB")
