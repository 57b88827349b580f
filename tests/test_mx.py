"""MX quantisation: the kernels against the slow reference (tests/reference_mx.py), and the API."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.blocks.job import BlockJob
from neuron_kernels.blocks.layout import BlockLayout, Pieces
from neuron_kernels.blocks.scheme import block_job
from neuron_kernels.formats import FORMATS as FORMATS_TABLE
from neuron_kernels.modes import E8M0_SCALE_MODES

from .helpers import ROOT, child_env
from .reference import random_bits
from .reference_mx import dequantize_mx_ref, pack_fp4_ref, quantize_mx_ref

FORMATS = list(nk.MX_FORMATS)
SCALE_MODES = list(E8M0_SCALE_MODES)


def _data(n: int, seed: int = 0) -> np.ndarray:
    """Values over 60 binades, with the special blocks of docs/blocks.md (block size 32)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    x[5] = -0.0
    x[32:64] = 0.0  # all-zero block
    x[64:96:3] = -0.0
    x[100] = np.nan  # NaN block
    x[140] = -np.inf  # inf block
    x[160:192] = (rng.standard_normal(32) * 1e-40).astype(np.float32)  # float32 subnormals
    x[192:224] = rng.standard_normal(32).astype(np.float32)
    x[200] = np.float32(448.0 * 2.0**5)  # exactly 448 * 2^k
    x[224:256] = rng.standard_normal(32).astype(np.float32)
    x[230] = np.nextafter(np.float32(2.0**10), np.float32(0))  # amax one ulp below a power of two
    x[256:288] = np.float32(1.5) * np.exp2(rng.integers(-4, 4, 32)).astype(np.float32)  # ties
    x[288:320] = (np.float32(8.5e37) * np.clip(rng.standard_normal(32), -3.9, 3.9)).astype(np.float32)  # top binades
    return x


