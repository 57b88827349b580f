"""The block kernels, by specialisation: one compiled closure per source, format, rounding mode and
layout, made once per process (the compiled code is cached on disk)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..._jit import jit, u32_and
from ...formats import BlockFormat
from .elements import load_value
from .policies import MAX_SIZE, groups_policies
from .rows import row_dequantize, row_fake_quantize, row_quantize
from .spec import element_of, own_length, scale_of, source_of, vector_length
from .tiles import tile_dequantize, tile_fake_quantize, tile_quantize


@cache
def quantize_kernel(
    source: str,
    fmt: BlockFormat,
    rounding: str,
    pack: int,
    row: bool,
    rotate: bool = False,
    policies: bool = False,
    rule: str = "",
) -> Any:
    """Row kernel ``(x, codes, scales, size, mode, policy, pts, key, idx0, signs, t0, t1)`` on (A, L)
    arrays (``pack``: FP4 codes two per byte along L), or tile kernel ``(x, codes, scales, rows,
    cols, mode, policy, pts, key, idx0, t0, t1)`` on (A, R, C) arrays (``pack``: ``PACK_*``).

    ``mode``, ``policy``: :func:`~.spec.scale_mode_id`, :func:`~.spec.policy_id`; ``pts``: the per-tensor scale
    (float32; 0 for none); ``idx0``: the C-order index of x's first element in the whole array
    (the stochastic bits depend on it), so that an array quantised in pieces gets the bits of the
    whole. Row kernels take ``signs`` (float64) after ``idx0``: the rotation's 16 signs for the
    kernels of the rotated input (``rotate``), else an empty array. ``policies``: kernels that
    evaluate the scale policies (else ``policy`` is ignored). ``rule``: the scale mode of float
    scales, compiled in (they divide or multiply each element); "" for every other format."""
    el, sc = element_of(fmt, rounding), scale_of(fmt, policies, rule)
    if row or rotate:
        vlen = own_length(fmt) if rotate else vector_length(source, fmt)  # the rotated input is float32
        return row_quantize(source_of(source), el, sc, bool(pack), vlen, rotate)
    return tile_quantize(source_of(source), el, sc, pack)


def binding(
    source: str, fmt: BlockFormat, rounding: str, size: int, row: bool, policies: bool, quantize: bool = True
) -> str:
    """Which binding a quantise (or, ``quantize`` False, a fake-quantise) kernel runs, from the same
    decisions the kernel makers take: ``"specialised"`` where every loop has the source, the
    format, the block length and the rounding compiled in (along the last axis: the element loops
    over runs of whole blocks of :mod:`.runs`), else ``"generic"`` and the loop that is: the scale
    policies on the shared loop (stochastic or directed rounding, float64 sources, blocks longer
    than :data:`~.policies.MAX_SIZE`, tiles), or the block amax by the scalar loop (a block length
    other than the format's own, or a source without the vector reduction)."""
    src, el = source_of(source), element_of(fmt, rounding)
    if policies and not (row and groups_policies(src, el) and size <= MAX_SIZE):
        return "generic: policies on the shared loop"
    if row and size != vector_length(source, fmt):
        return "generic: scalar amax"
    return "specialised"


@cache
def fake_quantize_kernel(
    source: str,
    fmt: BlockFormat,
    rounding: str,
    row: bool,
    rotate: bool = False,
    policies: bool = False,
    rule: str = "",
) -> Any:
    """As :func:`quantize_kernel`, writing the dequantised values into float32 ``out`` (in place of
    codes and scales)."""
    el, sc = element_of(fmt, rounding), scale_of(fmt, policies, rule)
    if row or rotate:
        vlen = own_length(fmt) if rotate else vector_length(source, fmt)  # the rotated input is float32
        return row_fake_quantize(source_of(source), el, sc, vlen, rotate)
    return tile_fake_quantize(source_of(source), el, sc)


@cache
def dequantize_kernel(fmt: BlockFormat, pack: int, row: bool) -> Any:
    """Row kernel ``(codes, scales, out, size, pts, t0, t1)`` or tile kernel ``(codes, scales,
    out, rows, cols, pts, t0, t1)``: the values into float32 ``out`` (float scales as float32
    patterns, whatever dtype stores them)."""
    el, sc = element_of(fmt, "nearest_even"), scale_of(fmt)
    if row:
        return row_dequantize(el, sc, bool(pack), own_length(fmt))
    return tile_dequantize(el, sc, pack)


@cache
def finite_amax_kernel(source: str, finite: bool = True) -> Any:
    """Kernel ``(x, out, chunk, t0, t1)``: ``out[t]`` = the largest finite |x| pattern of
    ``x[t * chunk : (t + 1) * chunk]`` (x 1-D), 0 where there is none; with ``finite`` False, the
    largest |x| pattern of all (an infinity's or a NaN's where there is one)."""
    src = source_of(source)
    kind = src.kind
    top = np.uint32(0x7F800000) if finite else np.uint32(0xFFFFFFFF)

    @jit
    def kernel(x, out, chunk, t0, t1):  # pragma: no cover - compiled
        for t in range(t0, t1):
            seg = x[t * chunk : min(t * chunk + chunk, x.size)]  # a slice: LLVM vectorises its loop
            m = np.uint32(0)
            for i in range(seg.size):
                v = u32_and(load_value(seg[i], kind, src.codec), 0x7FFFFFFF)
                v = v if v < top else u32_and(v, 0)
                m = max(m, v)
            out[t] = m

    return kernel
