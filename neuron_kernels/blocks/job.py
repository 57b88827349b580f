"""Validated quantisation options (:class:`BlockJob`), applied to whole arrays or to pieces of one.

The public functions and the file commands build a job with :func:`block_job`, which checks every
option and names what is accepted; the job then quantises or fake-quantises C-contiguous input
arrays (:func:`input_array`) with the kernels of :mod:`neuron_kernels.kernels.blocks`.
"""

from __future__ import annotations

import math
import numbers
import typing
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._parallel import PARALLEL_MIN_ELEMENTS, get_num_threads, run_tasks
from .._random import check_seed, draw_seed, stream_key
from ..dtypes import get_format
from ..errors import InvalidTypeError, InvalidValueError, NotApplicableError, UnknownFormatError
from ..formats import BLOCK_FORMATS, BlockFormat, Format
from ..modes import BLOCK_ROUNDING_MODES, FOUR_OVER_SIX, SCALE_MODES, SCALE_SEARCHES
from ..recipes import RECIPES, RecipeRule
from .array import BlockArray
from .inputs import input_array
from .layout import BlockLayout
from .recipes import check_finite, ct_global_scale, recipe_options, recipe_quantize, weight_dtype
from .rotation import check_length, rotate_array, rotated_amax, rotation_signs

__all__ = ["BlockJob", "block_job", "input_array", "per_tensor_scale_of", "tensor_amax", "DEFAULT"]


#: The default of options whose default depends on the format (``scale_mode``, ``per_tensor_scale``).
class _Default:
    """The marker of options left at the format's default (a value no caller passes by chance)."""

    def __repr__(self) -> str:
        return "<the format's default>"


DEFAULT: Any = _Default()


def choice(value: Any, accepted: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise InvalidValueError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


def block_format(fmt: Any, accepted: tuple[str, ...] = tuple(BLOCK_FORMATS), what: str = "block format") -> BlockFormat:
    """The block format named ``fmt``: an :class:`UnknownFormatError` for a name that is no block
    format, a :class:`NotApplicableError` for one that is but is not among ``accepted``."""
    if isinstance(fmt, BlockFormat):
        fmt = fmt.name
    if not isinstance(fmt, str) or fmt not in BLOCK_FORMATS:
        raise UnknownFormatError(f"unknown {what} {fmt!r}; accepted: {', '.join(accepted)}")
    if fmt not in accepted:
        raise NotApplicableError(
            f"{fmt} is not valid here, where an {what} is expected (valid: {', '.join(accepted)}); "
            f"quantize() takes every block format"
        )
    return BLOCK_FORMATS[fmt]


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"{name} must be a positive int, got {value!r}")
    if value < 1:
        raise InvalidValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def _axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise InvalidTypeError(f"axis must be an int, got {axis!r}")
    if ndim == 0:
        raise InvalidValueError("cannot quantise a 0-d array: blocks run along an axis")
    if not -ndim <= int(axis) < ndim:
        raise InvalidValueError(f"axis {axis} is out of range for an array of {ndim} dimensions")
    return int(axis) % ndim


