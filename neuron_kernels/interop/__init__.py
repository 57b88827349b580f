"""Arrays of other frameworks at the public boundary: :mod:`.torch_tensors` (PyTorch CPU tensors in
as zero-copy NumPy views, results back as torch tensors). Nothing here imports the framework: a
tensor can exist only once its framework is imported, so the check reads ``sys.modules``.
"""

from .torch_tensors import from_torch, is_torch, to_torch

__all__ = ["is_torch", "from_torch", "to_torch"]
