"""The format table: every number format the package knows, and everything derived from it.

Each format is one frozen :class:`Format` row holding its defining parameters (exponent and
mantissa widths, bias, infinity/NaN policy, sign rule, storage). Every other number (largest
finite value, smallest normal, codes of NaN and infinity, ...) is computed from those parameters;
nothing is written out per format. The block formats are rows of their own (:class:`BlockFormat`)
over these.

The kernels compile constants from this module, so its code is part of their cache key; turning a
user's dtype description into a row (:func:`~neuron_kernels.dtypes.as_dtype`,
:func:`~neuron_kernels.dtypes.get_format`, ``format_info``) is in :mod:`neuron_kernels.dtypes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import ml_dtypes
import numpy as np

from .errors import InvalidValueError
from .modes import E8M0_SCALE_MODES, FLOAT_SCALE_MODES

__all__ = [
    "BLOCK_FORMATS",
    "INTEGER_BITS",
    "INTEGER_FORMATS",
    "MX_FORMATS",
    "BlockFormat",
    "WHOLE",
    "FLOAT_SCALE_DTYPES",
    "SPECIALS",
    "Format",
    "NKDType",
    "FORMATS",
]

#: How a format spends its top codes on special values.
#: ``ieee``: all-ones exponent is inf (zero mantissa) or NaN (non-zero mantissa).
#: ``fn``: finite; only the all-ones exponent-and-mantissa code is NaN (``float8_e4m3fn``).
#: ``fnuz``: finite, unsigned zero; the negative-zero code 0x80 is the only NaN.
#: ``none``: every code is a finite number (FP6, FP4).
#: ``e8m0``: unsigned exponent-only scale; 0xff is NaN.
#: ``fixed``: a fixed-point element (kind ``"fixed"``): every code is a number, two's complement.
Specials = Literal["ieee", "fn", "fnuz", "none", "e8m0", "fixed"]
#: The specials kinds in a fixed order (the kernels number them by position).
SPECIALS: tuple[Specials, ...] = ("ieee", "fn", "fnuz", "none", "e8m0", "fixed")


@dataclass(frozen=True)
class Format:
    """One row of the format table.

    ``kind`` is ``"float"``, ``"int"``, ``"packed"`` (a container of four elements), ``"fixed"``
    (a fixed-point element of block formats, encoded as a float with one exponent bit: see
    :func:`_fixed`) or ``"qint"`` (a two's-complement integer element of block formats narrower
    than a byte, one code of ``bits`` bits per byte: see :func:`_qint`).
    For floats, ``ebits``/``mbits``/``bias`` define the encoding and ``specials`` the use of the
    top codes. ``bits`` is the width of one encoded value (sign included), ``itemsize`` the bytes
    one stored value takes. ``numpy_name`` names the numpy/ml_dtypes dtype when one exists;
    otherwise arrays of the format have the plain numpy dtype ``container``.
    """

    name: str
    kind: Literal["float", "int", "packed", "fixed", "qint"]
    bits: int
    itemsize: int
    container: str | None = None
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    specials: Specials = "ieee"
    signed: bool = True
    numpy_name: str | None = None
    element: str | None = None  # packed formats: the element format
    lanes: int = 1  # packed formats: elements per container
    #: NaN payload policy of the reference casts: float32 -> float16 keeps the payload's top bits
    #: (numpy); bfloat16 and float16 -> float32 keep the whole payload. Other NaNs become the
    #: format's quiet NaN.
    nan_payload_encode: bool = False
    nan_payload_decode: bool = False

    # ---- derived values -------------------------------------------------------------------
    @cached_property
    def is_float(self) -> bool:
        return self.kind == "float"

    @cached_property
    def is_packed(self) -> bool:
        return self.kind == "packed"

    @cached_property
    def has_inf(self) -> bool:
        return self.kind == "float" and self.specials == "ieee"

    @cached_property
    def has_nan(self) -> bool:
        return self.kind == "float" and self.specials != "none"

    @cached_property
    def has_negative_zero(self) -> bool:
        return self.kind == "float" and self.signed and self.specials in ("ieee", "fn", "none")

    @cached_property
    def float32_items(self) -> bool:
        """Whether the format's items are float32 bit patterns (float32, and the formats the package
        stores in float32 arrays: float32r, tfloat32): kernels read and write them as such."""
        return self.kind == "float" and self.itemsize == 4 and self.ebits == 8 and self.bias == 127

    @cached_property
    def float32_values(self) -> bool:
        """Whether the format's values are float32's, every one (float32, float32r): nothing rounds
        between the two."""
        return self.float32_items and self.mbits == 23 and self.specials == "ieee"

    @cached_property
    def float64_items(self) -> bool:
        """Whether the format's items are float64 values, which kernels take as they are (the
        widest source, read to float32 with one rounding; not a pattern of codes)."""
        return self.kind == "float" and self.itemsize == 8

    @cached_property
    def magnitude_bits(self) -> int:
        """The bits of a code that are not its sign (all of them in an unsigned format)."""
        return self.bits - 1 if self.signed else self.bits

    @cached_property
    def max_exponent_field(self) -> int:
        """Largest biased exponent field that encodes finite values."""
        top = (1 << self.ebits) - 1
        return top - 1 if self.specials in ("ieee", "e8m0") else top

    @cached_property
    def max_mantissa_field(self) -> int:
        """Largest mantissa field at :attr:`max_exponent_field` that encodes a finite value."""
        full = (1 << self.mbits) - 1
        return full - 1 if self.specials == "fn" else full

    @cached_property
    def max_code(self) -> int:
        """Code of the largest finite positive value (sign bit clear)."""
        return (self.max_exponent_field << self.mbits) | self.max_mantissa_field

    @cached_property
    def sign_code(self) -> int:
        """The sign bit of a code (0 for unsigned formats)."""
        return 1 << (self.bits - 1) if self.signed else 0

    @cached_property
    def inf_code(self) -> int | None:
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None

    @cached_property
    def nan_code(self) -> int | None:
        """The positive quiet NaN code (fn and e8m0: every magnitude bit set; fnuz: the only NaN, 0x80)."""
        if self.specials == "ieee":
            return (((1 << self.ebits) - 1) << self.mbits) | (1 << (self.mbits - 1))
        if self.specials in ("fn", "e8m0"):
            return (1 << self.magnitude_bits) - 1
        if self.specials == "fnuz":
            return 1 << (self.bits - 1)
        return None

    @cached_property
    def emin(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - self.bias if self.mbits else -self.bias

    @cached_property
    def emax(self) -> int:
        return self.max_exponent_field - self.bias

    @cached_property
    def integer(self) -> bool:
        """Whether the values are the integers of the codes (numpy's ints and the block elements of
        :func:`_qint`)."""
        return self.kind in ("int", "qint")

    @cached_property
    def max(self) -> float:
        if self.integer:
            return float((1 << self.magnitude_bits) - 1)
        frac = 1.0 + self.max_mantissa_field / (1 << self.mbits)
        return float(np.ldexp(frac, self.emax))

    @cached_property
    def lowest(self) -> float:
        if self.integer:
            return float(-(1 << self.magnitude_bits)) if self.signed else 0.0
        if self.signed:
            return -self.max
        return self.smallest_normal if self.specials == "e8m0" else 0.0  # e8m0 has no zero

    @cached_property
    def smallest_normal(self) -> float:
        return float(np.ldexp(1.0, self.emin))

    @cached_property
    def smallest_subnormal(self) -> float:
        return float(np.ldexp(1.0, self.emin - self.mbits))

    @cached_property
    def eps(self) -> float:
        return float(np.ldexp(1.0, -self.mbits))

    @cached_property
    def dtype(self) -> np.dtype | NKDType:
        """The dtype object users see: the numpy/ml_dtypes dtype, else the package's own."""
        if self.numpy_name is not None:
            return _numpy_dtype(self.numpy_name)
        return NKDType._for(self)

    @cached_property
    def result_dtype(self) -> np.dtype:
        """The dtype of the arrays that hold values of this format."""
        if self.numpy_name is not None:
            return _numpy_dtype(self.numpy_name)
        return np.dtype(self.container)

    @cached_property
    def storage_dtype(self) -> np.dtype:
        """The unsigned integer dtype of the same width: what the kernels see."""
        return np.dtype(f"uint{8 * self.itemsize}")


