"""Array files: ``.npy``, ``.npz`` and ``.safetensors``, read and written in pieces.

Each kind of file is a module of its own (:mod:`.npy`, :mod:`.npz`, :mod:`.safetensors`) that
registers its record (:class:`~.arrays.ArrayFileKind`: how to open it, its arrays as
:class:`~.arrays.ArrayEntry` objects with no data read, and how to write arrays produced piece by
piece) in the one table :data:`~.arrays.ARRAY_FILES`; :func:`~.arrays.array_file_kind` maps a path
to its record. This module imports them all, so that the table is complete, and gives their names
in one place.

Inputs are read in flat C-order ranges, so that a file larger than memory can be processed piece
by piece: a ``.npy`` file, an uncompressed ``.npz`` member and a ``.safetensors`` tensor through a
memory map of the requested range only (unmapped when the piece is dropped), a compressed ``.npz``
member by reading it whole (zip compression cannot be read from the middle). Outputs go to a
temporary name and are renamed into place only once complete (:mod:`.outputs`): an interrupted or
failed run, a full disk included, leaves no output behind.
"""

from __future__ import annotations

from .arrays import (
    ARRAY_FILES,
    ArrayEntry,
    ArrayFileKind,
    FileFormatError,
    OutArray,
    array_file_kind,
    open_arrays,
    register_file_kind,
)
from .npy import NpyWriter
from .npz import NpzWriter, stored_member_offset
from .outputs import atomic_output, check_output_path
from .safetensors import SafetensorsWriter, TensorSpec, read_safetensors_header, safetensors_dtype_code

__all__ = [
    "FileFormatError",
    "ArrayEntry",
    "ArrayFileKind",
    "ARRAY_FILES",
    "OutArray",
    "array_file_kind",
    "open_arrays",
    "register_file_kind",
    "check_output_path",
    "atomic_output",
    "NpyWriter",
    "NpzWriter",
    "SafetensorsWriter",
    "TensorSpec",
    "read_safetensors_header",
    "safetensors_dtype_code",
    "stored_member_offset",
]
