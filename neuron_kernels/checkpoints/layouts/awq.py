"""The ``awq`` layout: AutoAWQ's GEMM integer weights, read only.

Announced by config.json's ``quantization_config`` ``{"quant_method": "awq", "zero_point": true,
"group_size": 128, "bits": 4, "version": "gemm"}`` (with ``modules_to_not_convert``, the modules
kept plain). Only the GEMM version is read (``version`` absent means it; others, GEMV's and the
kernels' own layouts, are refused), of 4 bits. Per Linear module ``MODULE`` of ``in`` inputs and
``out`` outputs (a multiple of 8) in groups of ``G`` inputs (``in`` a multiple of ``G``;
``group_size`` -1: one group):

- ``MODULE.qweight`` int32 [in, out / 8]: the unsigned 4-bit codes ``q`` of ``w^T``, nibble ``i``
  (bits ``[4i, 4i + 4)``) of word ``c`` holding output column ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]``;
- ``MODULE.qzeros`` int32 [in / G, out / 8]: the unsigned zero points ``z``, packed the same way
  (AutoAWQ's GEMM stores them whatever ``zero_point`` says, and the runtimes subtract them: read
  as stored);
- ``MODULE.scales`` float16 [in / G, out].

The weight is ``w[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]`` in float16, read as an
``int4_group_asym`` (``int4_channel_asym``) block array of codes ``q - 8`` and zero points
``z - 8``, which give the same ``q - z`` (:class:`~.gptq.TransposedIntegerWeight`: the whole
matrix read at once).
Every dtype and shape is checked against the config and the other tensors before data is read.
"""

from __future__ import annotations

import numpy as np

from ...io.arrays import ArrayEntry, FileFormatError
from ..folder import Checkpoint
from .gptq import (
    TransposedIntegerWeight,
    check_module,
    check_rest,
    config_group_size,
    config_int,
    expect,
    read_only,
    transposed_integer_weight,
)
from .records import CheckpointLayout, Weight

__all__ = ["LAYOUT", "AWQ_ORDER"]

#: Nibble ``i`` of a word holds output column ``8c + AWQ_ORDER[i]`` of the word's eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: The column of each nibble's place: the nibble of column ``8c + j`` is nibble ``_NIBBLE_OF[j]``.
_NIBBLE_OF = np.argsort(AWQ_ORDER)
#: The last name components of the tensors of an AWQ module.
AWQ_PARTS = ("qweight", "qzeros", "scales")
#: The only width AutoAWQ's GEMM layout packs (eight codes per int32 word).
_BITS = 4


def _awq_detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    return qc is not None and qc.get("quant_method") == "awq"


def _awq_settings(ckpt: Checkpoint) -> int | None:
    """The group size of an AWQ checkpoint (None: per channel), its config checked: 4 bits, the
    GEMM version, AutoAWQ's backend."""
    qc = ckpt.quantization_config or {}
    bits = config_int(ckpt, qc, "bits", _BITS, "4")
    if bits != _BITS:
        raise FileFormatError(f"{ckpt.path}: AWQ weights of {bits} bits; 4 (AutoAWQ's GEMM) is read")
    version = qc.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise FileFormatError(f"{ckpt.path}: AWQ version {version!r} is not read; only 'gemm' (AutoAWQ's GEMM) is")
    backend = qc.get("backend", "autoawq")
    if not isinstance(backend, str) or backend.lower() != "autoawq":
        raise FileFormatError(
            f"{ckpt.path}: AWQ backend {backend!r} packs its own way; only 'autoawq' checkpoints (GEMM) are read"
        )
    return config_group_size(ckpt, qc)


def _unpack_awq(words: np.ndarray) -> np.ndarray:
    """The unsigned 4-bit fields of AWQ words [rows, m] in column order, uint8 [rows, 8m]."""
    w = np.ascontiguousarray(words).view(np.uint32)
    nibbles = np.empty(w.shape + (8,), np.uint8)
    for i in range(8):
        nibbles[..., i] = (w >> np.uint32(4 * i)) & np.uint32(0xF)
    return nibbles[..., _NIBBLE_OF].reshape(w.shape[0], -1)


def _awq_weights(ckpt: Checkpoint) -> list[Weight]:
    """Every ``MODULE.qweight`` with its ``qzeros`` and ``scales``, checked against the config and
    each other before any is read; a tensor of the layout of no complete module is refused."""
    group_size = _awq_settings(ckpt)
    t = ckpt.tensors
    found: list[Weight] = []
    for name in t:
        if not name.endswith(".qweight"):
            continue
        module = name[: -len(".qweight")]
        check_module(ckpt, module)
        found.append(_awq_weight(module, t[name], t[f"{module}.qzeros"], t[f"{module}.scales"], group_size))
    check_rest(ckpt, "awq", {p for w in found for p in w.parts}, AWQ_PARTS)
    return found


def _awq_weight(
    module: str, qweight: ArrayEntry, qzeros: ArrayEntry, scales: ArrayEntry, group_size: int | None
) -> TransposedIntegerWeight:
    if qweight.dtype != np.dtype(np.int32) or len(qweight.shape) != 2 or 0 in qweight.shape:
        raise FileFormatError(
            f"{qweight.where}: an AWQ qweight must be int32 of shape [in, out / 8], found {qweight.dtype} of shape "
            f"{list(qweight.shape)}"
        )
    if scales.dtype != np.dtype(np.float16) or len(scales.shape) != 2 or 0 in scales.shape:
        raise FileFormatError(
            f"{scales.where}: AWQ scales must be float16 of shape [in / group_size, out], found {scales.dtype} of "
            f"shape {list(scales.shape)}"
        )
    cols, out = qweight.shape[0], scales.shape[1]
    if out % 8:
        raise FileFormatError(
            f"{scales.where}: {out} outputs; AWQ's GEMM layout packs eight per word, so a multiple of 8 is read"
        )
    size = cols if group_size is None else group_size
    if cols % size:
        raise FileFormatError(
            f"{qweight.where}: {cols} inputs are no whole number of groups of {size} (AutoAWQ needs a multiple)"
        )
    expect(qweight, "int32", (cols, out // 8), f"the 4-bit codes of a [{out}, {cols}] weight")
    expect(scales, "float16", (cols // size, out), f"the scales of {cols} inputs in groups of {size}")
    expect(qzeros, "int32", (cols // size, out // 8), f"the 4-bit zero points of {out} outputs")

    def unpack() -> tuple[np.ndarray, np.ndarray]:
        q = _unpack_awq(np.asarray(qweight.read())).T
        z = _unpack_awq(np.asarray(qzeros.read())).T
        return np.ascontiguousarray(q), np.ascontiguousarray(z)

    return transposed_integer_weight(
        f"{module}.weight", bits=_BITS, shape=(out, cols), group_size=group_size, qweight=qweight, scales=scales,
        stored=(qweight, qzeros, scales), unpack=unpack, group_index=None, label="int4 (awq)",
    )  # fmt: skip


LAYOUT = CheckpointLayout(
    name="awq",
    help="AutoAWQ GEMM (MODULE.qweight, qzeros, scales), read only",
    formats=(),
    outputs=read_only("awq"),
    config=read_only("awq"),
    detect=_awq_detect,
    weights=_awq_weights,
    parts=AWQ_PARTS,
    config_files=("quant_config.json",),
)
