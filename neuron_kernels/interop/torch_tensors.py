"""PyTorch tensors in and out (docs/torch.md), without importing torch.

- :func:`from_torch`: a CPU tensor as a NumPy array that shares its memory (strides kept): float32,
  float64, float16 and the integers directly; bfloat16 and the float8 types (``float8_e4m3fn``,
  ``float8_e5m2``, the ``fnuz`` ones, ``float8_e8m0fnu``) reinterpreted as the ml_dtypes dtype of the
  same bits; ``float4_e2m1fn_x2`` (two FP4 codes per byte) unpacked to one ``float4_e2m1fn`` code
  per byte, the one input that is copied. A tensor on another device, one that requires grad and a
  dtype the package does not read are refused, naming what to do.
- :func:`to_torch`: a NumPy result as a tensor sharing its memory, in torch's dtype of the same
  format where torch has one, else its bytes as ``uint8`` (FP6, FP4 one code per byte,
  float8_e4m3, float8_e3m4, float8_e4m3b11fnuz, float8_e5m3fnu).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..dtypes import get_format
from ..errors import InvalidTypeError, MissingExtraError

__all__ = ["is_torch", "from_torch", "to_torch", "torch_dtype_name", "TORCH_BITS"]

#: torch dtypes that NumPy has: read and returned as they are.
_NATIVE = (
    "float64", "float32", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
)  # fmt: skip
#: torch dtypes NumPy lacks, by name (the ml_dtypes name is the same), with the integer dtype of
#: the same width through which their bits pass between the two.
TORCH_BITS = {
    "bfloat16": "int16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
}


def torch_module() -> Any:
    module = sys.modules.get("torch")
    if module is None:
        try:
            import torch as module
        except ImportError as exc:
            raise MissingExtraError("torch tensors need torch: pip install torch") from exc
    return module


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a ``torch.Tensor`` (if torch is not imported, no tensor exists)."""
    module = sys.modules.get("torch")
    return module is not None and isinstance(x, module.Tensor)


def torch_dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def from_torch(t: Any, what: str = "the input") -> np.ndarray:
    """The CPU tensor ``t`` as a NumPy array sharing its memory (see the module docstring)."""
    name = torch_dtype_name(t)
    if t.device.type != "cpu":
        raise InvalidTypeError(
            f"{what} is a torch tensor on {t.device}; the package computes on the CPU: pass tensor.cpu()"
        )
    if t.requires_grad:
        raise InvalidTypeError(
            f"{what} is a torch tensor that requires grad; pass tensor.detach() (for fake quantisation inside "
            f"a training step, neuron_kernels.torch_fake_quantize passes gradients straight through)"
        )
    if t.is_neg() or t.is_conj():
        t = t.resolve_neg().resolve_conj()
    if name in _NATIVE:
        return np.asarray(t.numpy())
    if name in TORCH_BITS:
        torch = torch_module()
        return np.asarray(t.view(getattr(torch, TORCH_BITS[name])).numpy()).view(get_format(name).dtype)
    if name == "float4_e2m1fn_x2":  # two FP4 codes per byte, element 2i in the low nibble: unpacked (a copy)
        packed = np.asarray(t.view(torch_module().uint8).numpy())
        codes = np.stack((packed & 0x0F, packed >> 4), axis=-1).reshape(*packed.shape[:-1], -1)
        return codes.view(get_format("float4_e2m1fn").dtype)
    readable = ", ".join((*_NATIVE, *TORCH_BITS, "float4_e2m1fn_x2"))
    raise InvalidTypeError(f"{what} is a torch tensor of dtype {t.dtype}, which the package does not read ({readable})")


def to_torch(a: np.ndarray) -> Any:
    """The NumPy array ``a`` as a CPU tensor sharing its memory (see the module docstring)."""
    torch = torch_module()
    a = np.asarray(a)
    name = a.dtype.name
    if name in _NATIVE:
        return torch.from_numpy(a)
    if name in TORCH_BITS:
        return torch.from_numpy(a.view(TORCH_BITS[name])).view(getattr(torch, name))
    if a.dtype.itemsize == 1:
        return torch.from_numpy(a.view(np.uint8))
    raise InvalidTypeError(f"no torch tensor for a NumPy array of dtype {a.dtype}")
