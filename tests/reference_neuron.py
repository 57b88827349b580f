"""Slow, obviously-correct reference for the operands of Neuron's ``nki.isa.nc_matmul_mx``.

Nothing here shares code with the package: every container, scale row and product is written
out one index at a time from the Neuron documentation, read at aws-neuron-sdk commit
81ce03ae261e12925e53437a0f690478e6366155 (the ``nc_matmul_mx`` and ``quantize_mx`` docstrings in
``nki/api/nki/isa/__init__.py``, the Trainium3 architecture guide, the deep dive
``nki/deep-dives/mxfp-matmul.rst`` and its ``mx_cpu_utils.py``), and aws-neuron/nki-library at
commit d2ad3a579498d1888aa8740af97fd325dd5f2740 (``mx_torch_common.py``). Element values come from
the cast reference ``reference_casts.decode_ref``.

What the documents say, as used here
====================================

- An operand is ``[P, F]`` packed containers per K tile, P (32, 64, 96 or 128) partitions; the
  contraction runs over the partitions and the four lanes of each container, so a K tile holds
  ``4 * P`` elements. FP8 containers are uint32 with lane l at bits 8l..8l+7; FP4 containers
  uint16 with lane l at bits 4l..4l+3 (lane 0 least significant).
- One e8m0 scale byte per 8 partitions x 4 lanes of one free column: data partitions 8a..8a+7 of
  column f share logical scale [a, f], stored on partition ``32 * (a // 4) + a % 4 + offset``
  (offset 0, 4, 8 or 12). A lane's value is ``element * 2^(byte - 127)``; byte 255 is NaN.
- ``dst[m, n] = sum over (p, l) of stationary[p, m, l] * moving[p, n, l]``, accumulated in float32.

How a logical array maps onto an operand (the package's choice, stated in its docstring): an MX
array blocked along K (blocks of 32 consecutive K) puts K element ``t * 4P + 4p + l`` on tile t,
partition p, lane l, so block ``t * P / 8 + a`` is group a of tile t. An array of 8 x 4 tiles is the
SBUF tile itself: row ``t * P + p``, column ``4f + l`` goes to tile t, partition p, column f, lane l.
The deep dive's on-device shuffle (``copy_data_strided``) relates such a tile to a logical
``[4P, F]`` matrix: element ``(l * P + p, f)`` of the K tile is row p, column 4f + l.

Public names
============

- ``FORMATS_NEURON_REF``: fmt -> (element format name, element bits).
- ``scale_partition_ref(a, offset)``: the partition of logical scale row a.
- ``layout_k_ref(codes, scale_bytes, fmt, k_tile, offset=0)``: codes uint8 ``[K, F]`` (one per
  element, K first), scale bytes ``[K / 32, F]`` -> ``(data [T, P, F], scales [T, P, F])``.
- ``layout_sbuf_ref(codes, scale_bytes, fmt, partitions, offset=0)``: codes ``[R, 4F]`` of 8 x 4
  tiles, scale bytes ``[R / 8, F]`` -> the same.
- ``decode_operand_ref(data, scales, fmt, offset=0)`` -> float64 ``[T, P, F, 4]`` lane values.
- ``nc_matmul_mx_ref(stationary, moving, accumulate=np.float32)``: decoded operands -> ``[M, N]``.
- ``sbuf_to_logical_ref(values)``: decoded lane values ``[T, P, F, 4]`` of an 8 x 4 tiled operand ->
  the logical ``[T * 4P, F]`` matrix of the deep dive's shuffle.
"""

from __future__ import annotations

import numpy as np

from .reference_casts import decode_ref

FORMATS_NEURON_REF = {
    "mxfp8_e4m3": ("float8_e4m3fn", 8),
    "mxfp8_e5m2": ("float8_e5m2", 8),
    "mxfp4_e2m1": ("float4_e2m1fn", 4),
}
SCALE_OFFSETS_REF = (0, 4, 8, 12)


def _bits(fmt: str) -> int:
    if fmt not in FORMATS_NEURON_REF:
        raise ValueError(f"not a format nc_matmul_mx takes: {fmt!r}")
    return FORMATS_NEURON_REF[fmt][1]


def _container(bits: int):
    return np.uint32 if bits == 8 else np.uint16


def scale_partition_ref(a: int, offset: int = 0) -> int:
    """Logical scale row a (data partitions 8a..8a+7) lives in quadrant a // 4 (partitions
    32 * (a // 4) ..), on its row a % 4, moved down by ``offset``."""
    if offset not in SCALE_OFFSETS_REF:
        raise ValueError(f"offset must be 0, 4, 8 or 12, got {offset!r}")
    quadrant = a // 4
    return 32 * quadrant + a % 4 + offset


