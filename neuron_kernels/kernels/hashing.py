"""The random bits of stochastic rounding: a counter-based hash of (stream key, element index), so
that a result never depends on how an array is split between threads or pieces."""

from __future__ import annotations

import numpy as np

from .._jit import jit, u32_add, u32_mul, u32_shr, u32_xor

__all__ = ["random_bits"]


@jit
def mix32(x):  # pragma: no cover - compiled
    """A 32-bit integer hash with good avalanche (xorshift-multiply, as in 'lowbias32')."""
    x = u32_xor(x, u32_shr(x, 16))
    x = u32_mul(x, 0x7FEB352D)
    x = u32_xor(x, u32_shr(x, 15))
    x = u32_mul(x, 0x846CA68B)
    return u32_xor(x, u32_shr(x, 16))


@jit
def random_bits(key_lo, key_hi, idx):  # pragma: no cover - compiled
    """32 random bits for element ``idx`` of an array: a hash of (key, idx), nothing else.

    With the key (:func:`neuron_kernels._random.stream_key` of the seed) split into 32-bit halves
    ``key_lo``/``key_hi`` and ``idx`` into ``idx_lo``/``idx_hi``:
    ``mix32(((mix32(idx_lo ^ key_lo) + idx_hi) mod 2^32) ^ key_hi)``.
    Stochastic rounding rounds a magnitude up when these bits, read as an unsigned integer, are
    below ``floor(2^32 * f)``, ``f`` being the discarded fraction of an ulp.
    """
    h = mix32(u32_xor(np.uint32(idx & 0xFFFFFFFF), key_lo))
    return mix32(u32_xor(u32_add(h, np.uint32((idx >> 32) & 0xFFFFFFFF)), key_hi))
