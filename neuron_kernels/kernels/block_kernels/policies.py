"""Scale policies (four-over-six, the MSE search) evaluated in vector registers: the specialised
binding of the policies' scale loop, for the kernels users train and quantise with (rounding to
nearest even, float32 and 16-bit float sources, blocks of at most :data:`MAX_SIZE`).

The shared loop (:func:`~.rows.row_scales`) sums the error of one block under one candidate
scale at a time, element after element, in float64: a chain of dependent additions with the
format's constants read at run time. Here ``GROUP`` consecutive blocks are evaluated together.
Their values are laid out element-major (``values[i, g]``: element ``i`` of block ``g``), and
candidate ``k`` of block ``g`` accumulates in lane ``g`` of ``sums[k]``. Each lane still adds its
block's errors from its first element to its last, starting at 0.0, exactly as the shared loop
does, so every sum is the same float64 number and every choice is the same. But the ``GROUP``
chains are independent, so they are one vector addition per element and candidate. The
candidates themselves come from the same helpers (:func:`~.scales.candidate`,
:func:`~.scales.multiplier`), so the choice is bit for bit the shared loop's; blocks past the
last whole group, partial blocks and longer blocks go to the shared loop."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._jit import f32_from_bits, jit
from .. import codec as C
from .elements import dequantized, load_value, scaled
from .scales import candidate, multiplier, policy_scale, row_amax, scale_byte
from .spec import BY_E4M3, FOUR_SIX_MAE, SEARCH_MSE, Element, Scale, Source

#: The most blocks evaluated together, one float64 lane each. Their count is a run-time value:
#: LLVM unrolls a loop of a constant 8 iterations before its vectoriser sees it.
GROUP = 64
#: The longest block the grouped loop takes (its scratch holds MAX_SIZE x GROUP values).
MAX_SIZE = 64
#: The most candidates a policy compares (the plain scale and four alternatives).
MAX_CANDIDATES = 5


@jit(inline="always")
def group_scratch():  # pragma: no cover - compiled
    """The scratch of :func:`grouped_scales`, made once per kernel call: candidate bytes, their
    multipliers and scales (float32), the error sums (float64), the values element-major and each
    block's amax pattern."""
    shape = (MAX_CANDIDATES, GROUP)
    return (
        np.empty(shape, np.uint32),
        np.empty(shape, np.float32),
        np.empty(shape, np.float32),
        np.empty(shape, np.float64),
        np.empty((MAX_SIZE, GROUP), np.uint32),
        np.empty(GROUP, np.uint32),
    )


def groups_policies(source: Source, el: Element) -> bool:
    """Whether kernels of this source and element rounding evaluate their policies grouped:
    nearest-even rounding (the stochastic bits and the directed encoder stay on the shared loop)
    of float32 patterns or 16-bit float codes."""
    return el.mode == C.NEAREST_EVEN and source.vector


def grouped_scales(source: Source, el: Element, sc: Scale, vlens: tuple[int, int, int]) -> Any:
    """``scales(xr, j, ng, size, mode, policy, pts, out, scratch)``: the scale bytes of the
    ``ng`` (at most ``GROUP``) whole blocks ``[j, j + ng)`` of the row ``xr`` (``size`` <= :data:`MAX_SIZE`) under the
    policy ``policy`` (not ``PLAIN``) into ``out[j:]``, the source, element and scale format
    compiled in (``vlens``: the vector lengths of the amax, see :func:`~.rows.row_amax`)."""
    kind, codec, scaling = source.kind, source.codec, sc.scaling
    fixed = el.codec.specials == C.FIXED
    v16, v32, v64 = vlens

    @jit(inline="always")
    def scales(xr, j, ng, size, mode, policy, pts, out, scratch):  # pragma: no cover - compiled
        cands, muls, steps, sums, values, amaxes = scratch
        count = 5 if (policy == SEARCH_MSE) & (scaling == BY_E4M3) else 2
        squared = policy != FOUR_SIX_MAE
        # each step a loop across the group's blocks, which vectorises (the candidates' divisions
        # included): block by block, these took 4.3 cycles an element, against 1.5
        for g in range(ng):
            l0 = np.uint64((j + g) * size)
            amaxes[g] = row_amax(xr, l0, l0 + np.uint64(size), kind, codec, v16, v32, v64)
        for g in range(ng):
            cands[0, g] = scale_byte(amaxes[g], mode, pts, sc, scaling)
        for k in range(count - 1):
            for g in range(ng):
                byte = cands[0, g]
                valid, cand = candidate(k, byte, policy, amaxes[g], pts, sc)
                cands[k + 1, g] = cand if valid else byte
        for k in range(count):
            for g in range(ng):
                mul, step = multiplier(cands[k, g], pts, sc, scaling)
                muls[k, g] = mul
                steps[k, g] = step
        for g in range(ng):
            l0 = np.uint64((j + g) * size)
            for i in range(size):
                values[i, g] = load_value(xr[l0 + np.uint64(i)], kind, codec)
        for k in range(count):
            for g in range(ng):
                sums[k, g] = 0.0
        for i in range(size):
            for k in range(count):
                if squared:
                    for g in range(ng):
                        u = values[i, g]
                        v = scaled(u, muls[k, g], scaling)
                        d = np.float64(dequantized(v, np.uint32(0), steps[k, g], el, C.NEAREST_EVEN, fixed))
                        d = d - np.float64(f32_from_bits(u))
                        sums[k, g] += d * d
                else:
                    for g in range(ng):
                        u = values[i, g]
                        v = scaled(u, muls[k, g], scaling)
                        d = np.float64(dequantized(v, np.uint32(0), steps[k, g], el, C.NEAREST_EVEN, fixed))
                        sums[k, g] += abs(d - np.float64(f32_from_bits(u)))
        for g in range(ng):
            chosen = cands[0, g]
            if policy_scale(chosen, amaxes[g], policy, pts, sc):
                best = sums[0, g]
                for k in range(1, count):
                    if sums[k, g] < best:
                        best, chosen = sums[k, g], cands[k, g]
            out[j + g] = chosen

    return scales
