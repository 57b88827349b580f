"""The ``npz`` layout: the package's own file of block arrays (:mod:`neuron_kernels.io.blockfile`).

It holds the quantised weights only (block arrays); which tensors are quantised:
:func:`neuron_kernels.checkpoints.selection.module_decision`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...blocks.array import BlockArray
from ...formats import BLOCK_FORMATS
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.blockfile import StoredBlocks, read_block_file
from ...io.file_jobs import decoded_pieces
from ..folder import Checkpoint
from ..selection import module_decision
from .integer_weights import decoded_amax
from .records import CheckpointLayout, StoredWeight

__all__ = ["LAYOUT"]

#: The layout is one file with this suffix, not a folder of shards.
SUFFIX = ".npz"


def _npz_detect(ckpt: Checkpoint) -> bool:
    return os.path.isfile(ckpt.path) and ckpt.path.lower().endswith(SUFFIX)


@dataclass(frozen=True)
class IntegerFileWeight(StoredWeight):
    """An integer block array of the file with zero points or a group index (``stored``), read
    through the file's own reader, whole rows at a time."""

    stored: StoredBlocks | None = None

    @property
    def _blocks(self) -> StoredBlocks:
        assert self.stored is not None
        return self.stored

    def block_array(self) -> BlockArray:
        return self._blocks.block_array()

    def decoded_pieces(self, dtype: str, chunk_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
        s = self._blocks
        yield from decoded_pieces(
            s.codes, s.scales, s.layout, s.per_tensor_scale, None, dtype, chunk_bytes, s.scale_dtype, s.zeros,
            s.group_index,
        )  # fmt: skip

    def decoded_entry(self) -> ArrayEntry:
        lay = self.layout
        cols = lay.shape[-1]

        def read(start: int, stop: int) -> np.ndarray:
            r0, r1 = start // cols, -(-stop // cols)
            if r1 <= r0:
                return np.empty(0, np.float32)
            part = self._rows(r0, r1)
            return part.dequantize("float32").reshape(-1)[start - r0 * cols : stop - r0 * cols]

        return ArrayEntry(self.codes.path, self.out_name, lay.shape, np.dtype(np.float32), read)

    def _rows(self, r0: int, r1: int) -> BlockArray:
        s, lay = self._blocks, self.layout
        crow, srow = lay.codes_shape[-1], lay.scales_shape[-1]
        zeros = None if s.zeros is None else np.asarray(s.zeros.read_flat(r0 * srow, r1 * srow)).reshape(r1 - r0, srow)
        return BlockArray.from_parts(
            np.asarray(s.codes.read_flat(r0 * crow, r1 * crow)).reshape(r1 - r0, crow),
            s.scale_values(np.asarray(s.scales.read_flat(r0 * srow, r1 * srow))).reshape(r1 - r0, srow),
            dataclasses.replace(lay, shape=(r1 - r0, lay.shape[-1])),
            s.codes.where,
            zero_points=zeros,
            group_index=s.group_index,
        )

    def finite_amax(self, chunk_bytes: int = 64 << 20) -> float:
        return decoded_amax(self, chunk_bytes)


def _npz_weights(ckpt: Checkpoint) -> list[StoredWeight]:
    found: list[StoredWeight] = []
    for key, s in read_block_file(ckpt.path).items():
        if s.rotation is not None:
            raise FileFormatError(
                f"{ckpt.path}[{key}]: quantised with a rotation; read it with neuron_kernels.load_blocks and "
                f"dequantize(unrotate=True)"
            )
        name = "array" if key is None else str(key)
        if s.zeros is not None or s.group_index is not None:
            found.append(IntegerFileWeight(name, s.layout, None, s.codes, s.scale_entry(), (), name, stored=s))
        else:
            found.append(StoredWeight(name, s.layout, s.per_tensor_scale, s.codes, s.scale_entry(), (), name))
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
