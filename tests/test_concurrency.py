"""Many Python threads calling the kernels at once get the single-threaded results, bit for bit.

The kernels release the GIL and large arrays are split over a shared thread pool, so concurrent
calls really run side by side: results must not depend on what else is running, on the thread
bound, or on which call loads a kernel first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels._parallel import PARALLEL_MIN_ELEMENTS

N_THREADS = 8
ROUNDS = 8
WIDTH = 1024
BIG_ROWS = PARALLEL_MIN_ELEMENTS // WIDTH + 3  # just above the parallel threshold
SMALL_ROWS = 37


def _data(rows: int, seed: int) -> np.ndarray:
    """float32 over 40 binades with NaN, infinities, signed zeros and subnormals."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, WIDTH)) * np.exp2(rng.integers(-20, 20, (rows, WIDTH)))).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 8)] = np.nan
    flat[rng.integers(0, flat.size, 8)] = np.inf
    flat[rng.integers(0, flat.size, 8)] = -np.inf
    flat[rng.integers(0, flat.size, 64)] = -0.0
    flat[rng.integers(0, flat.size, 64)] = np.float32(1e-40)
    return x


SMALL = _data(SMALL_ROWS, 1)
BIG = _data(BIG_ROWS, 2)
assert SMALL.size < PARALLEL_MIN_ELEMENTS <= BIG.size


def _jobs() -> dict[str, Callable[[], object]]:
    """Named calls covering casts (every path: contiguous, strided, packed, float64 and decode
    sources, stochastic) and the three MX functions, on arrays below and above the threshold."""
    jobs: dict[str, Callable[[], object]] = {}
    for label, x in (("small", SMALL), ("big", BIG)):
        x64 = x.astype(np.float64) * (1 + 2.0**-30)
        xb = x.astype(ml_dtypes.bfloat16)
        mx = nk.quantize_mx(x, "mxfp8_e4m3", axis=0, block_size=7, scale_mode="rceil")
        jobs.update(
            {
                f"{label}/bfloat16": lambda x=x: nk.cast(x, "bfloat16"),
                f"{label}/e4m3fn-saturate": lambda x=x: nk.cast(x, "float8_e4m3fn", saturate=True),
                f"{label}/e5m2-stochastic": lambda x=x: nk.cast(x, "float8_e5m2", rounding="stochastic", seed=7),
                f"{label}/fp4x4-stochastic": lambda x=x: nk.cast(
                    x, "float4_e2m1fn_x4", rounding="stochastic", seed=2**63 + 11
                ),
                f"{label}/tfloat32-toward-zero": lambda x=x: nk.cast(x, "tfloat32", rounding="toward_zero"),
                f"{label}/float64-e4m3-stochastic": lambda x64=x64: nk.cast(
                    x64, "float8_e4m3", rounding="stochastic", seed=3
                ),
                f"{label}/bfloat16-decode": lambda xb=xb: nk.cast(xb, np.float32),
                f"{label}/strided-float16": lambda x=x: nk.cast(x[:, ::-3], "float16", rounding="nearest_away"),
                f"{label}/mxfp4-stochastic": lambda x=x: nk.quantize_mx(x, "mxfp4_e2m1", rounding="stochastic", seed=5),
                f"{label}/mxfp8-axis0": lambda x=x: nk.quantize_mx(
                    x, "mxfp8_e4m3", axis=0, block_size=7, scale_mode="rceil"
                ),
                f"{label}/dequantize": lambda mx=mx: nk.dequantize_mx(mx),
                f"{label}/fake-mxint8-stochastic": lambda x=x: nk.fake_quantize_mx(
                    x, "mxint8", axis=0, block_size=5, rounding="stochastic", seed=9
                ),
                f"{label}/fake-mxfp6-even": lambda x=x: nk.fake_quantize_mx(
                    x, "mxfp6_e3m2", scale_mode="even", rounding="toward_zero"
                ),
            }
        )
    return jobs


def _bytes(result: object) -> list[np.ndarray]:
    """A result as byte arrays (block arrays: codes and scales), for bitwise comparison."""
    if isinstance(result, nk.BlockArray):
        return [np.ascontiguousarray(result.codes).view(np.uint8), result.scales.view(np.uint8)]
    assert isinstance(result, np.ndarray)
    return [np.ascontiguousarray(result).view(np.uint8)]


