"""Fake quantisation inside a PyTorch training step: :func:`torch_fake_quantize`, a torch autograd
function around :func:`neuron_kernels.fake_quantize` whose backward pass is the straight-through
estimator (the gradient passes unchanged), to simulate MX / NVFP4 numerics on the CPU. Importing
this module does not import torch; the first call does."""

from __future__ import annotations

import functools
from typing import Any

from .api import fake_quantize
from .interop.torch_tensors import from_torch, to_torch, torch_module

__all__ = ["torch_fake_quantize"]


@functools.cache
def _function() -> Any:
    torch = torch_module()

    class FakeQuantize(torch.autograd.Function):  # type: ignore[misc, name-defined]
        @staticmethod
        def forward(ctx: Any, x: Any, fmt: str, options: dict[str, Any]) -> Any:
            values = fake_quantize(from_torch(x.detach(), "x"), fmt, **options)
            return to_torch(values).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad, None, None

    return FakeQuantize


def torch_fake_quantize(x: Any, fmt: str, **options: Any) -> Any:
    """``fake_quantize(x, fmt, **options)`` of the CPU tensor ``x`` as a tensor of x's dtype, in
    torch's autograd graph: the forward pass is the package's fake quantisation (computed in
    float32, then cast to x's dtype), the backward pass the straight-through estimator (the
    incoming gradient unchanged). ``x`` may require grad."""
    torch = torch_module()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"torch_fake_quantize takes a torch tensor, got {type(x).__name__}")
    return _function().apply(x, fmt, options)
