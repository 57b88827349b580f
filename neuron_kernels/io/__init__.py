"""Files: everything the package reads from and writes to disk, above the numerics (which never
import it).

- :mod:`.files`: one record per array file kind (``.npy``, ``.npz``, ``.safetensors``: how to open,
  read in pieces and write each), the safetensors header reader and streaming writer, atomic outputs;
- :mod:`.blockfile`: the package's file of block arrays (:func:`save_blocks`, :func:`load_blocks`);
- :mod:`.stream`: quantise / dequantise / cast / error statistics of files in pieces, in bounded
  memory.
"""

from .blockfile import load_blocks, save_blocks

__all__ = ["load_blocks", "save_blocks"]