X = _data(1000)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away", "toward_zero"])
def test_quantize_matches_reference(fmt, scale_mode, rounding):
    for block_size in (32, 7):
        mx = nk.quantize_mx(X, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding, pack=False)
        codes, scales = quantize_mx_ref(X, fmt, block_size, scale_mode, rounding)
        np.testing.assert_array_equal(mx.scales.view(np.uint8), scales)
        np.testing.assert_array_equal(mx.codes, codes)
        dq = nk.dequantize_mx(mx)
        ref = dequantize_mx_ref(codes, scales, fmt, block_size)
        np.testing.assert_array_equal(dq.view(np.uint32), ref.view(np.uint32))
        fq = nk.fake_quantize_mx(X, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding)
        np.testing.assert_array_equal(fq.view(np.uint32), dq.view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_stochastic_matches_reference(fmt):
    seed = 1234
    mx = nk.quantize_mx(X, fmt, rounding="stochastic", seed=seed, pack=False)
    codes, scales = quantize_mx_ref(X, fmt, 32, "floor", "stochastic", rand=random_bits(seed, X.size))
    np.testing.assert_array_equal(mx.codes, codes)
    fq = nk.fake_quantize_mx(X, fmt, rounding="stochastic", seed=seed)
    np.testing.assert_array_equal(fq.view(np.uint32), mx.dequantize().view(np.uint32))


@pytest.mark.parametrize("fmt, axis", [("mxfp8_e4m3", -1), ("mxfp4_e2m1", -1), ("mxint8", 0)])
def test_stochastic_seeds_give_independent_roundings(fmt, axis):
    # Blocks of one amax (4.0) and 31 copies of v: each copy rounds up with the same probability p,
    # and the number of round-ups must vary from seed to seed as binomial draws (chi-square over 64
    # seeds), for quantise and fake-quantise alike. (Seeds once gave the same bits reordered.)
    v = np.float32(1.3)
    block = np.full(32, v, np.float32)
    block[0] = 4.0
    x = np.tile(block, 2048).reshape(2048, 32)
    x = np.ascontiguousarray(x.T) if axis == 0 else x
    seen = np.unique(nk.fake_quantize_mx(x, fmt, axis=axis, rounding="stochastic", seed=99)).tolist()
    lo, hi = sorted(set(seen) - {4.0})  # the neighbours of v in its block's grid
    p = (float(v) - lo) / (hi - lo)
    n = 2048 * 31
    for run in ("quantize", "fake_quantize"):
        counts = []
        for seed in range(64):
            if run == "quantize":
                dq = nk.quantize_mx(x, fmt, axis=axis, rounding="stochastic", seed=seed).dequantize()
            else:
                dq = nk.fake_quantize_mx(x, fmt, axis=axis, rounding="stochastic", seed=seed)
            assert set(np.unique(dq).tolist()) == {lo, hi, 4.0}
            counts.append(int((dq == hi).sum()))
        stat = float(((np.array(counts) - n * p) ** 2).sum() / (n * p * (1 - p)))
        assert 30 < stat < 110, (run, stat, counts[:8])  # chi-square, 64 degrees of freedom


@pytest.mark.parametrize("block_size", [32, 7, 1])
def test_fp4_packing(block_size):
    x = X[:999]  # odd length: the tail is padded with a zero nibble
    packed = nk.quantize_mx(x, "mxfp4_e2m1", block_size=block_size)
    plain = nk.quantize_mx(x, "mxfp4_e2m1", block_size=block_size, pack=False)
    assert packed.packed and packed.codes.shape == (500,)
    np.testing.assert_array_equal(packed.codes, pack_fp4_ref(plain.codes))
    np.testing.assert_array_equal(packed.dequantize().view(np.uint32), plain.dequantize().view(np.uint32))
    np.testing.assert_array_equal(packed.unpacked_codes(), plain.codes)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_other_axes_equal_the_transposed_last_axis(fmt, axis):
    x = _data(4 * 40 * 6, seed=3).reshape(4, 40, 6)
    mx = nk.quantize_mx(x, fmt, axis=axis, block_size=16)
    moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    ref = nk.quantize_mx(moved, fmt, axis=-1, block_size=16)
    np.testing.assert_array_equal(np.moveaxis(mx.scales.view(np.uint8), axis, -1), ref.scales.view(np.uint8))
    np.testing.assert_array_equal(np.moveaxis(mx.unpacked_codes(), axis, -1), ref.unpacked_codes())
    np.testing.assert_array_equal(mx.dequantize(), np.moveaxis(ref.dequantize(), -1, axis))
    fq = nk.fake_quantize_mx(x, fmt, axis=axis, block_size=16)
    np.testing.assert_array_equal(fq.view(np.uint32), mx.dequantize().view(np.uint32))


def test_stochastic_index_is_the_c_order_index():
    x = _data(512, seed=4)[:256].reshape(4, 64)
    a = nk.quantize_mx(x, "mxfp8_e5m2", rounding="stochastic", seed=9, axis=0, block_size=4)
    codes, _ = quantize_mx_ref(
        np.ascontiguousarray(x[:, 3]), "mxfp8_e5m2", 4, "floor", "stochastic", rand=random_bits(9, x.size)[3::64]
    )
    np.testing.assert_array_equal(a.codes[:, 3], codes)


def test_partial_block_equals_zero_padded():
    x = X[:40]
    padded = np.concatenate([x, np.zeros(24, np.float32)])
    a, b = nk.quantize_mx(x, "mxfp8_e4m3"), nk.quantize_mx(padded, "mxfp8_e4m3")
    np.testing.assert_array_equal(a.codes, b.codes[:40])
    np.testing.assert_array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_input_dtypes_go_through_float32(dtype):
    with np.errstate(over="ignore"):
        x = X[400:].astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        as32 = x.astype(np.float32)
    a, b = nk.quantize_mx(x, "mxfp6_e3m2"), nk.quantize_mx(as32, "mxfp6_e3m2")
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(nk.fake_quantize_mx(x, "mxfp6_e3m2"), nk.fake_quantize_mx(as32, "mxfp6_e3m2"))


def test_threads_do_not_change_the_result(threads):
    x = np.random.default_rng(5).standard_normal(3 << 20).astype(np.float32).reshape(-1, 96)
    threads(1)
    one = nk.quantize_mx(x, "mxfp4_e2m1", block_size=3, rounding="stochastic", seed=2)
    threads(2)
    two = nk.quantize_mx(x, "mxfp4_e2m1", block_size=3, rounding="stochastic", seed=2)
    np.testing.assert_array_equal(one.codes, two.codes)
    np.testing.assert_array_equal(nk.fake_quantize_mx(x, "mxint8"), nk.dequantize_mx(nk.quantize_mx(x, "mxint8")))


def test_dequantize_dtypes():
    mx = nk.quantize_mx(X, "mxfp8_e4m3")
    f32 = mx.dequantize()
    np.testing.assert_array_equal(mx.dequantize(np.float64), f32.astype(np.float64))
    np.testing.assert_array_equal(mx.dequantize("bfloat16").view(np.uint16), nk.cast(f32, "bfloat16").view(np.uint16))
    with pytest.raises(TypeError, match="float32, float64"):
        mx.dequantize(np.int8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "float16", "bfloat16"])
