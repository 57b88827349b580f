"""``quantize(..., out=block_array)``: codes and scales written into an existing block array
(docs/blocks.md, "Reusing outputs"), bit for bit the reference's answer, and the streaming
paths that reuse their pieces' buffers.

The expected bits come from the slow reference (``tests/block_checks.py``), never from an
allocating call of the code under test.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.blocks.scheme import block_job
from neuron_kernels.io.arrays import open_arrays
from neuron_kernels.io.file_jobs import quantized_pieces

from .block_checks import F32, assert_bits, block_binades, nvfp4_data, pack_along, reference

#: (format, options): one case per kind of kernel and per field ``out`` must match.
CASES = {
    "mxfp8 rows": ("mxfp8_e4m3", {}),
    "mxfp4 packed": ("mxfp4_e2m1", {}),
    "mxfp6 axis 0": ("mxfp6_e2m3", {"axis": 0}),
    "nvfp4 amax": ("nvfp4", {}),
    "nvfp4 tiles": ("nvfp4", {"block_shape": (16, 16)}),
    "nvfp4 rht": ("nvfp4", {"rht": True, "per_tensor_scale": None}),
}


def _data(seed: int) -> np.ndarray:
    return np.ascontiguousarray(nvfp4_data(seed)[:, :32])


def _check_against_reference(q: nk.BlockArray, x: np.ndarray, fmt: str, options: dict) -> None:
    want = reference(x, fmt, **options)
    assert_bits(q.unpacked_codes(), want.codes, "codes")
    assert_bits(q.scales.view(np.uint8), want.scales, "scale bytes")
    if q.packed:
        axis = q.axis
        assert_bits(q.codes, pack_along(want.codes, axis), "packed codes")
    if want.pts is None:
        assert q.per_tensor_scale is None
    else:
        assert_bits(np.array([q.per_tensor_scale], F32), np.array([want.pts], F32), "per-tensor scale")


@pytest.mark.parametrize("case", list(CASES))
def test_quantize_into_out(case):
    """A second array quantised into the first one's block array: its codes and scales land in
    those buffers, and every bit is the reference's for the second array."""
    fmt, options = CASES[case]
    first, second = _data(1), _data(2) * np.float32(0.5)  # another amax
    out = nk.quantize(first, fmt, **options)
    codes, scales = out.codes, out.scales
    q = nk.quantize(second, fmt, out=out, **options)
    assert q.codes is codes and q.scales is scales
    if fmt == "nvfp4" and options.get("per_tensor_scale", "amax") == "amax":
        # another amax, another per-tensor scale: a block array over the same buffers
        assert q is not out and q.per_tensor_scale != out.per_tensor_scale
    else:
        assert q is out
    _check_against_reference(q, second, fmt, options)


def test_quantize_mx_and_nvfp4_take_out():
    x, y = block_binades((4, 64), 3), block_binades((4, 64), 4)
    mx = nk.quantize_mx(x, "mxfp4_e2m1")
    assert nk.quantize_mx(y, "mxfp4_e2m1", out=mx) is mx
    _check_against_reference(mx, y, "mxfp4_e2m1", {})
    nv = nk.quantize_nvfp4(x, per_tensor_scale=0.5)
    assert nk.quantize_nvfp4(y, per_tensor_scale=0.5, out=nv) is nv
    _check_against_reference(nv, y, "nvfp4", {"per_tensor_scale": 0.5})


def _readonly(x: np.ndarray) -> nk.BlockArray:
    q = nk.quantize(x, "mxfp4_e2m1")
    q.codes.flags.writeable = False
    return q


def _strided(x: np.ndarray) -> nk.BlockArray:
    q = nk.quantize(x, "mxfp4_e2m1")
    wide = np.zeros((x.shape[0], 32), np.uint8)
    strided = nk.BlockArray(wide[:, ::2], q.scales.copy(), nk.BlockLayout("mxfp4_e2m1", x.shape, 1, 32, 1, True))
    assert not strided.codes.flags.c_contiguous
    return strided


#: (name, out made from the data, error, message): outs that do not fit an mxfp4_e2m1 result.
BAD_OUTS = [
    ("ndarray", lambda x: np.zeros(x.shape, np.uint8), TypeError, "out must be a BlockArray"),
    ("format", lambda x: nk.quantize(x, "mxfp6_e2m3"), ValueError, "its format 'mxfp6_e2m3'"),
    ("shape", lambda x: nk.quantize(x[:4], "mxfp4_e2m1"), ValueError, "its shape"),
    ("block_size", lambda x: nk.quantize(x, "mxfp4_e2m1", block_size=16), ValueError, "its block_size 16"),
    ("packed", lambda x: nk.quantize(x, "mxfp4_e2m1", pack=False), ValueError, "its packed False"),
    ("axis", lambda x: nk.quantize(x, "mxfp4_e2m1", axis=0), ValueError, "its axis 0"),
    ("read-only", _readonly, ValueError, "out's codes must be a writeable C-contiguous array"),
    ("strided", _strided, ValueError, "out's codes must be a writeable C-contiguous array"),
]


