"""Model checkpoints: directories of ``.safetensors`` shards in, the layouts runtimes load out.

A checkpoint is a directory of ``.safetensors`` shards (with or without an index), a
``config.json`` and other files, or a single ``.safetensors`` file; a checkpoint of any size is
processed in bounded memory. One module per job:

- :mod:`.folder`: the checkpoint folder (:func:`open_checkpoint`, :class:`Checkpoint`) and the symbolic
  links it follows (:func:`follow_links`);
- :mod:`.selection`: which tensors are quantised (:func:`tensor_decision`,
  :func:`expert_decision`, :data:`DEFAULT_EXCLUDES`) and which share a per-tensor scale
  (:data:`FUSED_SHARDS`, :func:`fused_groups`);
- :mod:`.layouts`: one record per layout (:class:`CheckpointLayout`, all of them in
  :data:`LAYOUTS`), one module each: ``compressed-tensors`` (vLLM, transformers), ``mxfp4``
  (transformers' MXFP4, the layout of the gpt-oss checkpoints), ``npz`` (the package's own file
  of block arrays, :mod:`neuron_kernels.io.blockfile`), ``modelopt`` (NVIDIA ModelOpt's NVFP4,
  MXFP8 and FP8, read only), ``fp8`` (fine-grained FP8, read only);
- :mod:`.gguf_convert`: GGUF files, llama.cpp's (:func:`quantize_gguf` to MXFP4 or NVFP4 blocks,
  :func:`dequantize_gguf`, :func:`load_gguf`) and :mod:`.gguf_carry` (a quantised checkpoint
  carried into GGUF, :func:`carry_into_gguf`);
- :mod:`.convert`: :func:`quantize_checkpoint` (from a plain checkpoint or a quantised one of any
  layout read: converted byte for byte to the same format, else dequantised exactly and
  quantised), :func:`dequantize_checkpoint`, :func:`load_checkpoint`.

The contract: ``docs/checkpoints.md``. Besides :data:`__all__`, ``detect_layout``,
``INDEX_NAME``, ``CONFIG_NAME`` and ``Output`` are importable from here.
"""

from .convert import (
    DEFAULT_MAX_SHARD_BYTES,
    TensorReport,
    dequantize_checkpoint,
    load_checkpoint,
    quantize_checkpoint,
)
from .folder import CONFIG_NAME as CONFIG_NAME
from .folder import INDEX_NAME as INDEX_NAME
from .folder import Checkpoint, LinkRefusedError, follow_links, open_checkpoint
from .gguf_carry import carry_into_gguf
from .gguf_convert import dequantize_gguf, load_gguf, quantize_gguf
from .layouts import LAYOUTS, CheckpointLayout, StoredWeight
from .layouts import Output as Output
from .layouts import detect_layout as detect_layout
from .selection import (
    DEFAULT_EXCLUDES,
    FUSED_SHARDS,
    GPTOSS_EXPERTS,
    GPTOSS_NOT_CONVERTED,
    expert_decision,
    fused_groups,
    tensor_decision,
)

__all__ = [
    "Checkpoint",
    "CheckpointLayout",
    "LAYOUTS",
    "DEFAULT_EXCLUDES",
    "StoredWeight",
    "TensorReport",
    "open_checkpoint",
    "follow_links",
    "LinkRefusedError",
    "load_checkpoint",
    "quantize_gguf",
    "dequantize_gguf",
    "load_gguf",
    "carry_into_gguf",
    "tensor_decision",
    "expert_decision",
    "fused_groups",
    "FUSED_SHARDS",
    "GPTOSS_EXPERTS",
    "GPTOSS_NOT_CONVERTED",
    "quantize_checkpoint",
    "dequantize_checkpoint",
    "DEFAULT_MAX_SHARD_BYTES",
]
