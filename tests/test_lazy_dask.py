"""Casts and block formats on Dask arrays, computed on a real ``dask.distributed.LocalCluster``,
against the in-memory functions (the oracle) bit for bit.

One cluster of two worker threads (``dask_client`` of conftest) serves most tests; where separate
processes are the point (the graph and the block arrays pickled across them, a worker that dies), a
cluster of two worker processes (``process_cluster``).
The arrays are small; the kernels are the ones the rest of the suite compiles (float32 sources,
default rounding) plus the stochastic variants the C-order offsets are about. The in-memory result
is computed first, so that the workers load the kernels from the compilation cache instead of
compiling them again.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import neuron_kernels as nk

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

#: Chunkings of an (8, 96) array: whole blocks of 32, blocks split across chunks, one chunk, many.
CHUNKINGS = {
    "aligned": (4, 32),
    "misaligned": (3, 40),
    "one": (8, 96),
    "many": (1, 16),
}


@pytest.fixture
def client(dask_client):
    return dask_client


@pytest.fixture
def x(rng):
    return (rng.standard_normal((8, 96)) * np.exp2(rng.integers(-8, 8, (8, 1)))).astype(np.float32)


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))


def _same_blocks(lazy, expected):
    got = lazy.compute()
    assert isinstance(got, type(expected))
    assert (got.fmt, got.shape, got.block_size, got.axis, got.packed) == (
        expected.fmt,
        expected.shape,
        expected.block_size,
        expected.axis,
        expected.packed,
    )
    assert got.per_tensor_scale == expected.per_tensor_scale
    _same(got.codes, expected.codes)
    _same(got.scales, expected.scales)


def test_import_does_not_import_dask():
    import subprocess

    from .helpers import child_env

    code = "import sys, neuron_kernels; print(sorted(m for m in ('dask', 'distributed', 'zarr') if m in sys.modules))"
    # A process of its own: which modules an import loads shows in a new interpreter only.
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "dtype,options,chunks",
    [
        ("bfloat16", {}, (3, 40)),  # the ufunc path
        ("float8_e4m3fn", {"rounding": "stochastic", "seed": 5}, (3, 40)),  # C-order offsets per piece
        ("float8_e4m3fn_x4", {}, (5, 30)),  # packed: chunks split groups of four, rechunked
    ],
)
def test_cast_on_cluster(client, x, dtype, options, chunks):
    expected = nk.cast(x, dtype, **options)
    lazy = nk.cast(da.from_array(x, chunks=chunks), dtype, **options)
    assert isinstance(lazy, da.Array) and lazy.dtype == expected.dtype and lazy.shape == expected.shape
    _same(lazy.compute(), expected)


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_mx_on_cluster(client, x, chunking):
    chunks = CHUNKINGS[chunking]
    expected = nk.quantize_mx(x, "mxfp8_e4m3")
    dx = da.from_array(x, chunks=chunks)
    q = nk.quantize_mx(dx, "mxfp8_e4m3")
    assert all(c % 32 == 0 for c in q.chunks[1][:-1])  # rechunked to whole blocks
    _same_blocks(q, expected)
    _same(nk.dequantize_mx(q).compute(), nk.dequantize_mx(expected))
    _same(nk.fake_quantize_mx(dx, "mxfp8_e4m3").compute(), nk.fake_quantize_mx(x, "mxfp8_e4m3"))
    assert nk.quantization_error(dx, q).compute() == nk.quantization_error(x, expected)


def test_mx_stochastic_and_packed_fp4_on_cluster(client, x):
    """Stochastic rounding along axis 0 (chunks hold pieces of rows), packed FP4 codes, and the
    statistics of blocks that are not along the last axis."""
    options = {"rounding": "stochastic", "seed": 11, "axis": 0, "block_size": 4}
    dx = da.from_array(x, chunks=(3, 40))
    q, expected = nk.quantize_mx(dx, "mxfp4_e2m1", **options), nk.quantize_mx(x, "mxfp4_e2m1", **options)
    _same_blocks(q, expected)
    # blocks across the rows: the statistics from the in-memory pass's pieces, folded in its order
    assert nk.quantization_error(dx, q).compute() == nk.quantization_error(x, expected)


@pytest.mark.parametrize("fmt", ["int4_group_asym", "int8_channel"])
def test_integers_on_cluster(client, x, fmt):
    """Integer formats (docs/integers.md): codes, scales and zero points chunk by chunk, equal to
    the in-memory quantisation; the dequantisation and the statistics too."""
    size = 32 if "group" in fmt else None
    expected = nk.quantize(x, fmt, block_size=size, scale_dtype="bfloat16")
    dx = da.from_array(x, chunks=(3, 40))
    q = nk.quantize(dx, fmt, block_size=size, scale_dtype="bfloat16")
    _same_blocks(q, expected)
    got = q.compute()
    assert (got.zero_points is None) == (expected.zero_points is None)
    if expected.zero_points is not None:
        _same(got.zero_points, expected.zero_points)
    _same(q.dequantize().compute(), expected.dequantize())
    assert nk.quantization_error(dx, q).compute() == nk.quantization_error(x, expected)


def test_act_order_integers_on_cluster(client):
    """An integer array with act-order's group index (as GPTQ's readers give it): cut into chunks
    of whole rows (a column's group is anywhere in its row), dequantised and its statistics taken
    on the cluster as in memory."""
    from neuron_kernels.lazy.block_arrays import lazy_block_array
    from tests.helpers import act_order_array

    q, want = act_order_array()
    lazy = lazy_block_array(q, chunks=(2, 16))
    assert lazy.chunks[-1] == (q.shape[-1],) and len(lazy.chunks[0]) == 3
    _same(lazy.dequantize("bfloat16").compute(), want)
    back = lazy.compute()
    _same(back.group_index, q.group_index)
    _same(back.zero_points, q.zero_points)
    x = q.dequantize(np.float32) * np.float32(1.01)
    dx = da.from_array(x, chunks=(2, 16))
    assert nk.quantization_error(dx, q).compute() == nk.quantization_error(x, q)


@pytest.mark.parametrize("chunks", [(3, 40), (8, 16)])
def test_nvfp4_on_cluster(client, x, chunks):
    _nvfp4_on(x, chunks)


def test_nvfp4_on_worker_processes(process_cluster, x):
    """The same on worker processes: the graph, the kernels' arguments and the block arrays
    (with their per-tensor scale) travel pickled between processes."""
    _nvfp4_on(x, (3, 40))


def _nvfp4_on(x, chunks):
    expected = nk.quantize_nvfp4(x)
    dx = da.from_array(x, chunks=chunks)
    q = nk.quantize_nvfp4(dx)  # the per-tensor scale: a Dask reduction, computed now
    assert q.per_tensor_scale == expected.per_tensor_scale
    _same_blocks(q, expected)
    _same(nk.dequantize(q).compute(), nk.dequantize(expected))
    _same(nk.fake_quantize_nvfp4(dx).compute(), nk.fake_quantize_nvfp4(x))
    assert nk.quantization_error(dx, q).compute() == nk.quantization_error(x, expected)


def _slowly(block):
    time.sleep(0.15)
    return block


def test_worker_killed_mid_job(process_cluster, rng):
    """One worker process dies while the job runs: the scheduler reruns its tasks elsewhere (and
    the nanny restarts it); the result is complete and identical."""
    x = rng.standard_normal((64, 64)).astype(np.float32)
    expected = nk.quantize_mx(x, "mxfp8_e4m3")
    slow = da.from_array(x, chunks=(4, 64)).map_blocks(_slowly, dtype=np.float32)
    q = nk.quantize_mx(slow, "mxfp8_e4m3")
    client = process_cluster
    codes, scales = client.compute([q.codes, q.scales])
    deadline = time.monotonic() + 30
    while not any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.4)  # some chunks done, more running
    victim = sorted(client.scheduler_info()["workers"])[0]
    assert not codes.done()
    client.run(os._exit, 1, workers=[victim], on_error="ignore")
    got_codes, got_scales = codes.result(timeout=120), scales.result(timeout=120)
    np.testing.assert_array_equal(got_codes, expected.codes)
    np.testing.assert_array_equal(got_scales, expected.scales.view(np.uint8))
    client.wait_for_workers(2, timeout=60)
    assert victim not in client.scheduler_info()["workers"]  # it did die (its successor has another address)


def test_lazy_bad_input_says_what_is_accepted():
    dx = da.zeros((4, 64), dtype=np.int32, chunks=(2, 32))
    with pytest.raises(TypeError, match="float32, float16, bfloat16 or float64"):
        nk.quantize_mx(dx, "mxfp8_e4m3")
    fx = dx.astype(np.float32)
    with pytest.raises(ValueError, match="mxfp8_e4m3"):
        nk.quantize_mx(fx, "mxfp9")
    with pytest.raises(TypeError, match="out= takes NumPy arrays"):
        nk.fake_quantize_mx(fx, "mxfp8_e4m3", out=np.empty((4, 64), np.float32))
    with pytest.raises(TypeError, match="out= takes NumPy arrays"):
        nk.cast(fx, "bfloat16", out=np.empty((4, 64), np.uint16))
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.cast(da.zeros((4, 6), np.float32), "float8_e4m3fn_x4")


def test_missing_extra_names_the_install_command(monkeypatch):
    from neuron_kernels.lazy import require

    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(ImportError, match=r'pip install "neuron_kernels\[dask\]"'):
        require("zarr", "a Zarr store")