def _blocks(block_size: Any, block_shape: Any, fmt: BlockFormat, axis: Any, ndim: int) -> tuple[int, int, int]:
    """(block_size, block_rows, axis) from ``block_size`` / ``block_shape`` / ``axis`` (a format's
    default 2-D tile where neither is given, but of a 1-D array or along another axis: the tile's
    row, a block of ``block_size``)."""
    if block_shape is None:
        size = fmt.block_size if block_size is DEFAULT else _positive_int(block_size, "block_size")
        ax = _axis(axis, ndim)
        if block_size is DEFAULT and fmt.block_rows > 1 and ndim >= 2 and ax == ndim - 1:
            return size, fmt.block_rows, ax
        return size, 1, ax
    if (
        isinstance(block_shape, (str, bytes))
        or not isinstance(block_shape, (tuple, list))
        or not 1 <= len(block_shape) <= 2
    ):
        raise InvalidTypeError(f"block_shape must be a tuple of one or two positive ints, got {block_shape!r}")
    dims = [_positive_int(v, "block_shape") for v in block_shape]
    if block_size is not DEFAULT and _positive_int(block_size, "block_size") != dims[-1]:
        raise InvalidValueError(
            f"block_size {block_size} and block_shape {tuple(block_shape)} disagree; give one of them"
        )
    if len(dims) == 1 or dims[0] == 1:
        return dims[-1], 1, _axis(axis, ndim)
    if ndim < 2:
        raise InvalidValueError(f"2-D blocks {tuple(dims)} need an array of 2 or more dimensions, got {ndim}")
    if _axis(axis, ndim) != ndim - 1:
        raise InvalidValueError(f"2-D blocks {tuple(dims)} tile the last two axes; axis must be -1, got {axis}")
    return dims[1], dims[0], ndim - 1


def _with_scale_dtype(bf: BlockFormat, scale_dtype: Any) -> BlockFormat:
    """The format with its scales stored as ``scale_dtype`` (None: the format's own): float scales
    may be float32, bfloat16 or float16 (see ``formats.FLOAT_SCALE_DTYPES``)."""
    if scale_dtype is None:
        return bf
    try:
        name = get_format(scale_dtype).name
    except (TypeError, ValueError):
        name = None
    if name not in bf.scale_dtypes:
        raise InvalidValueError(f"scale_dtype {scale_dtype!r} is not one of {bf.name}'s: {', '.join(bf.scale_dtypes)}")
    return bf if name == bf.scale else replace(bf, scale=str(name))


