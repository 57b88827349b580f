"""The producers' recipes (:mod:`neuron_kernels.recipes`) as kernels made from the recipe table's
numbers: one closure per source, recipe rule and format (:class:`RecipeSpec`), whose rule, codecs
and constants are compiled in (made when first used, and cached on disk).

:func:`recipe_rows` makes the kernel that quantises rows blocked along their last axis: each
block's scale from its amax by the recipe's rule, or, for 2-D tiles and whole matrices, from the
tiles' amaxes found first by :func:`recipe_amax`'s kernel and turned into scales by
:func:`recipe_scales`'s; then each element by the recipe's element rule. The arithmetic is the
producers' own, operation by operation, in float32 with the intermediate roundings they make
(docs/recipes.md)."""

from __future__ import annotations

import math
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from .._jit import f32_bits, f32_from_bits, jit, u32_and
from ..recipes import ELEMENT_RULES, SCALE_RULES, ZERO_SIGNS
from . import codec as C
from .block_kernels.elements import load_value, nearest_even
from .block_kernels.runs import pair_bytes
from .block_kernels.scales import row_amax
from .block_kernels.spec import Element

__all__ = ["RecipeSpec", "recipe_rows", "recipe_amax", "recipe_scales", "rule_id", "element_id", "zero_id"]

CT_E4M3, MODELOPT_E4M3, GGML_UE4M3, CT_E8M0, GGML_E8M0, MODELOPT_E8M0, CT_FLOAT, NXD_FLOAT = (
    SCALE_RULES.index(r)
    for r in (
        "ct_e4m3", "modelopt_e4m3", "ggml_ue4m3", "ct_e8m0", "ggml_e8m0", "modelopt_e8m0", "ct_float", "nxd_float"
    )
)  # fmt: skip
DIVIDE, MULTIPLY, GGML = (ELEMENT_RULES.index(r) for r in ("divide", "multiply", "ggml"))
KEPT, NEGATIVE, POSITIVE = (ZERO_SIGNS.index(z) for z in ("kept", "negative", "positive"))


def rule_id(name: str) -> int:
    return SCALE_RULES.index(name)


def element_id(name: str) -> int:
    return ELEMENT_RULES.index(name)


def zero_id(name: str) -> int:
    return ZERO_SIGNS.index(name)


@jit(inline="always")
def _w(v, wc):  # pragma: no cover - compiled
    """The finite float32 ``v`` rounded to the intermediate dtype (codec ``wc``; none: float32, as
    is; bfloat16: its pattern's top half, rounded to nearest even in integer arithmetic)."""
    if wc.bits == 0:
        return v
    if wc.bits == 16 and wc.mbits == 7:
        b = f32_bits(v)
        return f32_from_bits(u32_and(b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)), 0xFFFF0000))
    code = C.encode(f32_bits(v), np.uint32(0), np.uint32(0), wc, C.NEAREST_EVEN, False)
    return f32_from_bits(C.decode(code, wc))


@jit(inline="always")
def _pow2(e):  # pragma: no cover - compiled
    """2^e as a float32 (e in [-149, 128]; 128: infinity), exactly."""
    if e >= -126:
        return f32_from_bits(np.uint32(min(e + 127, 255)) << np.uint32(23))
    return f32_from_bits(np.uint32(1) << np.uint32(e + 149))


@jit
def _ue4m3(x, top):  # pragma: no cover - compiled
    """ggml's ``ggml_fp32_to_ue4m3``: half-up rounding, subnormals too, 256 and up -> 0x7E."""
    if not x > 0:
        return 0
    if x > top:
        x = top
    bits = f32_bits(x)
    e = np.int64((bits >> np.uint32(23)) & np.uint32(0xFF)) - 127
    man = np.int64((bits >> np.uint32(20)) & np.uint32(7))
    ue = e + 7
    if ue <= 0:
        m = np.int64(x * np.float32(512.0) + np.float32(0.5))
        return 0 if m < 1 else min(m, 7)
    if ue >= 15:
        return 0x7E
    man += np.int64((bits >> np.uint32(19)) & np.uint32(1))
    if man > 7:
        man = 0
        ue += 1
        if ue >= 15:
            return 0x7E
    return (ue << 3) | man


