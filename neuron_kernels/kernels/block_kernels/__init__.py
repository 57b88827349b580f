"""Numba kernels of the block-scaled formats (MX, NVFP4, FP8 with float scales): quantise, dequantise,
fake-quantise.

Geometry. *Row* kernels take (A, L) arrays with blocks of ``size`` consecutive elements along L,
the last axis (the fast path). *Tile* kernels take (A, R, C) arrays with tiles of ``rows x cols``
over (R, C): a 1-D block along an axis that is not the last is a tile ``(size, 1)`` of the array
seen as (outer, L, inner); a 2-D block is a tile over the last two axes. A *task* is one (row,
block) pair of a row kernel, or one row of tiles of a tile kernel; a kernel runs the tasks
``[t0, t1)``, so that threads share an array without sharing a block.

Scales come from the block's amax read as a float32 bit pattern (the integer max of |x|
patterns; NaN patterns are the largest), never from a floating-point log2; a float32 block of 16,
32 or 64 is reduced as one vector. The scale rule (``modes.SCALE_MODES``) and the scale policy
(plain, four-over-six, MSE search) are run-time arguments; the element format, the source, the
rounding mode and the layout are compiled in.

Flags. A helper that branches on the format (e8m0 or e4m3fn scales, the rounding mode,
fixed-point elements, the source kind) takes the decision as an argument of its own
(:func:`~.spec.flags`). A kernel passes constants of its closure, so numba drops the branches not
taken before typing them and compiles only the kernel's own path (it cannot see through a field
of a tuple constant); the shared scale loops pass the run-time fields and serve every format.

Elements. MX (e8m0 scales): an element is ``x * (1 / X)``, a product by a power of two, exact
where it matters (see :func:`~.elements.nearest_even`). NVFP4 (e4m3fn scales ``s``): ``x * (1 / s)``
single-level, ``x * ((1 / pts) / s)`` two-level, each operation rounded to float32, as torchao's
``nvfp4_quantize`` computes it (torchao 0.18 and later; earlier releases divided). The result is
encoded with saturation, under ``nearest_even`` by float arithmetic of its own, in the other
modes by the cast codec's generic encoder. Dequantised values are ``P * X`` (exact) and ``P * s``
or ``P * float32(pts * s)``.

Modules, one per job:

- :mod:`.spec`: what a kernel is specialised on (:class:`~.spec.Source`, :class:`~.spec.Element`,
  :class:`~.spec.Scale`), the ids of scale modes and policies, the flags;
- :mod:`.elements`: the element's rounding and encoding, the source loader;
- :mod:`.scales`: the scale rules and the scale policies (four-over-six, MSE search);
- :mod:`.rows`: the row kernels (blocks along the last axis): their task loop, scale loop and
  per-block element loops;
- :mod:`.tiles`: the tile kernels (1-D blocks along another axis, 2-D blocks), one task loop for
  both;
- :mod:`.runs`: the element loops over runs of whole blocks of 16 (NVFP4's; a constant trip
  count per block, multipliers computed per run, 4-bit codes paired as 16-bit words): the
  specialised binding of the per-block loops of :mod:`.rows`, which serve every other block
  length;
- :mod:`.policies`: the scale policies evaluated for up to 64 blocks at once (one float64 lane
  per block and candidate, each summed in the shared loop's order), the specialised binding of
  :func:`~.rows.row_scales` for nearest-even rounding of float32 and 16-bit sources;
- :mod:`.hadamard`: the random Hadamard rotation of a 16-element group;
- :mod:`.rotated`: the kernels of the rotation and of the rotated input's amax (the row kernels
  of the rotated input are :mod:`.rows`' own, which rotate each run of blocks into a scratch row
  first);
- :mod:`.error_sums`: the error statistics, every element folded by one helper;
- :mod:`.factories`: the public kernels, one compiled closure per specialisation.
"""

from .error_sums import N_SUMS, error_sums, quantize_error_kernel, row_error_kernel
from .factories import binding, dequantize_kernel, fake_quantize_kernel, finite_amax_kernel, quantize_kernel
from .rotated import rotate_kernel, rotated_amax_kernel
from .spec import PACK_COLS, PACK_ROWS, PLAIN, input_view, policy_id, scale_mode_id

__all__ = [
    "N_SUMS",
    "PACK_COLS",
    "PACK_ROWS",
    "PLAIN",
    "input_view",
    "scale_mode_id",
    "policy_id",
    "binding",
    "quantize_kernel",
    "fake_quantize_kernel",
    "dequantize_kernel",
    "finite_amax_kernel",
    "rotate_kernel",
    "rotated_amax_kernel",
    "row_error_kernel",
    "quantize_error_kernel",
    "error_sums",
]