def _place_scales(logical: np.ndarray, tiles: int, partitions: int, offset: int) -> np.ndarray:
    """logical [T * P / 8, F] -> [T, P, F] with row a of tile t on its partition."""
    free = logical.shape[1]
    out = np.zeros((tiles, partitions, free), dtype=np.uint8)
    for t in range(tiles):
        for a in range(partitions // 8):
            p = scale_partition_ref(a, offset)
            if p >= partitions:
                raise ValueError(f"scale row {a} would land on partition {p} of {partitions}")
            for f in range(free):
                out[t, p, f] = logical[t * (partitions // 8) + a, f]
    return out


def _check_partitions(partitions: int) -> None:
    if partitions not in (32, 64, 96, 128):
        raise ValueError(f"partitions must be 32, 64, 96 or 128, got {partitions}")


def layout_k_ref(codes, scale_bytes, fmt: str, k_tile: int, offset: int = 0):
    """Operands of an array blocked along K (32 consecutive K per block): codes ``[K, F]``."""
    bits = _bits(fmt)
    codes = np.asarray(codes)
    scale_bytes = np.asarray(scale_bytes)
    if codes.dtype != np.uint8 or codes.ndim != 2 or scale_bytes.dtype != np.uint8:
        raise ValueError("codes and scale bytes must be 2-D uint8")
    k, free = codes.shape
    partitions = k_tile // 4
    _check_partitions(partitions)
    if k % k_tile or scale_bytes.shape != (k // 32, free):
        raise ValueError("K must be a multiple of k_tile, with one scale per 32 K")
    tiles = k // k_tile
    data = np.zeros((tiles, partitions, free), dtype=_container(bits))
    for t in range(tiles):
        for p in range(partitions):
            for f in range(free):
                word = 0
                for lane in range(4):
                    word |= int(codes[t * k_tile + 4 * p + lane, f]) << (bits * lane)
                data[t, p, f] = word
    return data, _place_scales(scale_bytes, tiles, partitions, offset)


def layout_sbuf_ref(codes, scale_bytes, fmt: str, partitions: int, offset: int = 0):
    """Operands of an array of 8 x 4 tiles (the SBUF tile itself): codes ``[R, 4F]``."""
    bits = _bits(fmt)
    codes = np.asarray(codes)
    scale_bytes = np.asarray(scale_bytes)
    if codes.dtype != np.uint8 or codes.ndim != 2 or scale_bytes.dtype != np.uint8:
        raise ValueError("codes and scale bytes must be 2-D uint8")
    _check_partitions(partitions)
    rows, cols = codes.shape
    if rows % partitions or cols % 4 or scale_bytes.shape != (rows // 8, cols // 4):
        raise ValueError("rows must be a multiple of the partitions, columns of 4, one scale per 8 x 4")
    tiles, free = rows // partitions, cols // 4
    data = np.zeros((tiles, partitions, free), dtype=_container(bits))
    for t in range(tiles):
        for p in range(partitions):
            for f in range(free):
                word = 0
                for lane in range(4):
                    word |= int(codes[t * partitions + p, 4 * f + lane]) << (bits * lane)
                data[t, p, f] = word
    return data, _place_scales(scale_bytes, tiles, partitions, offset)


def decode_operand_ref(data, scales, fmt: str, offset: int = 0) -> np.ndarray:
    """The value of every lane, float64 ``[T, P, F, 4]``: element times 2^(scale byte - 127), the
    scale read from the group's partition (``[T, P, F]`` scale tiles)."""
    name, bits = FORMATS_NEURON_REF[fmt]
    data = np.asarray(data)
    scales = np.asarray(scales)
    if data.dtype != _container(bits) or data.ndim != 3 or scales.shape != data.shape:
        raise ValueError("data must be [T, P, F] containers of the format, scales of the same shape")
    table = decode_ref(np.arange(1 << bits, dtype=np.uint8), name).astype(np.float64)
    tiles, partitions, free = data.shape
    out = np.zeros((tiles, partitions, free, 4), dtype=np.float64)
    for t in range(tiles):
        for p in range(partitions):
            row = scale_partition_ref(p // 8, offset)
            for f in range(free):
                byte = int(scales[t, row, f])
                scale = float("nan") if byte == 255 else 2.0 ** (byte - 127)
                word = int(data[t, p, f])
                for lane in range(4):
                    code = (word >> (bits * lane)) & ((1 << bits) - 1)
                    out[t, p, f, lane] = table[code] * scale
    return out


def nc_matmul_mx_ref(stationary, moving, accumulate=np.float32) -> np.ndarray:
    """``dst[m, n] = sum over (t, p, l) of stationary[t, p, m, l] * moving[t, p, n, l]``, each
    product rounded to ``accumulate`` and added in that precision, in the order t, p, l (one
    output element at a time would be the same sums; the columns are done together)."""
    stationary = np.asarray(stationary, dtype=np.float64)
    moving = np.asarray(moving, dtype=np.float64)
    tiles, partitions, m_size, _ = stationary.shape
    if moving.shape[:2] != (tiles, partitions) or moving.shape[3] != 4:
        raise ValueError("both operands must have the same K tiles and partitions")
    acc = np.zeros((m_size, moving.shape[2]), dtype=accumulate)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(tiles):
            for p in range(partitions):
                for lane in range(4):
                    product = np.multiply.outer(stationary[t, p, :, lane], moving[t, p, :, lane])
                    acc += product.astype(accumulate)
    return acc


def sbuf_to_logical_ref(values) -> np.ndarray:
    """Lane values ``[T, P, F, 4]`` of an 8 x 4 tiled operand -> the logical ``[T * 4P, F]`` matrix:
    element ``(t * 4P + l * P + p, f)`` is lane l of container (p, f) of tile t."""
    values = np.asarray(values)
    tiles, partitions, free, _ = values.shape
    out = np.zeros((tiles * 4 * partitions, free), dtype=values.dtype)
    for t in range(tiles):
        for p in range(partitions):
            for f in range(free):
                for lane in range(4):
                    out[t * 4 * partitions + lane * partitions + p, f] = values[t, p, f, lane]
    return out
