"""Integer weights as checkpoints store them: codes packed into int32 words (compressed-tensors'
``pack-quantized``) or one per int8 (``int-quantized``), float scales, zero points and act-order's
column groups, read as integer block arrays (``int2_group`` ... ``int8_channel``).

compressed-tensors packs a row's codes, each offset to ``u = q + 2^(b-1)``, into consecutive
int32 words least significant bit first: densely (element ``i`` at bits ``[i*b, i*b+b)`` of the
row's stream, across word boundaries) since its 0.19 releases, and, for 3, 5, 6 and 7 bits in the
releases just before, ``32 // b`` codes per word (element ``i`` in word ``i // (32 // b)``). The
zero points are packed the same way along the output dimension (dim 0). docs/integers.md says
where each fact comes from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ...blocks.array import BlockArray
from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS, FLOAT_SCALE_DTYPES
from ...io.arrays import ArrayEntry, FileFormatError
from .records import StoredWeight

__all__ = [
    "IntegerWeight", "integer_weight", "decoded_amax", "unpack_words", "pack_words", "offset_fields", "signed_codes",
    "packed_width",
    "DENSE", "PADDED", "BYTES",
]  # fmt: skip

#: How codes are stored: densely packed int32 words, ``32 // b`` per word, or one per int8.
DENSE, PADDED, BYTES = "dense", "padded", "bytes"


def packed_width(count: int, bits: int, packing: str) -> int:
    """The int32 words ``count`` codes of ``bits`` bits take."""
    if packing == DENSE:
        return -(-count * bits // 32)
    return -(-count // (32 // bits))


def unpack_words(words: np.ndarray, bits: int, count: int, packing: str) -> np.ndarray:
    """The first ``count`` codes of each row of the int32 ``words`` (rows, width): the unsigned
    fields ``u`` (uint8), element ``i`` of a row at bit ``i * b`` of its stream (``DENSE``) or at
    bit ``b * (i % (32 // b))`` of word ``i // (32 // b)`` (``PADDED``)."""
    w = np.ascontiguousarray(words).view(np.uint32).astype(np.uint64)
    i = np.arange(count, dtype=np.int64)
    if packing == DENSE:
        word, shift = (i * bits) // 32, (i * bits) % 32
    else:
        per = 32 // bits
        word, shift = i // per, bits * (i % per)
    nxt = np.concatenate([w, np.zeros((w.shape[0], 1), np.uint64)], axis=1)[:, word + 1]
    both = w[:, word] | (nxt << np.uint64(32))
    return ((both >> shift.astype(np.uint64)) & np.uint64((1 << bits) - 1)).astype(np.uint8)


def pack_words(fields: np.ndarray, bits: int) -> np.ndarray:
    """The int32 words (rows, ceil(count * b / 32)) of the unsigned ``bits``-bit ``fields`` (rows,
    count), packed densely as :func:`unpack_words` reads them: 32 fields fill ``b`` words exactly,
    so each of the 32 positions of a run has its own word and shift."""
    rows, count = fields.shape
    runs = -(-count // 32)
    padded = np.zeros((rows, runs * 32), np.uint64)
    padded[:, :count] = fields
    padded = padded.reshape(rows, runs, 32)
    acc = np.zeros((rows, runs, bits + 1), np.uint64)
    for j in range(32):
        word, shift = (j * bits) // 32, (j * bits) % 32
        acc[:, :, word] |= padded[:, :, j] << np.uint64(shift)
    low = acc[:, :, :bits] & np.uint64(0xFFFFFFFF)
    low[:, :, 1:] |= acc[:, :, : bits - 1] >> np.uint64(32)
    words = low.astype(np.uint32).reshape(rows, runs * bits)[:, : packed_width(count, bits, DENSE)]
    return np.ascontiguousarray(words).view(np.int32)


def offset_fields(codes: np.ndarray, bits: int) -> np.ndarray:
    """The unsigned fields ``u = q + 2^(b-1)`` of ``bits``-bit two's-complement codes (uint8)."""
    return ((codes.astype(np.int16) + (1 << (bits - 1))) & ((1 << bits) - 1)).astype(np.uint8)


def signed_codes(fields: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-bit two's-complement codes of offset fields ``u = q + 2^(b-1)``."""
    return ((fields.astype(np.int16) - (1 << (bits - 1))) & ((1 << bits) - 1)).astype(np.uint8)


@dataclass(frozen=True)
class IntegerWeight(StoredWeight):
    """An integer weight [out, in] as a checkpoint stores it: ``codes`` (int32 words of
    ``packing``, or int8 codes: ``BYTES``), ``scales`` (float, [out, groups]), ``zeros`` (the zero
    points as int32 words packed along the output dimension, or None: symmetric) and ``g_idx``
    (int32 [in], or None). Its values are ``(q - z) * s`` in the scale's dtype."""

    bits: int = 4
    packing: str = DENSE
    zeros: ArrayEntry | None = None
    g_idx: ArrayEntry | None = None

    @property
    def packed_mx(self) -> bool:
        return False

    def _zero_points(self) -> np.ndarray | None:
        if self.zeros is None:
            return None
        out, groups = self.layout.shape[0], self.layout.scales_shape[-1]
        if self.zeros.dtype == np.int8:  # int-quantized: one per byte, as the codes
            return np.ascontiguousarray(self.zeros.read()).reshape(out, groups)
        fields = unpack_words(np.asarray(self.zeros.read()).T, self.bits, out, self._zero_packing).T
        return (fields.astype(np.int16) - (1 << (self.bits - 1))).astype(np.int8).reshape(out, groups)

    @property
    def _zero_packing(self) -> str:
        return DENSE if self.packing == BYTES else self.packing

    def _group_index(self) -> np.ndarray | None:
        return None if self.g_idx is None else np.ascontiguousarray(self.g_idx.read(), np.int32)

    def _rows(self, r0: int, r1: int, zeros: np.ndarray | None, gidx: np.ndarray | None) -> BlockArray:
        lay = self.layout
        cols = lay.shape[-1]
        width = self.codes.shape[-1]
        words = np.asarray(self.codes.read_flat(r0 * width, r1 * width)).reshape(r1 - r0, width)
        if self.packing == BYTES:
            values = words.view(np.int8)
            low = -(1 << (self.bits - 1))
            if self.bits < 8 and values.size and (values.min() < low or values.max() > -low - 1):
                raise FileFormatError(
                    f"{self.codes.where}: int8 codes of {self.bits}-bit weights outside [{low}, {-low - 1}]"
                )
            codes = (words.view(np.uint8) & np.uint8((1 << self.bits) - 1)).astype(np.uint8)
        else:
            codes = signed_codes(unpack_words(words, self.bits, cols, self.packing), self.bits)
        groups = lay.scales_shape[-1]
        scales = np.asarray(self.scales.read_flat(r0 * groups, r1 * groups)).reshape(r1 - r0, groups)
        return BlockArray.from_parts(
            codes,
            scales,
            BlockLayout(lay.fmt, (r1 - r0, cols), 1, lay.block_size),
            self.codes.where,
            zero_points=None if zeros is None else np.ascontiguousarray(zeros[r0:r1]),
            group_index=gidx,
        )

    def block_array(self) -> BlockArray:
        return self._rows(0, self.layout.shape[0], self._zero_points(), self._group_index())

    def row_pieces(self, chunk_bytes: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(codes one per byte, as their ``bits``-bit patterns; scales) of runs of whole rows."""
        rows = self.layout.shape[0]
        step = max(1, chunk_bytes // max(self.codes.shape[-1] * self.codes.dtype.itemsize, 1))
        zeros, gidx = self._zero_points(), self._group_index()
        for r0 in range(0, rows, step):
            part = self._rows(r0, min(rows, r0 + step), zeros, gidx)
            yield part.codes, part.scales

    def decoded_pieces(self, dtype: str, chunk_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
        rows = self.layout.shape[0]
        per_row = self.codes.shape[-1] * self.codes.dtype.itemsize + self.layout.scales_shape[-1] * 4
        step = max(1, chunk_bytes // max(per_row, 1))
        zeros, gidx = self._zero_points(), self._group_index()
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            yield self._rows(r0, r1, zeros, gidx).dequantize(dtype), (r1 - r0) * per_row

    def decoded_entry(self) -> ArrayEntry:
        cols = self.layout.shape[-1]
        zeros, gidx = self._zero_points(), self._group_index()

        def read(start: int, stop: int) -> np.ndarray:
            r0, r1 = start // cols, -(-stop // cols)
            if r1 <= r0:
                return np.empty(0, np.float32)
            values = self._rows(r0, r1, zeros, gidx).dequantize("float32").reshape(-1)
            return values[start - r0 * cols : stop - r0 * cols]

        return ArrayEntry(self.codes.path, self.out_name, self.layout.shape, np.dtype(np.float32), read)

    def finite_amax(self, chunk_bytes: int = 64 << 20) -> float:
        return decoded_amax(self, chunk_bytes)


def decoded_amax(weight: StoredWeight, chunk_bytes: int) -> float:
    """The largest finite |value| of an integer weight, from its values decoded piece by piece
    (its codes alone do not tell: a zero point shifts them)."""
    amax = 0.0
    for values, _ in weight.decoded_pieces("float32", chunk_bytes):
        finite = np.abs(values[np.isfinite(values)])
        amax = max(amax, float(finite.max())) if finite.size else amax
    return amax


def integer_weight(
    name: str,
    codes: ArrayEntry,
    scales: ArrayEntry,
    *,
    bits: int,
    shape: tuple[int, int],
    group_size: int | None,
    packing: str,
    zeros: ArrayEntry | None,
    g_idx: ArrayEntry | None,
    parts: tuple[str, ...],
    label: str,
) -> IntegerWeight:
    """The integer weight of ``shape`` [out, in] stored as ``codes`` (int32 words of ``packing`` or
    int8), ``scales`` [out, groups] (groups of ``group_size`` columns, None: one per row), packed
    ``zeros`` and ``g_idx``, every tensor checked against the others before anything is read."""
    if bits not in range(2, 9):
        raise FileFormatError(f"{codes.where}: integer weights of {bits!r} bits; 2 to 8 are read")
    out, cols = shape
    if out < 1 or cols < 1:
        raise FileFormatError(f"{codes.where}: a weight shape {shape} holds no element")
    want_codes: tuple[int, ...] = (out, cols) if packing == BYTES else (out, packed_width(cols, bits, packing))
    want_dtype = np.dtype(np.int8 if packing == BYTES else np.int32)
    if codes.dtype != want_dtype or codes.shape != want_codes:
        raise FileFormatError(
            f"{codes.where}: {bits}-bit codes of a [{out}, {cols}] weight must be {want_dtype} of shape "
            f"{list(want_codes)}, found {codes.dtype} of shape {list(codes.shape)}"
        )
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise FileFormatError(f"{codes.where}: group_size {group_size!r} is not a positive integer")
    size = cols if group_size is None else min(group_size, cols)
    groups = -(-cols // size)
    if scales.dtype.name not in FLOAT_SCALE_DTYPES or scales.shape != (out, groups):
        if not (scales.dtype.name in FLOAT_SCALE_DTYPES and group_size is None and scales.shape == (out,)):
            raise FileFormatError(
                f"{scales.where}: the scales of a [{out}, {cols}] weight in groups of {size} must be float32, "
                f"bfloat16 or float16 of shape [{out}, {groups}], found {scales.dtype} of shape {list(scales.shape)}"
            )
    scales = dataclasses.replace(scales, shape=(out, groups))
    if zeros is not None and packing == BYTES:
        expect = (out, groups)
        if zeros.dtype != np.dtype(np.int8) or zeros.shape != expect:
            raise FileFormatError(
                f"{zeros.where}: the zero points of int8 codes must be int8 of shape {list(expect)}, found "
                f"{zeros.dtype} of shape {list(zeros.shape)}"
            )
        values = np.asarray(zeros.read())
        if values.size and (values.min() < -(1 << (bits - 1)) or values.max() >= 1 << (bits - 1)):
            raise FileFormatError(f"{zeros.where}: zero points outside the {bits}-bit range")
    elif zeros is not None:
        want = (packed_width(out, bits, DENSE if packing == BYTES else packing), groups)
        if zeros.dtype != np.dtype(np.int32) or zeros.shape != want:
            raise FileFormatError(
                f"{zeros.where}: the zero points of a [{out}, {cols}] weight in {groups} groups must be int32 packed "
                f"along the output dimension, of shape {list(want)}; found {zeros.dtype} of shape {list(zeros.shape)}"
            )
    if g_idx is not None:
        if g_idx.dtype.kind != "i" or g_idx.shape != (cols,):
            raise FileFormatError(
                f"{g_idx.where}: g_idx must be int32 with one group per input column ({cols}), found {g_idx.dtype} "
                f"of shape {list(g_idx.shape)}"
            )
        index = np.asarray(g_idx.read())
        if index.size and (index.min() < 0 or index.max() >= groups):
            raise FileFormatError(f"{g_idx.where}: g_idx names groups outside [0, {groups}) of the scales")
        g_idx = dataclasses.replace(g_idx, dtype=np.dtype(np.int32), _reader=lambda a, b: index[a:b].astype(np.int32))
    kind = "channel" if group_size is None else "group"
    layout = BlockLayout(f"int{bits}_{kind}{'' if zeros is None else '_asym'}", (out, cols), 1, size)
    assert layout.fmt in BLOCK_FORMATS
    return IntegerWeight(
        name, layout, None, codes, scales, parts, name, False, label,
        bits=bits, packing=packing, zeros=zeros, g_idx=g_idx,
    )  # fmt: skip
