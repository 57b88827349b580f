"""The producers' recipes (:mod:`neuron_kernels.recipes`) as one generic kernel: the rules arrive
as numbers, so a single compilation per input dtype serves every recipe and format (they are the
long tail: the package's own kernels are the specialised ones).

:func:`recipe_rows` quantises rows blocked along their last axis: each block's scale from its
amax by the recipe's rule, or, for 2-D tiles and whole matrices, from the tiles' amaxes found
first by :func:`recipe_amax` and turned into scales by :func:`recipe_scales`; then each element
by the recipe's element rule. The arithmetic is the producers' own, operation by operation, in
float32 with the intermediate roundings they make (docs/recipes.md)."""

from __future__ import annotations

import math

import numpy as np

from .._jit import f32_bits, f32_from_bits, jit, u32_and
from ..recipes import ELEMENT_RULES, SCALE_RULES, ZERO_SIGNS
from . import codec as C
from . import sources as S

__all__ = ["recipe_rows", "recipe_amax", "recipe_scales", "rule_id", "element_id", "zero_id"]

CT_E4M3, MODELOPT_E4M3, GGML_UE4M3, CT_E8M0, GGML_E8M0, MODELOPT_E8M0, CT_FLOAT = (
    SCALE_RULES.index(r)
    for r in ("ct_e4m3", "modelopt_e4m3", "ggml_ue4m3", "ct_e8m0", "ggml_e8m0", "modelopt_e8m0", "ct_float")
)
DIVIDE, MULTIPLY, GGML = (ELEMENT_RULES.index(r) for r in ("divide", "multiply", "ggml"))
KEPT, NEGATIVE, POSITIVE = (ZERO_SIGNS.index(z) for z in ("kept", "negative", "positive"))

#: ggml's ``kvalues_mxfp4``: twice the E2M1 value of each code.
_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def rule_id(name: str) -> int:
    return SCALE_RULES.index(name)


def element_id(name: str) -> int:
    return ELEMENT_RULES.index(name)


def zero_id(name: str) -> int:
    return ZERO_SIGNS.index(name)


@jit(inline="always")
def _w(v, wc):  # pragma: no cover - compiled
    """The float32 ``v`` rounded to the intermediate dtype (codec ``wc``; none: float32, as is)."""
    if wc.bits == 0:
        return v
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


@jit
def _block_scale(a, rule, g, max_el, emax, bump, top, lowest, eps, sc, wc):  # pragma: no cover - compiled
    """(stored, v): a block's scale as stored (a byte, or a float scale's float32 pattern) and the
    float32 its elements are divided or multiplied by (ggml: the half scale), from its finite
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
            e = (np.int64(math.floor(np.float32(math.log2(np.float64(a))))) - emax + 127) & 0xFF
        half = f32_from_bits(np.uint32(0x00200000) << np.uint32(e)) if e < 2 else _pow2(e - 128)
        return np.uint32(e), half
    if rule == MODELOPT_E8M0:
        e = -127
        if a > 0:
            e = max(-127, min(127, np.int64(math.ceil(np.float32(math.log2(np.float64(a / max_el)))))))
        return np.uint32(e + 127), _pow2(-e)
    if rule == CT_E8M0:
        p = u32_and(f32_bits(a) + (np.uint32(1) << np.uint32(22 - bump)), 0x7F800000)
        if p == 0:
            byte = 0
        elif p == 0x7F800000:
            byte = 255
        else:
            byte = max(0, min(255, np.int64(p >> np.uint32(23)) - emax))
        return np.uint32(byte), _w(_pow2(byte - 127), wc)
    # CT_FLOAT
    s = _w(a / max_el, wc)
    s = eps if s == 0 else s
    return f32_bits(s), s


@jit(inline="always")
def _code(x, v, elements, zero, ec, qc):  # pragma: no cover - compiled
    """The code of the float32 ``x`` under its block's ``v`` by the element rule ``elements``."""
    if elements == GGML:
        best = 0
        best_err = abs(np.float32(0.0) * v - x)
        lo = 1 if x >= 0 else 9
        for i in range(lo, lo + 7):
            err = abs(_KVALUES[i] * v - x)
            if err < best_err:
                best = i
                best_err = err
        return np.uint32(best)
    q = _w(x / v if elements == DIVIDE else x * v, qc)
    code = C.encode(f32_bits(q), np.uint32(0), np.uint32(0), ec, C.NEAREST_EVEN, True)
    if u32_and(code, ec.sign_bit - 1) == 0 and zero != KEPT:
        return np.uint32(ec.sign_bit) if (zero == NEGATIVE) & (q < 0) else np.uint32(0)
    return np.uint32(code)