def _has_numpy_dtype(name: str) -> bool:
    if hasattr(ml_dtypes, name):
        return True
    try:
        np.dtype(name)
    except TypeError:
        return False
    return True


def _numpy_dtype(name: str) -> np.dtype:
    obj = getattr(ml_dtypes, name, None)
    return np.dtype(obj if obj is not None else name)


class NKDType:
    """A dtype object for a format that numpy and ml_dtypes do not have.

    ``tfloat32`` and ``float32r`` are stored in float32 arrays; the packed ``*_x4`` types in
    uint32 (FP8 lanes) or uint16 (FP4 lanes) arrays. The object carries the format's ``name``,
    ``itemsize`` and the ``container`` dtype; it compares equal to itself and to its name.
    """

    __slots__ = ("_format",)
    _instances: dict[str, NKDType] = {}

    def __init__(self, fmt: Format) -> None:
        self._format = fmt

    @classmethod
    def _for(cls, fmt: Format) -> NKDType:
        inst = cls._instances.get(fmt.name)
        if inst is None:
            inst = cls._instances[fmt.name] = cls(fmt)
        return inst

    @property
    def name(self) -> str:
        return self._format.name

    @property
    def itemsize(self) -> int:
        return self._format.itemsize

    @property
    def container(self) -> np.dtype:
        return np.dtype(self._format.container)

    @property
    def format(self) -> Format:
        return self._format

    def __repr__(self) -> str:
        return f"neuron_kernels.{self.name}"

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NKDType):
            return other._format.name == self._format.name
        if isinstance(other, str):
            return other == self._format.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("neuron_kernels", self._format.name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_dtype_named, (self.name,))


