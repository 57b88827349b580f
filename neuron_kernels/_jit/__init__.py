"""Numba in one place: the kernel decorators, the 32-bit integer intrinsics the kernels use, the
package's kernel cache with its compiled tiers, and the compile log.

Importing this package imports numba; the rest of the package imports it only when a kernel is
first needed, so ``import neuron_kernels`` stays cheap and compiles nothing.

- :mod:`.options`: ``jit`` and ``vectorize`` with the package's options;
- :mod:`.intrinsics`: 32-bit integer and bit-pattern intrinsics;
- :mod:`.source_digest`: the digest of the kernel sources in every cache key, and the cache's file lock;
- :mod:`.cache`: the tolerant on-disk cache, which also looks in the compiled tiers;
- :mod:`.tiers`: the compiled tiers the wheel carries;
- :mod:`.log`: the count of compiles, their subscribers and the one-time notice;
- :mod:`.numba_internals`: every use of numba's private attributes, checked against one release.
"""

from __future__ import annotations

from .cache import ORIGINS
from .intrinsics import (
    f16_to_f32_bits,
    f32_bits,
    f32_from_bits,
    i32_positive,
    u32_add,
    u32_amax_abs,
    u32_and,
    u32_mul,
    u32_or,
    u32_shl,
    u32_shr,
    u32_sub,
    u32_xor,
)
from .log import compiles, on_compile
from .options import JIT_OPTIONS, jit, vectorize
from .source_digest import KERNEL_SOURCES, PACKAGE_ROOT
from .tiers import CPU_LEVELS, MANIFEST, compiled_root, compiled_tag, compiled_tiers, host_levels, local_cache_only

__all__ = [
    "jit",
    "vectorize",
    "JIT_OPTIONS",
    "u32_add",
    "u32_sub",
    "u32_mul",
    "u32_shr",
    "u32_shl",
    "u32_and",
    "u32_or",
    "u32_xor",
    "f32_bits",
    "f32_from_bits",
    "f16_to_f32_bits",
    "i32_positive",
    "u32_amax_abs",
    "compiles",
    "on_compile",
    "ORIGINS",
    "PACKAGE_ROOT",
    "KERNEL_SOURCES",
    "CPU_LEVELS",
    "MANIFEST",
    "compiled_root",
    "compiled_tag",
    "compiled_tiers",
    "host_levels",
    "local_cache_only",
]