def _assert_same(name: str, got: object, want: list[np.ndarray]) -> None:
    parts = _bytes(got)
    assert len(parts) == len(want), name
    for g, w in zip(parts, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
        assert bad.size == 0, f"{name}: {bad.size} bytes differ from the single-threaded result, first at {bad[0]}"


def _run_concurrently(tasks: list[Callable[[], object]]) -> list[object]:
    """Run ``tasks`` on ``N_THREADS`` threads, released together."""
    go = threading.Event()

    def wait_then(task: Callable[[], object]) -> object:
        go.wait()
        return task()

    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        futures = [pool.submit(wait_then, t) for t in tasks]
        go.set()
        return [f.result() for f in futures]


@pytest.fixture(scope="module")
def sequential():
    """Every job's result, one call at a time, with kernels limited to one thread."""
    nk.set_num_threads(1)
    try:
        return {name: _bytes(job()) for name, job in _jobs().items()}
    finally:
        nk.set_num_threads(None)


@pytest.mark.parametrize("num_threads", [1, None, 3])
def test_concurrent_calls_equal_sequential(sequential, threads, num_threads):
    """ROUNDS calls of every job, shuffled, from N_THREADS threads at once: each result equals
    the single-threaded one, whatever the thread bound (1, the default, or more than the CPUs)."""
    threads(num_threads)
    jobs = _jobs()
    names = [n for n in jobs for _ in range(ROUNDS)]
    np.random.default_rng(0 if num_threads is None else num_threads).shuffle(names)
    _run_concurrently([lambda n=n: _assert_same(n, jobs[n](), sequential[n]) for n in names])


def test_default_thread_bound_equals_one_thread(sequential, threads):
    """With the default bound the large arrays are split across threads: same results as one."""
    threads(None)
    for name, job in _jobs().items():
        _assert_same(name, job(), sequential[name])


def test_concurrent_writes_into_one_out_array(threads):
    """Threads writing their own rows of one output array (``out=``) do not disturb each other."""
    threads(None)
    rows = 2 * N_THREADS
    x = BIG.reshape(-1)[: BIG.size // rows * rows].reshape(rows, -1)
    mx_rows = [nk.quantize_mx(x[i], "mxfp4_e2m1", block_size=16) for i in range(rows)]
    kinds = {
        "cast": (lambda i, out: nk.cast(x[i], "bfloat16", rounding="stochastic", seed=i, out=out), ml_dtypes.bfloat16),
        "fake_quantize_mx": (
            lambda i, out: nk.fake_quantize_mx(x[i], "mxfp8_e5m2", rounding="stochastic", seed=i, out=out),
            np.float32,
        ),
        "dequantize_mx": (lambda i, out: nk.dequantize_mx(mx_rows[i], out=out), np.float32),
    }
    for kind, (call, dtype) in kinds.items():
        want = np.stack([call(i, None) for i in range(rows)])
        shared = np.full(x.shape, 7, dtype)
        _run_concurrently([lambda i=i: call(i, shared[i]) for i in range(rows)])
        _assert_same(kind, shared, _bytes(want))


FRESH_PROCESS = textwrap.dedent("""
    import sys, threading
    import numpy as np
    import neuron_kernels as nk
    from concurrent.futures import ThreadPoolExecutor

    x = np.load(sys.argv[1])
    go = threading.Event()
    calls = [
        lambda: nk.cast(x, "float8_e5m2", rounding="stochastic", seed=7),
        lambda: nk.cast(x, "bfloat16"),
        lambda: nk.quantize_mx(x, "mxfp4_e2m1", rounding="stochastic", seed=5).codes,
        lambda: nk.fake_quantize_mx(x, "mxint8", axis=0, block_size=5, rounding="stochastic", seed=9),
    ] * 2

    def run(call):
        go.wait()
        return np.ascontiguousarray(call()).view(np.uint8)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(run, c) for c in calls]
        go.set()
        results = [f.result() for f in futures]
    np.savez(sys.argv[2], *results)
""")


def test_first_calls_race_in_a_fresh_process(tmp_path):
    """In a new process, threads making the first calls of the same kernels at once (loading or
    compiling them concurrently) get the results this process computes one call at a time."""
    x = SMALL[:32]
    np.save(tmp_path / "x.npy", x)
    root = os.path.dirname(os.path.dirname(os.path.abspath(nk.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    # A process of its own: the first calls of a process (nothing loaded yet) are the point.
    subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "x.npy"), str(tmp_path / "out.npz")],
        check=True,
        env=env,
        timeout=300,
    )
    want = [
        nk.cast(x, "float8_e5m2", rounding="stochastic", seed=7),
        nk.cast(x, "bfloat16"),
        nk.quantize_mx(x, "mxfp4_e2m1", rounding="stochastic", seed=5).codes,
        nk.fake_quantize_mx(x, "mxint8", axis=0, block_size=5, rounding="stochastic", seed=9),
    ] * 2
    with np.load(tmp_path / "out.npz") as got:
        assert len(got.files) == len(want)
        for i, w in enumerate(want):
            _assert_same(f"call {i}", got[f"arr_{i}"], _bytes(w))
