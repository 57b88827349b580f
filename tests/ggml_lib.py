"""ggml's own C functions, from the library llama-cpp-python builds (``libggml-base``), through
ctypes: its decoding of a block type (``to_float``) and its quantiser (``ggml_quantize_chunk``),
the oracle and the peer of the GGUF tests. Import only where llama-cpp-python is installed."""

from __future__ import annotations

import ctypes
import os

import numpy as np


class _Traits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def _library() -> ctypes.CDLL:
    import llama_cpp

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
    return lib


_LIB = _library()
#: ggml's type numbers (ggml.h).
MXFP4, NVFP4 = 39, 40


def ggml_decode(blocks: np.ndarray, ggml_type: int, n: int) -> np.ndarray:
    """ggml's float32 values of ``n`` elements stored as ``blocks`` of ``ggml_type``."""
    blocks = np.ascontiguousarray(blocks, np.uint8)
    out = np.empty(n, np.float32)
    _TO_FLOAT(_LIB.ggml_get_type_traits(ggml_type).contents.to_float)(blocks.ctypes.data, out.ctypes.data, n)
    return out


def ggml_quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """ggml's own quantisation of the float32 matrix ``x`` (rows along the last axis) as blocks."""
    x = np.ascontiguousarray(x, np.float32)
    rows, cols = x.shape
    out = np.zeros((rows, _LIB.ggml_row_size(ggml_type, cols)), np.uint8)
    _LIB.ggml_quantize_chunk(ggml_type, x.ctypes.data, out.ctypes.data, 0, rows, cols, None)
    return out
