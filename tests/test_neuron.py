"""MX arrays as the operands of ``nki.isa.nc_matmul_mx`` (``to_nc_matmul_mx`` / ``from_nc_matmul_mx``).

Checked against ``tests/reference_neuron.py`` (written from the Neuron documents, index by index):
the containers and placed scales for both kinds of arrays (blocked along K, 8 x 4 tiles), the
round trip, the product the instruction computes from the laid-out operands against ``mx_matmul``
of the arrays, and clear errors for arrays and operands that do not fit.
"""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels import BlockArray, BlockLayout
from neuron_kernels.neuron.operands import NC_MATMUL_MX_FORMATS, nc_matmul_mx_scale_partitions

from .reference_blocks import neuron_quantize_mx_ref, neuron_scale_tile_ref
from .reference_mx import pack_fp4_ref, unpack_fp4_ref
from .reference_neuron import (
    decode_operand_ref,
    layout_k_ref,
    layout_sbuf_ref,
    nc_matmul_mx_ref,
    sbuf_to_logical_ref,
    scale_partition_ref,
)

U32 = 2.0**-24  # float32 unit roundoff


def _pack_along(codes: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(pack_fp4_ref(np.moveaxis(codes, axis, -1)), -1, axis)


def random_k_array(rng, fmt, k, free, axis, pack=True, scale_bytes=None):
    """An MX array of random codes and scale bytes blocked along K (``axis`` of a 2-D array);
    returns it with its codes ``[K, F]`` (one per element) and scale bytes ``[K / 32, F]``."""
    bits = 4 if fmt == "mxfp4_e2m1" else 8
    codes = rng.integers(0, 1 << bits, size=(k, free), dtype=np.uint8)
    if scale_bytes is None:
        scale_bytes = rng.integers(0, 256, size=(k // 32, free), dtype=np.uint8)
    shape = (k, free) if axis == 0 else (free, k)
    stored = codes if axis == 0 else codes.T
    packed = pack and bits == 4
    if packed:
        stored = _pack_along(stored, axis)
    scales = scale_bytes if axis == 0 else scale_bytes.T
    q = BlockArray.from_parts(
        np.ascontiguousarray(stored), np.ascontiguousarray(scales), BlockLayout(fmt, shape, axis, 32, 1, packed)
    )
    return q, codes, scale_bytes


def random_tile_array(rng, fmt, rows, cols, pack=True):
    """An MX array of random codes in 8 x 4 tiles ``[rows, cols]``, with its codes and scale bytes."""
    bits = 4 if fmt == "mxfp4_e2m1" else 8
    codes = rng.integers(0, 1 << bits, size=(rows, cols), dtype=np.uint8)
    scale_bytes = rng.integers(0, 256, size=(rows // 8, cols // 4), dtype=np.uint8)
    packed = pack and bits == 4
    stored = pack_fp4_ref(codes) if packed else codes
    q = BlockArray.from_parts(stored, scale_bytes, BlockLayout(fmt, (rows, cols), 1, 4, 8, packed))
    return q, codes, scale_bytes


def assert_same_array(a: BlockArray, b: BlockArray) -> None:
    assert (a.fmt, a.shape, a.axis, a.block_size, a.block_rows, a.packed) == (
        b.fmt,
        b.shape,
        b.axis,
        b.block_size,
        b.block_rows,
        b.packed,
    )
    assert (a.per_tensor_scale, a.rotation) == (b.per_tensor_scale, b.rotation)
    assert a.codes.dtype == b.codes.dtype and np.array_equal(a.codes, b.codes)
    assert a.scales.dtype == b.scales.dtype and np.array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))


def stored_codes(q: BlockArray) -> np.ndarray:
    """The array's codes one per element, unpacked by the reference (not by the package)."""
    if not q.packed:
        return q.codes
    moved = np.moveaxis(q.codes, q.axis, -1)
    return np.moveaxis(unpack_fp4_ref(moved, q.shape[q.axis]), -1, q.axis)


# (fmt, K, F, K axis, k_tile, scale offset, operand, pack)
K_CASES = [
    ("mxfp8_e4m3", 512, 64, 0, None, 0, "stationary", True),
    ("mxfp8_e5m2", 1024, 48, 1, 256, 4, "stationary", True),
    ("mxfp4_e2m1", 384, 40, 1, None, 12, "moving", True),
    ("mxfp4_e2m1", 256, 10, 0, 128, 8, "moving", False),
    ("mxfp8_e4m3", 128, 600, 0, None, 0, "moving", True),
    ("mxfp4_e2m1", 1536, 8, 0, 512, 0, "stationary", True),
]

# (fmt, rows, cols, k_tile, scale offset, pack)
TILE_CASES = [
    ("mxfp8_e4m3", 128, 64, None, 0, True),
    ("mxfp8_e5m2", 64, 16, None, 4, True),
    ("mxfp4_e2m1", 256, 32, 512, 0, True),
    ("mxfp4_e2m1", 96, 8, None, 12, False),
    ("mxfp8_e4m3", 64, 24, 128, 8, True),
]


def test_formats_are_the_mx_formats_with_a_container():
    assert NC_MATMUL_MX_FORMATS == ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4_e2m1")


def test_scale_partitions():
    # The deep dive's load_scales_scattered: logical rows 0:4 -> partitions 0:4, 4:8 -> 32:36,
    # 8:12 -> 64:68, 12:16 -> 96:100.
    full = [0, 1, 2, 3, 32, 33, 34, 35, 64, 65, 66, 67, 96, 97, 98, 99]
    assert nc_matmul_mx_scale_partitions(128) == full
    assert nc_matmul_mx_scale_partitions(128, 12) == [p + 12 for p in full]
    assert nc_matmul_mx_scale_partitions(32, 4) == [4, 5, 6, 7]
    for partitions in (32, 64, 96, 128):
        for offset in (0, 4, 8, 12):
            want = [scale_partition_ref(a, offset) for a in range(partitions // 8)]
            assert nc_matmul_mx_scale_partitions(partitions, offset) == want


@pytest.mark.parametrize("fmt, k, free, axis, k_tile, offset, operand, pack", K_CASES)
def test_k_blocked_layout_matches_reference(rng, fmt, k, free, axis, k_tile, offset, operand, pack):
    q, codes, scale_bytes = random_k_array(rng, fmt, k, free, axis, pack)
    data, scales = nk.to_nc_matmul_mx(q, operand, k_tile=k_tile, scale_offset=offset)
    want_data, want_scales = layout_k_ref(codes, scale_bytes, fmt, k_tile or min(k, 512), offset)
    assert data.dtype == want_data.dtype and np.array_equal(data, want_data)
    assert scales.dtype == np.uint8 and np.array_equal(scales, want_scales)


@pytest.mark.parametrize("fmt, rows, cols, k_tile, offset, pack", TILE_CASES)
def test_tiled_layout_matches_reference(rng, fmt, rows, cols, k_tile, offset, pack):
    q, codes, scale_bytes = random_tile_array(rng, fmt, rows, cols, pack)
    data, scales = nk.to_nc_matmul_mx(q, "moving", k_tile=k_tile, scale_offset=offset)
    partitions = (k_tile or 4 * min(rows, 128)) // 4
    want_data, want_scales = layout_sbuf_ref(codes, scale_bytes, fmt, partitions, offset)
    assert data.dtype == want_data.dtype and np.array_equal(data, want_data)
    assert np.array_equal(scales, want_scales)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("offset", [0, 8])
def test_quantize_mx_emulation_gives_the_instruction_outputs(rng, fmt, offset):
    # quantize_mx on a [P, F] tile writes x4 data [P, F/4] and scales on the quadrant rows: the
    # 8 x 4 emulation laid out here must equal the quantize_mx reference of reference_blocks.
    x = (rng.standard_normal((64, 32)) * np.exp2(rng.integers(-6, 7, size=(64, 1)))).astype(np.float32)
    q = nk.quantize_mx(x, fmt, block_shape=(8, 4), scale_mode="neuron")
    data, scales = nk.to_nc_matmul_mx(q, "moving", scale_offset=offset)
    packed, logical = neuron_quantize_mx_ref(x, fmt)
    assert np.array_equal(data[0], packed)
    assert np.array_equal(scales[0], neuron_scale_tile_ref(logical, 64, offset))


@pytest.mark.parametrize("fmt, k, free, axis, k_tile, offset, operand, pack", K_CASES)
def test_k_blocked_round_trip(rng, fmt, k, free, axis, k_tile, offset, operand, pack):
    q, _, _ = random_k_array(rng, fmt, k, free, axis, pack)
    data, scales = nk.to_nc_matmul_mx(q, operand, k_tile=k_tile, scale_offset=offset)
    back = nk.from_nc_matmul_mx(data, scales, fmt, axis=axis, scale_offset=offset, pack=pack)
    assert_same_array(back, q)


@pytest.mark.parametrize("fmt, rows, cols, k_tile, offset, pack", TILE_CASES)
def test_tiled_round_trip(rng, fmt, rows, cols, k_tile, offset, pack):
    q, _, _ = random_tile_array(rng, fmt, rows, cols, pack)
    data, scales = nk.to_nc_matmul_mx(q, "moving", k_tile=k_tile, scale_offset=offset)
    back = nk.from_nc_matmul_mx(data, scales, fmt, block_shape=(8, 4), scale_offset=offset, pack=pack)
    assert_same_array(back, q)


def test_round_trip_of_quantised_and_rotated_arrays(rng):
    w = rng.standard_normal((96, 1024)).astype(np.float32)
    for q in (
        nk.quantize_mx(w, "mxfp4_e2m1"),
        nk.quantize_mx(w.T.copy(), "mxfp8_e4m3", axis=0, scale_mode="rceil"),
        nk.quantize(w, "mxfp4_e2m1", rht=True),
    ):
        data, scales = nk.to_nc_matmul_mx(q, "stationary")
        back = nk.from_nc_matmul_mx(data, scales, q.fmt, axis=q.axis, rotation=q.rotation)
        assert_same_array(back, q)
        assert np.array_equal(back.dequantize(), q.dequantize(), equal_nan=True)


def test_one_tile_compact_scales_and_other_dtypes(rng):
    # One K tile may be given as [P, F]; with 32 partitions the [4, F] scale tile is enough; scales
    # may be float8_e8m0fnu and containers of either byte order.
    q, _, _ = random_k_array(rng, "mxfp8_e5m2", 128, 16, 1)
    data, scales = nk.to_nc_matmul_mx(q, "stationary")
    assert data.shape == scales.shape == (1, 32, 16)
    assert not scales[0, 4:].any()
    assert_same_array(nk.from_nc_matmul_mx(data[0], scales[0], q.fmt), q)
    assert_same_array(nk.from_nc_matmul_mx(data, scales[:, :4], q.fmt), q)
    assert_same_array(nk.from_nc_matmul_mx(data, scales.view(ml_dtypes.float8_e8m0fnu), q.fmt), q)
    swapped = data.byteswap().view(data.dtype.newbyteorder())  # the same containers, big-endian
    assert_same_array(nk.from_nc_matmul_mx(swapped, scales, q.fmt), q)


def test_four_tensors_share_one_scale_tile(rng):
    # Scale rows at offsets 0, 4, 8, 12 fill 16 rows of each quadrant: four operands' scales in one
    # tile, each read back with its own offset.
    arrays = [random_k_array(rng, "mxfp8_e4m3", 512, 32, 0)[0] for _ in range(4)]
    laid = [nk.to_nc_matmul_mx(q, "stationary", scale_offset=off) for q, off in zip(arrays, (0, 4, 8, 12))]
    shared = np.zeros_like(laid[0].scales)
    for _, scales in laid:
        assert not (shared.astype(bool) & scales.astype(bool)).any()
        shared |= scales
    rows = [p for p in range(128) if p % 32 < 16]
    assert not np.delete(shared, rows, axis=1).any()
    for q, (data, _), off in zip(arrays, laid, (0, 4, 8, 12)):
        assert_same_array(nk.from_nc_matmul_mx(data, shared, q.fmt, axis=0, scale_offset=off), q)


def _logical_from_lanes(values: np.ndarray) -> np.ndarray:
    """Decoded lanes [T, P, F, 4] of a K-blocked operand -> [K, F], K = t * 4P + 4p + l."""
    tiles, partitions, free, _ = values.shape
    return values.transpose(0, 1, 3, 2).reshape(tiles * partitions * 4, free)


def _check_product(got, exact, terms, magnitude):
    """``got`` within the float32 summation bound of the exact product: |got - exact| <= n u sum|ab|."""
    bound = 1.01 * terms * U32 * magnitude
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)


# (stationary fmt, moving fmt, M, K, N, k_tile, stationary offset, moving offset)
PRODUCT_CASES = [
    ("mxfp8_e4m3", "mxfp8_e4m3", 64, 512, 96, None, 0, 0),
    ("mxfp4_e2m1", "mxfp8_e5m2", 32, 1024, 40, 256, 4, 8),
    ("mxfp8_e5m2", "mxfp4_e2m1", 128, 384, 16, None, 12, 0),
    ("mxfp4_e2m1", "mxfp4_e2m1", 16, 1024, 24, 128, 8, 4),
]


@pytest.mark.parametrize("fa, fb, m, k, n, k_tile, off_a, off_b", PRODUCT_CASES)
def test_product_of_the_operands_is_mx_matmul(rng, fa, fb, m, k, n, k_tile, off_a, off_b):
    # a [M, K] blocked along K is the stationary operand, b [K, N] the moving one; the instruction's
    # product of the laid-out operands (decoded and summed by the reference, float32) equals
    # mx_matmul of the arrays up to the order of the float32 sums.
    a_x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-8, 9, size=(m, 1)))).astype(np.float32)
    b_x = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-8, 9, size=(1, n)))).astype(np.float32)
    a, b = nk.quantize_mx(a_x, fa, axis=1), nk.quantize_mx(b_x, fb, axis=0)
    stationary = nk.to_nc_matmul_mx(a, "stationary", k_tile=k_tile, scale_offset=off_a)
    moving = nk.to_nc_matmul_mx(b, "moving", k_tile=k_tile, scale_offset=off_b)
    s_vals = decode_operand_ref(*stationary, fa, off_a)
    m_vals = decode_operand_ref(*moving, fb, off_b)
    # The decoded lanes are the arrays' values, K element 4p + l of each tile on partition p, lane l.
    assert np.array_equal(_logical_from_lanes(s_vals), a.dequantize().T.astype(np.float64))
    assert np.array_equal(_logical_from_lanes(m_vals), b.dequantize().astype(np.float64))
    got = nc_matmul_mx_ref(s_vals, m_vals)
    want = nk.mx_matmul(a, b)
    assert got.shape == want.shape == (m, n) and got.dtype == np.float32
    a64, b64 = a.dequantize().astype(np.float64), b.dequantize().astype(np.float64)
    exact, magnitude = a64 @ b64, np.abs(a64) @ np.abs(b64)
    _check_product(got, exact, k, magnitude)
    _check_product(want, exact, k, magnitude)