@jit(inline="always")
def _ue4m3_half(b):  # pragma: no cover - compiled
    """ggml's ``ggml_ue4m3_to_fp32``: half the value of the UE4M3 byte (0 for 0x00 and 0x7F)."""
    if b == 0 or b == 0x7F:
        return np.float32(0.0)
    ex = (b >> 3) & 0xF
    man = b & 7
    raw = (
        np.float32(man) * _pow2(-9)
        if ex == 0
        else (np.float32(1.0) + np.float32(man) / np.float32(8.0)) * _pow2(ex - 7)
    )
    return raw * np.float32(0.5)


@jit(inline="always")
def _floor_log2f(a):  # pragma: no cover - compiled
    """``floor(log2f(a))`` of a positive float32, log2f correctly rounded to float32: the exponent
    of a normal ``a``, except where log2f rounds up to the next integer (a significand within
    2^-11 of 2, or a subnormal ``a``), which takes the logarithm itself."""
    b = f32_bits(a)
    if (b >> np.uint32(23)) != 0 and (b & np.uint32(0x7FFFFF)) < np.uint32(0x7FF000):
        return np.int64(b >> np.uint32(23)) - 127
    return np.int64(math.floor(np.float32(math.log2(np.float64(a)))))


@jit(inline="always")
def _ceil_log2f(r):  # pragma: no cover - compiled
    """``ceil(log2(r))`` of a positive float32, the logarithm rounded to float32 first (torch's): the
    exponent of a normal power of two, the exponent plus one where the significand is far enough
    above 1 for the rounded logarithm to stay above the integer, else the logarithm itself."""
    b = f32_bits(r)
    ex = np.int64(b >> np.uint32(23))
    man = b & np.uint32(0x7FFFFF)
    if ex != 0 and man == 0:
        return ex - 127
    if ex != 0 and man > np.uint32(64):
        return ex - 126
    return np.int64(math.ceil(np.float32(math.log2(np.float64(r)))))


@jit(inline="always")
def _block_scale(a, rule, g, max_el, emax, bump, top, lowest, eps, sc, wc):  # pragma: no cover - compiled
    """(stored, v): a block's scale as stored (a byte, or a float scale's float32 pattern) and the
    float32 its elements are divided or multiplied by (ggml: the half scale; ``ct_e8m0``: the
    reciprocal of the divisor, its elements multiplied by it), from its finite
    amax ``a`` by the rule ``rule`` (see :data:`neuron_kernels.recipes.SCALE_RULES`)."""
    zero = np.uint32(0)
    if rule == CT_E4M3:
        t = min(max(g * _w(a / max_el, wc), -top), top)
        byte = C.encode(f32_bits(t), zero, zero, sc, C.NEAREST_EVEN, True)
        s = f32_from_bits(C.decode(byte, sc))
        if s == 0:
            byte = C.encode(f32_bits(eps), zero, zero, sc, C.NEAREST_EVEN, True)
            s = eps
        return np.uint32(byte), s / g
    if rule == MODELOPT_E4M3:
        t = a / (max_el * g)
        t = np.float32(1.0) if t == 0 else t
        t = min(max(t, lowest), top)
        byte = C.encode(f32_bits(t), zero, zero, sc, C.NEAREST_EVEN, True)
        return np.uint32(byte), f32_from_bits(C.decode(byte, sc)) * g
    if rule == GGML_UE4M3:
        byte = _ue4m3(a / max_el, top)
        return np.uint32(byte), _ue4m3_half(byte)
    if rule == GGML_E8M0:
        e = 0
        if a > 0:
            e = (_floor_log2f(a) - emax + 127) & 0xFF
        half = f32_from_bits(np.uint32(0x00200000) << np.uint32(e)) if e < 2 else _pow2(e - 128)
        return np.uint32(e), half
    if rule == MODELOPT_E8M0:
        e = -127
        if a > 0:
            e = max(-127, min(127, _ceil_log2f(a / max_el)))
        return np.uint32(e + 127), _pow2(-e)
    if rule == CT_E8M0:
        p = u32_and(f32_bits(a) + (np.uint32(1) << np.uint32(22 - bump)), 0x7F800000)
        if p == 0:
            byte = 0
        elif p == 0x7F800000:
            byte = 255
        else:
            byte = max(0, min(255, np.int64(p >> np.uint32(23)) - emax))
        # elements are divided by W(2^(byte - 127)): multiplied by its exact reciprocal instead (the
        # same float32 quotient; 0 for byte 255, whose divisor is infinite)
        return np.uint32(byte), _pow2(127 - byte) if byte < 255 else np.float32(0.0)
    if rule == NXD_FLOAT:  # the floor is ``eps``
        s = max(a / max_el, eps)
        return f32_bits(s), s
    # CT_FLOAT
    s = _w(a / max_el, wc)
    s = eps if s == 0 else s
    return f32_bits(s), s


