"""neuron_kernels: fast, bit-exact casts between the number formats of ML accelerators.

Importing the package compiles nothing and does not import numba; each kernel is compiled (or
loaded from the on-disk cache) the first time it runs.
"""

from ._compat import find_moved_modules
from ._parallel import get_num_threads, set_num_threads
from .api import (
    block_matmul,
    cast,
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
from .autograd import torch_fake_quantize
from .blocks import BlockArray, BlockLayout, QuantizationStats, rotate
from .casting import pack_x4, unpack_x4
from .checkpoints import load_checkpoint, open_checkpoint
from .checkpoints.state_dict import dequantize_state_dict, quantize_state_dict
from .dtypes import FormatInfo, as_dtype, canonical_name, format_info
from .errors import (
    ClusterError,
    InvalidTypeError,
    InvalidValueError,
    MissingExtraError,
    NeuronKernelsError,
    NotApplicableError,
    UnknownFormatError,
)
from .formats import BLOCK_FORMATS, FORMATS, INTEGER_FORMATS, MX_FORMATS, BlockFormat, Format, NKDType
from .io import load_blocks, save_blocks
from .io.arrays import FileFormatError
from .neuron.auto_cast import auto_cast
from .neuron.operands import NcMatmulMxOperand, from_nc_matmul_mx, to_nc_matmul_mx
from .neuron.promotion import (
    NoPromotionPathError,
    Promotion,
    can_merge_type,
    explain_promotion,
    get_x1_from_x4,
    get_x4_from_x1,
    is_floating,
    is_x4_dtype,
    launder_x4_dtype,
    merge_type,
    promote_type,
    promotion_table,
)
from .registry import (
    ROUNDING_MODES,
    CastKernel,
    CastOptions,
    UnsupportedCastError,
    lookup_cast,
    register_cast,
    supported_casts,
)

__version__ = "0.1.0"

__all__ = [
    "BLOCK_FORMATS",
    "FORMATS",
    "MX_FORMATS",
    "INTEGER_FORMATS",
    "BlockArray",
    "BlockFormat",
    "BlockLayout",
    "QuantizationStats",
    "ROUNDING_MODES",
    "CastKernel",
    "ClusterError",
    "FileFormatError",
    "InvalidTypeError",
    "InvalidValueError",
    "MissingExtraError",
    "NeuronKernelsError",
    "NotApplicableError",
    "UnknownFormatError",
    "CastOptions",
    "Format",
    "FormatInfo",
    "NKDType",
    "NcMatmulMxOperand",
    "NoPromotionPathError",
    "Promotion",
    "UnsupportedCastError",
    "as_dtype",
    "auto_cast",
    "can_merge_type",
    "canonical_name",
    "cast",
    "block_matmul",
    "dequantize",
    "dequantize_mx",
    "explain_promotion",
    "fake_quantize",
    "fake_quantize_mx",
    "fake_quantize_nvfp4",
    "format_info",
    "from_nc_matmul_mx",
    "get_num_threads",
    "get_x1_from_x4",
    "get_x4_from_x1",
    "is_floating",
    "is_x4_dtype",
    "launder_x4_dtype",
    "load_blocks",
    "load_checkpoint",
    "lookup_cast",
    "merge_type",
    "mx_matmul",
    "open_checkpoint",
    "pack_x4",
    "promote_type",
    "promotion_table",
    "quantization_error",
    "quantize",
    "quantize_state_dict",
    "dequantize_state_dict",
    "torch_fake_quantize",
    "quantize_mx",
    "quantize_nvfp4",
    "register_cast",
    "rotate",
    "save_blocks",
    "set_num_threads",
    "shared_per_tensor_scale",
    "supported_casts",
    "to_nc_matmul_mx",
    "unpack_x4",
]


find_moved_modules()


def __getattr__(name: str) -> object:
    """Names that changed: the old one still works, with a DeprecationWarning."""
    renamed = {"QuantizationError": QuantizationStats, "MXArray": BlockArray}  # the new names
    if name in renamed:
        import warnings

        new = renamed[name]
        warnings.warn(f"{name} is now {new.__name__}", DeprecationWarning, stacklevel=2)
        return new
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
