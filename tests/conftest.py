"""Fixtures and hooks shared by the test modules (their helpers are in ``helpers.py``): ``rng``,
``threads``, ``isolated_runs`` (every subprocess case of a module), the Dask clusters, the compile log and
``fresh_registry``."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import neuron_kernels as nk

from .helpers import run_isolated, runtime_missing, runtime_python


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture
def threads():
    """Restore the thread bound after a test changes it."""
    yield nk.set_num_threads
    nk.set_num_threads(None)


@pytest.fixture(scope="module")
def isolated_runs(request):
    """Every subprocess case of the test module (its ``ISOLATED`` dict), started together on two workers when
    the first of them is needed, suspected hangs (short timeouts) first."""
    cases = sorted(request.module.ISOLATED.items(), key=lambda item: item[1][1])
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: (pool.submit(run_isolated, body, timeout), timeout) for name, (body, timeout) in cases}


def pytest_collection_modifyitems(config, items):
    """The slow tests first (in their order, then the others in theirs): under pytest-xdist the
    long sweeps start at once beside the short tests instead of ending the run on one worker."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def dask_client():
    """A ``distributed.Client`` of a LocalCluster whose scheduler and two workers (one thread each)
    run as threads of this test process: the real scheduler, its task graph and its workers, without
    the start-up and memory of more processes beside the test workers; the default scheduler while
    it is open. Tests where separate processes are the point (pickling across processes, a worker
    that dies) use ``process_cluster`` instead. Skipped without the ``dask`` extra."""
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0", worker_dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.fixture
def process_cluster(dask_client):
    """A ``distributed.Client`` of a LocalCluster of two worker processes (one thread each), for the
    tests where processes are the point; it is the default scheduler while the test runs and is
    closed after it."""
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", worker_dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.fixture(autouse=bool(os.environ.get("NEURON_KERNELS_COMPILE_LOG")))
def _compile_log(request):
    """With ``NEURON_KERNELS_COMPILE_LOG=path`` set: one line per kernel compiled during a test
    (worker, test, kernel, seconds) appended to ``path``: which tests compile, on which worker, and
    how much of the run's time compiling takes."""
    from neuron_kernels import _jit

    path, worker = os.environ["NEURON_KERNELS_COMPILE_LOG"], os.environ.get("PYTEST_XDIST_WORKER", "main")

    def log(event, name, seconds):
        if event == "end":
            with open(path, "a") as f:
                f.write(f"{worker}\t{request.node.nodeid}\t{name}\t{seconds:.3f}\n")

    with _jit.on_compile(log):
        yield


@pytest.fixture
def fresh_registry(monkeypatch):
    """The cast registry as a new process has it (empty, the package's kernels not loaded yet); the
    real one is put back after the test, whatever the test registered."""
    from neuron_kernels import registry

    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_loaded", False)
    return registry


@pytest.fixture(scope="module")
def runtime():
    """Run a script in the interpreter that has the runtimes (torch, transformers, compressed-tensors):
    this one, or ``NEURON_KERNELS_RUNTIME_PYTHON``; skipped, or failed where they are required, without."""
    python, why = runtime_python()
    if python is None:
        runtime_missing(why)

    def run(script: str, *args) -> str:
        # A process of its own: the runtime's interpreter, its own imports, not this checkout's path.
        r = subprocess.run(
            [python, "-c", script, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=900,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    return run
