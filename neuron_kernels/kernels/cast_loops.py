"""The cast kernels: a source's loader, then a target's storer, in one loop per layout.

:func:`make_cast_kernel` makes the kernel of one (source kind, target kind, rounding, saturate,
layout); :func:`storer` picks what it makes of a float32 pattern (the pattern, a float64, a code
of :mod:`.codec`). Copies of items and look-ups through a table of results are here too.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from .._jit import f32_from_bits, jit, u32_shl
from .codec import E8M0, STOCHASTIC, Codec, encode, encode_e8m0
from .hashing import random_bits
from .loaders import SOURCE_F64_SPLIT, SOURCE_INT, loader
from .narrowing import f64_rest
from .nibble_kernels import nibble, nibble_pair

__all__ = ["Store", "storer", "make_cast_kernel", "copy_items", "look_up_items"]

# What a kernel makes of a float32 pattern, and how its items are laid out.
TARGET_F32 = 0
TARGET_F64 = 1
TARGET_CODES = 2
ELEMENTWISE, PACK_NIBBLES, UNPACK_NIBBLES = 0, 1, 2


class Store(NamedTuple):
    """What a kernel makes of a float32 pattern: the source and target kinds, the target's
    :class:`Codec`, the rounding mode id and saturation."""

    source: int
    target: int
    codec: Codec
    mode: int
    saturate: bool


@jit
def _store_pattern(x, u, rnd, how):  # pragma: no cover - compiled
    return u


@jit
def _store_f64(x, u, rnd, how):  # pragma: no cover - compiled
    return np.float64(f32_from_bits(u))


@jit
def _store_f64_of_int(x, u, rnd, how):  # pragma: no cover - compiled
    return np.float64(x)


@jit
def _store_code(x, u, rnd, how):  # pragma: no cover - compiled
    return u32_shl(encode(u, rnd, np.uint32(0), how.codec, how.mode, how.saturate), how.codec.shift)


@jit
def _store_code_split(x, u, rnd, how):  # pragma: no cover - compiled
    return u32_shl(encode(u, rnd, f64_rest(x, u), how.codec, how.mode, how.saturate), how.codec.shift)


@jit
def _store_e8m0(x, u, rnd, how):  # pragma: no cover - compiled
    return encode_e8m0(u, rnd, np.uint32(0), how.mode, how.saturate)


@jit
def _store_e8m0_split(x, u, rnd, how):  # pragma: no cover - compiled
    return encode_e8m0(u, rnd, f64_rest(x, u), how.mode, how.saturate)


def storer(how: Store) -> Any:
    """The compiled ``(x, u, rnd, how) -> target item`` of the float32 pattern ``u`` (``x`` is the
    source item it came from, ``rnd`` the random bits of stochastic rounding), as :class:`Store`
    ``how`` says: the pattern itself, a float64, or a code (float64 sources split for stochastic
    rounding also pass on the bits below the float32 truncation)."""
    if how.target == TARGET_F32:
        return _store_pattern
    if how.target == TARGET_F64:
        return _store_f64_of_int if how.source == SOURCE_INT else _store_f64
    split = how.source == SOURCE_F64_SPLIT
    if how.codec.specials == E8M0:
        return _store_e8m0_split if split else _store_e8m0
    return _store_code_split if split else _store_code


@cache
def make_cast_kernel(
    source: int,
    src_codec: Codec,
    target: int,
    dst_codec: Codec,
    mode: int,
    saturate: bool,
    layout: int = ELEMENTWISE,
) -> Any:
    """Kernel ``(src, dst, key, start)`` casting 1-D arrays.

    ``source`` is one of ``SOURCE_*`` (codes need ``src_codec``), ``target`` one of ``TARGET_*``
    (codes need ``dst_codec``; :data:`NO_CODEC` where there is none). Codes and float32 patterns
    are passed as unsigned-int views, float64 and integers as they are. ``layout``:
    ``ELEMENTWISE``; ``PACK_NIBBLES`` (two 4-bit codes per output byte, element 2k in the low
    nibble); ``UNPACK_NIBBLES`` (the reverse). ``key`` seeds the stochastic rounding: element
    ``start + i`` uses the hash of (key, start + i), so results do not depend on how the array
    was split.
    """
    stochastic = mode == STOCHASTIC
    how = Store(source, target, dst_codec, mode, bool(saturate))
    load_item, store_item = loader(source), storer(how)

    # One loop per kernel, chosen here rather than inside the kernel: with a single call site
    # LLVM inlines the helpers into the loop and vectorises it (inlining them in numba's IR
    # instead triples the compile time for the same machine code).
    if layout == ELEMENTWISE:

        @jit
        def kernel(src, dst, key, start):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            rnd = np.uint32(0)
            for i in range(src.size):
                if stochastic:
                    rnd = random_bits(key_lo, key_hi, start + i)
                u = load_item(src[i], src_codec)
                dst[i] = store_item(src[i], u, rnd, how)

    elif layout == PACK_NIBBLES:

        @jit
        def kernel(src, dst, key, start):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            rnd_lo = np.uint32(0)
            rnd_hi = np.uint32(0)
            for k in range(dst.size):
                if stochastic:
                    rnd_lo = random_bits(key_lo, key_hi, start + 2 * k)
                    rnd_hi = random_bits(key_lo, key_hi, start + 2 * k + 1)
                a = src[2 * k]
                b = src[2 * k + 1]
                lo = store_item(a, load_item(a, src_codec), rnd_lo, how)
                hi = store_item(b, load_item(b, src_codec), rnd_hi, how)
                dst[k] = nibble_pair(lo, hi)

    else:

        @jit
        def kernel(src, dst, key, start):  # pragma: no cover - compiled
            key_lo, key_hi = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
            rnd_lo = np.uint32(0)
            rnd_hi = np.uint32(0)
            for k in range(src.size):
                if stochastic:
                    rnd_lo = random_bits(key_lo, key_hi, start + 2 * k)
                    rnd_hi = random_bits(key_lo, key_hi, start + 2 * k + 1)
                a = nibble(src[k], 0)
                b = nibble(src[k], 1)
                dst[2 * k] = store_item(a, load_item(a, src_codec), rnd_lo, how)
                dst[2 * k + 1] = store_item(b, load_item(b, src_codec), rnd_hi, how)

    return kernel


@jit
def copy_items(src, dst, key, start):  # pragma: no cover - compiled
    """Item by item with C conversion semantics (integer to integer: wrap, as numpy does)."""
    for i in range(src.size):
        dst[i] = src[i]


@jit
def look_up_items(src, table, dst):  # pragma: no cover - compiled
    """``dst[i] = table[src[i]]``: a cast of codes through the table of its results for every
    code (see :func:`neuron_kernels.kernels.compiled._by_table`)."""
    for i in range(src.size):
        dst[i] = table[src[i]]
