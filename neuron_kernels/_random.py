"""Seeds of stochastic rounding, and the key of their random bits (pure Python, no numba).

Stochastic rounding draws 32 random bits per element from a hash of (key, element index), where
the key is the seed mixed by SplitMix64's output function, a bijection of 64-bit integers in
which every output bit depends on every input bit. The kernels compute, for element ``i``
(``i_lo``/``i_hi`` its low and high 32 bits, ``k_lo``/``k_hi`` the key's)::

    bits(i) = mix32(((mix32(i_lo ^ k_lo) + i_hi) mod 2^32) ^ k_hi)

with ``mix32`` a 32-bit integer hash of full avalanche (xorshift-multiply). Because the seed is
mixed before it meets the index, the streams of two seeds are unrelated: the streams of seeds
``s`` and ``s ^ d`` are not the same bits at permuted indices (as they were when the seed itself
was XORed into the index), whatever ``d``. Every seed in ``[0, 2^64)`` has its own key.
"""

from __future__ import annotations

import numbers
import secrets
from typing import Any

from .errors import InvalidTypeError, InvalidValueError

__all__ = ["SEED_LIMIT", "check_seed", "draw_seed", "stream_key"]

#: Seeds are integers in ``[0, SEED_LIMIT)``.
SEED_LIMIT = 1 << 64
_MASK64 = SEED_LIMIT - 1


def check_seed(seed: Any) -> None:
    """``TypeError`` unless ``seed`` is None or an int; ``ValueError`` outside ``[0, 2^64)``."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise InvalidTypeError(f"seed must be None or an int in [0, 2**64), got {seed!r}")
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise InvalidValueError(f"seed must be None or an int in [0, 2**64), got {seed!r}")


def draw_seed() -> int:
    """A fresh seed from the operating system's entropy (what ``seed=None`` means)."""
    return secrets.randbits(64)


def stream_key(seed: int) -> int:
    """The key the kernels hash with the element index, as a signed 64-bit int (one numba type).

    SplitMix64's output function of ``seed``: ``z = seed + 0x9E3779B97F4A7C15``, then
    ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``
    (mod 2^64).
    """
    z = (int(seed) + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z - SEED_LIMIT if z >> 63 else z
