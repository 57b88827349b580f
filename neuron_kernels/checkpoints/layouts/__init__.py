"""Every checkpoint layout (:data:`LAYOUTS`), and which of them a checkpoint is in.

One module per layout, each holding its :class:`~.records.CheckpointLayout` record:

- :mod:`.compressed_tensors`: ``compressed-tensors`` (vLLM, transformers);
- :mod:`.gptoss`: ``mxfp4`` (transformers' MXFP4, the layout of the gpt-oss checkpoints);
- :mod:`.npz_layout`: ``npz``, the package's own file of block arrays;
- :mod:`.modelopt`: ``modelopt`` (NVIDIA ModelOpt's NVFP4, MXFP8 and FP8 read; its FP8 per
  channel and per block written);
- :mod:`.finegrained_fp8`: ``fp8`` (fine-grained FP8: DeepSeek, Qwen3-FP8);
- :mod:`.awq`: ``awq`` (AutoAWQ's GEMM integer weights, read only);
- :mod:`.gptq`: ``gptq`` (AutoGPTQ's and GPTQModel's integer weights, v1 and v2, read only);
- :mod:`.nxd_inference`: ``neuron`` (NxD Inference's quantized checkpoint: Trn1, Trn2).

:data:`WRITABLE` names the layouts ``--layout`` takes (those that store a format), and
:data:`DEFAULT_LAYOUT` the one it takes by default.
"""

from __future__ import annotations

import os

from ...io.arrays import FileFormatError
from ..folder import Checkpoint, open_checkpoint
from . import awq, compressed_tensors, finegrained_fp8, gptoss, gptq, modelopt, npz_layout, nxd_inference
from .records import CheckpointLayout, Output, StoredWeight, Weight

__all__ = [
    "LAYOUTS", "WRITABLE", "DEFAULT_LAYOUT", "CheckpointLayout", "StoredWeight", "Weight", "Output", "detect_layout",
    "open_any", "stored_weights",
]  # fmt: skip

#: Every checkpoint layout, by the name ``--layout`` takes.
LAYOUTS: dict[str, CheckpointLayout] = {
    layout.name: layout
    for layout in (
        compressed_tensors.LAYOUT, gptoss.LAYOUT, npz_layout.LAYOUT, modelopt.LAYOUT, finegrained_fp8.LAYOUT,
        awq.LAYOUT, gptq.LAYOUT, nxd_inference.LAYOUT,
    )
}  # fmt: skip

#: The layout a checkpoint folder is written in where none is chosen (``--layout``).
DEFAULT_LAYOUT: str = compressed_tensors.LAYOUT.name

#: The layouts the package writes, by name (the others it reads only).
WRITABLE: tuple[str, ...] = tuple(name for name, layout in LAYOUTS.items() if layout.formats)


def detect_layout(ckpt: Checkpoint) -> CheckpointLayout | None:
    """The layout of a quantised checkpoint, or None for a plain one."""
    for layout in LAYOUTS.values():
        if layout.detect(ckpt):
            return layout
    qc = ckpt.quantization_config
    if qc is not None:
        raise FileFormatError(
            f"{ckpt.path}: quantization_config with quant_method {qc.get('quant_method')!r} is not a layout "
            f"this package reads ({', '.join(LAYOUTS)})"
        )
    return None


def open_any(path: str) -> tuple[Checkpoint, CheckpointLayout | None]:
    """The checkpoint at ``path`` and its layout (None for a plain one); a file of a layout that is
    one file of its own is not opened as shards."""
    for layout in LAYOUTS.values():  # a layout that is one file of its own (the package's)
        if layout.suffix and os.path.isfile(path) and path.lower().endswith(layout.suffix):
            return Checkpoint(path, None, {}, None), layout
    ckpt = open_checkpoint(path)
    return ckpt, detect_layout(ckpt)


def stored_weights(ckpt: Checkpoint, layout: CheckpointLayout | None) -> list[Weight]:
    """The quantised weights of ``ckpt`` in ``layout`` (none for a plain checkpoint); a folder that
    says it is in a layout but holds none of its weights is refused."""
    weights = layout.weights(ckpt) if layout is not None else []
    if layout is not None and not weights and not layout.single_file:
        raise FileFormatError(f"{ckpt.path}: says it is {layout.name} but holds no quantised weight of that layout")
    return weights
