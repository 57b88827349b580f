"""``neuron-kernels quantize`` on Zarr stores: Zarr in, Zarr out (codes and scale bytes as uint8, the
format in the attributes), on Dask's threads, on the shared LocalCluster (``--scheduler``) and on a
local cluster of its own (``--workers``). Oracle: the in-memory ``quantize_mx`` / ``quantize_nvfp4``
of the same arrays. Bad input: one line naming what is wrong, no traceback, no store left behind.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.cli import main

zarr = pytest.importorskip("zarr", minversion="3")
pytest.importorskip("dask.array")


@pytest.fixture
def store(tmp_path, rng):
    """A group of two float32 arrays, chunked across the blocks (7 x 50)."""
    arrays = {
        "w": rng.standard_normal((40, 200)).astype(np.float32),
        "b": (rng.standard_normal((3, 96)) * 100).astype(np.float32),
    }
    group = zarr.open_group(tmp_path / "in.zarr", mode="w")
    for name, a in arrays.items():
        group.create_array(name, data=a, chunks=(7, 50))
    return tmp_path / "in.zarr", arrays


def _no_leftovers(folder, *allowed):
    assert sorted(os.listdir(folder)) == sorted(allowed)


def _same_blocks(got, expected):
    assert (got.fmt, got.shape, got.block_size, got.axis, got.packed, got.per_tensor_scale) == (
        expected.fmt,
        expected.shape,
        expected.block_size,
        expected.axis,
        expected.packed,
        expected.per_tensor_scale,
    )
    np.testing.assert_array_equal(got.codes, expected.codes)
    np.testing.assert_array_equal(got.scales.view(np.uint8), expected.scales.view(np.uint8))
    assert got.scales.dtype == expected.scales.dtype  # read back as the ml_dtypes scale type


def test_zarr_to_zarr_in_process(store, tmp_path, capsys):
    from neuron_kernels.lazy.stores import open_quantized

    path, arrays = store
    out = tmp_path / "out.zarr"
    assert main(["quantize", str(path), str(out), "--format", "mxfp8_e4m3", "--quiet"]) == 0
    printed = capsys.readouterr().out
    for name, a in arrays.items():
        expected = nk.quantize_mx(a, "mxfp8_e4m3")
        q = open_quantized(str(out), name)
        _same_blocks(q.compute(scheduler="sync"), expected)
        np.testing.assert_array_equal(nk.dequantize(q).compute(scheduler="sync"), nk.dequantize_mx(expected))
        group = zarr.open_group(out, mode="r")[name]
        assert group["codes"].dtype == np.uint8 and group["scales"].dtype == np.uint8
        record = group.attrs["neuron_kernels"]
        assert record["format"] == "mxfp8_e4m3" and record["scale_dtype"] == "float8_e8m0fnu"
        error = nk.quantization_error(a, expected)
        assert record["error"]["sqnr_db"] == error.sqnr_db
        assert f"{error.sqnr_db:.2f}" in printed
    _no_leftovers(tmp_path, "in.zarr", "out.zarr")


def test_zarr_chunks_aligned_to_blocks(store, tmp_path):
    """Small chunks of the input (7 x 50: across blocks of 32) are read and written whole-block."""
    from neuron_kernels.lazy.stores import open_quantized, open_zarr_arrays, quantize_to_zarr

    path, arrays = store
    entries = open_zarr_arrays(str(path), "w", chunk_bytes=7 * 200 * 4)
    assert entries[0].array.numblocks[0] > 1
    out = tmp_path / "w.zarr"
    options = {"rounding": "stochastic", "seed": 9}
    quantize_to_zarr(entries, str(out), "mxfp4_e2m1", quantize=nk.quantize, error=nk.quantization_error, **options)
    codes = zarr.open_array(out / "w" / "codes", mode="r")
    assert codes.chunks[1] % 16 == 0  # whole blocks of 32 (packed: 16 bytes)
    got = open_quantized(str(out), "w").compute(scheduler="sync")
    _same_blocks(got, nk.quantize_mx(arrays["w"], "mxfp4_e2m1", **options))


def test_zarr_on_cluster_with_scheduler_address(store, tmp_path, dask_client):
    from neuron_kernels.lazy.stores import open_quantized

    path, arrays = store
    out = tmp_path / "out.zarr"
    address = dask_client.scheduler.address
    assert main(["quantize", str(path), str(out), "--format", "nvfp4", "--scheduler", address, "--quiet"]) == 0
    for name, a in arrays.items():
        _same_blocks(open_quantized(str(out), name).compute(), nk.quantize_nvfp4(a))


def test_zarr_bad_input_on_cluster_says_why_and_leaves_nothing(tmp_path, dask_client, capsys):
    zarr.create_array(tmp_path / "int.zarr", data=np.arange(128, dtype=np.int32).reshape(4, 32), chunks=(2, 32))
    out = tmp_path / "out.zarr"
    args = ["quantize", str(tmp_path / "int.zarr"), str(out), "--format", "mxfp8_e4m3"]
    assert main([*args, "--scheduler", dask_client.scheduler.address]) == 2
    err = capsys.readouterr().err
    assert "neuron-kernels quantize: error: block quantisation takes float32" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    _no_leftovers(tmp_path, "int.zarr")


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "not both"),
        (["--layout", "compressed-tensors"], "checkpoint folders"),
    ],
)
def test_zarr_usage_errors(store, tmp_path, capsys, extra, message):
    path, _ = store
    assert main(["quantize", str(path), str(tmp_path / "o.zarr"), "--format", "mxfp8_e4m3", *extra]) == 2
    assert message in capsys.readouterr().err
    _no_leftovers(tmp_path, "in.zarr")


def test_zarr_output_must_be_a_store(store, tmp_path, capsys):
    path, _ = store
    assert main(["quantize", str(path), str(tmp_path / "o.npz"), "--format", "mxfp8_e4m3"]) == 2
    assert "must be a Zarr store ending in .zarr" in capsys.readouterr().err


def test_zarr_without_the_extra_names_it(store, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)
    path, _ = store
    assert main(["quantize", str(path), str(tmp_path / "o.zarr"), "--format", "mxfp8_e4m3"]) == 2
    assert 'pip install "neuron_kernels[dask]"' in capsys.readouterr().err
    _no_leftovers(tmp_path, "in.zarr")


def test_zarr_with_local_workers(store, tmp_path, capsys):
    """``--workers 1`` starts a local cluster of its own for the job (and stops it)."""
    from neuron_kernels.lazy.stores import open_quantized

    path, arrays = store
    out = tmp_path / "out.zarr"
    assert main(["quantize", str(path), str(out), "--format", "mxfp8_e4m3", "--workers", "1", "--name", "b"]) == 0
    assert "1 local workers" in capsys.readouterr().out
    _same_blocks(open_quantized(str(out), "b").compute(scheduler="sync"), nk.quantize_mx(arrays["b"], "mxfp8_e4m3"))