@pytest.mark.parametrize("make, error, pattern", [b[1:] for b in BAD_OUTS], ids=[b[0] for b in BAD_OUTS])
def test_bad_out_is_refused_before_writing(make, error, pattern):
    out = make(_data(1))
    before = None if isinstance(out, np.ndarray) else (out.codes.copy(), out.scales.view(np.uint8).copy())
    with pytest.raises(error, match=pattern):
        nk.quantize(_data(2), "mxfp4_e2m1", out=out)
    if before is not None:
        assert_bits(out.codes, before[0])
        assert_bits(out.scales.view(np.uint8), before[1])


def test_out_sharing_the_input_is_refused():
    buf = np.zeros(2 * 64 * 4, np.uint8)
    x = buf.view(F32).reshape(2, 64)
    x[...] = block_binades((2, 64), 5)
    out = nk.BlockArray(
        buf[:128].reshape(2, 64), np.zeros((2, 2), np.uint8), nk.BlockLayout("mxfp8_e4m3", (2, 64), 1, 32)
    )
    with pytest.raises(ValueError, match="out's codes overlap the input"):
        nk.quantize(x, "mxfp8_e4m3", out=out)


def test_lazy_input_with_out_is_refused():
    x = _data(1)
    with pytest.raises(TypeError, match="out= takes NumPy arrays"):
        nk.quantize(da.from_array(x, chunks=8), "mxfp8_e4m3", out=nk.quantize(x, "mxfp8_e4m3"))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_streamed_pieces_reuse_buffers_and_keep_the_last_two(tmp_path, fmt):
    """Pieces of a file are quantised into the buffers of the piece before last: a consumer that
    still holds the previous piece (the checkpoint path's statistics thread) sees it unchanged, and
    every piece is the reference's answer for its rows."""
    x = block_binades((64, 64), 9)
    path = tmp_path / "x.npy"
    np.save(path, x)
    (entry,) = open_arrays(path)
    job = block_job(fmt, 2).with_amax(float(np.abs(x).max())) if fmt == "nvfp4" else block_job(fmt, 2)
    seen: list[tuple[np.ndarray, nk.BlockArray, np.ndarray]] = []
    for arr, q in quantized_pieces(entry, job, chunk_bytes=8 * 64 * 4):  # a few rows a piece
        if seen:
            prev_arr, prev_q, prev_codes = seen[-1]
            assert_bits(prev_q.codes, prev_codes, "the previous piece, held while this one was made")
        seen.append((arr.copy(), q, q.codes.copy()))
    assert len(seen) > 2
    assert len({id(q.codes) for _, q, _ in seen}) == 2
    options = {"per_tensor_scale": job.per_tensor_scale} if fmt == "nvfp4" else {}
    for arr, _, codes in seen:  # pieces are (rows, 64, 1), blocked along axis 1
        want = reference(arr.reshape(arr.shape[0], 64), fmt, **options)
        assert_bits(codes.reshape(arr.shape[0], -1), pack_along(want.codes, 1) if fmt == "nvfp4" else want.codes)


# ---- long rows seen as several ----------------------------------------------------------------

#: (format, options) quantised with long rows split (ROW_ELEMENTS lowered so that small arrays split).
SPLIT_CASES = {
    "mxfp8 1-D": ("mxfp8_e4m3", (2048,), {}),
    "mxfp4 rows stochastic": ("mxfp4_e2m1", (3, 1024), {"rounding": "stochastic", "seed": 11}),
    "mxfp4 odd blocks": ("mxfp4_e2m1", (2, 1470), {"block_size": 21}),
    "nvfp4 1-D amax": ("nvfp4", (4096,), {}),
    "nvfp4 rht": ("nvfp4", (2, 1024), {"rht": True, "rounding": "stochastic", "seed": 3}),
    "nvfp4 four_over_six": ("nvfp4", (1, 2048), {"four_over_six": "mse"}),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_long_rows_split_into_shorter_ones(monkeypatch, case):
    """The quantising row kernels see a long row as several shorter ones (docs/performance.md):
    the same blocks, stochastic indices, codes and scales, checked against the reference."""
    fmt, shape, options = SPLIT_CASES[case]
    monkeypatch.setattr("neuron_kernels.blocks.layout.ROW_ELEMENTS", 64)
    lay = block_job(fmt, len(shape), **options).layout(shape)
    assert lay.kernel_shapes(split_rows=True).values[0] > lay.kernel_shapes().values[0]
    x = block_binades(shape, 21)
    want = reference(x, fmt, **options)
    _check_against_reference(nk.quantize(x, fmt, **options), x, fmt, options)
    assert_bits(nk.fake_quantize(x, fmt, **options), want.values)  # rotated values for rht, as dequantize gives
