"""Block-scaled formats (MX, NVFP4, FP8 with float scales): one family over the format table's block rows.

- :mod:`.layout`: where codes and scales live, and how arrays are cut into pieces;
- :mod:`.nibbles`: 4-bit codes two per byte, in numpy;
- :mod:`.array`: the container (:class:`BlockArray`) and dequantisation;
- :mod:`.inputs`: the input dtypes, and arrays made ready for the kernels;
- :mod:`.job`: validated options applied to arrays or pieces;
- :mod:`.rotation`: the random Hadamard rotation;
- :mod:`.stats`: error statistics.

The package's file of block arrays is :mod:`neuron_kernels.io.blockfile`. These handle in-memory
arrays; the public functions (``quantize``, ``dequantize``, ...) are in :mod:`neuron_kernels.api`,
which sends lazy arrays to :mod:`neuron_kernels.lazy`.
"""

from .array import BlockArray
from .layout import BlockLayout
from .rotation import rotate
from .stats import QuantizationStats

__all__ = ["BlockArray", "BlockLayout", "QuantizationStats", "rotate"]
