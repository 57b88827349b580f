"""The launcher of the block kernels: what the block containers ask for (quantise, fake-quantise,
dequantise, error sums, a producer's recipe, the rotation, an amax), its kernel found or compiled
(:mod:`.block_kernels`, :mod:`.recipe_kernels`) and its tasks scheduled on the package's threads.

The containers (:mod:`neuron_kernels.blocks`) say what to compute: a job (the validated options
of a :class:`~neuron_kernels.blocks.job.BlockJob`, read by attribute), an input, an output; they
reach this module through :func:`neuron_kernels.registry.block_kernels`, as casts reach theirs
through the registry, so that no module above imports a kernel module (nor numba until a kernel
is first needed). Nothing here validates: the job was.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._parallel import PARALLEL_MIN_ELEMENTS, get_num_threads, read_only, run_tasks
from ..formats import FORMATS, BlockFormat
from . import block_kernels as K
from . import codec as C
from .block_kernels import integers as INT
from .block_kernels.spec import element_of, source_of, vector_length
from .recipe_kernels import RecipeSpec, element_id, recipe_amax, recipe_rows, recipe_scales, rule_id, zero_id

__all__ = [
    "N_SUMS",
    "amax_pattern",
    "binding",
    "dequantize",
    "error_fold",
    "error_sums",
    "fake_quantize",
    "input_view",
    "integer_quantize",
    "quantize",
    "recipe_quantize",
    "rotate_rows",
    "rotated_amax_rows",
    "row_error_sums",
]

#: The error sums of a row, as the kernels store them (see :mod:`.block_kernels.error_sums`).
N_SUMS = K.N_SUMS
input_view = K.input_view
error_fold = K.error_sums


def amax_pattern(arr: np.ndarray, src: str, finite: bool) -> int:
    """The largest |x| pattern (float32 bits) of an input array: of its finite values, or of all
    (an infinity's or a NaN's where it holds one); 0 for none."""
    view = K.input_view(arr).reshape(-1)
    chunk = 1 << 16
    n = -(-view.size // chunk)
    if n == 0:
        return 0
    out = np.empty(n, np.uint32)
    run_tasks(K.finite_amax_kernel(src, finite), n, view.size, (view, out, chunk))
    return int(out.max())


def _policy(job: Any) -> int:
    return K.policy_id(job.four_over_six, job.scale_search)


def _rule(job: Any) -> str:
    """The scale mode compiled into the kernels: that of float scales, else none."""
    return job.scale_mode if job.fmt.float_scales else ""


def _pts(job: Any) -> np.float32:
    if isinstance(job.per_tensor_scale, str):
        raise RuntimeError("the per-tensor scale of this job has not been computed yet")
    return np.float32(job.per_tensor_scale or 0.0)


def _fused_rotation(job: Any, row: bool) -> bool:
    """Whether the kernel rotates (row kernels do; other layouts get a rotated copy)."""
    return job.rotation is not None and row


def _run(job: Any, kernel: Any, lay: Any, arrays: tuple[np.ndarray, ...], idx0: int, align: int = 1) -> None:
    ks = lay.kernel_shapes(split_rows=True)
    row = ks.row
    geometry = (min(job.block_size, max(ks.values[-1], 1)),) if row else lay.tile()
    options: tuple[Any, ...] = (K.scale_mode_id(job.scale_mode), _policy(job), _pts(job), job.key, idx0)
    if row:  # the rotation's signs (row kernels of the rotated input), else none
        options += (np.array(job.rotation if _fused_rotation(job, row) else (), np.float64),)
    run_tasks(kernel, ks.tasks, lay.size, (*arrays, *geometry, *options), align)


def bands(job: Any, shape: tuple[int, ...]) -> int:
    """Rows per band where a float-scale tile spans whole matrices too few to keep every thread
    busy (``fp8_tensor``: one task per matrix): the matrix's amax found first, its bands are tasks
    of their own that take it (:func:`_run_bands`); 0 otherwise."""
    if not job.fmt.float_scales or len(shape) < 2 or job.rotation is not None:
        return 0
    rows, cols = shape[-2], shape[-1]
    threads = get_num_threads()
    matrices = math.prod(map(int, shape[:-2]))
    if job.block_rows < rows or job.block_size < cols or matrices >= threads or rows < 2 * threads:
        return 0
    return -(-rows // (4 * threads)) if rows * cols >= PARALLEL_MIN_ELEMENTS else 0


def _run_bands(job: Any, kernel: Any, arr: np.ndarray, src: str, out: np.ndarray, scales: Any, idx0: int) -> None:
    """Each matrix of ``arr`` (a tile of its own) as bands of :func:`bands` rows, on every thread,
    each band given the matrix's amax pattern (all values': an infinity or a NaN makes every
    band's scale NaN, as the matrix's); the codes (or values) into ``out``, the scale into
    ``scales`` (one per matrix; None for values)."""
    rows, cols = arr.shape[-2], arr.shape[-1]
    band = bands(job, arr.shape)
    x3, o3 = K.input_view(arr).reshape(-1, rows, cols), out.reshape(-1, rows, cols)
    nb = -(-rows // band)
    words = np.empty((1, nb, 1), np.uint32)
    options = (K.scale_mode_id(job.scale_mode), _policy(job))
    for a in range(x3.shape[0]):
        given = np.uint32(amax_pattern(x3[a], src, False)).view(np.float32)
        first = idx0 + a * rows * cols
        dst = (o3[a : a + 1], words) if scales is not None else (o3[a : a + 1],)
        run_tasks(kernel, nb, rows * cols, (x3[a : a + 1], *dst, band, cols, *options, given, job.key, first))
        if scales is not None:
            scales.reshape(-1)[a] = words[0, 0, 0]


def quantize(job: Any, lay: Any, arr: np.ndarray, src: str, codes: np.ndarray, scales: np.ndarray, idx0: int) -> None:
    """The codes and scale words of ``arr`` (C-contiguous, of dtype ``src``; the rotated copy
    already made where the rotation is not fused) into ``codes`` and ``scales``."""
    ks = lay.kernel_shapes(split_rows=True)
    row = ks.row
    pack = (K.PACK_COLS if lay.two_d else K.PACK_ROWS) if job.pack and not row else int(job.pack)
    kernel = K.quantize_kernel(
        src, job.fmt, job.rounding, pack, row, _fused_rotation(job, row), _policy(job) != K.PLAIN, _rule(job)
    )
    # Two blocks of odd length along the block axis share bytes of packed codes: keep such pairs on
    # one thread (whole pairs of rows of tasks if a row has an odd number).
    align = 1
    if job.pack and not lay.two_d and job.block_size % 2:
        align = 2 if ks.scales[1] % 2 == 0 else 2 * ks.scales[1]
    if bands(job, arr.shape):
        _run_bands(job, kernel, arr, src, codes, scales, idx0)
    else:
        arrays = (K.input_view(arr).reshape(ks.values), codes.reshape(ks.codes), scales.reshape(ks.scales))
        _run(job, kernel, lay, arrays, idx0, align)


def fake_quantize(job: Any, lay: Any, arr: np.ndarray, src: str, out: np.ndarray, idx0: int) -> None:
    """The dequantised values of ``arr`` (as :func:`quantize` takes it) into the float32 ``out``."""
    ks = lay.kernel_shapes(split_rows=True)
    row, vshape = ks.row, ks.values
    kernel = K.fake_quantize_kernel(
        src, job.fmt, job.rounding, row, _fused_rotation(job, row), _policy(job) != K.PLAIN, _rule(job)
    )
    if bands(job, arr.shape):
        _run_bands(job, kernel, arr, src, out, None, idx0)
    else:
        _run(job, kernel, lay, (K.input_view(arr).reshape(vshape), out.reshape(vshape)), idx0)


def rotated_in_kernel(job: Any, lay: Any) -> bool:
    """Whether the kernels of ``lay`` rotate the input themselves (row kernels), so that the caller
    gives them the input as it is rather than a rotated copy."""
    return _fused_rotation(job, lay.kernel_shapes(split_rows=True).row)


def error_sums(job: Any, lay: Any, arr: np.ndarray, src: str) -> np.ndarray:
    """The per-row error sums (rows, N_SUMS) of quantising the C-contiguous ``arr`` blocked along
    its last axis (``lay``'s rows), from one pass that writes no codes."""
    vshape = lay.kernel_shapes().values
    sums = np.zeros((vshape[0], K.N_SUMS), np.float64)
    if arr.size:
        kernel = K.quantize_error_kernel(src, job.fmt, _rule(job))
        size = min(job.block_size, max(vshape[1], 1))
        options = (K.scale_mode_id(job.scale_mode), _policy(job), _pts(job), job.key)
        run_tasks(kernel, vshape[0], arr.size, (K.input_view(arr).reshape(vshape), size, *options, sums))
    return sums


def binding(job: Any, row: bool, src: str, quantize: bool) -> str:
    """Which binding of the kernels quantises (``quantize`` False: fake-quantises) for ``job``
    (see :func:`~.block_kernels.binding`)."""
    return K.binding(src, job.fmt, job.rounding, job.block_size, row, _policy(job) != K.PLAIN, quantize)


def integer_quantize(
    job: Any, arr: np.ndarray, src: str, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None
) -> None:
    """The codes (packed two per byte where the job packs 4-bit codes), float32 scales and, where
    ``zeros`` is given, zero points of the integer job ``job`` on ``arr`` (C-contiguous, of dtype
    ``src``, grouped along its block axis: the last, or a piece's (A, L, 1))."""
    length = arr.shape[job.axis]
    rows = arr.size // max(length, 1)
    packed = bool(job.pack) and job.fmt.packable
    torch_rule = job.rule is not None and job.rule.scale == "torch_int"
    kernel = INT.quantize_kernel(src, INT.ROUNDING_OF[job.fmt.scale], not job.fmt.zero_points, packed, torch_rule)
    grid = (rows, -1)
    spare = np.empty((1, 1), np.int8)
    args = (
        K.input_view(arr).reshape(rows, length),
        codes.reshape(rows, -1),
        scales.reshape(grid),
        spare if zeros is None else zeros.reshape(grid),
        min(job.block_size, length),
        job.fmt.element_bits,
    )
    run_tasks(kernel, rows, arr.size, args)


def _integer_dequantize(q: Any, values: np.ndarray) -> None:
    length = q.shape[q.axis]
    rows = q.size // max(length, 1)  # blocks along the last axis of the values, or of a piece's
    codes = q.codes.reshape(rows, -1)
    scales = np.ascontiguousarray(q.scales, np.float32).reshape(rows, -1)
    zeros = np.empty((1, 1), np.int8) if q.zero_points is None else q.zero_points.reshape(rows, -1)
    gidx = np.empty(0, np.int32) if q.group_index is None else np.ascontiguousarray(q.group_index, np.int32)
    kernel = INT.dequantize_kernel(
        INT.ROUNDING_OF[q.format.scale], q.zero_points is None, q.group_index is not None, bool(q.packed)
    )
    args = (read_only(codes), read_only(scales), read_only(zeros), read_only(gidx), values.reshape(rows, length))
    run_tasks(kernel, rows, q.size, (*args, min(q.block_size, length), q.format.element_bits))


def dequantize(q: Any, values: np.ndarray) -> None:
    """The values of the block array ``q`` (float32) into ``values``, of its shape."""
    if q.format.integer:
        _integer_dequantize(q, values)
        return
    lay = q.layout
    ks = lay.kernel_shapes()
    pack = (K.PACK_COLS if lay.two_d else K.PACK_ROWS) if q.packed and not ks.row else int(q.packed)
    kernel = K.dequantize_kernel(q.format, pack, ks.row)
    pts = np.float32(q.per_tensor_scale or 0.0)
    codes, scales = read_only(q.codes.reshape(ks.codes)), read_only(q.scale_words().reshape(ks.scales))
    geometry = (min(q.block_size, max(ks.values[-1], 1)),) if ks.row else lay.tile()
    run_tasks(kernel, ks.tasks, values.size, (codes, scales, values.reshape(ks.values), *geometry, pts))


def row_error_sums(x: np.ndarray, src: str, q: Any) -> np.ndarray:
    """Per-row error sums (rows, N_SUMS) of ``x`` (C-contiguous, of dtype ``src``) and the block
    array ``q``, blocked along the last axis without a rotation: one compiled pass per row that
    dequantises on the way, rows on every thread."""
    ks = q.layout.kernel_shapes()
    vshape = ks.values
    sums = np.zeros((vshape[0], K.N_SUMS), np.float64)
    if x.size == 0:
        return sums
    kernel = K.row_error_kernel(src, q.format, q.packed)
    size = min(q.block_size, max(vshape[1], 1))
    codes, scales = read_only(q.codes.reshape(ks.codes)), read_only(q.scale_words().reshape(ks.scales))
    pts = np.float32(q.per_tensor_scale or 0.0)
    run_tasks(kernel, vshape[0], x.size, (K.input_view(x).reshape(vshape), codes, scales, size, pts, sums))
    return sums


def rotate_rows(rows: np.ndarray, source: str, out: np.ndarray, signs: tuple[int, ...], inverse: bool) -> None:
    """The rotation (or its inverse) of every 16-element group of the (A, L) ``rows`` (input
    patterns of dtype ``source``) into ``out`` (float32 patterns; ``rows`` itself is allowed)."""
    if rows.size:
        kernel = K.rotate_kernel(source)
        run_tasks(kernel, rows.size // 16, rows.size, (read_only(rows), out, np.array(signs, np.float64), inverse))


def rotated_amax_rows(rows: np.ndarray, source: str, signs: tuple[int, ...]) -> float:
    """The largest finite |y| of the rotation y of the (A, L) ``rows`` (0 when there is none)."""
    groups = rows.size // 16
    if groups == 0:
        return 0.0
    chunk = 1 << 12
    out = np.empty(-(-groups // chunk), np.uint32)
    args = (read_only(rows), out, np.array(signs, np.float64), chunk)
    run_tasks(K.rotated_amax_kernel(source), out.size, rows.size, args)
    return float(out.max().view(np.float32))


def _codec(name: str | None) -> Any:
    return C.NO_CODEC if name is None else C.codec_of(FORMATS[name])


def recipe_quantize(
    rule: Any,
    bf: BlockFormat,
    wdtype: str,
    pts: float | None,
    arr: np.ndarray,
    src: str,
    values: tuple[int, ...],
    blocks: tuple[int, int],
    pack: bool,
    codes: np.ndarray,
    scales: np.ndarray,
) -> None:
    """The codes and scales of the C-contiguous ``arr`` by a recipe's rule (a
    :class:`~neuron_kernels.recipes.RecipeRule`) into ``codes`` (two per byte with ``pack``) and
    ``scales`` (a float scale's float32 patterns), both C-contiguous in the layout's shapes.
    ``values``: the kernels' view of ``arr``, (A, L) rows blocked along L or (A, R, C) matrices
    tiled; ``blocks``: (block length, tile rows: 1 for rows). The input holds finite values only."""
    block, tile_rows = blocks
    cols = values[-1]
    source = source_of(src)
    x = K.input_view(arr).reshape(-1, cols)
    rows = x.shape[0]
    c2 = codes.reshape(rows, -1)
    wc = _codec(None if wdtype == "float32" else wdtype)
    spec = RecipeSpec(
        kind=source.kind,
        xc=source.codec,
        el=element_of(bf, "nearest_even"),
        sc=wc if bf.float_scales else _codec(bf.scale),
        wc=wc,
        qc=wc if rule.quotient == "weight" else _codec(None),
        rule=rule_id(rule.scale),
        # a power-of-two divisor: the kernel multiplies by its exact reciprocal (the same quotient)
        elements=element_id("multiply" if rule.scale == "ct_e8m0" else rule.elements),
        zero=zero_id(rule.zero_sign),
        max_el=np.float32(bf.max_element),
        emax=bf.emax_elem,
        bump=rule.bump_bits,
        top=np.float32(bf.scale_format.max),
        lowest=np.float32(bf.scale_format.smallest_subnormal),
        eps=np.float32(
            rule.scale_floor or (FORMATS[wdtype].eps if bf.float_scales else bf.scale_format.eps)
        ),  # the smallest scale (``nxd_float``), or the one a zero scale becomes
    )
    g = np.float32(0.0)
    if rule.per_tensor == "ct" and pts is not None:
        g = np.float32(1.0 / pts)
    elif pts is not None:
        g = np.float32(pts)
    vlen = vector_length(src, bf) if block == bf.block_size else 0
    kernel = recipe_rows(spec, vlen, pack)
    if len(values) == 2:
        s2 = scales.reshape(rows, -1)
        run_tasks(kernel, rows, x.size, (x, c2, s2, np.empty((0, 1), np.float32), block, 1, g))
        return
    mrows = values[1]
    matrices = rows // mrows
    nb = -(-cols // block)
    for m in range(matrices):
        xm = x[m * mrows : (m + 1) * mrows]
        amax = np.empty((mrows, nb), np.uint32)
        run_tasks(recipe_amax(spec), mrows, xm.size, (xm, amax, block))
        tiles = np.maximum.reduceat(amax, np.arange(0, mrows, tile_rows), axis=0)
        stored = np.empty(tiles.size, np.uint32)
        vals = np.empty(tiles.size, np.float32)
        recipe_scales(spec)(tiles.reshape(-1), stored, vals, g)
        scales.reshape(matrices, -1)[m] = stored.astype(scales.dtype)
        dst = c2[m * mrows : (m + 1) * mrows]
        run_tasks(
            kernel,
            mrows,
            xm.size,
            (xm, dst, np.empty((0, 1), scales.dtype), vals.reshape(tiles.shape), block, tile_rows, g),
        )
