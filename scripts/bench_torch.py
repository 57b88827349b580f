"""The torch path against the NumPy path on the same data (docs/torch.md; issue figures, not a
test): a bfloat16 tensor of ``--size`` elements quantised to NVFP4 and MXFP8 through
``nk.quantize(tensor)`` and through ``nk.quantize(numpy view)``, and by torchao's own CPU
quantisers in the same run; best of ``--repeat`` runs each.

    python scripts/bench_torch.py --size 64Mi --repeat 5
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import neuron_kernels as nk
from neuron_kernels.cli.quantities import parse_size
from neuron_kernels.interop import from_torch


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="64Mi")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch

        try:
            from torchao.prototype.mx_formats.mx_tensor import MXTensor
            from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
        except ImportError:
            MXTensor = nvfp4_quantize = None
    n = parse_size(args.size)
    t = torch.randn(n // 4096, 4096, dtype=torch.bfloat16)
    a = from_torch(t)
    print(f"{n} bfloat16 elements, best of {args.repeat}")
    for fmt in ("nvfp4", "mxfp8_e4m3"):
        torch_s = best(lambda fmt=fmt: nk.quantize(t, fmt), args.repeat)
        numpy_s = best(lambda fmt=fmt: nk.quantize(a, fmt), args.repeat)
        line = f"{fmt:12s} torch path {torch_s * 1e3:8.1f} ms  numpy path {numpy_s * 1e3:8.1f} ms"
        line += f"  ratio {torch_s / numpy_s:.3f}"
        if fmt == "nvfp4" and nvfp4_quantize is not None:
            ao = best(lambda: nvfp4_quantize(t, 16, None), max(1, args.repeat // 2))
            line += f"  torchao {ao * 1e3:8.1f} ms ({ao / torch_s:.1f}x ours)"
        elif MXTensor is not None:
            ao = best(lambda: MXTensor.to_mx(t, torch.float8_e4m3fn, 32), max(1, args.repeat // 2))
            line += f"  torchao {ao * 1e3:8.1f} ms ({ao / torch_s:.1f}x ours)"
        print(line)
    assert np.array_equal(nk.quantize(t, "nvfp4").codes, nk.quantize(a, "nvfp4").codes)


if __name__ == "__main__":
    main()