def _dtype_named(name: str) -> np.dtype | NKDType:
    """The dtype object of the format ``name`` (how an :class:`NKDType` is unpickled)."""
    return FORMATS[name].dtype


def _float(
    name: str,
    ebits: int,
    mbits: int,
    bias: int,
    specials: Specials,
    *,
    itemsize: int = 1,
    container: str | None = None,
    signed: bool = True,
    nan_payload_encode: bool = False,
    nan_payload_decode: bool = False,
) -> Format:
    width = 1 + ebits + mbits if signed else ebits + mbits
    numpy_name = None if container else name
    if numpy_name is not None and not _has_numpy_dtype(name):
        # a format newer than the installed ml_dtypes: its codes in plain unsigned integers
        numpy_name, container = None, f"uint{8 * itemsize}"
    return Format(
        name=name,
        kind="float",
        bits=width,
        itemsize=itemsize,
        container=container,
        ebits=ebits,
        mbits=mbits,
        bias=bias,
        specials=specials,
        signed=signed,
        numpy_name=numpy_name,
        nan_payload_encode=nan_payload_encode,
        nan_payload_decode=nan_payload_decode,
    )


def _int(name: str) -> Format:
    info = np.iinfo(name)
    return Format(name=name, kind="int", bits=info.bits, itemsize=info.bits // 8, signed=info.min < 0, numpy_name=name)


def _fixed(name: str, bits: int, fraction_bits: int) -> Format:
    """A two's-complement fixed-point code c of ``bits`` bits meaning c / 2^fraction_bits, clamped
    to +-(2^(bits-1) - 1). With ``bits = fraction_bits + 2`` its magnitudes are exactly those of a
    float with one exponent bit, ``fraction_bits`` mantissa bits and bias 1 (c / 2^f for c below
    2^f are its subnormals, the rest its one binade of normals), so the generic encoder rounds it;
    only the sign differs (two's complement instead of a sign bit)."""
    if bits != fraction_bits + 2:
        raise InvalidValueError("a fixed-point element row needs bits == fraction_bits + 2")
    return Format(
        name=name,
        kind="fixed",
        bits=bits,
        itemsize=1,
        container=f"int{bits}",
        ebits=1,
        mbits=fraction_bits,
        bias=1,
        specials="fixed",
        numpy_name=None,
    )


def _qint(bits: int) -> Format:
    """The signed integer element of ``bits`` bits (2 to 7) of integer block formats: codes in
    [-2^(bits-1), 2^(bits-1) - 1], each stored as its ``bits``-bit two's-complement pattern in a
    byte (4-bit codes may pack two per byte). Not a cast target: an element of block formats only
    (8 bits is numpy's int8)."""
    return Format(
        name=f"int{bits}", kind="qint", bits=bits, itemsize=1, container="uint8", specials="fixed", numpy_name=None
    )


def _packed(name: str, element: str, container: str) -> Format:
    size = np.dtype(container).itemsize
    return Format(
        name=name,
        kind="packed",
        bits=8 * size,
        itemsize=size,
        container=container,
        element=element,
        lanes=4,
        numpy_name=None,
        signed=False,
    )


_TABLE: tuple[Format, ...] = (
    # IEEE and numpy floats
    _float("float64", 11, 52, 1023, "ieee", itemsize=8),
    _float("float32", 8, 23, 127, "ieee", itemsize=4),
    _float("float16", 5, 10, 15, "ieee", itemsize=2, nan_payload_encode=True, nan_payload_decode=True),
    # Package-only floats stored in float32 arrays (tfloat32: the low 13 mantissa bits are zero)
    _float("float32r", 8, 23, 127, "ieee", itemsize=4, container="float32"),
    _float("tfloat32", 8, 10, 127, "ieee", itemsize=4, container="float32"),
    # ml_dtypes floats
    _float("bfloat16", 8, 7, 127, "ieee", itemsize=2, nan_payload_decode=True),
    _float("float8_e4m3", 4, 3, 7, "ieee"),
    _float("float8_e4m3fn", 4, 3, 7, "fn"),
    _float("float8_e4m3fnuz", 4, 3, 8, "fnuz"),
    _float("float8_e4m3b11fnuz", 4, 3, 11, "fnuz"),
    _float("float8_e5m2", 5, 2, 15, "ieee"),
    _float("float8_e5m2fnuz", 5, 2, 16, "fnuz"),
    _float("float8_e3m4", 3, 4, 3, "ieee"),
    _float("float8_e5m3fnu", 5, 3, 15, "fn", signed=False),
    _float("float6_e2m3fn", 2, 3, 1, "none"),
    _float("float6_e3m2fn", 3, 2, 3, "none"),
    _float("float4_e2m1fn", 2, 1, 1, "none"),
    _float("float8_e8m0fnu", 8, 0, 127, "e8m0", signed=False),
    # Neuron's packed containers: four elements of the last axis per container
    _packed("float8_e4m3fn_x4", "float8_e4m3fn", "uint32"),
    _packed("float8_e5m2_x4", "float8_e5m2", "uint32"),
    _packed("float4_e2m1fn_x4", "float4_e2m1fn", "uint16"),
    # integers
    *(_int(n) for n in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")),
    # fixed-point elements of block formats (not cast targets): mxint8's code c / 64
    _fixed("fixed8_q6", 8, 6),
    # integer elements of block formats narrower than int8 (not cast targets)
    *(_qint(b) for b in range(2, 8)),
)

#: The widths of the integer block formats' elements (compressed-tensors packs 2 to 8 bits).
INTEGER_BITS: tuple[int, ...] = tuple(range(2, 9))

#: Every format, by canonical name.
FORMATS: dict[str, Format] = {f.name: f for f in _TABLE}

#: The float dtypes of plain arrays: what block formats quantise from and dequantise to, and the
#: plain weights files and checkpoints hold (the widest first read to float32 with one rounding).
INPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")

# ---- block formats ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockFormat:
    """One block-scaled format: elements of one format that share, per block, a scale of another.

    ``element`` is a float, fixed-point or integer row of :data:`FORMATS`, ``scale`` the scale's row
    (``float8_e8m0fnu`` for MX, ``float8_e4m3fn`` for NVFP4, ``float32`` for FP8 and the integer
    formats with float scales, which may be stored as ``bfloat16`` or ``float16`` too:
    :data:`FLOAT_SCALE_DTYPES`; integer formats may add a zero point per block),
    ``block_size`` the default block length and ``block_rows`` the default rows of a 2-D tile
    (:data:`WHOLE`: the whole axis, per channel or per tensor), ``per_tensor_scale`` whether a
    float32 per-tensor scale may apply on top (NVFP4's two levels), ``zero_points`` whether each
    block has a zero point (the asymmetric integer formats, ``*_asym``). Every other number is derived
    from these rows.
    """

    name: str
    element: str
    scale: str
    block_size: int
    per_tensor_scale: bool = False
    block_rows: int = 1
    #: Integer formats: a zero point per block (asymmetric: ``(q - z) * s``).
    zero_points: bool = False

    @cached_property
    def element_format(self) -> Format:
        return FORMATS[self.element]

    @cached_property
    def scale_format(self) -> Format:
        return FORMATS[self.scale]

    @cached_property
    def max_element(self) -> float:
        """The largest element value."""
        return self.element_format.max

    @cached_property
    def emax_elem(self) -> int:
        """Exponent of the element's largest normal value, floor(log2(max element))."""
        return self.element_format.emax

    @cached_property
    def mbits(self) -> int:
        """The element's mantissa width (fixed point: its fraction bits)."""
        return self.element_format.mbits

    @cached_property
    def element_bits(self) -> int:
        return self.element_format.bits

    @cached_property
    def packable(self) -> bool:
        """Whether codes can be stored two per byte (4-bit elements)."""
        return self.element_bits == 4

    @cached_property
    def x4(self) -> str | None:
        """The Neuron packed container of the element, if any."""
        return next((f.name for f in FORMATS.values() if f.kind == "packed" and f.element == self.element), None)

    @cached_property
    def nan_element_code(self) -> int:
        """The code of every element of a block holding a NaN or an infinity: the element's
        positive NaN code, or 0 where it has none."""
        return self.element_format.nan_code or 0

    @cached_property
    def integer(self) -> bool:
        """Whether the elements are integers (``int2`` ... ``int8``): a block's values are ``(q - z) *
        s``, ``z`` its zero point (0 for symmetric quantisation)."""
        return self.element_format.integer

    @cached_property
    def scale_modes(self) -> tuple[str, ...]:
        """The scale modes (``modes.SCALE_MODES``) of this scale format; the first is the default."""
        if self.integer:
            return ("divide",)
        if self.float_scales:
            return FLOAT_SCALE_MODES
        return E8M0_SCALE_MODES if self.scale_format.specials == "e8m0" else ("nearest",)

    @cached_property
    def float_scales(self) -> bool:
        """Whether the scales are floats of 16 or 32 bits (FP8 with float scales), not bytes."""
        return self.scale_format.kind == "float" and self.scale_format.bits >= 16

    @cached_property
    def scale_dtypes(self) -> tuple[str, ...]:
        """The dtypes the scales may be stored as; the first is the default."""
        return FLOAT_SCALE_DTYPES if self.float_scales else (self.scale,)

    @cached_property
    def per_matrix(self) -> bool:
        """Whether one scale covers a whole matrix (FP8 per tensor)."""
        return self.block_rows == WHOLE and self.block_size == WHOLE

    @cached_property
    def default_block_shape(self) -> tuple[int, ...]:
        """The default block, ``(block_size,)`` or the 2-D tile ``(block_rows, block_size)``
        (:data:`WHOLE` where it spans the axis)."""
        return (self.block_size,) if self.block_rows == 1 else (self.block_rows, self.block_size)

    @cached_property
    def is_mx(self) -> bool:
        """Whether this is an OCP MX format (power-of-two e8m0 scales)."""
        return self.scale_format.specials == "e8m0"

    @cached_property
    def family(self) -> str:
        """The family's name, as messages and reprs say it: ``MX``, ``INT`` (integer elements),
        ``FP8`` (float scales), or the format's own (``NVFP4``)."""
        if self.integer:
            return "INT"
        if self.float_scales:
            return "FP8"
        return "MX" if self.is_mx else self.name.upper()


#: A block length that spans its whole axis: one scale per row (per channel) or, as the rows of a
#: tile too, per matrix. Any block is cut to the array it lies in, so the largest length will do.
WHOLE = 2**62

#: The dtypes float scales may be stored as (the first is the default): float32 (DeepSeek, vLLM,
#: transformers), bfloat16 and float16 (compressed-tensors keeps the weight's dtype).
FLOAT_SCALE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

_BLOCK_TABLE: tuple[BlockFormat, ...] = (
    BlockFormat("mxfp8_e4m3", "float8_e4m3fn", "float8_e8m0fnu", 32),
    BlockFormat("mxfp8_e5m2", "float8_e5m2", "float8_e8m0fnu", 32),
    BlockFormat("mxfp6_e2m3", "float6_e2m3fn", "float8_e8m0fnu", 32),
    BlockFormat("mxfp6_e3m2", "float6_e3m2fn", "float8_e8m0fnu", 32),
    BlockFormat("mxfp4_e2m1", "float4_e2m1fn", "float8_e8m0fnu", 32),
    BlockFormat("mxint8", "fixed8_q6", "float8_e8m0fnu", 32),
    BlockFormat("nvfp4", "float4_e2m1fn", "float8_e4m3fn", 16, per_tensor_scale=True),
    BlockFormat("fp8_block", "float8_e4m3fn", "float32", 128, block_rows=128),
    BlockFormat("fp8_channel", "float8_e4m3fn", "float32", WHOLE),
    BlockFormat("fp8_tensor", "float8_e4m3fn", "float32", WHOLE, block_rows=WHOLE),
    # FP8 of the IEEE-style E4M3 (max 240: Trn1 and Trn2), whose codes are float8_e4m3fn's up to 240
    BlockFormat("fp8_e4m3_block", "float8_e4m3", "float32", 128, block_rows=128),
    BlockFormat("fp8_e4m3_channel", "float8_e4m3", "float32", WHOLE),
    BlockFormat("fp8_e4m3_tensor", "float8_e4m3", "float32", WHOLE, block_rows=WHOLE),
    # integers with float scales, symmetric or with zero points (``_asym``): per group of 128 (GPTQ,
    # AWQ, compressed-tensors' W4A16) or per channel (W8A8)
    *(
        BlockFormat(f"int{b}_{kind}{'_asym' if asym else ''}", f"int{b}", "float32", size, zero_points=asym)
        for asym in (False, True)
        for kind, size in (("group", 128), ("channel", WHOLE))
        for b in INTEGER_BITS
    ),
)

#: Every block format, by name.
BLOCK_FORMATS: dict[str, BlockFormat] = {f.name: f for f in _BLOCK_TABLE}

#: The integer block formats, by name.
INTEGER_FORMATS: dict[str, BlockFormat] = {n: f for n, f in BLOCK_FORMATS.items() if f.integer}

#: The OCP MX formats (e8m0 scales), by name.
MX_FORMATS: dict[str, BlockFormat] = {n: f for n, f in BLOCK_FORMATS.items() if f.is_mx}
