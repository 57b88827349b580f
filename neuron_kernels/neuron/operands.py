"""MX arrays laid out as the operands of Neuron's ``nki.isa.nc_matmul_mx``, and back.

What the instruction takes
==========================

Sources: aws-neuron-sdk at commit 81ce03ae261e12925e53437a0f690478e6366155 (Neuron 2.32): the
docstrings of ``nc_matmul_mx`` and ``quantize_mx`` in ``nki/api/nki/isa/__init__.py`` (and the
longer ``quantize_mx`` docstring of commit 86a92868, Neuron 2.28), the section "Quad-MXFP8/MXFP4
Matmul Performance" of ``nki/guides/architecture/trainium3_arch.rst``, the deep dive
``nki/deep-dives/mxfp-matmul.rst`` with its ``src/mxfp-matmul/mx_cpu_utils.py`` and
``mx_kernel_utils.py``, and the ``rmsnorm_mx_prefill`` page ``nki/library/api/rmsnorm-mx-prefill.rst``;
aws-neuron/nki-library at commit d2ad3a579498d1888aa8740af97fd325dd5f2740
(``nkilib/core/utils/mx_torch_common.py``: the x4 lane order and the matmul it checks kernels with).

- ``dst[M, N] = sum over k of stationary[k, m] * moving[k, n]``, dequantised: both data operands
  are SBUF tiles ``[P, F]`` of a packed x4 type, P the partition axis, F the free axis (M for the
  stationary operand, N for the moving one). The contraction runs over the partition axis *and*
  the four lanes of each container: one K tile is ``4 * P`` elements. P is a multiple of 32 up to
  128 (a K tile of 128, 256, 384 or 512), the same for both operands; the stationary free size is
  even and at most 128; the moving free size at most 4096 with a float32 ``dst``, 8192 with a
  bfloat16 one. Products are accumulated in float32.
- Data types: ``float8_e4m3fn_x4`` and ``float8_e5m2_x4`` (four 8-bit codes in a uint32, lane i at
  bits 8i..8i+7) and ``float4_e2m1fn_x4`` (four 4-bit codes in a uint16, lane i at bits 4i..4i+3);
  the two operands may differ (MXFP8 x MXFP4 is allowed). So the formats are ``mxfp8_e4m3``,
  ``mxfp8_e5m2`` and ``mxfp4_e2m1``: the MX formats of the table that have an x4 container.
- Scales: one e8m0 byte (uint8 or float8_e8m0fnu) per group of 32 elements along K, a group being
  8 partitions x the 4 lanes of one container: partitions 8a..8a+7 of free column f share logical
  scale [a, f]. The scales of a group must sit in its own quadrant of 32 partitions, in the first
  16 partitions of it: logical row a is on partition ``32 * (a // 4) + a % 4 + offset``, offset 0,
  4, 8 or 12 (so four tensors can share one scale tile). A scale tile spanning more than one
  quadrant is ``[P, F]`` with the other partitions unused; with P = 32 the compact ``[4, F]`` tile
  is also accepted. The value of lane l of container (p, f) is ``element * 2^(scale - 127)``.

Which K element goes to which (partition, lane) is the caller's choice, as long as both operands
make the same one and each group of 32 elements sharing a scale lands on 8 partitions x 4 lanes.
The deep dive builds the tile on the device from a BF16 ``[K, F]`` tile with K on the partitions:
it packs into one container the four elements that lie K/4 apart (128 for a full tile, see
``copy_data_strided``), so its scale groups are 8 consecutive K in each quarter of the tile. That
is right for data quantised after the shuffle (``quantize_mx`` on the shuffled tile), not for an
OCP MX array, whose blocks are 32 *consecutive* K: those four lanes would belong to four
different blocks. For MX arrays blocked along K this module puts K element ``4 * p + l`` of a tile
on partition p, lane l, so block a of the tile is exactly group a. It is the order the
``rmsnorm_mx_prefill`` page gives for natural-order data meeting MX activations (its host-side
weight permutation puts element ``h = 512 * t + 4 * p + q`` on partition p, lane q of K tile t).

What this module accepts
========================

- A 2-D MX array blocked along K with blocks of 32 (``quantize_mx(x, fmt, axis=k)``, the layout
  of MX checkpoints): K is its block axis, the other axis is the free axis. K tile t, partition p,
  lane l, column f holds element ``(t * k_tile + 4 * p + l, f)`` (K first).
- A 2-D MX array of 8 x 4 tiles (``quantize_mx(tile, fmt, block_shape=(8, 4))``, the emulation of
  ``quantize_mx``): the array already is the SBUF tile ``[P, 4 * F]``; row p, column 4f + l goes to
  partition p, lane l, column f, and tile [a, f] is group a. Tall arrays are cut into K tiles of P
  rows.

The data come out as ``[T, P, F]`` containers (uint32 or uint16), one ``[P, F]`` operand per K
tile, and the scales as ``[T, P, F]`` uint8 tiles placed on their partitions (zero elsewhere).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from ..blocks import nibbles
from ..blocks.array import BlockArray
from ..blocks.layout import BlockLayout
from ..casting import pack_x4, unpack_x4
from ..errors import InvalidTypeError, InvalidValueError
from ..formats import FORMATS, MX_FORMATS, BlockFormat

__all__ = [
    "NC_MATMUL_MX_FORMATS",
    "NcMatmulMxOperand",
    "from_nc_matmul_mx",
    "nc_matmul_mx_scale_partitions",
    "to_nc_matmul_mx",
]

#: The block formats the instruction multiplies: MX formats with a Neuron x4 container.
NC_MATMUL_MX_FORMATS: tuple[str, ...] = tuple(n for n, f in MX_FORMATS.items() if f.x4 is not None)

LANES = 4  # elements of K per container
GROUP = 32  # elements of K per scale
GROUP_PARTITIONS = GROUP // LANES  # 8
QUADRANT = 32  # partitions per SBUF quadrant
MAX_PARTITIONS = 128
#: The partitions an operand may span: whole quadrants, up to 128 (a K tile of 128 to 512).
PARTITIONS: tuple[int, ...] = tuple(range(QUADRANT, MAX_PARTITIONS + 1, QUADRANT))
#: Where a quadrant's scale rows may start: the first 16 partitions, in steps of 4 rows.
SCALE_OFFSETS: tuple[int, ...] = tuple(range(0, 16, QUADRANT // GROUP_PARTITIONS))
#: The largest free size of each operand (moving: a bfloat16 dst; a float32 dst takes 4096).
FREE_LIMITS: dict[str, int] = {"stationary": 128, "moving": 8192}
#: The 2-D tiles of ``quantize_mx``: 8 partitions x 4 elements.
SBUF_TILE: tuple[int, int] = (GROUP_PARTITIONS, LANES)


class NcMatmulMxOperand(NamedTuple):
    """One operand of ``nc_matmul_mx`` per K tile.

    ``data``: ``[T, P, F]`` x4 containers (uint32 for FP8, uint16 for FP4), ``data[t]`` the SBUF
    tile of K tile t. ``scales``: ``[T, P, F]`` uint8, logical row a of tile t on partition
    ``32 * (a // 4) + a % 4 + offset``, zero on the other partitions.
    """

    data: np.ndarray
    scales: np.ndarray


def nc_matmul_mx_scale_partitions(partitions: int, offset: int = 0) -> list[int]:
    """The SBUF partition of each logical scale row of a ``partitions``-row data tile.

    Row a (the group of data partitions 8a..8a+7) is on ``32 * (a // 4) + a % 4 + offset``: the
    first four partitions of the group's quadrant, moved by ``offset`` (0, 4, 8 or 12).
    """
    _check_partitions(partitions)
    _check_offset(offset)
    per_quadrant = QUADRANT // GROUP_PARTITIONS
    return [QUADRANT * (a // per_quadrant) + a % per_quadrant + offset for a in range(partitions // GROUP_PARTITIONS)]


def to_nc_matmul_mx(
    q: BlockArray,
    operand: str,
    *,
    k_tile: int | None = None,
    axis: int | None = None,
    scale_offset: int = 0,
) -> NcMatmulMxOperand:
    """Lay an MX array out as the ``stationary`` or ``moving`` operand of ``nc_matmul_mx``.

    Parameters
    ----------
    q
        A 2-D array of ``mxfp8_e4m3``, ``mxfp8_e5m2`` or ``mxfp4_e2m1``, either blocked along K with
        blocks of 32 (K is its block axis, the other axis the free one; K element ``4p + l`` of a
        tile goes to partition p, lane l) or quantised in 8 x 4 tiles (``block_shape=(8, 4)``: the
        array is the SBUF tile ``[P, 4F]``; row p, columns 4f..4f+3 go to partition p, column f).
    operand
        ``"stationary"`` (free size even, at most 128) or ``"moving"`` (at most 8192; 4096 if the
        instruction writes float32). Both are laid out alike; this selects the check.
    k_tile
        Elements of K per instruction: 128, 256, 384 or 512 (4 x 32, 64, 96 or 128 partitions).
        Default: 512, or K when K is smaller. K (or the rows of an 8 x 4 tiled array, times 4)
        must be a multiple of it.
    axis
        The K axis, to check that the array is blocked along it (default: its block axis).
    scale_offset
        0, 4, 8 or 12: the row within each quadrant where the scales start.

    Returns
    -------
    NcMatmulMxOperand
        ``(data, scales)``, each ``[T, P, F]`` with T = K / k_tile and P = k_tile / 4.
    """
    if not isinstance(q, BlockArray):
        raise InvalidTypeError(f"to_nc_matmul_mx needs an MX BlockArray, got {type(q).__name__}")
    fmt = _check_format(q.fmt)
    limit = _check_operand(operand)
    _check_offset(scale_offset)
    if len(q.shape) != 2:
        raise InvalidValueError(f"to_nc_matmul_mx needs a 2-D array (K and the free axis), got shape {q.shape}")
    if q.block_shape == SBUF_TILE:
        if axis is not None:
            raise InvalidValueError(
                "an array of 8 x 4 tiles is the SBUF tile itself (rows are partitions, K runs over rows "
                "and lanes): axis= does not apply"
            )
        if q.rotation is not None:
            raise InvalidValueError("a rotated array of 8 x 4 tiles is rotated along its free axis, not along K")
        rows, cols = q.shape
        if cols % LANES:
            raise InvalidValueError(f"an array of 8 x 4 tiles needs a multiple of 4 columns, got {cols}")
        partitions = _tile_partitions(LANES * rows, k_tile, f"K (4 x {rows} rows)")
        tiles, free = rows // partitions, cols // LANES
        _check_free(free, operand, limit)
        lanes_last = q.element_codes().reshape(tiles, partitions, free, LANES)
        logical = q.scales.view(np.uint8).reshape(tiles, partitions // GROUP_PARTITIONS, free)
    else:
        k = _k_axis(q, axis)
        length, free = q.shape[k], q.shape[1 - k]
        partitions = _tile_partitions(length, k_tile, "K")
        tiles = length // (LANES * partitions)
        _check_free(free, operand, limit)
        k_first = np.moveaxis(q.element_codes(), k, 0).reshape(tiles, partitions, LANES, free)
        lanes_last = k_first.transpose(0, 1, 3, 2)
        logical = np.moveaxis(q.scales.view(np.uint8), k, 0).reshape(tiles, partitions // GROUP_PARTITIONS, free)
    x4 = fmt.x4
    assert x4 is not None
    data = pack_x4(np.ascontiguousarray(lanes_last).reshape(tiles, partitions, free * LANES), x4)
    placed = np.zeros((tiles, partitions, free), dtype=np.uint8)
    placed[:, nc_matmul_mx_scale_partitions(partitions, scale_offset), :] = logical
    return NcMatmulMxOperand(data, placed)


def from_nc_matmul_mx(
    data: Any,
    scales: Any,
    fmt: str,
    *,
    axis: int = -1,
    block_shape: tuple[int, ...] | None = None,
    scale_offset: int = 0,
    pack: bool = True,
    rotation: Any = None,
) -> BlockArray:
    """The MX array of operands laid out by :func:`to_nc_matmul_mx` (its inverse).

    Parameters
    ----------
    data
        ``[T, P, F]`` x4 containers of ``fmt`` (uint32 for FP8, uint16 for FP4), or one tile
        ``[P, F]``; P is 32, 64, 96 or 128.
    scales
        uint8 (or float8_e8m0fnu) ``[T, P, F]`` tiles (``[P, F]`` with one data tile), the scales
        on their partitions; only those partitions are read (others may hold other tensors'
        scales). With P = 32 and offset 0 the compact ``[T, 4, F]`` tile is accepted as well.
    fmt
        ``mxfp8_e4m3``, ``mxfp8_e5m2`` or ``mxfp4_e2m1``.
    axis
        The K axis of the result, blocked along it with blocks of 32: 0 gives ``[K, F]``, 1 or -1
        ``[F, K]``. Not used with ``block_shape=(8, 4)``.
    block_shape
        None (blocks of 32 along K) or ``(8, 4)``: the result is the SBUF tile ``[T * P, 4F]`` in 8 x 4
        tiles, as ``quantize_mx(tile, fmt, block_shape=(8, 4))`` makes it.
    scale_offset
        0, 4, 8 or 12: the row within each quadrant where the scales start.
    pack
        Store FP4 codes two per byte along the block axis (as ``quantize_mx`` does by default).
    rotation
        The 16 signs of the rotation the array was quantised with (``rht=``), or None: the layout
        does not record it.
    """
    bfmt = _check_format(fmt)
    _check_offset(scale_offset)
    data3, scales3, x4 = _operand_tiles(data, scales, bfmt, pack, block_shape, scale_offset)
    tiles, partitions, free = data3.shape
    rows = nc_matmul_mx_scale_partitions(partitions, scale_offset)
    logical = scales3[:, rows, :]
    lanes_last = unpack_x4(data3, x4).view(np.uint8).reshape(tiles, partitions, free, LANES)
    if block_shape is not None:
        if axis not in (-1, 1):
            raise InvalidValueError(
                "from_nc_matmul_mx: with block_shape=(8, 4) the result is the SBUF tile: axis= does not apply"
            )
        if rotation is not None:
            raise InvalidValueError("from_nc_matmul_mx: an array of 8 x 4 tiles cannot carry a rotation along K")
        codes = lanes_last.reshape(tiles * partitions, free * LANES)
        block_scales = logical.reshape(tiles * partitions // GROUP_PARTITIONS, free)
        block_size, block_rows, k = LANES, GROUP_PARTITIONS, 1
    else:
        k = _two_d_axis(axis, "from_nc_matmul_mx")
        k_first = lanes_last.transpose(0, 1, 3, 2).reshape(tiles * partitions * LANES, free)
        codes = np.moveaxis(k_first, 0, k)
        block_scales = np.moveaxis(logical.reshape(tiles * partitions // GROUP_PARTITIONS, free), 0, k)
        block_size, block_rows = GROUP, 1
    packed = bool(pack) and bfmt.packable
    shape = codes.shape
    if packed:
        codes = nibbles.pack(codes, k)
    return BlockArray.from_parts(
        np.ascontiguousarray(codes),
        np.ascontiguousarray(block_scales),
        BlockLayout(bfmt.name, shape, k, block_size, block_rows, packed),
        "from_nc_matmul_mx",
        rotation=rotation,
    )


def _operand_tiles(
    data: Any, scales: Any, bfmt: BlockFormat, pack: Any, block_shape: Any, scale_offset: int
) -> tuple[np.ndarray, np.ndarray, str]:
    """:func:`from_nc_matmul_mx`'s inputs checked: the data and scale tiles as ``[T, P, F]`` (the
    scales as bytes) and the name of the format's x4 container."""
    x4 = bfmt.x4
    assert x4 is not None
    container = FORMATS[x4].result_dtype
    if not isinstance(data, np.ndarray) or not isinstance(scales, np.ndarray):
        raise InvalidTypeError("from_nc_matmul_mx: data and scales must be numpy arrays")
    if data.dtype.newbyteorder("=") != container:
        raise InvalidTypeError(
            f"from_nc_matmul_mx: {bfmt.name} data must be {x4} containers ({container}), got dtype {data.dtype}"
        )
    if scales.dtype not in (np.dtype(np.uint8), bfmt.scale_format.result_dtype):
        raise InvalidTypeError(
            f"from_nc_matmul_mx: scales must be e8m0 bytes (uint8 or {bfmt.scale}), got dtype {scales.dtype}"
        )
    if not isinstance(pack, (bool, np.bool_)):
        raise InvalidTypeError(f"from_nc_matmul_mx: pack must be True or False, got {pack!r}")
    if block_shape is not None and (not isinstance(block_shape, (tuple, list)) or tuple(block_shape) != SBUF_TILE):
        raise InvalidValueError(
            f"from_nc_matmul_mx: block_shape must be None (blocks of 32 along K) or (8, 4), got {block_shape!r}"
        )
    if data.ndim not in (2, 3) or scales.ndim != data.ndim:
        raise InvalidValueError(
            f"from_nc_matmul_mx: data and scales must both be [T, P, F] (or [P, F]), got shapes "
            f"{data.shape} and {scales.shape}"
        )
    data3 = data.reshape((1,) * (3 - data.ndim) + data.shape)
    scales3 = scales.view(np.uint8).reshape((1,) * (3 - scales.ndim) + scales.shape)
    tiles, partitions, free = data3.shape
    if tiles < 1 or free < 1:
        raise InvalidValueError(f"from_nc_matmul_mx: data holds no operand (shape {data.shape})")
    _check_partitions(partitions)
    # With one quadrant and offset 0 the scale tile may be the compact [4, F] (the deep dive's
    # "oversize optional"); otherwise it has the data's partitions.
    compact_rows = QUADRANT // GROUP_PARTITIONS if partitions == QUADRANT and scale_offset == 0 else partitions
    if scales3.shape not in ((tiles, partitions, free), (tiles, compact_rows, free)):
        raise InvalidValueError(
            f"from_nc_matmul_mx: scales must have the shape of data {data.shape}, got {scales.shape}"
        )
    return data3, scales3, x4


def _check_format(fmt: Any) -> BlockFormat:
    if not isinstance(fmt, str):
        raise InvalidTypeError(f"fmt must be a block format name, got {type(fmt).__name__}")
    if fmt not in NC_MATMUL_MX_FORMATS:
        raise InvalidValueError(f"nc_matmul_mx multiplies {', '.join(NC_MATMUL_MX_FORMATS)}; got {fmt!r}")
    return MX_FORMATS[fmt]


def _check_operand(operand: Any) -> int:
    if not isinstance(operand, str) or operand not in FREE_LIMITS:
        raise InvalidValueError(f"operand must be one of {', '.join(map(repr, FREE_LIMITS))}, got {operand!r}")
    return FREE_LIMITS[operand]


def _check_offset(offset: Any) -> None:
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset not in SCALE_OFFSETS:
        raise InvalidValueError(f"scale_offset must be one of {', '.join(map(str, SCALE_OFFSETS))}, got {offset!r}")


def _check_partitions(partitions: Any) -> None:
    if isinstance(partitions, bool) or not isinstance(partitions, numbers.Integral) or partitions not in PARTITIONS:
        raise InvalidValueError(
            f"an nc_matmul_mx operand spans 32, 64, 96 or 128 partitions (a K tile of 128 to 512), got {partitions!r}"
        )


def _check_free(free: int, operand: str, limit: int) -> None:
    even = operand == "stationary"
    if not (2 if even else 1) <= free <= limit or (even and free % 2):
        size = f"an even number of elements, 2 to {limit}," if even else f"1 to {limit} elements"
        raise InvalidValueError(f"a {operand} operand needs {size} on its free axis; got {free}")


def _tile_partitions(length: int, k_tile: Any, what: str) -> int:
    """Partitions per K tile for ``length`` elements of K (``what`` names them), checking that
    whole tiles cover them."""
    valid = [LANES * p for p in PARTITIONS]
    if k_tile is not None and (
        isinstance(k_tile, bool) or not isinstance(k_tile, numbers.Integral) or k_tile not in valid
    ):
        raise InvalidValueError(f"k_tile must be one of {', '.join(map(str, valid))}, got {k_tile!r}")
    tile = min(length, valid[-1]) if k_tile is None else int(k_tile)
    if length > 0 and length % tile == 0 and tile in valid:
        return tile // LANES
    fits = [t for t in valid if length > 0 and length % t == 0]
    hint = f"; k_tile={fits[-1]} divides it" if fits else "; pad K to a multiple of 128 (32 partitions)"
    raise InvalidValueError(
        f"{what} = {length} is not a whole number of K tiles of {tile if tile in valid else valid[-1]} "
        f"(a K tile is {', '.join(map(str, valid))} elements){hint}"
    )


def _two_d_axis(axis: Any, where: str) -> int:
    """A 2-D array's axis 0 or 1 (also given as -2 or -1)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or axis not in (-2, -1, 0, 1):
        raise InvalidValueError(f"{where}: axis must be 0 or 1 (or -2, -1), got {axis!r}")
    return int(axis) % 2


def _k_axis(q: BlockArray, axis: Any) -> int:
    """The K axis of a 1-D blocked array: its block axis, which must hold blocks of 32."""
    if q.block_rows > 1:
        raise InvalidValueError(
            f"nc_matmul_mx groups 32 elements along K: blocks of 32 along K, or 8 x 4 tiles of an SBUF "
            f"tile; got {q.block_shape[0]} x {q.block_shape[1]} tiles"
        )
    if axis is not None:
        k = _two_d_axis(axis, "to_nc_matmul_mx")
        if k != q.axis:
            raise InvalidValueError(
                f"the array is blocked along axis {q.axis}, not along K (axis {k}); quantise it along K"
            )
    if q.block_size != GROUP:
        raise InvalidValueError(
            f"nc_matmul_mx scales groups of 32 elements along K; the array has blocks of {q.block_size}"
        )
    return q.axis
