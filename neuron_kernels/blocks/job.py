"""What a validated quantisation computes (:class:`BlockJob`), applied to whole arrays or to pieces
of one.

A :class:`~.scheme.Scheme` (the options as given) validated for arrays of a number of
dimensions is a job: the format, the blocks, the scale rule and every option in the form the
kernels take them. A job quantises, fake-quantises or measures C-contiguous input arrays
(:func:`input_array`); the kernels that compute are reached through the registry
(:func:`neuron_kernels.registry.block_kernels`), which finds or compiles them and schedules their
tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError
from ..formats import BlockFormat, Format
from ..recipes import RecipeRule
from ..registry import block_kernels
from .array import BlockArray
from .inputs import input_array
from .layout import BlockLayout, count
from .recipe_options import check_finite, ct_global_scale, recipe_rule
from .rotation import check_length, rotate_array, rotated_amax

__all__ = ["BlockJob", "input_array", "per_tensor_scale_of", "tensor_amax"]


def tensor_amax(arr: np.ndarray, src: Format) -> float:
    """The largest finite |x| of an input array (as its float32 value; 0 when there is none)."""
    return float(np.uint32(block_kernels().amax_pattern(arr, src.name, True)).view(np.float32))


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
        rule = recipe_rule(self.recipe, self.fmt)
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

    def _source(self, arr: np.ndarray, src: Format, lay: BlockLayout) -> tuple[np.ndarray, str]:
        """The array the kernel reads and its dtype: a rotated float32 copy for a rotation the
        kernels of ``lay`` do not make themselves (along an axis that is not the last)."""
        if self.rotation is not None:
            check_length(arr.shape[self.axis], self.axis)
            if not block_kernels().rotated_in_kernel(self, lay):
                return rotate_array(arr, src.name, self.axis, self.rotation), "float32"
        return arr, src.name

    def _stored(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(block_size, block_rows) as a block array of ``shape`` records them (a block or tile
        longer than the array is cut to it)."""
        if not count(shape):
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
        lay = self.layout(arr.shape)
        if self.fmt.integer:
            if self.rule is not None and arr.size:
                check_finite(block_kernels().amax_pattern(arr, src.name, False), self.recipe)
            q = self._integers(arr, src, lay)
            if out is None:
                return q
            self.out_buffers(out, arr)  # checked as for every format; the fields copied in
            out.codes[...] = q.codes
            out.scales[...] = q.scales
            if q.zero_points is not None and out.zero_points is not None:
                out.zero_points[...] = q.zero_points
            return out
        if out is None:
            codes = np.empty(lay.codes_shape, np.uint8)
            scales = self._scale_buffer(lay.scales_shape)
        else:
            codes, scales = self.out_buffers(out, arr)
        if arr.size and self.rule is not None:
            self._by_recipe(arr, src, codes, scales)
        elif arr.size:
            source, name = self._source(arr, src, lay)
            block_kernels().quantize(self, lay, source, name, codes, scales, idx0)
        pts = self.per_tensor_scale if not isinstance(self.per_tensor_scale, str) else None
        if out is not None:
            if self.fmt.float_scales:
                out.scales[...] = self._stored_scales(scales)
            return out if out.per_tensor_scale == pts else replace(out, per_tensor_scale=pts)
        size, rows = self._stored(arr.shape)
        return BlockArray._made(
            codes,
            self._stored_scales(scales),
            BlockLayout(self.fmt.name, arr.shape, self.axis, size, rows, self.pack),
            per_tensor_scale=pts,
            rotation=self.rotation,
        )

    def _integers(self, arr: np.ndarray, src: Format, lay: BlockLayout) -> BlockArray:
        """The integer codes (one per byte, then packed where the layout packs), scales in the
        scale dtype and zero points of ``arr`` (see :mod:`~neuron_kernels.kernels.block_kernels.integers`)."""
        codes = np.zeros(lay.codes_shape, np.uint8)
        scales = np.empty(lay.scales_shape, np.float32)
        zeros = np.empty(lay.scales_shape, np.int8) if self.fmt.zero_points else None
        if arr.size:
            block_kernels().integer_quantize(self, arr, src.name, codes, scales, zeros)
        size, rows = self._stored(arr.shape)
        stored = scales if self.fmt.scale == "float32" else scales.astype(self.fmt.scale_format.result_dtype)
        return BlockArray(
            codes, stored, BlockLayout(self.fmt.name, arr.shape, self.axis, size, rows, lay.packed), zero_points=zeros
        )

    def _by_recipe(self, arr: np.ndarray, src: Format, codes: np.ndarray, scales: np.ndarray) -> None:
        """The codes and scales of ``arr`` by the recipe's rule (:mod:`.recipe_options`)."""
        rule = self.rule
        assert rule is not None
        check_finite(block_kernels().amax_pattern(arr, src.name, False), self.recipe)
        size, rows = self._stored(arr.shape)
        pts = self.per_tensor_scale if isinstance(self.per_tensor_scale, float) else None
        if rule.per_tensor != "none" and pts is None:
            raise RuntimeError("the per-tensor scale of this job has not been computed yet")
        lay = self.layout(arr.shape)
        ks = lay.kernel_shapes()
        if not (ks.row or lay.two_d):
            raise InvalidValueError(f"recipe {self.recipe!r} blocks the last axis, as its producer does")
        blocks = (size, rows if lay.two_d else 1)
        block_kernels().recipe_quantize(
            rule, self.fmt, self.intermediate, pts, arr, src.name, ks.values, blocks, self.pack, codes, scales
        )

    def binding(self, shape: tuple[int, ...], src: Format, quantize: bool = True) -> str:
        """Which binding of the kernels quantises (``quantize`` False: fake-quantises) an array of
        ``shape`` and dtype ``src`` (see :func:`~neuron_kernels.kernels.block_kernels.binding`)."""
        if self.fmt.integer:
            return "integers: rows of groups" + (f" (recipe {self.recipe}: {self.rule.scale})" if self.rule else "")
        if self.rule is not None:
            return f"recipe {self.recipe}: recipe_rows ({self.rule.scale})"
        row = self.layout(shape).kernel_shapes().row
        source = "float32" if self.rotation is not None else src.name
        return str(block_kernels().binding(self, row, source, quantize))

    def fake_quantize(self, arr: np.ndarray, src: Format, out: np.ndarray, idx0: int = 0) -> None:
        """The dequantised values of every element of ``arr`` into the C-contiguous float32 ``out``."""
        lay = self.layout(arr.shape)
        if arr.size and (self.rule is not None or self.fmt.integer):  # the codes, dequantised
            self.quantize(arr, src, idx0).dequantize(out=out.reshape(arr.shape))
        elif arr.size:
            source, name = self._source(arr, src, lay)
            block_kernels().fake_quantize(self, lay, source, name, out, idx0)

    def error_sums(self, arr: np.ndarray, src: Format) -> np.ndarray | None:
        """The per-row error sums (rows, N_SUMS) of quantising the C-contiguous ``arr``, from one
        pass that writes no codes (see :func:`~neuron_kernels.kernels.block_kernels.quantize_error_kernel`);
        None where the statistics need the codes: blocks not along the last axis, 2-D blocks, a
        rotation, another rounding than nearest-even."""
        if (
            self.rotation is not None
            or self.rounding != "nearest_even"
            or self.block_rows > 1
            or self.rule is not None
            or self.fmt.integer
        ):
            return None
        lay = self.layout(arr.shape)
        if not lay.kernel_shapes().row:
            return None
        sums: np.ndarray = block_kernels().error_sums(self, lay, arr, src.name)
        return sums
