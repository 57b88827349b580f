"""Files: everything the package reads from and writes to disk, above the numerics (which never
import it).

- :mod:`.arrays`: an array of a file read in pieces, and the one table of file kinds, which
  :mod:`.npy`, :mod:`.npz` and :mod:`.safetensors` each fill with their record (how to open, read
  in pieces and write that kind); :mod:`.files` imports them all and gives their names;
- :mod:`.outputs`: outputs written whole or not at all;
- :mod:`.blockfile`: the package's file of block arrays (:func:`save_blocks`, :func:`load_blocks`);
- :mod:`.stream`: quantise / dequantise / cast / error statistics of files in pieces, in bounded
  memory.
"""

from .blockfile import load_blocks, save_blocks

__all__ = ["load_blocks", "save_blocks"]