def test_dequantize_into_out(dtype):
    x = X[:960].reshape(30, 32)
    mx = nk.quantize_mx(x, "mxfp4_e2m1", axis=0, block_size=7)
    want = mx.dequantize(dtype)
    for out in (np.empty(x.shape, want.dtype), np.empty(x.shape[::-1], want.dtype).T):  # C, then strided
        out[...] = 7
        assert nk.dequantize_mx(mx, dtype, out=out) is out
        np.testing.assert_array_equal(np.ascontiguousarray(out).view(np.uint8), want.view(np.uint8))
    with pytest.raises(ValueError, match=r"shape \(30, 31\); the result has shape \(30, 32\)"):
        mx.dequantize(dtype, out=np.empty((30, 31), want.dtype))
    with pytest.raises(ValueError, match="dtype"):
        mx.dequantize(dtype, out=np.empty(x.shape, np.int32))
    read_only = np.empty(x.shape, want.dtype)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        mx.dequantize(dtype, out=read_only)


def test_fake_quantize_into_out():
    x = X[:960].reshape(30, 32)
    want = nk.fake_quantize_mx(x, "mxfp6_e3m2", rounding="stochastic", seed=5)
    for out in (np.empty(x.shape, np.float32), np.empty((32, 30), np.float32).T):
        assert nk.fake_quantize_mx(x, "mxfp6_e3m2", rounding="stochastic", seed=5, out=out) is out
        np.testing.assert_array_equal(np.ascontiguousarray(out).view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="overlaps the input"):
        nk.fake_quantize_mx(x, out=x)
    with pytest.raises(ValueError, match="dtype float64; the result has dtype float32"):
        nk.fake_quantize_mx(x, out=np.empty(x.shape, np.float64))
    with pytest.raises(TypeError, match="numpy array"):
        nk.fake_quantize_mx(x, out=[0.0] * 960)


# ---- BlockArray ---------------------------------------------------------------------------------


def test_mxarray_metadata_and_repr():
    mx = nk.quantize_mx(np.zeros((4, 64), np.float32), "mxfp4_e2m1")
    assert mx.nbytes == 4 * 32 + 4 * 2
    assert mx.bits_per_element == pytest.approx(8 * (128 + 8) / 256)
    assert mx.scales.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert mx.shape == (4, 64) and mx.axis == 1 and mx.block_size == 32
    assert repr(mx).startswith("BlockArray(MX, fmt='mxfp4_e2m1'") and "bits_per_element" in repr(mx)
    nv = nk.quantize_nvfp4(np.ones((4, 64), np.float32))
    assert repr(nv).startswith("BlockArray(NVFP4, fmt='nvfp4'") and "per_tensor_scale=" in repr(nv)


def test_save_and_load(tmp_path):
    mx = nk.quantize_mx(X.reshape(10, 100), "mxfp4_e2m1", axis=0, block_size=3)
    path = tmp_path / "w.npz"
    nk.save_blocks(path, mx)
    back = nk.load_blocks(path)
    assert (back.fmt, back.block_size, back.axis, back.shape, back.packed) == (mx.fmt, 3, 0, (10, 100), True)
    np.testing.assert_array_equal(back.codes, mx.codes)
    np.testing.assert_array_equal(back.dequantize(), mx.dequantize())


