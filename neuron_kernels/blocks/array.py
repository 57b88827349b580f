"""The block-format array (MX, NVFP4, FP8 with float scales): codes, scales, per-tensor scale, blocks;
and dequantisation.

One container for every block format: :class:`BlockArray` (``MXArray``, its earlier name, still
gives it from the top level, with a DeprecationWarning). It validates its fields on construction
(the kernels trust them), dequantises itself, gives its codes as element dtypes or Neuron's packed
containers. The package's file of block arrays is I/O
(:mod:`neuron_kernels.io.blockfile`: ``save_blocks`` / ``load_blocks``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import numpy as np

from ..casting import cast, check_out, pack_x4
from ..dtypes import get_format
from ..errors import InvalidTypeError, InvalidValueError
from ..formats import BLOCK_FORMATS, BlockFormat
from ..registry import block_kernels
from . import nibbles
from .earlier_forms import block_array_fields, from_parts_fields
from .inputs import INPUT_DTYPES
from .layout import BlockLayout
from .rotation import rotate_in_place, rotation_signs

__all__ = ["BlockArray", "TorchBlocks", "result_buffer", "deliver"]


class TorchBlocks(NamedTuple):
    """A block array as torch tensors (see :meth:`BlockArray.to_torch`)."""

    qdata: Any
    scale: Any
    per_tensor_scale: Any


def result_buffer(
    out: np.ndarray | None, shape: tuple[int, ...], dtype: Any, *inputs: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """(a plain view of the validated ``out``, or None; the C-contiguous array a kernel writes)."""
    if out is None:
        return None, np.empty(shape, dtype)
    target = check_out(out, shape, np.dtype(dtype), *inputs)
    return target, target if target.flags.c_contiguous else np.empty(shape, dtype)


def deliver(out: np.ndarray | None, target: np.ndarray | None, values: np.ndarray) -> np.ndarray:
    """The result: ``values``, or ``out`` once ``values`` are in it."""
    if out is None or target is None:
        return values
    if values is not target:
        target[...] = values
    return out


class BlockFields:
    """What a block array in memory and a lazy one (:class:`~neuron_kernels.lazy.block_arrays.LazyBlockArray`)
    share: the ``layout`` (:class:`~neuron_kernels.blocks.layout.BlockLayout`: format, shape, axis,
    blocks, packing), whose fields each reads as its own, ``per_tensor_scale``, ``rotation``,
    ``codes`` and ``scales``; their size and the start of their repr."""

    codes: Any
    scales: Any
    layout: BlockLayout
    per_tensor_scale: float | None
    rotation: tuple[int, ...] | None
    #: Integer formats: the zero point of each block (int8, the scales' shape), or None (symmetric);
    #: the group of each column along the block axis (int32, act-order's ``g_idx``), or None (column
    #: ``c`` in block ``c // block_size``).
    zero_points: Any = None
    group_index: Any = None

    @property
    def fmt(self) -> str:
        return self.layout.fmt

    @property
    def block_size(self) -> int:
        return self.layout.block_size

    @property
    def axis(self) -> int:
        return self.layout.axis

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def packed(self) -> bool:
        return self.layout.packed

    @property
    def block_rows(self) -> int:
        return self.layout.block_rows

    @property
    def format(self) -> BlockFormat:
        return self.layout.format

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.layout.block_shape

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def nbytes(self) -> int:
        """Bytes of codes and scales (and the per-tensor scale's 4, the zero points and the group
        index, when there are)."""
        extra = sum(int(a.nbytes) for a in (self.zero_points, self.group_index) if a is not None)
        return int(self.codes.nbytes + self.scales.nbytes + (4 if self.per_tensor_scale is not None else 0) + extra)

    def _repr_head(self) -> str:
        extra = f", block_shape={self.block_shape}" if self.block_rows > 1 else ""
        if self.per_tensor_scale is not None:
            extra += f", per_tensor_scale={self.per_tensor_scale:.6g}"
        if self.rotation is not None:
            extra += ", rotated"
        if self.zero_points is not None:
            extra += ", zero_points"
        if self.group_index is not None:
            extra += ", group_index"
        return (
            f"fmt={self.fmt!r}, shape={self.shape}, block_size={self.block_size}, axis={self.axis}{extra}, "
            f"packed={self.packed}"
        )


@dataclass(frozen=True, eq=False, init=False)
class BlockArray(BlockFields):
    """A block-quantised array (MX or NVFP4): ``BlockArray(codes, scales, layout, per_tensor_scale=None,
    rotation=None)``.

    Attributes
    ----------
    codes
        uint8 element codes, the shape of the original array; 4-bit codes stored with ``packed``
        two per byte along the block axis (element 2i in the low nibble, an odd tail padded with a
        zero nibble). mxint8 codes are int8 two's complement (c / 64).
    scales
        The block scales in the scale format's dtype (float8_e8m0fnu for MX, float8_e4m3fn for
        NVFP4): the original shape with each blocked axis replaced by its number of blocks.
    layout
        A :class:`~neuron_kernels.blocks.layout.BlockLayout`: ``fmt``, ``shape``, ``axis`` (the
        non-negative block axis), ``block_size``, ``block_rows`` (tiles of ``block_rows x
        block_size`` over the last two axes when above 1) and ``packed`` (4-bit codes two per
        byte), each also read as the array's own attribute.
    per_tensor_scale
        NVFP4's second level, the float32 decode multiplier ``pts`` (None: single level): a value
        is ``P * float32(pts * s)``.
    rotation
        The 16 signs of the random Hadamard rotation applied along the block axis before
        quantising, or None (see :func:`neuron_kernels.rotate`).
    zero_points
        The asymmetric integer formats (``int4_group_asym``, ...): the zero point of each block,
        int8 of the scales' shape (None for every other format). A value is ``(q - z) * s``, ``q``
        the two's-complement code.
    group_index
        Integer formats blocked along the last axis: the block of each column (int32, the
        act-order ``g_idx`` of GPTQ and compressed-tensors), or None (column ``c`` in block
        ``c // block_size``).

    Integer codes are each the element's ``bits``-bit two's-complement pattern (4-bit ones packed
    two per byte with ``packed``); :meth:`integer_codes` gives them as int8 values.

    The constructor's earlier form, ``BlockArray(codes, scales, fmt, block_size, axis, shape,
    packed=False, block_rows=1, per_tensor_scale=None, rotation=None)``, still works and warns
    (``neuron_kernels._compat``).
    """

    codes: np.ndarray
    scales: np.ndarray
    layout: BlockLayout
    per_tensor_scale: float | None = None
    rotation: tuple[int, ...] | None = None
    zero_points: np.ndarray | None = None
    group_index: np.ndarray | None = None

    def __init__(
        self,
        codes: np.ndarray,
        scales: np.ndarray,
        layout: Any,
        *fields: Any,
        per_tensor_scale: float | None = None,
        rotation: tuple[int, ...] | None = None,
        zero_points: np.ndarray | None = None,
        group_index: np.ndarray | None = None,
        **named: Any,
    ) -> None:
        if not isinstance(layout, BlockLayout):
            layout, per_tensor_scale, rotation = block_array_fields(layout, fields, named, per_tensor_scale, rotation)
        elif fields or named:
            raise InvalidTypeError(
                "BlockArray takes (codes, scales, layout, per_tensor_scale=None, rotation=None); "
                f"got {len(fields)} more positional and {sorted(named)} named arguments"
            )
        self._set(codes, scales, layout, per_tensor_scale, rotation, zero_points, group_index)
        self.__post_init__()

    def _set(self, *values: Any) -> None:
        """The fields, in their order, set on this frozen instance."""
        for f, value in zip(fields(self), values, strict=True):
            object.__setattr__(self, f.name, value)

    @classmethod
    def _made(
        cls,
        codes: np.ndarray,
        scales: np.ndarray,
        layout: BlockLayout,
        per_tensor_scale: float | None = None,
        rotation: tuple[int, ...] | None = None,
    ) -> BlockArray:
        """A block array the package's own kernels have just written for ``layout`` (a checked
        job's): its fields fit together by construction, so they are not checked again."""
        made = object.__new__(cls)
        made._set(codes, scales, layout, per_tensor_scale, rotation, None, None)
        return made

    def __post_init__(self) -> None:
        """Refuse fields that do not fit together (the kernels trust them)."""
        for name in ("codes", "scales"):
            if not isinstance(getattr(self, name), np.ndarray):
                raise InvalidTypeError(
                    f"block array {name} must be a numpy array, got {type(getattr(self, name)).__name__}"
                )
        problem = self.layout.problem((self.codes.shape, self.codes.dtype), (self.scales.shape, self.scales.dtype))
        if (
            problem is None
            and not self.format.float_scales
            and self.scales.dtype.kind == "f"
            and self.scales.dtype != self.format.scale_format.dtype
        ):
            problem = f"scales must be {self.format.scale} bytes, got dtype {self.scales.dtype}"
        if problem is None:
            problem = _extra_problem(self.format, self.per_tensor_scale, self.rotation)
        if problem is None:
            problem = _integer_problem(self.layout, self.zero_points, self.group_index)
        if problem:
            family = BLOCK_FORMATS[self.fmt].family if self.fmt in BLOCK_FORMATS else "a"
            raise InvalidValueError(f"inconsistent {family} block array: {problem}")

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element as stored."""
        return 8 * self.nbytes / self.size if self.size else 0.0

    def __repr__(self) -> str:
        return (
            f"BlockArray({self.format.family}, {self._repr_head()}, blocks={self.scales.size}, nbytes={self.nbytes}, "
            f"bits_per_element={self.bits_per_element:.3g})"
        )

    def dequantize(
        self, dtype: Any = np.float32, *, out: np.ndarray | None = None, unrotate: bool = False
    ) -> np.ndarray:
        """The values (exact in float32 for MX; ``P * s`` or ``P * float32(pts * s)`` for NVFP4),
        in ``dtype`` (float32 by default; float64, float16 and bfloat16 are rounded from the
        float32 values). A block holding a NaN or an infinity is NaN throughout.

        ``unrotate``: for an array quantised with a rotation (``rht=``), rotate the float32 values
        back (the values of the array itself stay rotated otherwise, as the simulated operands of
        a matmul do).

        ``out``: an array of the shape and ``dtype`` to write the values into (reusing one saves
        the operating system's zeroing of fresh pages, most of the time of a large call).
        """
        out_fmt = get_format(dtype)
        if out_fmt.name not in INPUT_DTYPES:
            raise InvalidTypeError(f"dequantisation writes float32, float64, float16 or bfloat16; got {out_fmt.name}")
        if not isinstance(unrotate, (bool, np.bool_)):
            raise InvalidTypeError(f"unrotate must be True or False, got {unrotate!r}")
        if unrotate and self.rotation is None:
            raise InvalidValueError("unrotate=True needs an array quantised with a rotation (rht=); this one has none")
        staged = out_fmt.name != "float32" and unrotate  # rotate float32 values back, then convert
        narrow = out_fmt.name in ("float16", "bfloat16") or staged
        wide = np.dtype("float64" if out_fmt.name == "float64" and not staged else "float32")
        target, values = result_buffer(None if narrow else out, self.shape, wide, self.codes, self.scales)
        if values.size:
            self._dequantize_into(values)
            if unrotate:
                self._unrotate(values)
        if narrow:
            return cast(values, out_fmt.name, out=out)
        return deliver(out, target, values)

    def _unrotate(self, values: np.ndarray) -> None:
        assert self.rotation is not None
        if self.axis == values.ndim - 1:
            rotate_in_place(values, self.axis, self.rotation, inverse=True)
        else:
            from .rotation import rotate_array

            values[...] = rotate_array(values, "float32", self.axis, self.rotation, inverse=True)

    def _dequantize_into(self, values: np.ndarray) -> None:
        block_kernels().dequantize(self, values)

    def scale_words(self) -> np.ndarray:
        """The scales as the kernels read them: bytes (uint8), or float scales as float32 patterns
        (uint32; bfloat16 and float16 scales widened exactly)."""
        if self.format.float_scales:
            return np.ascontiguousarray(self.scales, np.float32).view(np.uint32)
        return self.scales.view(np.uint8)

    def unpacked_codes(self) -> np.ndarray:
        """The codes one per byte (unpacking 4-bit codes if stored packed)."""
        if not self.packed:
            return self.codes
        return nibbles.unpack(self.codes, self.shape[self.axis], self.axis)

    def integer_codes(self) -> np.ndarray:
        """Integer formats: the codes as int8 values (sign-extended from the element's width), unpacked."""
        if not self.format.integer:
            raise InvalidTypeError(f"{self.fmt} has no integer codes; element_codes() gives its codes")
        half = np.int16(1 << (self.format.element_bits - 1))
        values: np.ndarray = ((self.unpacked_codes().astype(np.int16) ^ half) - half).astype(np.int8)
        return values

    def element_codes(self) -> np.ndarray:
        """The codes as an array of the element's dtype (int8 for mxint8), unpacked."""
        return self.unpacked_codes().view(self.format.element_format.result_dtype)

    def to_x4(self) -> np.ndarray:
        """The element codes in Neuron's packed container of the format, along the last axis.

        mxfp8_e4m3 -> float8_e4m3fn_x4, mxfp8_e5m2 -> float8_e5m2_x4, mxfp4_e2m1 and nvfp4 ->
        float4_e2m1fn_x4. The last axis must be a multiple of 4. Other formats raise ``TypeError``.
        """
        x4 = self.format.x4
        if x4 is None:
            having = ", ".join(n for n, f in BLOCK_FORMATS.items() if f.x4)
            raise InvalidTypeError(f"{self.fmt} has no Neuron packed container; {having} do")
        return pack_x4(self.element_codes(), x4)

    def to_torch(self) -> TorchBlocks:
        """The block array as the CPU tensors torchao's ``NVFP4Tensor`` / ``MXTensor`` hold, sharing
        this array's memory: ``qdata`` (4-bit codes packed two per byte as uint8, element 2i in the
        low nibble; FP8 codes as ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``; FP6 and mxint8
        codes one per byte as uint8), ``scale`` (``torch.float8_e8m0fnu`` for MX,
        ``torch.float8_e4m3fn`` for NVFP4) and ``per_tensor_scale`` (a 0-d float32 tensor, or None).
        Needs torch; rotated arrays are refused (torchao has no place for the rotation)."""
        from ..interop.torch_tensors import to_torch, torch_module

        if self.rotation is not None:
            raise InvalidValueError("a rotated block array has no torch form (torchao keeps no rotation)")
        torch = torch_module()
        fmt = self.format
        codes = self.codes.view(fmt.element_format.result_dtype) if fmt.element_bits == 8 else self.codes
        pts = None if self.per_tensor_scale is None else torch.tensor(self.per_tensor_scale, dtype=torch.float32)
        return TorchBlocks(to_torch(codes), to_torch(self.scales), pts)

    def to_torchao(self, orig_dtype: Any = None) -> Any:
        """The block array as torchao's own tensor subclass (needs torch and torchao): an
        ``NVFP4Tensor`` for nvfp4, an ``MXTensor`` for mxfp8_e4m3, mxfp8_e5m2 and mxfp4_e2m1, for
        blocks of the format's own size along the last axis (4-bit codes packed), whose
        ``dequantize()`` gives this array's values. ``orig_dtype``: the torch dtype it reports
        (``torch.float32`` by default)."""
        from ..interop.torch_tensors import torch_module

        torch = torch_module()
        fmt = self.format
        # torchao's element dtypes: FP4 packed two per byte, or torch's own dtype of the element
        elem = torch.float4_e2m1fn_x2 if fmt.packable else getattr(torch, fmt.element, None)
        if (
            elem is None
            or self.axis != len(self.shape) - 1
            or self.block_rows != 1
            or self.block_size != fmt.block_size
            or (fmt.packable and not self.packed)
        ):
            raise InvalidValueError(
                "torchao holds NVFP4 and the MX formats with FP8 or FP4 elements, in blocks of the format's own "
                f"size along the last axis (4-bit codes packed); this array is {self!r}"
            )
        parts = self.to_torch()
        orig = torch.float32 if orig_dtype is None else orig_dtype
        if fmt.per_tensor_scale:
            from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor  # type: ignore[import-untyped, import-not-found, unused-ignore]

            return NVFP4Tensor(parts.qdata, parts.scale, fmt.block_size, orig, parts.per_tensor_scale)
        from torchao.prototype.mx_formats.mx_tensor import MXTensor  # type: ignore[import-untyped, import-not-found, unused-ignore]
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference  # type: ignore[import-untyped, import-not-found, unused-ignore]

        return MXTensor(parts.qdata, parts.scale, elem, fmt.block_size, orig, KernelPreference.EMULATED, None, False)

    def with_codes(self, codes: np.ndarray) -> BlockArray:
        """The same blocks with other codes (of the same layout)."""
        return replace(self, codes=codes)

    def save(self, path: Any) -> None:
        """Moved: the file is I/O, which lives above the numerics: ``neuron_kernels.save_blocks(path, q)``."""
        raise AttributeError("BlockArray.save moved: use neuron_kernels.save_blocks(path, q)")

    @classmethod
    def load(cls, path: Any, name: str | None = None) -> BlockArray:
        """Moved: ``neuron_kernels.load_blocks(path, name=None)``."""
        raise AttributeError("BlockArray.load moved: use neuron_kernels.load_blocks(path, name=None)")

    @classmethod
    def from_parts(
        cls,
        codes: Any,
        scales: Any,
        layout: Any,
        where: Any = "BlockArray",
        *fields: Any,
        per_tensor_scale: Any = None,
        rotation: Any = None,
        zero_points: Any = None,
        group_index: Any = None,
        **named: Any,
    ) -> BlockArray:
        """A block array from its parts as read from a file (``layout``'s fields as read too),
        checked for consistency (``ValueError`` naming ``where``): shapes, dtypes, and element
        codes within the element's width. (The earlier form, ``from_parts(codes, scales, fmt,
        block_size, axis, shape, packed, where, block_rows=1, ...)``, still works and warns.)"""
        if not isinstance(layout, BlockLayout):
            layout, where = from_parts_fields(layout, (where, *fields), named)
        elif fields or named:
            raise InvalidTypeError(
                "from_parts takes (codes, scales, layout, where, per_tensor_scale=None, rotation=None); "
                f"got {len(fields)} more positional and {sorted(named)} named arguments"
            )
        if not isinstance(codes, np.ndarray) or not isinstance(scales, np.ndarray):
            raise InvalidTypeError(f"{where}: codes and scales must be numpy arrays")
        problem = layout.problem((codes.shape, codes.dtype), (scales.shape, scales.dtype))
        if problem is None:
            problem = _extra_problem(layout.format, per_tensor_scale, rotation)
        if problem is None:
            problem = _integer_problem(layout.normalised(), zero_points, group_index)
        if problem:
            raise InvalidValueError(f"{where}: {problem}")
        fmt = layout.format
        element = fmt.element_format
        if not layout.packed and codes.size and element.bits < 8 and int(codes.max()) >= 1 << element.bits:
            raise InvalidValueError(
                f"{where}: codes hold values above {(1 << element.bits) - 1}, the largest "
                f"{element.bits}-bit code of {fmt.name}"
            )
        scales = np.ascontiguousarray(scales)
        return cls(
            np.ascontiguousarray(codes),
            scales if fmt.float_scales else scales.view(np.uint8).view(fmt.scale_format.result_dtype),
            layout.normalised(),
            per_tensor_scale=None if per_tensor_scale is None else float(per_tensor_scale),
            rotation=None if rotation is None else tuple(int(v) for v in rotation),
            zero_points=None if zero_points is None else np.ascontiguousarray(zero_points),
            group_index=None if group_index is None else np.ascontiguousarray(group_index),
        )


def _integer_problem(layout: BlockLayout, zero_points: Any, group_index: Any) -> str | None:
    """What is wrong with the zero points and group index of an array of ``layout``, or None."""
    fmt = layout.format
    if (zero_points is not None or group_index is not None) and not fmt.integer:
        return f"zero points and a group index are for the integer formats; {fmt.name} has none"
    if fmt.integer and (zero_points is None) == fmt.zero_points:
        return f"{fmt.name} has {'a zero point per block' if fmt.zero_points else 'no zero points'}"
    if zero_points is not None:
        element = fmt.element_format
        if not isinstance(zero_points, np.ndarray) or zero_points.dtype != np.int8:
            return "zero points must be an int8 numpy array"
        if zero_points.shape != layout.scales_shape:
            return f"zero points must have the scales' shape {layout.scales_shape}, got {zero_points.shape}"
        if zero_points.size and (zero_points.min() < element.lowest or zero_points.max() > element.max):
            return f"zero points must lie in [{element.lowest:.0f}, {element.max:.0f}] ({element.name})"
    if group_index is not None:
        if not isinstance(group_index, np.ndarray) or group_index.dtype != np.int32 or group_index.ndim != 1:
            return "the group index must be a 1-D int32 numpy array"
        if layout.axis != len(layout.shape) - 1 or layout.block_rows > 1:
            return "a group index needs blocks along the last axis"
        if group_index.shape != (layout.shape[-1],):
            return f"the group index must have one entry per column ({layout.shape[-1]}), got {group_index.shape}"
        blocks = layout.scales_shape[-1]
        if group_index.size and (group_index.min() < 0 or group_index.max() >= blocks):
            return f"the group index must name blocks in [0, {blocks})"
    return None


def _positive_in_float32(x: float) -> bool:
    """Whether ``x`` stays positive and finite in float32, where the values are decoded with it."""
    with np.errstate(over="ignore"):
        f = np.float32(x)
    return bool(np.isfinite(f) and f > 0)


def _extra_problem(fmt: BlockFormat, per_tensor_scale: Any, rotation: Any) -> str | None:
    """What is wrong with a per-tensor scale or a rotation of an array of ``fmt``, or None."""
    if per_tensor_scale is not None:
        if not fmt.per_tensor_scale:
            return f"{fmt.name} has no per-tensor scale, got {per_tensor_scale!r}"
        if (
            isinstance(per_tensor_scale, bool)
            or not isinstance(per_tensor_scale, numbers.Real)
            or not (math.isfinite(float(per_tensor_scale)) and float(per_tensor_scale) > 0)
            or not _positive_in_float32(float(per_tensor_scale))
        ):
            return f"per_tensor_scale must be a positive finite float (finite in float32), got {per_tensor_scale!r}"
    if rotation is not None:
        try:
            rotation_signs(tuple(rotation))
        except (TypeError, ValueError) as exc:
            return str(exc)
    return None


#: The name the MX API has always used for the container.