def test_product_is_exact_where_every_sum_is(rng):
    # FP4 codes with scales 2^-1..2^1: every value is a multiple of 2^-2 below 12, every product a
    # multiple of 2^-4 below 144, and 1024 of them sum below 2^24 units: exact in float32 in any
    # order, so the instruction's product equals mx_matmul bit for bit.
    k = 1024
    a, _, _ = random_k_array(rng, "mxfp4_e2m1", k, 16, 1, scale_bytes=rng.integers(126, 129, (k // 32, 16), np.uint8))
    b, _, _ = random_k_array(rng, "mxfp4_e2m1", k, 24, 0, scale_bytes=rng.integers(126, 129, (k // 32, 24), np.uint8))
    stationary = nk.to_nc_matmul_mx(a, "stationary", k_tile=256)
    moving = nk.to_nc_matmul_mx(b, "moving", k_tile=256, scale_offset=4)
    got = nc_matmul_mx_ref(decode_operand_ref(*stationary, a.fmt), decode_operand_ref(*moving, b.fmt, 4))
    assert np.array_equal(got, nk.mx_matmul(a, b))
    assert np.array_equal(got, a.dequantize().astype(np.float64) @ b.dequantize().astype(np.float64))


def test_product_of_tiled_operands(rng):
    # quantize_mx output on shuffled tiles: the instruction's product is that of the logical
    # matrices the deep dive's shuffle relates them to (K element l * P + p of a tile is row p,
    # lane l), here checked with numpy's arrangement of the package's dequantised values.
    partitions, m, n = 128, 16, 40
    xs = rng.standard_normal((2 * partitions, 4 * m)).astype(np.float32)
    xm = (rng.standard_normal((2 * partitions, 4 * n)) * 100).astype(np.float32)
    s = nk.quantize_mx(xs, "mxfp8_e4m3", block_shape=(8, 4), scale_mode="neuron")
    mv = nk.quantize_mx(xm, "mxfp8_e5m2", block_shape=(8, 4), scale_mode="neuron")
    s_vals = decode_operand_ref(*nk.to_nc_matmul_mx(s, "stationary"), s.fmt)
    m_vals = decode_operand_ref(*nk.to_nc_matmul_mx(mv, "moving", scale_offset=12), mv.fmt, 12)

    def logical(q):
        dq = q.dequantize().astype(np.float64)
        free = dq.shape[1] // 4
        return dq.reshape(2, partitions, free, 4).transpose(0, 3, 1, 2).reshape(8 * partitions, free)

    a_t, b = logical(s), logical(mv)
    assert np.array_equal(sbuf_to_logical_ref(s_vals), a_t)
    assert np.array_equal(sbuf_to_logical_ref(m_vals), b)
    got = nc_matmul_mx_ref(s_vals, m_vals)
    _check_product(got, a_t.T @ b, 8 * partitions, np.abs(a_t.T) @ np.abs(b))


# ---- bad input ----------------------------------------------------------------------------------


@pytest.fixture
def k_array(rng):
    return random_k_array(rng, "mxfp8_e4m3", 512, 16, 1)[0]


@pytest.mark.parametrize(
    "make, kwargs, error, pattern",
    [
        (lambda x: x.dequantize(), {}, TypeError, "needs an MX BlockArray"),
        (lambda x: nk.quantize(x.dequantize(), "nvfp4"), {}, ValueError, "multiplies mxfp8_e4m3, mxfp8_e5m2, mxfp4"),
        (lambda x: nk.quantize_mx(x.dequantize(), "mxfp6_e2m3"), {}, ValueError, "got 'mxfp6_e2m3'"),
        (lambda x: nk.quantize_mx(x.dequantize(), "mxint8"), {}, ValueError, "got 'mxint8'"),
        (lambda x: x, {"operand": "both"}, ValueError, "operand must be one of 'stationary', 'moving'"),
        (lambda x: nk.quantize_mx(np.zeros((2, 16, 512), np.float32)), {}, ValueError, "needs a 2-D array"),
        (lambda x: nk.quantize_mx(x.dequantize(), block_size=16), {}, ValueError, "groups of 32 .* blocks of 16"),
        (lambda x: x, {"axis": 0}, ValueError, "blocked along axis 1, not along K \\(axis 0\\)"),
        (lambda x: x, {"axis": 2}, ValueError, "axis must be 0 or 1"),
        (
            lambda x: nk.quantize_mx(np.ones((32, 32), np.float32), block_shape=(16, 4)),
            {},
            ValueError,
            "got 16 x 4 tiles",
        ),
        (lambda x: nk.quantize_mx(np.ones((16, 640), np.float32)), {}, ValueError, "K = 640 .* k_tile=128 divides it"),
        (lambda x: nk.quantize_mx(np.ones((16, 96), np.float32)), {}, ValueError, "K = 96 .* pad K"),
        (lambda x: x, {"k_tile": 100}, ValueError, "k_tile must be one of 128, 256, 384, 512"),
        (lambda x: x, {"k_tile": True}, ValueError, "k_tile must be one of"),
        (
            lambda x: nk.quantize_mx(np.ones((130, 512), np.float32)),
            {},
            ValueError,
            "an even number of elements, 2 to 128, on its free axis; got 130",
        ),
        (lambda x: nk.quantize_mx(np.ones((15, 512), np.float32)), {}, ValueError, "even number .*; got 15"),
        (
            lambda x: nk.quantize_mx(np.ones((128, 8193), np.float32), axis=0),
            {"operand": "moving"},
            ValueError,
            "1 to 8192 elements on its free axis; got 8193",
        ),
        (lambda x: x, {"scale_offset": 2}, ValueError, "scale_offset must be one of 0, 4, 8, 12"),
        (lambda x: x, {"scale_offset": 16}, ValueError, "scale_offset must be one of"),
        (lambda x: x, {"scale_offset": True}, ValueError, "scale_offset must be one of"),
        (
            lambda x: nk.quantize_mx(np.ones((32, 16), np.float32), block_shape=(8, 4)),
            {"axis": 0},
            ValueError,
            "axis= does not apply",
        ),
        (
            lambda x: nk.quantize_mx(np.ones((32, 18), np.float32), block_shape=(8, 4)),
            {},
            ValueError,
            "multiple of 4 columns, got 18",
        ),
        (
            lambda x: nk.quantize_mx(np.ones((40, 16), np.float32), block_shape=(8, 4)),
            {},
            ValueError,
            "K \\(4 x 40 rows\\) = 160",
        ),
    ],
)
def test_to_refuses(k_array, make, kwargs, error, pattern):
    options = {"operand": "stationary", **kwargs}
    operand = options.pop("operand")
    with pytest.raises(error, match=pattern):
        nk.to_nc_matmul_mx(make(k_array), operand, **options)


def test_to_refuses_a_rotated_tile_array():
    q = nk.quantize_mx(np.ones((32, 16), np.float32), block_shape=(8, 4))
    rotated = BlockArray.from_parts(q.codes, q.scales, BlockLayout(q.fmt, q.shape, 1, 4, 8), rotation=(1,) * 16)
    with pytest.raises(ValueError, match="rotated along its free axis"):
        nk.to_nc_matmul_mx(rotated, "moving")


@pytest.fixture
def laid(k_array):
    return nk.to_nc_matmul_mx(k_array, "stationary")


@pytest.mark.parametrize(
    "change, kwargs, error, pattern",
    [
        (lambda d, s: (d.astype(np.uint16), s), {}, TypeError, "float8_e4m3fn_x4 containers \\(uint32\\)"),
        (lambda d, s: (d.view(np.float32), s), {}, TypeError, "got dtype float32"),
        (lambda d, s: (d.tolist(), s), {}, TypeError, "must be numpy arrays"),
        (lambda d, s: (d, s.astype(np.float32)), {}, TypeError, "e8m0 bytes"),
        (lambda d, s: (d, s.view(ml_dtypes.float8_e4m3fn)), {}, TypeError, "e8m0 bytes"),
        (lambda d, s: (d, s[0]), {}, ValueError, "must both be \\[T, P, F\\]"),
        (lambda d, s: (d[:, :48], s[:, :48]), {}, ValueError, "32, 64, 96 or 128 partitions"),
        (lambda d, s: (d[:0], s[:0]), {}, ValueError, "holds no operand"),
        (lambda d, s: (d, s[:, :, :8]), {}, ValueError, "shape of data"),
        (lambda d, s: (d, s[:, :16]), {}, ValueError, "shape of data"),
        (lambda d, s: (d, s), {"fmt": "nvfp4"}, ValueError, "multiplies"),
        (lambda d, s: (d, s), {"fmt": None}, TypeError, "block format name"),
        (lambda d, s: (d, s), {"axis": 2}, ValueError, "axis must be 0 or 1"),
        (lambda d, s: (d, s), {"axis": True}, ValueError, "axis must be 0 or 1"),
        (lambda d, s: (d, s), {"block_shape": (4, 8)}, ValueError, "block_shape must be None"),
        (lambda d, s: (d, s), {"block_shape": 8}, ValueError, "block_shape must be None"),
        (lambda d, s: (d, s), {"block_shape": (8, 4), "axis": 0}, ValueError, "axis= does not apply"),
        (lambda d, s: (d, s), {"block_shape": (8, 4), "rotation": (1,) * 16}, ValueError, "rotation"),
        (lambda d, s: (d, s), {"rotation": (1, 2)}, ValueError, "16 signs"),
        (lambda d, s: (d, s), {"scale_offset": 3}, ValueError, "scale_offset must be one of"),
        (lambda d, s: (d, s), {"pack": "yes"}, TypeError, "pack must be True or False"),
    ],
)
def test_from_refuses(laid, change, kwargs, error, pattern):
    data, scales = change(*laid)
    options = {"fmt": "mxfp8_e4m3", **kwargs}
    fmt = options.pop("fmt")
    with pytest.raises(error, match=pattern):
        nk.from_nc_matmul_mx(data, scales, fmt, **options)


def test_from_refuses_compact_scales_at_an_offset(rng):
    q, _, _ = random_k_array(rng, "mxfp8_e4m3", 128, 16, 1)
    data, scales = nk.to_nc_matmul_mx(q, "stationary", scale_offset=4)
    with pytest.raises(ValueError, match="shape of data"):
        nk.from_nc_matmul_mx(data, scales[:, 4:8], q.fmt, scale_offset=4)