def test_load_rejects_bad_files(tmp_path):
    mx = nk.quantize_mx(X, "mxfp8_e4m3")
    good = tmp_path / "good.npz"
    nk.save_blocks(good, mx)
    data = good.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    np.savez(
        tmp_path / "shape.npz",
        codes=mx.codes[:-1],
        scales=mx.scales.view(np.uint8),
        meta=np.frombuffer(
            b'{"version": 1, "fmt": "mxfp8_e4m3", "block_size": 32, "axis": 0, "shape": [1000], "packed": false}',
            np.uint8,
        ),
    )
    np.savez(
        tmp_path / "meta.npz",
        codes=mx.codes,
        scales=mx.scales.view(np.uint8),
        meta=np.frombuffer(b"{not json", np.uint8),
    )
    np.savez(
        tmp_path / "fmt.npz",
        codes=mx.codes,
        scales=mx.scales.view(np.uint8),
        meta=np.frombuffer(
            b'{"version": 1, "fmt": "mxfp9", "block_size": 32, "axis": 0, "shape": [1000], "packed": false}', np.uint8
        ),
    )
    for name, message in [
        ("trunc", "cannot read"),
        ("junk", "cannot read"),
        ("other", "not a block file"),
        ("shape", "codes must be"),
        ("meta", "corrupt block file metadata"),
        ("fmt", "unknown block format"),
    ]:
        with pytest.raises(ValueError, match=message):
            nk.load_blocks(tmp_path / f"{name}.npz")
    with pytest.raises(FileNotFoundError):
        nk.load_blocks(tmp_path / "missing.npz")


@pytest.mark.parametrize(
    "fmt, x4, container", [("mxfp8_e4m3", "float8_e4m3fn_x4", np.uint32), ("mxfp4_e2m1", "float4_e2m1fn_x4", np.uint16)]
)
def test_to_x4(fmt, x4, container):
    mx = nk.quantize_mx(X[:992].reshape(4, 248), fmt)
    packed = mx.to_x4()
    assert packed.dtype == container and packed.shape == (4, 62)
    np.testing.assert_array_equal(nk.unpack_x4(packed, x4).view(np.uint8), mx.unpacked_codes())
    with pytest.raises(TypeError, match="no Neuron packed container"):
        nk.quantize_mx(X, "mxint8").to_x4()


# ---- simulation -----------------------------------------------------------------------------


def test_mx_matmul():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal((64, 5)).astype(np.float32)
    qa, qb = nk.quantize_mx(a, "mxfp8_e4m3", axis=1), nk.quantize_mx(b, "mxfp8_e4m3", axis=0)
    np.testing.assert_array_equal(nk.mx_matmul(qa, qb), qa.dequantize() @ qb.dequantize())
    with pytest.raises(ValueError, match="last axis"):
        nk.mx_matmul(nk.quantize_mx(a, "mxfp8_e4m3", axis=0), qb)
    with pytest.raises(ValueError, match="first axis"):
        nk.mx_matmul(qa, nk.quantize_mx(b, "mxfp8_e4m3", axis=1))
    with pytest.raises(ValueError, match="block sizes differ"):
        nk.mx_matmul(qa, nk.quantize_mx(b, "mxfp8_e4m3", axis=0, block_size=16))
    with pytest.raises(TypeError, match="MX BlockArray"):
        nk.mx_matmul(a, qb)


def test_quantization_error():
    exact = np.array([1.0, -2.0, 0.5, 0.0] * 8, np.float32)
    stats = nk.quantization_error(exact, nk.quantize_mx(exact, "mxfp8_e4m3"))
    assert (stats.sqnr_db, stats.mse, stats.max_abs_error, stats.saturated, stats.flushed) == (np.inf, 0, 0, 0, 0)
    x = np.array([1.0] * 31 + [1e-6], np.float32)
    stats = nk.quantization_error(x, nk.quantize_mx(x, "mxfp4_e2m1"))
    assert stats.flushed == pytest.approx(1 / 32) and stats.max_rel_error == 1.0
    # neuron's scale is a binade above floor's: nothing saturates; floor may saturate the amax
    y = np.array([7.9] + [1.0] * 31, np.float32)
    assert nk.quantization_error(y, nk.quantize_mx(y, "mxfp4_e2m1")).saturated == pytest.approx(1 / 32)
    assert nk.quantization_error(y, nk.quantize_mx(y, "mxfp4_e2m1", scale_mode="neuron")).saturated == 0
    with pytest.raises(ValueError, match="shape"):
        nk.quantization_error(y[:8], nk.quantize_mx(y, "mxfp4_e2m1"))