#: The element loop's run over long blocks (a constant trip count, which unrolls and vectorises).
_RUN = 64

#: The positive E2M1 codes' doubled values (ggml's ``kvalues_mxfp4[1:8]``).
_KPOS = np.array([1, 2, 3, 4, 6, 8, 12], np.float32)


@jit(inline="always")
def _code(x, v, elements, zero, el, qc):  # pragma: no cover - compiled
    """The code of the float32 ``x`` under its block's ``v`` by the element rule ``elements``
    (``el``: the element's :class:`~.block_kernels.spec.Element`). ggml's arg-min over the 16 codes is
    taken over the 7 non-zero ones of ``x``'s sign against the zero code (a code of the other sign
    is never nearer, and the lower index wins a tie: the +0 code is index 0); ``|k * v - x|`` is
    ``|k * v - |x||`` for the negative codes, exactly. Otherwise the quotient (``x / v``, or ``x *
    v``: MX multiplies by the power of two's exact reciprocal, the same float32), rounded to the
    intermediate dtype, is rounded to nearest even, saturating."""
    if elements == GGML:
        ax = abs(x)
        best = np.uint32(0)
        best_err = ax
        for i in range(7):  # branch-free: the loop vectorises across elements
            err = abs(_KPOS[i] * v - ax)
            better = err < best_err
            best = np.uint32(i + 1) if better else best
            best_err = err if better else best_err
        return best + np.uint32(8) if (x < 0) & (best != 0) else best
    q = _w(x / v if elements == DIVIDE else x * v, qc)
    code = np.uint32(nearest_even(q, el, False))
    sign = np.uint32(1 << (el.codec.bits - 1))
    if zero != KEPT and u32_and(code, sign - np.uint32(1)) == 0:
        return sign if (zero == NEGATIVE) & (q < 0) else np.uint32(0)
    return code


class RecipeSpec(NamedTuple):
    """What a recipe kernel is specialised on (compile-time constants): the source (``kind``,
    ``xc``), the element, scale and intermediate codecs, the rule ids and the format's numbers."""

    kind: int
    xc: C.Codec
    el: Element
    sc: C.Codec
    wc: C.Codec
    qc: C.Codec
    rule: int
    elements: int
    zero: int
    max_el: np.float32
    emax: int
    bump: int
    top: np.float32
    lowest: np.float32
    eps: np.float32


@cache
def recipe_amax(spec: RecipeSpec) -> Any:
    """Kernel ``(x, amax, block, r0, r1)``: the largest |x| pattern of each block of ``block``
    along the rows ``[r0, r1)`` of the 2-D ``x`` into ``amax`` (rows, blocks) uint32 (an
    infinity's or a NaN's where it holds one): the first pass of tiles and whole matrices."""
    p = spec

    @jit
    def kernel(x, amax, block, r0, r1):  # pragma: no cover - compiled
        cols = x.shape[1]
        for r in range(r0, r1):
            xr = x[r]
            for b in range(amax.shape[1]):
                l0 = np.uint64(b * block)
                l1 = np.uint64(min(b * block + block, cols))
                amax[r, b] = row_amax(xr, l0, l1, p.kind, p.xc, 0, 0, 0)

    return kernel


@cache
def recipe_scales(spec: RecipeSpec) -> Any:
    """Kernel ``(amax, stored, vals, g)``: the scales of blocks (or tiles) from their finite amax
    patterns ``amax`` (flat): stored into ``stored``, the element divisors or multipliers into
    ``vals`` (see :func:`_block_scale`); ``g`` the global scale."""
    p = spec

    @jit
    def kernel(amax, stored, vals, g):  # pragma: no cover - compiled
        for k in range(amax.size):
            stored[k], vals[k] = _block_scale(
                f32_from_bits(amax[k]), p.rule, g, p.max_el, p.emax, p.bump, p.top, p.lowest, p.eps, p.sc, p.wc
            )

    return kernel


