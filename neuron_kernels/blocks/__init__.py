"""Block-scaled formats (MX, NVFP4): one family over the format table's block rows.

- :mod:`.layout`: where codes and scales live, and how arrays are cut into pieces;
- :mod:`.nibbles`: 4-bit codes two per byte, in numpy;
- :mod:`.array`: the container (:class:`BlockArray`, also called ``MXArray``) and dequantisation;
- :mod:`.file`: the package's file of block arrays;
- :mod:`.job`: validated options applied to arrays or pieces;
- :mod:`.rotation`: the random Hadamard rotation;
- :mod:`.stats`: error statistics;
- :mod:`.api`: the public functions.
"""

from .api import (
    block_matmul,
    dequantize,
    dequantize_mx,
    fake_quantize,
    fake_quantize_mx,
    fake_quantize_nvfp4,
    mx_matmul,
    quantization_error,
    quantize,
    quantize_mx,
    quantize_nvfp4,
    shared_per_tensor_scale,
)
from .array import BlockArray, MXArray
from .rotation import rotate
from .stats import QuantizationStats

__all__ = [
    "BlockArray",
    "MXArray",
    "QuantizationStats",
    "block_matmul",
    "dequantize",
    "dequantize_mx",
    "fake_quantize",
    "fake_quantize_mx",
    "fake_quantize_nvfp4",
    "mx_matmul",
    "quantization_error",
    "quantize",
    "quantize_mx",
    "quantize_nvfp4",
    "rotate",
    "shared_per_tensor_scale",
]
