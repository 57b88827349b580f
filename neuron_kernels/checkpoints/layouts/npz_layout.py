"""The ``npz`` layout: the package's own file of block arrays (:mod:`neuron_kernels.io.blockfile`).

It holds the quantised weights only (block arrays); which tensors are quantised:
:func:`neuron_kernels.checkpoints.selection.module_decision`.
"""

from __future__ import annotations

import os
from typing import Any

from ...formats import BLOCK_FORMATS
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.blockfile import read_block_file
from ..folder import Checkpoint
from ..selection import module_decision
from .records import CheckpointLayout, StoredWeight

__all__ = ["LAYOUT"]

#: The layout is one file with this suffix, not a folder of shards.
SUFFIX = ".npz"


def _npz_detect(ckpt: Checkpoint) -> bool:
    return os.path.isfile(ckpt.path) and ckpt.path.lower().endswith(SUFFIX)


def _npz_weights(ckpt: Checkpoint) -> list[StoredWeight]:
    found = []
    for key, s in read_block_file(ckpt.path).items():
        if s.rotation is not None:
            raise FileFormatError(
                f"{ckpt.path}[{key}]: quantised with a rotation; read it with neuron_kernels.load_blocks and "
                f"dequantize(unrotate=True)"
            )
        name = "array" if key is None else str(key)
        found.append(StoredWeight(name, s.layout, s.per_tensor_scale, s.codes, s.scales, (), name))
    return found


def _no_config(fmt: str, kept: list[tuple[str, ArrayEntry]], ignore: list[str]) -> dict[str, Any]:
    return {}


LAYOUT = CheckpointLayout(
    "npz",
    "the package's file of block arrays (one .npz)",
    tuple(BLOCK_FORMATS),
    lambda name, layout, scale_dtype: [],
    _no_config,
    _npz_detect,
    _npz_weights,
    suffix=SUFFIX,
    decide=module_decision,
)
