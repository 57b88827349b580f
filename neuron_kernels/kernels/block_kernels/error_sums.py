"""Error statistics of block quantisation: per-row sums from codes (:func:`row_error_kernel`) or
from a pass that writes no codes (:func:`quantize_error_kernel`), and over flat arrays
(:func:`error_sums`)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..._jit import f32_from_bits, jit
from ...formats import BlockFormat
from .. import codec as C
from ..nibble_kernels import nibble
from .elements import dequantized, element_value, load_value, scaled
from .rows import row_scales, scale_scratch
from .scales import multiplier
from .spec import element_of, flags, scale_of, source_of

#: The sums of the error statistics, in the order kernels store them.
N_SUMS = 7  # count, sum x^2, sum err^2, max |err|, max |err| / |x|, saturated, flushed


@jit(inline="always")
def _no_errors():  # pragma: no cover - compiled
    """The sums of no element (see :func:`_add_error`)."""
    return np.int64(0), 0.0, 0.0, 0.0, 0.0, np.int64(0), np.int64(0)


@jit(inline="always")
def _add_error(sums, x, d, q, lim):  # pragma: no cover - compiled
    """The sums (count, sum x^2, sum err^2, max |err|, max |err| / |x| over x != 0, saturated
    count, flushed count) with one more element: ``x`` (float64), its dequantised value ``d``
    (float64), the value as quantised ``q`` (x, or x rotated; float64) and the largest value its
    block can hold ``lim`` (max element times the block's scale): err = |x - d|, saturated when
    |q| > lim, flushed when d == 0 for x != 0. An element with a non-finite x or a NaN dequantised
    value (blocks holding a NaN or an infinity) is left out. The one accumulation of the error
    statistics: the row kernels and :func:`error_sums` fold every element through it."""
    count, signal, noise, max_abs, max_rel, saturated, flushed = sums
    if not np.isfinite(x) or np.isnan(d):
        return sums
    err = abs(x - d)
    if x != 0:
        max_rel = max(max_rel, err / abs(x))
        flushed += d == 0
    return count + 1, signal + x * x, noise + err * err, max(max_abs, err), max_rel, saturated + (abs(q) > lim), flushed


@jit(inline="always")
def _store_errors(out, r, sums):  # pragma: no cover - compiled
    """The sums into ``out[r, :N_SUMS]``, in their order."""
    count, signal, noise, max_abs, max_rel, saturated, flushed = sums
    out[r, 0] = count
    out[r, 1] = signal
    out[r, 2] = noise
    out[r, 3] = max_abs
    out[r, 4] = max_rel
    out[r, 5] = saturated
    out[r, 6] = flushed


@cache
def row_error_kernel(source: str, fmt: BlockFormat, packed: bool) -> Any:
    """Kernel ``(x, codes, scales, size, pts, out, t0, t1)``: the error statistics of the rows
    ``[t0, t1)`` of (A, L) ``x`` quantised as ``codes``/``scales`` (1-D blocks along L), row ``r``'s
    into ``out[r]`` (see :func:`error_sums`), dequantising on the way: no array of values is
    made, and rows are independent tasks whose sums are combined in row order (so the result
    does not depend on the thread count)."""
    src = source_of(source)
    el, sc = element_of(fmt, "nearest_even"), scale_of(fmt)
    top = fmt.element_format.max_code
    kind, _, _, scaling = flags(src, el, sc)
    n_codes = 1 << fmt.element_bits

    @jit
    def kernel(x, codes, scales, size, pts, out, t0, t1):  # pragma: no cover - compiled
        length = x.shape[1]
        # each code's value, looked up instead of decoded per element (the same float32 product
        # as ``_value``'s; a NaN block's NaN scale makes every product NaN, left out as NaNs are)
        values = np.empty(n_codes, np.float32)
        for c in range(n_codes):
            values[c] = f32_from_bits(C.decode(np.uint32(c), el.codec))
        for r in range(t0, t1):
            xr, cr, sr = x[r], codes[r], scales[r]
            sums = _no_errors()
            for j in range(sr.size):
                _, scale = multiplier(np.uint32(sr[j]), pts, sc, scaling)
                lim = abs(np.float64(element_value(np.uint32(top), scale, el)))
                for i in range(j * size, min(j * size + size, length)):
                    code = nibble(cr[i >> 1], i & 1) if packed else np.uint32(cr[i])
                    d = np.float64(values[code] * scale)
                    xi = np.float64(f32_from_bits(load_value(xr[i], kind, src.codec)))
                    sums = _add_error(sums, xi, d, xi, lim)
            _store_errors(out, r, sums)

    return kernel


@cache
def quantize_error_kernel(source: str, fmt: BlockFormat, rule: str = "") -> Any:
    """Kernel ``(x, size, mode, policy, pts, key, out, t0, t1)``: the error statistics of the rows
    ``[t0, t1)`` of (A, L) ``x`` quantised to ``fmt`` (1-D blocks along L, rounding to nearest
    even, any scale mode and policy at run time) into ``out[r]``, as :func:`row_error_kernel`
    computes them from the codes, bit for bit, without writing codes: one kernel per source and
    format serves every scale mode and policy of a format (what the error table compares), but
    the rule of float scales (``rule``), which is compiled in."""
    src = source_of(source)
    el, sc = element_of(fmt, "nearest_even"), scale_of(fmt, True, rule)
    top = fmt.element_format.max_code
    kind, rmode, fixed, scaling = flags(src, el, sc)

    @jit
    def kernel(x, size, mode, policy, pts, key, out, t0, t1):  # pragma: no cover - compiled
        length = x.shape[1]
        nb = (length + size - 1) // size
        bytes_ = np.empty(nb, np.uint32)
        cands, errs, _, _ = scale_scratch()
        for r in range(t0, t1):
            xr = x[r]
            row_scales(xr, 0, nb, size, r * length, bytes_, mode, policy, pts, key, src, el, sc, cands, errs)
            sums = _no_errors()
            for j in range(nb):
                mul, scale = multiplier(bytes_[j], pts, sc, scaling)
                lim = abs(np.float64(element_value(np.uint32(top), scale, el)))
                for i in range(j * size, min(j * size + size, length)):
                    u = load_value(xr[i], kind, src.codec)
                    d = np.float64(dequantized(scaled(u, mul, scaling), np.uint32(0), scale, el, rmode, fixed))
                    xi = np.float64(f32_from_bits(u))
                    sums = _add_error(sums, xi, d, xi, lim)
            _store_errors(out, r, sums)

    return kernel


@jit
def error_sums(xv, dq, xs, lim):  # pragma: no cover - compiled
    """The sums behind the error statistics over flat arrays: x as float64, its dequantised
    values, the values as quantised (x, or x rotated) and the largest value each one's block can
    hold (max element times the block's scale). Elements with a non-finite x or a NaN dequantised
    value (blocks holding a NaN or an infinity) are left out. Returns (count, sum x^2, sum err^2,
    max |err|, max |err|/|x| over x != 0, saturated count, flushed count)."""
    sums = _no_errors()
    for i in range(xv.size):
        sums = _add_error(sums, xv[i], np.float64(dq[i]), np.float64(xs[i]), np.float64(lim[i]))
    return sums