@pytest.mark.parametrize("shape, axis, block_size", [((5000, 300), 1, 32), ((4099, 257), 0, 7), ((3, 700, 511), 1, 5)])
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16", np.float64])
def test_quantization_error_equals_a_direct_computation(shape, axis, block_size, dtype):
    """The statistics (a compiled pass over pieces of about 1 Mi elements) against numpy in one
    pass, with a NaN block, an infinity and a saturating element in the data."""
    x = (np.random.default_rng(3).standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[[7, 100_000]] = [np.nan, -np.inf]
    x = nk.cast(x, dtype) if dtype == "bfloat16" else x.astype(dtype)
    mx = nk.quantize_mx(x, "mxfp4_e2m1", axis=axis, block_size=block_size)
    got = nk.quantization_error(x, mx)
    xv, dq = (
        nk.cast(x, np.float32).astype(np.float64) if dtype == "bfloat16" else x.astype(np.float64),
        mx.dequantize().astype(np.float64),
    )
    scale = np.take(np.repeat(mx.scales.astype(np.float64), block_size, axis=axis), np.arange(shape[axis]), axis=axis)
    keep = np.isfinite(xv) & np.isfinite(scale)  # the blocks of the NaN and of the inf are left out
    assert keep.sum() < x.size - 2
    xv, dq, scale = xv[keep], dq[keep], scale[keep]
    err = np.abs(xv - dq)
    assert got.mse == pytest.approx(np.mean(err * err), rel=1e-9)
    assert got.sqnr_db == pytest.approx(10 * np.log10(np.sum(xv * xv) / np.sum(err * err)), rel=1e-9)
    assert got.max_abs_error == np.max(err)
    assert got.max_rel_error == np.max(err[xv != 0] / np.abs(xv[xv != 0]))
    assert got.saturated == np.count_nonzero(np.abs(xv) > 6 * scale) / xv.size > 0
    assert got.flushed == np.count_nonzero((dq == 0) & (xv != 0)) / xv.size


def test_pieces_cut_on_blocks_and_byte_pairs():
    whole_rows = Pieces(BlockLayout("mxfp4_e2m1", (100, 10), 1, 32, packed=True))
    assert whole_rows.cuts(250) == [(0, 25, 0, 10), (25, 50, 0, 10), (50, 75, 0, 10), (75, 100, 0, 10)]
    axis0 = Pieces(
        BlockLayout("mxfp4_e2m1", (100, 10), 0, 7, packed=True)
    )  # one row of 100 x 10: cut the block axis, 14 at a time
    assert axis0.cuts(250) == [(0, 1, lo, min(lo + 14, 100)) for lo in range(0, 100, 14)]
    assert axis0.codes((0, 1, 14, 28)) == (70, 140, (1, 7, 10)) and axis0.scales((0, 1, 14, 28)) == (20, 40, (1, 2, 10))
    long_rows = Pieces(BlockLayout("mxfp8_e4m3", (3, 1000), 1, 32))
    assert long_rows.cuts(100) == [(r, r + 1, lo, min(lo + 96, 1000)) for r in range(3) for lo in range(0, 1000, 96)]
    assert long_rows.values((1, 2, 96, 192)) == (1096, 1192, (1, 96, 1))
    assert Pieces(BlockLayout("mxfp8_e4m3", (0, 4), 1, 32)).cuts(10) == [(0, 0, 0, 4)]


@pytest.mark.parametrize(
    "shape, axis, block_size, fmt",
    [((1, 5000), 1, 32, "mxfp4_e2m1"), ((3, 9, 70), 1, 7, "mxfp4_e2m1"), ((4, 301), 0, 5, "mxint8")],
)
def test_pieces_reassemble_the_whole(shape, axis, block_size, fmt):
    """Quantising piece by piece (as the files are) gives the whole array's codes and scales."""
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    whole = nk.quantize_mx(x, fmt, axis=axis, block_size=block_size, rounding="stochastic", seed=11)
    job = block_job(fmt, x.ndim, axis=axis, block_size=block_size, rounding="stochastic", seed=11)
    layout = Pieces(job.layout(shape))
    piece_job = BlockJob(**{**job.__dict__, "axis": 1})
    codes, scales = [], []
    for cut in layout.cuts(64):
        start, stop, piece_shape = layout.values(cut)
        mx = piece_job.quantize(x.reshape(-1)[start:stop].reshape(piece_shape), FORMATS_TABLE["float32"], idx0=start)
        codes.append(mx.codes.reshape(-1))
        scales.append(mx.scales.view(np.uint8).reshape(-1))
        assert layout.codes(cut)[1] - layout.codes(cut)[0] == mx.codes.size
    np.testing.assert_array_equal(np.concatenate(codes), whole.codes.reshape(-1))
    np.testing.assert_array_equal(np.concatenate(scales), whole.scales.view(np.uint8).reshape(-1))


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"fmt": "mxfp9"}, ValueError, "unknown MX format 'mxfp9'; accepted: mxfp8_e4m3"),
        ({"scale_mode": "round"}, ValueError, "unknown scale mode 'round'; accepted: floor, ceil, even, rceil, neuron"),
        ({"rounding": "toward_positive"}, ValueError, "unknown rounding mode"),
        ({"block_size": 0}, ValueError, "block_size must be a positive int"),
        ({"block_size": -3}, ValueError, "block_size must be a positive int"),
        ({"block_size": 1.5}, TypeError, "block_size must be a positive int"),
        ({"block_size": True}, TypeError, "block_size must be a positive int"),
        ({"axis": 2}, ValueError, "axis 2 is out of range"),
        ({"axis": "0"}, TypeError, "axis must be an int"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_bad_options(kwargs, error, message):
    with pytest.raises(error, match=message):
        nk.quantize_mx(np.zeros((2, 32), np.float32), **kwargs)


@pytest.mark.parametrize(
    "x",
    [
        np.zeros(32, np.int32),
        np.zeros(32, np.complex64),
        np.array(["a"] * 32),
        np.zeros(32, bool),
        np.array([object()] * 32),
    ],
)
def test_bad_input_dtypes(x):
    with pytest.raises(TypeError, match="block quantisation takes float32"):
        nk.quantize_mx(x)
    with pytest.raises(TypeError, match="block quantisation takes float32"):
        nk.fake_quantize_mx(x)


def test_zero_d_and_empty():
    with pytest.raises(ValueError, match="0-d"):
        nk.quantize_mx(np.float32(1.0))
    mx = nk.quantize_mx(np.zeros((3, 0), np.float32))
    assert mx.codes.shape == (3, 0) and mx.scales.shape == (3, 0)
    assert mx.dequantize().shape == (3, 0)


_MEMORY_PEAKS = """
import json, tracemalloc
import numpy as np
import neuron_kernels as nk

x = np.ones((256, 1024), np.float32)
q = nk.quantize_mx(x, "mxfp4_e2m1")
calls = {
    "quantize": lambda: nk.quantize_mx(x, "mxfp4_e2m1"),
    "fake_quantize": lambda: nk.fake_quantize_mx(x),
    "dequantize": lambda: nk.dequantize_mx(q),
}
peaks = {}
for name, run in calls.items():
    run()  # compile first
    tracemalloc.start()
    try:
        result = run()
        peaks[name] = (tracemalloc.get_traced_memory()[1], result.nbytes)
    finally:
        tracemalloc.stop()
print("PEAKS " + json.dumps(peaks))
"""


def test_extra_memory_is_the_output():
    """docs/performance.md / the issue: no allocation beyond the result (numpy allocations are traced). In an
    interpreter of its own: tracemalloc counts every thread's allocations, and a test process may hold a dask
    client whose event loop allocates in the background."""
    # A process of its own: tracemalloc must see this call's allocations only (see the docstring).
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PEAKS], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("PEAKS "))
    peaks = json.loads(line[len("PEAKS ") :])
    assert set(peaks) == {"quantize", "fake_quantize", "dequantize"}
    for call, (peak, nbytes) in peaks.items():
        assert peak <= nbytes + 64 * 1024, (call, peak, nbytes)


def test_quantization_error_leaves_out_nan_blocks():
    x = np.ones(64, np.float32)
    x[3] = np.nan  # the first block dequantises to NaN as a whole
    x[40] = 1.1
    mx = nk.quantize_mx(x, "mxfp8_e4m3")
    stats = nk.quantization_error(x, mx)
    clean = nk.quantization_error(x[32:], nk.quantize_mx(x[32:], "mxfp8_e4m3"))
    assert stats.as_dict() == clean.as_dict()  # the same 32 elements count, and only they
    assert np.isfinite(stats.sqnr_db) and stats.max_abs_error > 0
