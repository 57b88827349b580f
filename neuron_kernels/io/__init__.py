"""Files: everything the package reads from and writes to disk, above the numerics (which never
import it).

- :mod:`.arrays`: an array of a file read in pieces (:class:`~.arrays.ArrayEntry`), and the one
  table of file kinds (:data:`~.arrays.ARRAY_FILES`), which :mod:`.npy`, :mod:`.npz` and
  :mod:`.safetensors` each fill with their record (how to open, read in pieces and write that
  kind); they are imported here, so that the table is complete whichever module is imported;
- :mod:`.outputs`: outputs written whole or not at all;
- :mod:`.blockfile`: the package's file of block arrays (:func:`save_blocks`, :func:`load_blocks`);
- :mod:`.file_jobs`: quantise / dequantise / cast / error statistics of array files in pieces, in
  bounded memory;
- :mod:`.gguf_file`: GGUF files (llama.cpp's); :mod:`.untrusted`: the checks every file's bytes
  pass before they are used.
"""

from . import npy, npz, safetensors  # noqa: F401 - each registers its kind of file in ARRAY_FILES
from .blockfile import load_blocks, save_blocks

__all__ = ["load_blocks", "save_blocks"]
