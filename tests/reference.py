"""Small, obviously-correct helpers the references and tests share (the references themselves are
``reference_casts.py``, ``reference_blocks.py``, ``reference_mx.py`` and ``reference_neuron.py``).

Nothing here shares code with the package: values are computed in float64 with frexp/ldexp
and ``numpy.rint`` (round half to even), the way one would do it by hand.
"""

from __future__ import annotations

import numpy as np


def round_float32_to_mbits(x: np.ndarray, mbits: int) -> np.ndarray:
    """Round float32 values to a float32-range format with ``mbits`` mantissa bits (ties to even).

    The format has float32's exponent range (8 bits, bias 127), subnormals with quantum
    2^(-126 - mbits), and overflows to infinity past its largest finite value. NaN becomes the
    quiet NaN of its sign (0x7fc00000 / 0xffc00000). Returns float32 values.
    """
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        x64 = x32.astype(np.float64)
    # The exponent of the value's binade, clamped to the normal range: the biased exponent field
    # (1 for subnormals and zero); the ulp 2^(exp - mbits) built as a float64 from its exponent field.
    biased = np.maximum((x32.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF), np.uint32(1))
    exponent = biased.astype(np.int64) - (127 + mbits)
    ulp = ((exponent + 1023) << 52).view(np.float64)
    inverse = ((1023 - exponent) << 52).view(np.float64)  # 1 / ulp, a power of two: x * inverse is exact
    with np.errstate(invalid="ignore", over="ignore"):
        q = x64 * inverse
        np.rint(q, out=q)
        q *= ulp
        largest = np.ldexp(2.0 - 2.0**-mbits, 127)
        q = np.where(np.abs(q) > largest, np.copysign(np.inf, x64), q)
        out = q.astype(np.float32)
    bits = out.view(np.uint32)
    nan = np.isnan(x64)
    sign = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0x80000000)
    bits = np.where(nan, sign | np.uint32(0x7FC00000), bits)
    return bits.astype(np.uint32).view(np.float32)


def pack_lanes(codes: np.ndarray, lane_bits: int, container: type) -> np.ndarray:
    """Pack the last axis four codes at a time, element 0 in the least significant lane (a loop)."""
    codes = np.asarray(codes)
    n = codes.shape[-1] // 4
    out = np.zeros(codes.shape[:-1] + (n,), dtype=container)
    flat_in = codes.reshape(-1, codes.shape[-1])
    flat_out = out.reshape(-1, n)
    for r in range(flat_in.shape[0]):
        for j in range(n):
            word = 0
            for lane in range(4):
                word |= (int(flat_in[r, 4 * j + lane]) & ((1 << lane_bits) - 1)) << (lane * lane_bits)
            flat_out[r, j] = word
    return out


# ---- the random bits of stochastic rounding, written from their documentation -----------------------


def mix32(x: np.ndarray) -> np.ndarray:
    """The 32-bit hash of the package's documentation, in uint64 arithmetic reduced mod 2^32."""
    m = np.uint64(0xFFFFFFFF)
    x = np.asarray(x, dtype=np.uint64) & m
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & m
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & m
    return x ^ (x >> np.uint64(16))


def splitmix64(seed: int) -> int:
    """SplitMix64's output function (Steele, Lea and Flood 2014), in Python integers."""
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def random_bits(seed: int, n: int, start: int = 0) -> np.ndarray:
    """The uint32 draws of elements ``start .. start + n - 1`` for ``seed``."""
    key = splitmix64(seed)
    key_lo, key_hi = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    idx = np.arange(n, dtype=np.uint64) + np.uint64(start)
    h = mix32((idx & np.uint64(0xFFFFFFFF)) ^ key_lo)
    return mix32(((h + (idx >> np.uint64(32))) & np.uint64(0xFFFFFFFF)) ^ key_hi).astype(np.uint32)