@cache
def recipe_rows(spec: RecipeSpec, vlen: int, pack: bool) -> Any:
    """Kernel ``(x, codes, scales, vals, block, tile_rows, g, r0, r1)``: rows ``[r0, r1)`` of the
    2-D ``x`` (float32 patterns, 16-bit float codes or float64, as ``spec.kind`` says) quantised in
    blocks of ``block`` along the last axis: codes into ``codes`` (two per byte with ``pack``, the
    even element low), each block's scale into ``scales`` (rows, blocks). With ``vals`` empty,
    each block's scale comes from its own amax; otherwise ``vals`` (row tiles, blocks) holds each
    tile's divisor or multiplier (the scales already stored), the tile of row ``r`` being
    ``r // tile_rows``. ``g``: the global scale. The blocks hold finite values only (the caller
    checks). ``vlen``: the block length compiled in (16, 32 or 64, the format's own, where the
    source has the vector amax; 0: none), whose element loops have a constant trip count, so that
    they unroll and vectorise, as :mod:`.block_kernels.runs` explains. Per row: the scales first, then the
    codes one per byte, then (``pack``) paired."""
    p = spec
    v16, v32, v64 = (vlen if vlen == n else 0 for n in (16, 32, 64))

    @jit
    def kernel(x, codes, scales, vals, block, tile_rows, g, r0, r1):  # pragma: no cover - compiled
        cols = x.shape[1]
        nb = -(-cols // block)
        row_vals = np.empty(nb, np.float32)
        amaxes = np.empty(nb, np.uint32)
        words = np.empty(cols // 2 + 1, np.uint16)
        one = words.view(np.uint8)
        for r in range(r0, r1):
            xr = x[r]
            if vals.shape[0] == 0:  # the amaxes, then the scales in a loop of their own (it vectorises)
                for b in range(nb):
                    l0 = np.uint64(b * block)
                    l1 = np.uint64(min(b * block + block, cols))
                    amaxes[b] = row_amax(xr, l0, l1, p.kind, p.xc, v16, v32, v64)
                sr = scales[r]
                for b in range(nb):
                    stored, v = _block_scale(
                        f32_from_bits(amaxes[b]),
                        p.rule,
                        g,
                        p.max_el,
                        p.emax,
                        p.bump,
                        p.top,
                        p.lowest,
                        p.eps,
                        p.sc,
                        p.wc,
                    )
                    sr[b] = stored
                    row_vals[b] = v
            else:
                row_vals[:] = vals[r // tile_rows]
            dst = one if pack else codes[r]
            for b in range(nb):
                v = row_vals[b]
                l0 = np.uint64(b * block)
                if vlen != 0 and b * block + vlen <= cols:
                    for k in range(vlen):  # a constant trip count
                        i = l0 + np.uint64(k)
                        dst[i] = _code(
                            f32_from_bits(load_value(xr[i], p.kind, p.xc)), v, p.elements, p.zero, p.el, p.qc
                        )
                else:  # long or partial blocks: runs of a constant trip count, then the rest
                    l1 = np.uint64(min(b * block + block, cols))
                    i0 = l0
                    while i0 + np.uint64(_RUN) <= l1:
                        for k in range(_RUN):
                            i = i0 + np.uint64(k)
                            dst[i] = _code(
                                f32_from_bits(load_value(xr[i], p.kind, p.xc)), v, p.elements, p.zero, p.el, p.qc
                            )
                        i0 += np.uint64(_RUN)
                    for i in range(i0, l1):
                        dst[i] = _code(
                            f32_from_bits(load_value(xr[i], p.kind, p.xc)), v, p.elements, p.zero, p.el, p.qc
                        )
            if pack:
                cr = codes[r]
                for j in range(cols // 2):
                    cr[j] = pair_bytes(words[j])
                if cols % 2:
                    cr[cols // 2] = one[cols - 1]

    return kernel
