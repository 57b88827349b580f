"""neuron_kernels: fast, bit-exact casts between the number formats of ML accelerators.

Importing the package compiles nothing and does not import numba; each kernel is compiled (or
loaded from the on-disk cache) the first time it runs.
"""

from ._parallel import get_num_threads, set_num_threads
from .casting import auto_cast, cast, pack_x4, unpack_x4
from .formats import FORMATS, Format, FormatInfo, NKDType, as_dtype, canonical_name, format_info
from .mx import (
    MX_FORMATS,
    MXArray,
    dequantize_mx,
    fake_quantize_mx,
    mx_matmul,
    quantization_error,
    quantize_mx,
)
from .promotion import (
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
    "FORMATS",
    "MX_FORMATS",
    "MXArray",
    "ROUNDING_MODES",
    "CastKernel",
    "CastOptions",
    "Format",
    "FormatInfo",
    "NKDType",
    "NoPromotionPathError",
    "Promotion",
    "UnsupportedCastError",
    "as_dtype",
    "auto_cast",
    "can_merge_type",
    "canonical_name",
    "cast",
    "dequantize_mx",
    "explain_promotion",
    "fake_quantize_mx",
    "format_info",
    "get_num_threads",
    "get_x1_from_x4",
    "get_x4_from_x1",
    "is_floating",
    "is_x4_dtype",
    "launder_x4_dtype",
    "lookup_cast",
    "merge_type",
    "mx_matmul",
    "pack_x4",
    "promote_type",
    "promotion_table",
    "quantization_error",
    "quantize_mx",
    "register_cast",
    "set_num_threads",
    "supported_casts",
    "unpack_x4",
]
