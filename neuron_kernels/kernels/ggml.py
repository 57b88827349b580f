"""ggml's FP4 blocks from 4-bit codes (one per byte, in element order) and their scale bytes, in
one pass: a block of ``block`` elements is its ``block // group`` scale bytes, then each group of
``group`` elements as ``group // 2`` bytes, byte ``j`` holding element ``j`` of the group in its
low nibble and element ``j + group // 2`` in its high one (``block_mxfp4``: 32 elements, one
group of 32; ``block_nvfp4``: 64 elements, four groups of 16). :mod:`neuron_kernels.io.gguf_file`
has the numpy inverse and the layouts' description."""

from __future__ import annotations

from .._jit import jit
from .nibble_kernels import nibble_pair

__all__ = ["ggml_blocks"]


@jit
def ggml_blocks(codes, scales, out, block, group, b0, b1):  # pragma: no cover - compiled
    """Blocks ``[b0, b1)`` of ``out`` (blocks, block // group + block // 2) uint8 from ``codes``
    (blocks * block,) and ``scales`` (blocks * block // group,), both uint8 (a task range of
    :func:`neuron_kernels._parallel.run_tasks`)."""
    per = block // group
    half = group // 2
    for b in range(b0, b1):
        for s in range(per):
            out[b, s] = scales[b * per + s]
        for g in range(per):
            base = b * block + g * group
            at = per + g * half
            for j in range(half):
                out[b, at + j] = nibble_pair(codes[base + j], codes[base + j + half])
