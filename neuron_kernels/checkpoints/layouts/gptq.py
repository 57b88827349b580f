"""The ``gptq`` layout: AutoGPTQ's and GPTQModel's integer weights, read only.

Announced by config.json's ``quantization_config`` ``{"quant_method": "gptq", "bits": 4,
"group_size": 128, "desc_act": false, "sym": true, "checkpoint_format": "gptq"}`` (GPTQModel also
writes ``format``, the same, and ``pack_dtype``, the words' dtype: int32 is read; absent, the format
is ``"gptq"``; GPTQModel's ``dynamic`` rules that give modules bits or a group size of their own are
refused). Per Linear module ``MODULE``
of ``in`` inputs and ``out`` outputs, in groups of ``G`` inputs (``group_size`` -1: one group,
per channel), ``groups = ceil(in / G)``:

- ``MODULE.qweight`` int32 [ceil(in * b / 32), out]: the unsigned codes ``q`` packed along the
  input dimension, each column a little-endian bit stream (code ``i`` at bits ``[i*b, i*b + b)``;
  for 2, 4 and 8 bits ``32 // b`` whole codes per word, for 3 bits codes cross words);
- ``MODULE.qzeros`` int32 [groups, ceil(out * b / 32)]: the unsigned zero points packed the same
  way along the output dimension; ``checkpoint_format`` ``"gptq"`` (v1) stores ``z - 1``, read
  back as ``(stored + 1)`` masked to ``b`` bits, ``"gptq_v2"`` stores ``z``; symmetric
  quantisation (``sym``) stores them too (``2^(b-1)``), read as stored;
- ``MODULE.scales`` float16 [groups, out];
- ``MODULE.g_idx`` int32 [in]: the group of each input (act-order, ``desc_act``, permutes it;
  without act-order it is ``i // G`` and may be absent).

The weight is ``w[n, i] = s[g_idx[i], n] * (q[i, n] - z[g_idx[i], n])`` in float16, read as an
integer block array with zero points (``int{b}_group_asym``, ``int{b}_channel_asym``) of codes
``q - 2^(b-1)`` and zero points ``z - 2^(b-1)``, which give the same ``q - z``
(:class:`TransposedIntegerWeight`, which the ``awq`` layout shares). Widths, formats and shapes
are checked against the config and between the tensors before any data is read.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...blocks.array import BlockArray
from ...blocks.layout import BlockLayout
from ...io.arrays import ArrayEntry, FileFormatError
from ..folder import Checkpoint
from .integer_weights import decoded_amax
from .records import CheckpointLayout, StoredWeight, Weight

__all__ = [
    "LAYOUT", "TransposedIntegerWeight", "transposed_integer_weight", "unpack_columns", "read_only", "check_module",
    "check_rest", "config_int", "config_flag", "config_group_size", "expect",
]  # fmt: skip

#: The words GPTQ packs codes and zero points into (GPTQModel's ``pack_dtype`` may name others).
_WORDS = np.dtype(np.int32)

#: The code widths GPTQ checkpoints are read in (AutoGPTQ's and GPTQModel's packers).
GPTQ_BITS = (2, 3, 4, 8)
#: ``checkpoint_format`` values read: v1 (zero points stored minus one) and v2 (stored as they are).
GPTQ_VERSIONS = {"gptq": "v1", "gptq_v2": "v2"}
#: The last name components of the tensors of a GPTQ module.
GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")


# ---- the weight, shared with the awq layout -----------------------------------------------------


@dataclass(frozen=True)
class TransposedIntegerWeight(StoredWeight):
    """An integer weight [out, in] that its checkpoint stores transposed and packed (GPTQ's
    ``qweight`` [in * b / 32, out], AWQ's [in, out / 8]): a run of output rows is no contiguous run
    of stored bytes, so the whole matrix is read and unpacked at once (one matrix at a time; a piece
    of rows is then cut from it). ``unpack()`` gives the unsigned codes ``q`` (uint8 [out, in]) and
    zero points ``z`` (uint8 [out, groups]); ``stored_scales`` is the float scales' tensor as stored,
    [groups, out]; ``group_index`` the act-order group of each input (int32 [in], checked), or None
    for the default ``i // block_size``. ``codes`` and ``scales`` are views of the weight as its
    block array holds them (codes [out, in], one b-bit pattern per byte; scales [out, groups]), read
    by unpacking the whole matrix: no byte of the file is laid out that way (their ``offset`` is
    None)."""

    bits: int = 4
    stored_scales: ArrayEntry | None = None
    stored_parts: tuple[ArrayEntry, ...] = ()
    unpack: Callable[[], tuple[np.ndarray, np.ndarray]] | None = dataclasses.field(default=None, compare=False)
    group_index: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def packed_mx(self) -> bool:
        return False

    @property
    def stored_bytes(self) -> int:
        """The bytes of the stored tensors the weight reads."""
        return sum(e.nbytes for e in self.stored_parts)

    def fields(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole matrix as its block array holds it: (codes [out, in], each ``q - 2^(b-1)`` as a
        b-bit two's-complement pattern in a byte; zero points int8 [out, groups], ``z - 2^(b-1)``;
        scales [out, groups] in their stored dtype)."""
        assert self.unpack is not None and self.stored_scales is not None
        q, z = self.unpack()
        half = 1 << (self.bits - 1)
        codes = q ^ np.uint8(half)  # (q - 2^(b-1)) mod 2^b
        zeros = (z.astype(np.int16) - half).astype(np.int8)
        scales = np.ascontiguousarray(np.asarray(self.stored_scales.read()).T)
        return codes, zeros, scales

    def _rows(self, fields: tuple[np.ndarray, np.ndarray, np.ndarray], r0: int, r1: int) -> BlockArray:
        codes, zeros, scales = fields
        lay = self.layout
        return BlockArray.from_parts(
            codes[r0:r1],
            scales[r0:r1],
            BlockLayout(lay.fmt, (r1 - r0, lay.shape[1]), 1, lay.block_size),
            self.codes.where,
            zero_points=zeros[r0:r1],
            group_index=self.group_index,
        )

    def _steps(self, chunk_bytes: int) -> Iterator[tuple[int, int]]:
        """Runs of output rows of about ``chunk_bytes`` of float32 values each."""
        rows, cols = self.layout.shape
        step = max(1, chunk_bytes // max(cols * 4, 1))
        for r0 in range(0, rows, step):
            yield r0, min(rows, r0 + step)

    def block_array(self) -> BlockArray:
        return self._rows(self.fields(), 0, self.layout.shape[0])

    def decoded_pieces(self, dtype: str, chunk_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
        """The values in ``dtype``, [out, in] in pieces of whole rows, the stored bytes counted out
        among them (the whole matrix is read before the first)."""
        fields = self.fields()
        rows, total = self.layout.shape[0], self.stored_bytes
        for r0, r1 in self._steps(chunk_bytes):
            yield self._rows(fields, r0, r1).dequantize(dtype), total * r1 // rows - total * r0 // rows

    def row_pieces(self, chunk_bytes: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(codes, scales) of runs of whole rows, as the block array holds them."""
        codes, _, scales = self.fields()
        for r0, r1 in self._steps(chunk_bytes):
            yield codes[r0:r1], scales[r0:r1]

    def decoded_entry(self) -> ArrayEntry:
        """The weight in float32, read piece by piece: the matrix is unpacked at the first read and
        kept until its last element has been read."""
        rows, cols = self.layout.shape
        kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        lock = threading.Lock()  # pieces may be read from several threads: unpack once

        def read(start: int, stop: int) -> np.ndarray:
            r0, r1 = start // cols, -(-stop // cols)
            if r1 <= r0:
                return np.empty(0, np.float32)
            with lock:
                if not kept:
                    kept.append(self.fields())
                fields = kept[0]
                if stop >= rows * cols:  # the last piece: the matrix is not kept past it
                    kept.clear()
            values = self._rows(fields, r0, r1).dequantize("float32").reshape(-1)
            return values[start - r0 * cols : stop - r0 * cols]

        return ArrayEntry(self.codes.path, self.out_name, self.layout.shape, np.dtype(np.float32), read)

    def finite_amax(self, chunk_bytes: int = 64 << 20) -> float:
        return decoded_amax(self, chunk_bytes)


def transposed_integer_weight(
    name: str,
    *,
    bits: int,
    shape: tuple[int, int],
    group_size: int | None,
    qweight: ArrayEntry,
    scales: ArrayEntry,
    stored: tuple[ArrayEntry, ...],
    unpack: Callable[[], tuple[np.ndarray, np.ndarray]],
    group_index: np.ndarray | None,
    label: str,
) -> TransposedIntegerWeight:
    """The weight ``name`` of ``shape`` [out, in] (already checked), in groups of ``group_size``
    inputs (None: per channel), its float ``scales`` stored [groups, out]; ``stored``: every tensor
    it reads (the first one's path and name are the weight's in messages)."""
    out, cols = shape
    size = cols if group_size is None else min(group_size, cols)
    # zero points always stored: the asymmetric formats (a symmetric GPTQ's are 2^(b-1), read as they are)
    layout = BlockLayout(f"int{bits}_{'channel' if group_size is None else 'group'}_asym", shape, 1, size)
    groups = layout.scales_shape[-1]
    half = np.uint8(1 << (bits - 1))

    def codes_flat(a: int, b: int) -> np.ndarray:
        codes: np.ndarray = unpack()[0] ^ half
        return codes.reshape(-1)[a:b]

    def scales_flat(a: int, b: int) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(scales.read()).T).reshape(-1)[a:b]

    codes_view = ArrayEntry(qweight.path, qweight.name, shape, np.dtype(np.uint8), codes_flat)
    scales_view = ArrayEntry(scales.path, scales.name, (out, groups), scales.dtype, scales_flat)
    parts = tuple(e.name for e in stored if e.name is not None)
    return TransposedIntegerWeight(
        name, layout, None, codes_view, scales_view, parts, name, False, label,
        bits=bits, stored_scales=scales, stored_parts=stored, unpack=unpack, group_index=group_index,
    )  # fmt: skip


def unpack_columns(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` unsigned ``bits``-bit fields of each column of the int32 ``words`` [n,
    cols], a little-endian bit stream down each column (field ``i`` at bits ``[i*b, i*b + b)``), as
    uint8 [count, cols]. Whole words at a time where ``b`` divides 32; field by field otherwise."""
    w = np.ascontiguousarray(words).view(np.uint32)
    mask = np.uint32((1 << bits) - 1)
    cols = w.shape[1]
    if 32 % bits == 0:
        per = 32 // bits
        out = np.empty((w.shape[0], per, cols), np.uint8)
        for j in range(per):
            out[:, j, :] = (w >> np.uint32(bits * j)) & mask
        return out.reshape(-1, cols)[:count]
    out = np.empty((count, cols), np.uint8)
    for i in range(count):
        word, shift = divmod(i * bits, 32)
        field = w[word] >> np.uint32(shift)
        if shift + bits > 32:  # the field goes on in the next word
            field = field | (w[word + 1] << np.uint32(32 - shift))
        out[i] = field & mask
    return out


# ---- helpers shared with the awq layout ---------------------------------------------------------


def read_only(name: str) -> Callable[..., Any]:
    """The ``outputs`` and ``config`` of a layout the package reads only (never called: its empty
    ``formats`` refuse it as ``--layout`` first)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise FileFormatError(f"the {name} layout is read only; choose another --layout")

    return refuse


def check_rest(ckpt: Checkpoint, layout: str, claimed: set[str], parts: tuple[str, ...]) -> None:
    """Refuse tensors of the layout (their last name component one of ``parts``) that belong to no
    complete module (a ``qweight`` with its ``qzeros`` and ``scales``): a runtime would not load them."""
    for name in ckpt.tensors:
        if name not in claimed and name.rpartition(".")[2] in parts:
            module = name.rpartition(".")[0]
            raise FileFormatError(
                f"{ckpt.path}: {name} belongs to no quantised module of the {layout} layout (there is no "
                f"{module}.qweight with its qzeros and scales); a runtime would not load it"
            )


def check_module(ckpt: Checkpoint, module: str) -> None:
    """Refuse a ``MODULE.qweight`` without its ``qzeros`` and ``scales``, or with a plain ``MODULE.weight``
    beside it (two weights of one module: a runtime loads neither as the checkpoint means)."""
    for part in ("qzeros", "scales"):
        if f"{module}.{part}" not in ckpt.tensors:
            raise FileFormatError(f"{ckpt.path}: {module}.qweight has no {module}.{part} beside it")
    if f"{module}.weight" in ckpt.tensors:
        raise FileFormatError(
            f"{ckpt.path}: {module}.weight is stored beside {module}.qweight; a quantised module holds no plain weight"
        )


def config_int(ckpt: Checkpoint, qc: dict[str, Any], key: str, default: int, accepted: str) -> int:
    """The integer ``key`` of the ``quantization_config`` (``default`` where absent)."""
    value = qc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FileFormatError(f"{ckpt.path}: quantization_config {key} {value!r} is not an integer ({accepted})")
    return value


def config_flag(ckpt: Checkpoint, qc: dict[str, Any], key: str, default: bool) -> bool:
    """The true-or-false ``key`` of the ``quantization_config`` (``default`` where absent)."""
    value = qc.get(key, default)
    if not isinstance(value, bool):
        raise FileFormatError(f"{ckpt.path}: quantization_config {key} {value!r} is not true or false")
    return value


def expect(entry: ArrayEntry, dtype: str, shape: tuple[int, ...], what: str) -> None:
    """Refuse ``entry`` unless it is ``dtype`` of ``shape``, naming what it must be."""
    if entry.dtype.name != dtype or entry.shape != shape:
        raise FileFormatError(
            f"{entry.where}: {what} must be {dtype} of shape {list(shape)}, found {entry.dtype} of shape "
            f"{list(entry.shape)}"
        )


def config_group_size(ckpt: Checkpoint, qc: dict[str, Any]) -> int | None:
    """The config's ``group_size``: a positive integer, or None for -1 (one group per channel)."""
    size = config_int(ckpt, qc, "group_size", 128, "-1 or a positive integer")
    if size == -1:
        return None
    if size < 1:
        raise FileFormatError(f"{ckpt.path}: quantization_config group_size {size} is not -1 or a positive integer")
    return size


# ---- GPTQ ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    """What a GPTQ config says of its weights."""

    bits: int
    group_size: int | None
    desc_act: bool
    sym: bool
    version: str


def _gptq_detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    return qc is not None and qc.get("quant_method") == "gptq"


def _gptq_settings(ckpt: Checkpoint) -> _Settings:
    qc = ckpt.quantization_config or {}
    bits = config_int(ckpt, qc, "bits", 4, "2, 3, 4 or 8")
    if bits not in GPTQ_BITS:
        raise FileFormatError(f"{ckpt.path}: GPTQ weights of {bits} bits; 2, 3, 4 and 8 are read")
    group_size = config_group_size(ckpt, qc)
    version = qc.get("checkpoint_format", qc.get("format", "gptq"))
    if version not in GPTQ_VERSIONS or qc.get("is_marlin_format", False) is not False:
        shown = "marlin (is_marlin_format)" if version in GPTQ_VERSIONS else repr(version)
        raise FileFormatError(f"{ckpt.path}: GPTQ checkpoint_format {shown} is not read; 'gptq' (v1) and 'gptq_v2' are")
    pack_dtype = qc.get("pack_dtype", _WORDS.name)
    if pack_dtype != _WORDS.name:  # a config string naming the words' dtype
        raise FileFormatError(
            f"{ckpt.path}: GPTQ pack_dtype {pack_dtype!r} (GPTQModel's words of other widths) is not read; int32 is"
        )
    dynamic = qc.get("dynamic")
    if dynamic:
        changed = [
            rule for rule, given in (dynamic.items() if isinstance(dynamic, dict) else [("dynamic", dynamic)])
            if not str(rule).startswith("-:") and (not isinstance(given, dict) or {"bits", "group_size"} & set(given))
        ]  # fmt: skip
        if changed:
            raise FileFormatError(
                f"{ckpt.path}: quantization_config dynamic gives modules {changed[0]!r} bits or a group_size of their "
                f"own, which this package does not read (only rules that skip modules, '-:...')"
            )
    return _Settings(
        bits, group_size, config_flag(ckpt, qc, "desc_act", False), config_flag(ckpt, qc, "sym", True), version
    )


def _gptq_weights(ckpt: Checkpoint) -> list[Weight]:
    """Every ``MODULE.qweight`` with its ``qzeros``, ``scales`` and ``g_idx`` (absent: the default,
    refused under ``desc_act``), each checked against the config and the others before any is
    read; a tensor of the layout of no complete module is refused."""
    settings = _gptq_settings(ckpt)
    t = ckpt.tensors
    found: list[Weight] = []
    for name in t:
        if not name.endswith(".qweight"):
            continue
        module = name[: -len(".qweight")]
        check_module(ckpt, module)
        g_idx = t.get(f"{module}.g_idx")
        if g_idx is None and settings.desc_act:
            raise FileFormatError(
                f"{ckpt.path}: {name} has no {module}.g_idx beside it, which desc_act (act-order) needs"
            )
        found.append(_gptq_weight(module, t[name], t[f"{module}.qzeros"], t[f"{module}.scales"], g_idx, settings))
    check_rest(ckpt, "gptq", {p for w in found for p in w.parts}, GPTQ_PARTS)
    return found


def _gptq_weight(
    module: str,
    qweight: ArrayEntry,
    qzeros: ArrayEntry,
    scales: ArrayEntry,
    g_idx: ArrayEntry | None,
    settings: _Settings,
) -> TransposedIntegerWeight:
    bits = settings.bits
    if scales.dtype != np.dtype(np.float16) or len(scales.shape) != 2 or 0 in scales.shape:
        raise FileFormatError(
            f"{scales.where}: GPTQ scales must be float16 of shape [groups, out], found {scales.dtype} of shape "
            f"{list(scales.shape)}"
        )
    if qweight.dtype != np.dtype(np.int32) or len(qweight.shape) != 2 or 0 in qweight.shape:
        raise FileFormatError(
            f"{qweight.where}: a GPTQ qweight must be int32 of shape [in * {bits} / 32, out], found {qweight.dtype} "
            f"of shape {list(qweight.shape)}"
        )
    out = scales.shape[1]
    if g_idx is not None:
        if g_idx.dtype != np.dtype(np.int32) or len(g_idx.shape) != 1 or g_idx.shape[0] == 0:
            raise FileFormatError(
                f"{g_idx.where}: g_idx must be int32 of shape [in], found {g_idx.dtype} of shape {list(g_idx.shape)}"
            )
        cols = g_idx.shape[0]
    elif qweight.shape[0] * 32 % bits:
        raise FileFormatError(
            f"{qweight.where}: {qweight.shape[0]} rows of {bits}-bit codes are no whole number of inputs, and no "
            f"g_idx says how many there are"
        )
    else:
        cols = qweight.shape[0] * 32 // bits
    expect(qweight, "int32", (-(-cols * bits // 32), out), f"the {bits}-bit codes of a [{out}, {cols}] weight")
    size = cols if settings.group_size is None else settings.group_size
    groups = -(-cols // size)
    expect(scales, "float16", (groups, out), f"the scales of {cols} inputs in groups of {size}")
    expect(qzeros, "int32", (groups, -(-out * bits // 32)), f"the {bits}-bit zero points of {out} outputs")
    index = None
    if g_idx is not None:
        index = np.ascontiguousarray(g_idx.read(), np.int32)
        if index.min() < 0 or index.max() >= groups:
            raise FileFormatError(
                f"{g_idx.where}: g_idx holds groups {int(index.min())} to {int(index.max())}; the scales have "
                f"groups 0 to {groups - 1}"
            )
        if np.array_equal(index, np.arange(cols, dtype=np.int32) // size):
            index = None  # the default: no act-order
    v1 = settings.version == "gptq"

    def unpack() -> tuple[np.ndarray, np.ndarray]:
        q = unpack_columns(np.asarray(qweight.read()), bits, cols).T
        z = unpack_columns(np.asarray(qzeros.read()).T, bits, out)  # [out, groups]
        if v1:
            z = (z + np.uint8(1)) & np.uint8((1 << bits) - 1)
        return np.ascontiguousarray(q), np.ascontiguousarray(z)

    stored = (qweight, qzeros, scales) + ((g_idx,) if g_idx is not None else ())
    extra = ("" if settings.sym else ", asymmetric") + (", act-order" if index is not None else "")
    return transposed_integer_weight(
        f"{module}.weight", bits=bits, shape=(out, cols), group_size=settings.group_size, qweight=qweight,
        scales=scales, stored=stored, unpack=unpack, group_index=index,
        label=f"int{bits} (gptq {GPTQ_VERSIONS[settings.version]}{extra})",
    )  # fmt: skip


LAYOUT = CheckpointLayout(
    name="gptq",
    help="AutoGPTQ / GPTQModel (MODULE.qweight, qzeros, scales, g_idx), read only",
    formats=(),
    outputs=read_only("gptq"),
    config=read_only("gptq"),
    detect=_gptq_detect,
    weights=_gptq_weights,
    parts=GPTQ_PARTS,
    config_files=("quantize_config.json",),
)