def _per_tensor(value: Any, fmt: BlockFormat) -> float | str | None:
    """``"amax"``, None or a positive finite float (NVFP4); None for formats without one."""
    if value is DEFAULT:
        return "amax" if fmt.per_tensor_scale else None
    if value is None:
        return None
    if not fmt.per_tensor_scale:
        raise NotApplicableError(
            f"{fmt.name} has no per-tensor scale (per_tensor_scale applies to NVFP4); got {value!r}"
        )
    if isinstance(value, str):
        if value != "amax":
            raise InvalidValueError(f"per_tensor_scale must be 'amax', None or a positive float, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating)):
        raise InvalidTypeError(f"per_tensor_scale must be 'amax', None or a positive float, got {value!r}")
    with np.errstate(over="ignore", under="ignore"):
        f32 = np.float32(value)  # the kernels compute in float32: the value must stay positive and finite there
    if not (math.isfinite(float(value)) and float(value) > 0 and np.isfinite(f32) and f32 > 0):
        raise InvalidValueError(
            f"per_tensor_scale must be a positive finite float, non-zero and finite in float32 too; got {value!r}"
        )
    return float(f32)


def tensor_amax(arr: np.ndarray, src: Format) -> float:
    """The largest finite |x| of an input array (as its float32 value; 0 when there is none)."""
    return float(np.uint32(_amax_pattern(arr, src, True)).view(np.float32))


def _amax_pattern(arr: np.ndarray, src: Format, finite: bool) -> int:
    """The largest |x| pattern (float32 bits) of an input array: of its finite values, or of all
    (an infinity's or a NaN's where it holds one); 0 for none."""
    from ..kernels import blocks as K

    view = K.input_view(arr).reshape(-1)
    chunk = 1 << 16
    n = -(-view.size // chunk)
    if n == 0:
        return 0
    out = np.empty(n, np.uint32)
    run_tasks(K.finite_amax_kernel(src.name, finite), n, view.size, (view, out, chunk))
    return int(out.max())


def per_tensor_scale_of(amax: float, bound: float, max_element: float) -> float:
    """NVFP4's per-tensor scale from the tensor's finite amax: ``amax / (bound * max_element)``
    (the largest block scale times the largest element, 448 * 6 by default), every operation in
    float32, 1.0 where that is 0 or not finite."""
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        pts = np.float32(amax) / (np.float32(bound) * np.float32(max_element))
    return float(pts) if np.isfinite(pts) and pts > 0 else 1.0


@dataclass(frozen=True)
class BlockJob:
    """Validated options of a quantisation, applied to an array or to pieces of one.

    ``quantize(arr, src, idx0)`` and ``fake_quantize(arr, src, out, idx0)`` take a C-contiguous
    array from :func:`input_array` blocked along ``axis`` (or tiled over its last two axes);
    ``idx0`` is the C-order index of its first element in the whole array (stochastic rounding
    depends on it), so that a large array processed in pieces gives the result of processing it
    whole. ``per_tensor_scale`` is ``"amax"`` until :meth:`with_amax` resolves it from the whole
    tensor's amax (which :meth:`resolved` computes for an array in memory).
    """

    fmt: BlockFormat
    block_size: int
    block_rows: int
    axis: int
    scale_mode: str
    rounding: str
    key: int
    pack: bool
    per_tensor_scale: float | str | None = None
    scale_bound: float = 0.0  # block_job sets it (the scale format's largest value by default)
    four_over_six: str | None = None
    scale_search: str | None = None
    rotation: tuple[int, ...] | None = None
    #: A producer's recipe (:data:`neuron_kernels.recipes.RECIPES`; "": the package's own rules) and
    #: the dtype its intermediate results are rounded to (the weight's, where the producer keeps it).
    recipe: str = ""
    intermediate: str = "float32"

    @property
    def needs_amax(self) -> bool:
        return self.per_tensor_scale == "amax"

    @property
    def rule(self) -> RecipeRule | None:
        """The recipe's rule for this job's format, where a recipe replaces the package's kernels."""
        if not self.recipe:
            return None
        rule = RECIPES[self.recipe].rules[self.fmt.name]
        return None if rule.scale == "package" else rule

    def with_amax(self, amax: float) -> BlockJob:
        """This job with the per-tensor scale of a tensor whose finite amax is ``amax`` (by the
        recipe's rule, with one)."""
        rule = self.rule
        if rule is not None and rule.per_tensor == "ct":
            pts = ct_global_scale(amax, self.intermediate, self.scale_bound, self.fmt.max_element)
        else:
            pts = per_tensor_scale_of(amax, self.scale_bound, self.fmt.max_element)
        return replace(self, per_tensor_scale=pts)

    def amax(self, arr: np.ndarray, src: Format) -> float:
        """The finite amax of ``arr`` as this job quantises it (rotated first, with a rotation)."""
        if self.rotation is not None:
            return rotated_amax(arr, src.name, self.axis, self.rotation)
        return tensor_amax(arr, src)

    def resolved(self, arr: np.ndarray, src: Format) -> BlockJob:
        """This job with its per-tensor scale computed from ``arr`` if it needs one."""
        return self.with_amax(self.amax(arr, src)) if self.needs_amax else self

    def layout(self, shape: tuple[int, ...], axis: int | None = None) -> BlockLayout:
        return BlockLayout(
            self.fmt.name, shape, self.axis if axis is None else axis, self.block_size, self.block_rows, self.pack
        )

    def _pts(self) -> np.float32:
        if isinstance(self.per_tensor_scale, str):
            raise RuntimeError("the per-tensor scale of this job has not been computed yet")
        pts: float = self.per_tensor_scale or 0.0
        return typing.cast(np.float32, np.float32(pts))  # numpy's stubs type the constructor as Any

    def _policy(self) -> int:
        from ..kernels import blocks as K

        return K.policy_id(self.four_over_six, self.scale_search)

    def _rule(self) -> str:
        """The scale mode compiled into the kernels: that of float scales, else none."""
        return self.scale_mode if self.fmt.float_scales else ""

    def _scale_buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """What the kernels write the scales into: bytes, or float32 patterns for float scales."""
        return np.empty(shape, np.uint32 if self.fmt.float_scales else np.uint8)

    def _stored_scales(self, words: np.ndarray) -> np.ndarray:
        """The scales the kernels wrote, as the array stores them: bytes viewed as the scale format;
        float32 patterns as the scale dtype (the reciprocal rule's multipliers ``m`` as ``1 / m``)."""
        if not self.fmt.float_scales:
            return words.view(self.fmt.scale_format.result_dtype)
        values = words.view(np.float32)
        if self.scale_mode == "reciprocal":
            with np.errstate(divide="ignore"):
                np.divide(np.float32(1.0), values, out=values)
        return values if self.fmt.scale == "float32" else values.astype(self.fmt.scale_format.result_dtype)

    def _run(self, kernel: Any, lay: BlockLayout, arrays: tuple[np.ndarray, ...], idx0: int, align: int = 1) -> None:
        from ..kernels import blocks as K

        ks = lay.kernel_shapes(split_rows=True)
        row = ks.row
        geometry = (min(self.block_size, max(ks.values[-1], 1)),) if row else lay.tile()
        options: tuple[Any, ...] = (K.scale_mode_id(self.scale_mode), self._policy(), self._pts(), self.key, idx0)
        if row:  # the rotation's signs (row kernels of the rotated input), else none
            options += (np.array(self.rotation if self._fused_rotation(row) else (), np.float64),)
        run_tasks(kernel, ks.tasks, lay.size, (*arrays, *geometry, *options), align)

    def _bands(self, shape: tuple[int, ...]) -> int:
        """Rows per band where a float-scale tile spans whole matrices too few to keep every
        thread busy (``fp8_tensor``: one task per matrix): the matrix's amax found first, its
        bands are tasks of their own that take it (:meth:`_run_bands`); 0 otherwise."""
        if not self.fmt.float_scales or len(shape) < 2 or self.rotation is not None:
            return 0
        rows, cols = shape[-2], shape[-1]
        threads = get_num_threads()
        matrices = int(np.prod(shape[:-2], dtype=np.int64))
        if self.block_rows < rows or self.block_size < cols or matrices >= threads or rows < 2 * threads:
            return 0
        return -(-rows // (4 * threads)) if rows * cols >= PARALLEL_MIN_ELEMENTS else 0

    def _run_bands(self, kernel: Any, arr: np.ndarray, src: str, out: np.ndarray, scales: Any, idx0: int) -> None:
        """Each matrix of ``arr`` (a tile of its own) as bands of :meth:`_bands` rows, on every
        thread, each band given the matrix's amax pattern (all values': an infinity or a NaN
        makes every band's scale NaN, as the matrix's); the codes (or values) into ``out``, the
        scale into ``scales`` (one per matrix; None for values)."""
        from ..kernels import blocks as K

        rows, cols = arr.shape[-2], arr.shape[-1]
        band = self._bands(arr.shape)
        x3, o3 = K.input_view(arr).reshape(-1, rows, cols), out.reshape(-1, rows, cols)
        nb = -(-rows // band)
        words = np.empty((1, nb, 1), np.uint32)
        fmt = get_format(src)
        options = (K.scale_mode_id(self.scale_mode), self._policy())
        for a in range(x3.shape[0]):
            given = np.uint32(_amax_pattern(x3[a], fmt, False)).view(np.float32)
            first = idx0 + a * rows * cols
            dst = (o3[a : a + 1], words) if scales is not None else (o3[a : a + 1],)
            run_tasks(kernel, nb, rows * cols, (x3[a : a + 1], *dst, band, cols, *options, given, self.key, first))
            if scales is not None:
                scales.reshape(-1)[a] = words[0, 0, 0]

    def _fused_rotation(self, row: bool) -> bool:
        """Whether the kernel rotates (row kernels do; other layouts get a rotated copy)."""
        return self.rotation is not None and row

    def _source(self, arr: np.ndarray, src: Format, row: bool) -> tuple[np.ndarray, str]:
        """The array the kernel reads and its dtype: a rotated float32 copy for a rotation along
        an axis that is not the last."""
        if self.rotation is not None:
            check_length(arr.shape[self.axis], self.axis)
            if not row:
                return rotate_array(arr, src.name, self.axis, self.rotation), "float32"
        return arr, src.name

    def _stored(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(block_size, block_rows) as a block array of ``shape`` records them (a block or tile
        longer than the array is cut to it)."""
        if not int(np.prod(shape, dtype=np.int64)):
            return self.block_size, self.block_rows
        rows = min(self.block_rows, shape[-2]) if self.block_rows > 1 else self.block_rows
        return min(self.block_size, shape[self.axis]), rows

    def stored_blocks(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(block_size, block_rows) as the block array of an array of ``shape`` records them."""
        return self._stored(shape)

    def out_buffers(self, out: Any, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The codes and scale bytes of ``out`` (a BlockArray) to write the quantisation of ``arr``
        into, once checked: the same format, shape, axis, blocks, packing and rotation as the
        result, writeable C-contiguous codes and scales, no memory shared with ``arr``."""
        if not isinstance(out, BlockArray):
            raise InvalidTypeError(f"out must be a BlockArray (a result of quantize), got {type(out).__name__}")
        size, rows = self._stored(arr.shape)
        want = (self.fmt.name, tuple(arr.shape), self.axis, size, rows, self.pack, self.rotation)
        have = (out.fmt, out.shape, out.axis, out.block_size, out.block_rows, out.packed, out.rotation)
        names = ("format", "shape", "axis", "block_size", "block_rows", "packed", "rotation")
        wrong = [f"{n} {h!r} (the result's: {w!r})" for n, h, w in zip(names, have, want) if h != w]
        if wrong:
            raise InvalidValueError(f"out does not fit the result: its {', '.join(wrong)}")
        for name, a in (("codes", out.codes), ("scales", out.scales)):
            if not (a.flags.c_contiguous and a.flags.writeable):
                raise InvalidValueError(f"out's {name} must be a writeable C-contiguous array")
            if np.may_share_memory(a, arr) and np.shares_memory(a, arr, max_work=10**6):  # type: ignore[arg-type, unused-ignore]
                raise InvalidValueError(f"out's {name} overlap the input; pass a separate block array")
        if self.fmt.float_scales:  # written as float32 patterns, then stored as the scale dtype
            if out.scales.dtype != self.fmt.scale_format.result_dtype:
                raise InvalidValueError(f"out's scales must be {self.fmt.scale} (the result's), got {out.scales.dtype}")
            return out.codes.view(np.ndarray), self._scale_buffer(out.scales.shape)
        return out.codes.view(np.ndarray), out.scales.view(np.uint8)

    def quantize(self, arr: np.ndarray, src: Format, idx0: int = 0, out: BlockArray | None = None) -> BlockArray:
        """The quantisation of ``arr`` (see the class docstring): a new BlockArray, or, given
        ``out`` (checked by :meth:`out_buffers`), the codes and scales written into ``out``'s
        arrays and ``out`` returned (a copy of it sharing those arrays where the per-tensor scale
        differs from ``out``'s: a block array's fields are fixed)."""
        from ..kernels import blocks as K

        lay = self.layout(arr.shape)
        if out is None:
            codes = np.empty(lay.codes_shape, np.uint8)
            scales = self._scale_buffer(lay.scales_shape)
        else:
            codes, scales = self.out_buffers(out, arr)
        if arr.size and self.rule is not None:
            self._by_recipe(arr, src, codes, scales)
        elif arr.size:
            ks = lay.kernel_shapes(split_rows=True)
            row = ks.row
            arr, source = self._source(arr, src, row)
            pack = (K.PACK_COLS if lay.two_d else K.PACK_ROWS) if self.pack and not row else int(self.pack)
            kernel = K.quantize_kernel(
                source,
                self.fmt,
                self.rounding,
                pack,
                row,
                self._fused_rotation(row),
                self._policy() != K.PLAIN,
                self._rule(),
            )
            # Two blocks of odd length along the block axis share bytes of packed codes: keep such
            # pairs on one thread (whole pairs of rows of tasks if a row has an odd number).
            align = 1
            if self.pack and not lay.two_d and self.block_size % 2:
                align = 2 if ks.scales[1] % 2 == 0 else 2 * ks.scales[1]
            if self._bands(arr.shape):
                self._run_bands(kernel, arr, source, codes, scales, idx0)
            else:
                arrays = (K.input_view(arr).reshape(ks.values), codes.reshape(ks.codes), scales.reshape(ks.scales))
                self._run(kernel, lay, arrays, idx0, align)
        pts = self.per_tensor_scale if not isinstance(self.per_tensor_scale, str) else None
        if out is not None:
            if self.fmt.float_scales:
                out.scales[...] = self._stored_scales(scales)
            return out if out.per_tensor_scale == pts else replace(out, per_tensor_scale=pts)
        size, rows = self._stored(arr.shape)
        return BlockArray(
            codes,
            self._stored_scales(scales),
            BlockLayout(self.fmt.name, arr.shape, self.axis, size, rows, self.pack),
            per_tensor_scale=pts,
            rotation=self.rotation,
        )

    def _by_recipe(self, arr: np.ndarray, src: Format, codes: np.ndarray, scales: np.ndarray) -> None:
        """The codes and scales of ``arr`` by the recipe's rule (:mod:`.recipes`)."""
        rule = self.rule
        assert rule is not None
        check_finite(_amax_pattern(arr, src, False), self.recipe)
        size, rows = self._stored(arr.shape)
        pts = self.per_tensor_scale if isinstance(self.per_tensor_scale, float) else None
        if rule.per_tensor != "none" and pts is None:
            raise RuntimeError("the per-tensor scale of this job has not been computed yet")
        lay = self.layout(arr.shape)
        ks = lay.kernel_shapes()
        if not (ks.row or lay.two_d):
            raise InvalidValueError(f"recipe {self.recipe!r} blocks the last axis, as its producer does")
        blocks = (size, rows if lay.two_d else 1)
        recipe_quantize(
            rule, self.recipe, self.fmt, self.intermediate, pts, arr, src, ks.values, blocks, self.pack, codes, scales
        )

    def binding(self, shape: tuple[int, ...], src: Format, quantize: bool = True) -> str:
        """Which binding of the kernels quantises (``quantize`` False: fake-quantises) an array of
        ``shape`` and dtype ``src`` (see :func:`~neuron_kernels.kernels.blocks.binding`)."""
        from ..kernels import blocks as K

        if self.rule is not None:
            return f"recipe {self.recipe}: recipe_rows ({self.rule.scale})"
        row = self.layout(shape).kernel_shapes().row
        source = "float32" if self.rotation is not None else src.name
        return K.binding(source, self.fmt, self.rounding, self.block_size, row, self._policy() != K.PLAIN, quantize)

    def fake_quantize(self, arr: np.ndarray, src: Format, out: np.ndarray, idx0: int = 0) -> None:
        """The dequantised values of every element of ``arr`` into the C-contiguous float32 ``out``."""
        from ..kernels import blocks as K

        lay = self.layout(arr.shape)
        if arr.size and self.rule is not None:  # the recipe's codes, dequantised
            self.quantize(arr, src, idx0).dequantize(out=out.reshape(arr.shape))
        elif arr.size:
            ks = lay.kernel_shapes(split_rows=True)
            row, vshape = ks.row, ks.values
            arr, source = self._source(arr, src, row)
            kernel = K.fake_quantize_kernel(
                source, self.fmt, self.rounding, row, self._fused_rotation(row), self._policy() != K.PLAIN, self._rule()
            )
            if self._bands(arr.shape):
                self._run_bands(kernel, arr, source, out, None, idx0)
            else:
                self._run(kernel, lay, (K.input_view(arr).reshape(vshape), out.reshape(vshape)), idx0)

    def error_sums(self, arr: np.ndarray, src: Format) -> np.ndarray | None:
        """The per-row error sums (rows, N_SUMS) of quantising the C-contiguous ``arr``, from one
        pass that writes no codes (see :func:`~neuron_kernels.kernels.blocks.quantize_error_kernel`);
        None where the statistics need the codes: blocks not along the last axis, 2-D blocks, a
        rotation, another rounding than nearest-even."""
        from ..kernels import blocks as K

        if self.rotation is not None or self.rounding != "nearest_even" or self.block_rows > 1 or self.rule is not None:
            return None
        ks = self.layout(arr.shape).kernel_shapes()
        vshape = ks.values
        if not ks.row:
            return None
        sums = np.zeros((vshape[0], K.N_SUMS), np.float64)
        if arr.size:
            kernel = K.quantize_error_kernel(src.name, self.fmt, self._rule())
            size = min(self.block_size, max(vshape[1], 1))
            options = (K.scale_mode_id(self.scale_mode), self._policy(), self._pts(), self.key)
            run_tasks(kernel, vshape[0], arr.size, (K.input_view(arr).reshape(vshape), size, *options, sums))
        return sums


def block_job(
    fmt: Any,
    ndim: int,
    *,
    block_size: Any = DEFAULT,
    block_shape: Any = None,
    axis: Any = -1,
    scale_mode: Any = DEFAULT,
    rounding: Any = "nearest_even",
    seed: Any = None,
    pack: Any = True,
    per_tensor_scale: Any = DEFAULT,
    scale_bound: Any = DEFAULT,
    four_over_six: Any = None,
    scale_search: Any = None,
    rht: Any = False,
    scale_dtype: Any = None,
    recipe: Any = None,
    dtype: Any = None,
    formats: tuple[str, ...] = tuple(BLOCK_FORMATS),
    what: str = "block format",
) -> BlockJob:
    """Validate the options of :func:`neuron_kernels.quantize` for arrays of ``ndim`` dimensions
    (``formats``: the formats accepted, named ``what`` in errors). ``recipe``: a producer's
    (:mod:`.recipes`), which fixes the options of its arithmetic; ``dtype``: the input's dtype
    (the intermediate dtype of a recipe that computes in the weight's; None: float32)."""
    if recipe is not None:
        own = block_format(fmt, formats, what)
        left = (DEFAULT, None, False, "nearest_even", "amax", own.block_size)  # defaults, and family functions' own
        named = {
            "block_size": block_size, "block_shape": block_shape, "scale_mode": scale_mode, "rounding": rounding,
            "per_tensor_scale": per_tensor_scale, "scale_bound": scale_bound, "four_over_six": four_over_six,
            "scale_search": scale_search, "rht": rht, "scale_dtype": scale_dtype,
        }  # fmt: skip
        given = {k for k, v in named.items() if not any(v is d or (type(v) is type(d) and v == d) for d in left)}
        if per_tensor_scale is None:  # one level, which a recipe with a global scale does not write
            given.add("per_tensor_scale")
        rule = recipe_options(recipe, own, {"axis": axis, "ndim": ndim}, given)
        intermediate = weight_dtype(rule, dtype, recipe)
        job = block_job(
            fmt, ndim, block_size=block_size, block_shape=block_shape, axis=axis, pack=pack, formats=formats, what=what,
            scale_mode=rule.scale_mode if rule.scale == "package" else DEFAULT,
            scale_dtype=intermediate if rule.scale != "package" and own.float_scales else None,
        )  # fmt: skip
        if rule.scale != "package" and rule.per_tensor == "none":
            job = replace(job, per_tensor_scale=None)
        elif "per_tensor_scale" in given:  # as given, in double precision (a recipe's global scale is exact)
            _per_tensor(per_tensor_scale, job.fmt)
            if not isinstance(per_tensor_scale, (numbers.Real, np.floating)) or isinstance(per_tensor_scale, bool):
                raise InvalidValueError(
                    f"recipe {recipe!r} computes the per-tensor scale from the amax ('amax') or takes a fused "
                    f"layer's (a float, from shared_per_tensor_scale); got {per_tensor_scale!r}"
                )
            job = replace(job, per_tensor_scale=float(per_tensor_scale))
        return replace(job, recipe=recipe, intermediate=intermediate)
    bf = _with_scale_dtype(block_format(fmt, formats, what), scale_dtype)
    size, rows, ax = _blocks(block_size, block_shape, bf, axis, ndim)
    mode = bf.scale_modes[0] if scale_mode is DEFAULT else scale_mode
    if isinstance(mode, str) and mode in SCALE_MODES and mode not in bf.scale_modes:
        raise NotApplicableError(f"scale mode {mode!r} is not valid for {bf.name} (valid: {', '.join(bf.scale_modes)})")
    if not isinstance(mode, str) or mode not in bf.scale_modes:
        raise InvalidValueError(f"unknown scale mode {mode!r}; accepted: {', '.join(bf.scale_modes)} ({bf.name})")
    rnd = choice(rounding, BLOCK_ROUNDING_MODES, "rounding mode")
    if not isinstance(pack, (bool, np.bool_)):
        raise InvalidTypeError(f"pack must be True or False, got {pack!r}")
    check_seed(seed)
    if rnd == "stochastic" and seed is None:
        seed = draw_seed()
    pts = _per_tensor(per_tensor_scale, bf)
    largest = bf.scale_format.max
    if scale_bound is DEFAULT or scale_bound is None:
        scale_bound = largest
    if isinstance(scale_bound, bool) or not isinstance(scale_bound, numbers.Real):
        raise InvalidTypeError(f"scale_bound must be a float in (0, {largest:g}], got {scale_bound!r}")
    bound = float(scale_bound)
    if not (math.isfinite(bound) and 0 < bound <= largest and np.float32(bound) > 0):
        raise InvalidValueError(
            f"scale_bound must be a float in (0, {largest:g}] (the largest {bf.scale} value, the default; "
            f"256 with four_over_six), got {scale_bound}"
        )
    if bf.float_scales and mode == "reciprocal" and bf.scale != "float32":
        raise NotApplicableError(
            f"scale mode 'reciprocal' stores float32 scales (transformers' rule); got scale_dtype {bf.scale!r}"
        )
    if bf.float_scales and mode == "pow2" and bf.scale == "float16":
        raise NotApplicableError(
            "scale mode 'pow2' stores float32 or bfloat16 scales (float16 holds too few powers of two); "
            f"got scale_dtype {bf.scale!r}"
        )
    if bf.float_scales and (four_over_six is not None or scale_search is not None):
        raise NotApplicableError(
            f"four_over_six and scale_search choose among float8_e4m3fn or e8m0 scales; {bf.name}'s are floats"
        )
    if four_over_six is not None:
        choice(four_over_six, FOUR_OVER_SIX, "four_over_six error measure")
        if bf.is_mx:
            raise NotApplicableError(
                f"four_over_six is not valid for {bf.name} (valid: nvfp4, whose scales are float8_e4m3fn)"
            )
    if scale_search is not None:
        choice(scale_search, SCALE_SEARCHES, "scale search")
        if four_over_six is not None:
            raise InvalidValueError("four_over_six and scale_search are two scale policies; give one of them")
    rotation = rotation_signs(rht)
    if rotation is not None:
        if rows > 1:
            raise InvalidValueError("rht= rotates along the block axis of 1-D blocks, not 2-D tiles")
        if size % 16:
            raise InvalidValueError(
                f"rht= rotates groups of 16 along the block axis; block_size must be a multiple of 16, got {size}"
            )
    return BlockJob(
        bf,
        size,
        rows,
        ax,
        mode,
        rnd,
        stream_key(0 if seed is None else seed),
        bool(pack) and bf.packable,
        pts,
        float(scale_bound),
        four_over_six,
        scale_search,
        rotation,
    )