@jit
def recipe_amax(x, amax, block, kind, xc, r0, r1):  # pragma: no cover - compiled
    """The largest |x| pattern of each block of ``block`` along the rows ``[r0, r1)`` of the 2-D
    ``x`` into ``amax`` (rows, blocks) uint32 (an infinity's or a NaN's where it holds one)."""
    cols = x.shape[1]
    for r in range(r0, r1):
        for b in range(amax.shape[1]):
            m = np.uint32(0)
            for i in range(b * block, min(b * block + block, cols)):
                m = max(m, u32_and(S.load(x[r, i], kind, xc), 0x7FFFFFFF))
            amax[r, b] = m


@jit
def recipe_scales(amax, stored, vals, rule, g, max_el, emax, bump, top, lowest, eps, sc, wc):  # pragma: no cover
    """The scales of blocks (or tiles) from their finite amax patterns ``amax`` (flat): stored
    into ``stored``, the element divisors or multipliers into ``vals`` (see :func:`_block_scale`)."""
    for k in range(amax.size):
        stored[k], vals[k] = _block_scale(f32_from_bits(amax[k]), rule, g, max_el, emax, bump, top, lowest, eps, sc, wc)


@jit
def recipe_rows(x, codes, scales, vals, block, tile_rows, kind, xc, ec, sc, wc, qc, rule, elements, zero, g, max_el,
                emax, bump, top, lowest, eps, pack, r0, r1):  # fmt: skip  # pragma: no cover - compiled
    """Rows ``[r0, r1)`` of the 2-D ``x`` (float32 patterns, 16-bit float codes or float64: ``kind``
    and ``xc`` as :func:`~.sources.load` takes them) quantised in blocks of ``block`` along the last
    axis (``wc``, ``qc``: the codecs of the scale's and the quotient's intermediate dtypes): codes
    into ``codes`` (two per byte with ``pack``, the even element low), each block's scale into
    ``scales`` (rows, blocks). With ``vals`` empty, each block's scale comes from its own amax;
    otherwise ``vals`` (row tiles, blocks) holds each tile's divisor or multiplier (the scales
    already stored), the tile of row ``r`` being ``r // tile_rows``. The blocks hold finite values
    only (the caller checks)."""
    cols = x.shape[1]
    nb = -(-cols // block)
    for r in range(r0, r1):
        for b in range(nb):
            l0 = b * block
            l1 = min(l0 + block, cols)
            if vals.shape[0] == 0:
                m = np.uint32(0)
                for i in range(l0, l1):
                    m = max(m, u32_and(S.load(x[r, i], kind, xc), 0x7FFFFFFF))
                stored, v = _block_scale(f32_from_bits(m), rule, g, max_el, emax, bump, top, lowest, eps, sc, wc)
                scales[r, b] = stored
            else:
                v = vals[r // tile_rows, b]
            if pack:
                for i in range(l0, l1, 2):
                    lo = _code(f32_from_bits(S.load(x[r, i], kind, xc)), v, elements, zero, ec, qc)
                    hi = np.uint32(0)
                    if i + 1 < l1:
                        hi = _code(f32_from_bits(S.load(x[r, i + 1], kind, xc)), v, elements, zero, ec, qc)
                    codes[r, i >> 1] = lo | (hi << np.uint32(4))
            else:
                for i in range(l0, l1):
                    codes[r, i] = _code(f32_from_bits(S.load(x[r, i], kind, xc)), v, elements, zero, ec, qc)
