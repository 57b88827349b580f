"""MX block-scale quantisation (OCP Microscaling): quantise, dequantise, fake-quantise, simulate.

An MX array stores, for every block of ``block_size`` consecutive elements along one axis, a shared
power-of-two scale X (an e8m0 byte) and one small code P per element; the value is X * P. The
rules (scale modes, special blocks, rounding) are those of ``spec/mx.md``; the public functions here
validate and allocate, the kernels in ``kernels/mx_kernels.py`` compute.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ._parallel import run_tasks
from ._random import check_seed, draw_seed, stream_key
from .casting import check_out
from .formats import FORMATS, Format, get_format

__all__ = [
    "MX_FORMATS",
    "MX_ROUNDING_MODES",
    "SCALE_MODES",
    "MXArray",
    "MXFormat",
    "QuantizationError",
    "dequantize_mx",
    "fake_quantize_mx",
    "mx_matmul",
    "quantization_error",
    "quantize_mx",
]

#: How the shared exponent of a block is chosen (see spec/mx.md).
SCALE_MODES: tuple[str, ...] = ("floor", "ceil", "even", "rceil", "neuron")
#: How elements are rounded (the cast vocabulary; MX elements always saturate).
MX_ROUNDING_MODES: tuple[str, ...] = ("nearest_even", "nearest_away", "toward_zero", "stochastic")
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


@dataclass(frozen=True)
class MXFormat:
    """One MX format: its element format and the numbers derived from it.

    ``element`` names a float format of the table, or ``"int8"`` for mxint8 (code c, value c/64).
    """

    name: str
    element: str

    @property
    def is_int(self) -> bool:
        return self.element == "int8"

    @property
    def element_format(self) -> Format | None:
        return None if self.is_int else FORMATS[self.element]

    @property
    def emax_elem(self) -> int:
        """Exponent of the element's largest normal value, floor(log2(max element))."""
        return 0 if self.is_int else self.element_format.emax  # type: ignore[union-attr]

    @property
    def max_element(self) -> float:
        return 127 / 64 if self.is_int else self.element_format.max  # type: ignore[union-attr]

    @property
    def mbits(self) -> int:
        """The element's mantissa width (for mxint8: 6, the fraction bits of c/64 in [1, 2))."""
        return 6 if self.is_int else self.element_format.mbits  # type: ignore[union-attr]

    @property
    def element_bits(self) -> int:
        return 8 if self.is_int else self.element_format.bits  # type: ignore[union-attr]

    @property
    def packable(self) -> bool:
        """Whether codes can be stored two per byte (FP4)."""
        return self.element_bits == 4

    @property
    def x4(self) -> str | None:
        """The Neuron packed container of the element, if any."""
        for f in FORMATS.values():
            if f.kind == "packed" and f.element == self.element:
                return f.name
        return None


#: Every MX format, by name.
MX_FORMATS: dict[str, MXFormat] = {
    f.name: f
    for f in (
        MXFormat("mxfp8_e4m3", "float8_e4m3fn"),
        MXFormat("mxfp8_e5m2", "float8_e5m2"),
        MXFormat("mxfp6_e2m3", "float6_e2m3fn"),
        MXFormat("mxfp6_e3m2", "float6_e3m2fn"),
        MXFormat("mxfp4_e2m1", "float4_e2m1fn"),
        MXFormat("mxint8", "int8"),
    )
}

_INPUT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _choice(value: Any, accepted: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


def _mx_format(fmt: Any) -> MXFormat:
    if isinstance(fmt, MXFormat):
        return fmt
    return MX_FORMATS[_choice(fmt, tuple(MX_FORMATS), "MX format")]


def _block_size(block_size: Any) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"block_size must be a positive int, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size}")
    return int(block_size)


def _axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if ndim == 0:
        raise ValueError("cannot quantise a 0-d array: MX blocks run along an axis")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {ndim} dimensions")
    return int(axis) % ndim


def _input_array(x: Any) -> tuple[np.ndarray, Format]:
    arr = np.asarray(x)  # subclasses (matrix, memmap) as plain arrays
    try:
        fmt = get_format(arr.dtype)
    except TypeError:
        fmt = None
    if fmt is None or fmt.name not in _INPUT_DTYPES:
        raise TypeError(f"MX quantisation takes float32, float16, bfloat16 or float64 arrays; got dtype {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.asarray(arr, order="C"), fmt


def _key(rounding: str, seed: Any) -> int:
    """The kernels' key of the random bits (see :mod:`neuron_kernels._random`)."""
    check_seed(seed)
    if rounding == "stochastic" and seed is None:
        seed = draw_seed()
    return stream_key(0 if seed is None else seed)


@dataclass(frozen=True)
class MXJob:
    """Validated quantisation options, applied to an array or to pieces of one.

    ``quantize(arr, idx0)`` and ``fake_quantize(arr, out, idx0)`` take a C-contiguous array from
    :func:`_input_array` whose ``axis`` is the block axis; ``idx0`` is the C-order index of its
    first element in the whole array (stochastic rounding depends on it), so that a large array
    processed in pieces along its first axis gives the result of processing it whole.
    """

    fmt: MXFormat
    block_size: int
    axis: int
    scale_mode: str
    rounding: str
    key: int
    pack: bool

    def quantize(self, arr: np.ndarray, src: Format, idx0: int = 0) -> MXArray:
        from .kernels import mx_kernels

        size, ax, pack = self.block_size, self.axis, self.pack
        outer, length, inner = _geometry(arr.shape, ax)
        nblocks = -(-length // size)
        code_len = (length + 1) // 2 if pack else length
        codes = np.empty(arr.shape[:ax] + (code_len,) + arr.shape[ax + 1 :], np.uint8)
        scales = np.empty(arr.shape[:ax] + (nblocks,) + arr.shape[ax + 1 :], np.uint8)
        if arr.size:
            last = inner == 1
            kernel = mx_kernels.quantize_kernel(src.name, self.fmt.name, self.scale_mode, self.rounding, pack, last)
            arrays = _blocked(
                last, outer, inner, (mx_kernels.input_view(arr), length), (codes, code_len), (scales, nblocks)
            )
            size = min(size, length)  # a block longer than the axis is the whole axis (and fits in int64)
            align = 2 if pack and size % 2 else 1  # two odd blocks share a byte: keep them on one thread
            run_tasks(kernel, outer * nblocks, arr.size, (*arrays, size, self.key, idx0), align)
        return MXArray(codes, scales.view(_E8M0), self.fmt.name, size, ax, arr.shape, pack)

    def fake_quantize(self, arr: np.ndarray, src: Format, out: np.ndarray, idx0: int = 0) -> None:
        """X * P of every element of ``arr`` into the C-contiguous float32 ``out``."""
        from .kernels import mx_kernels

        outer, length, inner = _geometry(arr.shape, self.axis)
        if arr.size:
            last = inner == 1
            kernel = mx_kernels.fake_quantize_kernel(src.name, self.fmt.name, self.scale_mode, self.rounding, last)
            arrays = _blocked(last, outer, inner, (mx_kernels.input_view(arr), length), (out, length))
            size = min(self.block_size, length)  # a block longer than the axis is the whole axis
            run_tasks(kernel, outer * -(-length // size), arr.size, (*arrays, size, self.key, idx0))


def mx_job(
    fmt: Any,
    ndim: int,
    *,
    block_size: Any = 32,
    axis: Any = -1,
    scale_mode: Any = "floor",
    rounding: Any = "nearest_even",
    seed: Any = None,
    pack: Any = True,
) -> MXJob:
    """Validate the options of :func:`quantize_mx` for arrays of ``ndim`` dimensions."""
    mxf = _mx_format(fmt)
    rnd = _choice(rounding, MX_ROUNDING_MODES, "rounding mode")
    if not isinstance(pack, (bool, np.bool_)):
        raise TypeError(f"pack must be True or False, got {pack!r}")
    return MXJob(
        mxf,
        _block_size(block_size),
        _axis(axis, ndim),
        _choice(scale_mode, SCALE_MODES, "scale mode"),
        rnd,
        _key(rnd, seed),
        bool(pack) and mxf.packable,
    )


def _geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, length, inner): the array seen as (A, L, B) with blocks along L."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, shape[axis], inner


def _blocked(last: bool, outer: int, inner: int, *arrays: tuple[np.ndarray, int]) -> list[np.ndarray]:
    """Views of C-contiguous arrays as (A, n) when the block axis is last, else (A, n, B)."""
    return [a.reshape((outer, n) if last else (outer, n, inner)) for a, n in arrays]


@dataclass(frozen=True, eq=False)
class MXArray:
    """An MX-quantised array.

    Attributes
    ----------
    codes
        uint8 element codes, the shape of the original array; for mxfp4 stored with ``packed``
        two per byte along the block axis (element 2i in the low nibble, an odd tail padded with a
        zero nibble). mxint8 codes are int8 two's complement.
    scales
        float8_e8m0fnu scales: the original shape with the block axis replaced by the number of
        blocks.
    fmt, block_size, axis, shape
        The MX format name, the block length, the (non-negative) block axis, the original shape.
    packed
        Whether FP4 codes are stored two per byte.
    """

    codes: np.ndarray
    scales: np.ndarray
    fmt: str
    block_size: int
    axis: int
    shape: tuple[int, ...]
    packed: bool = False

    def __post_init__(self) -> None:
        """Refuse fields that do not fit together (the kernels trust them)."""
        from .mxfile import layout_error

        for name in ("codes", "scales"):
            if not isinstance(getattr(self, name), np.ndarray):
                raise TypeError(f"MXArray {name} must be a numpy array, got {type(getattr(self, name)).__name__}")
        problem = layout_error(
            self.fmt,
            self.block_size,
            self.axis,
            self.shape,
            self.packed,
            (self.codes.shape, self.codes.dtype),
            (self.scales.shape, self.scales.dtype),
        )
        if problem:
            raise ValueError(f"inconsistent MXArray: {problem}")

    @property
    def format(self) -> MXFormat:
        return MX_FORMATS[self.fmt]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of codes and scales."""
        return int(self.codes.nbytes + self.scales.nbytes)

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element as stored (codes and scales)."""
        return 8 * self.nbytes / self.size if self.size else 0.0

    def __repr__(self) -> str:
        return (
            f"MXArray(fmt={self.fmt!r}, shape={self.shape}, block_size={self.block_size}, axis={self.axis}, "
            f"packed={self.packed}, blocks={self.scales.size}, nbytes={self.nbytes}, "
            f"bits_per_element={self.bits_per_element:.3g})"
        )

    def dequantize(self, dtype: Any = np.float32, *, out: np.ndarray | None = None) -> np.ndarray:
        """The values X * P (exact in float32); see :func:`dequantize_mx`."""
        return dequantize_mx(self, dtype, out=out)

    def unpacked_codes(self) -> np.ndarray:
        """The codes one per byte (unpacking FP4 if stored packed)."""
        if not self.packed:
            return self.codes
        from .kernels import mx_kernels

        return mx_kernels.unpack_fp4_axis(self.codes, self.shape, self.axis)

    def element_codes(self) -> np.ndarray:
        """The codes as an array of the element's ml_dtypes dtype (int8 for mxint8), unpacked."""
        codes = self.unpacked_codes()
        if self.format.is_int:
            return codes.view(np.int8)
        return codes.view(self.format.element_format.result_dtype)  # type: ignore[union-attr]

    def to_x4(self) -> np.ndarray:
        """The element codes in Neuron's packed container of the format, along the last axis.

        mxfp8_e4m3 -> float8_e4m3fn_x4, mxfp8_e5m2 -> float8_e5m2_x4, mxfp4_e2m1 -> float4_e2m1fn_x4.
        The last axis must be a multiple of 4. Other formats raise ``TypeError``.
        """
        x4 = self.format.x4
        if x4 is None:
            raise TypeError(f"{self.fmt} has no Neuron packed container; mxfp8_e4m3, mxfp8_e5m2 and mxfp4_e2m1 do")
        from .casting import pack_x4

        return pack_x4(self.element_codes(), x4)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write one ``.npz`` file (codes, scale bytes and the metadata; see :mod:`neuron_kernels.mxfile`),
        atomically. ``.npz`` is appended to a path without it."""
        from .files import atomic_output
        from .mxfile import MXFileWriter

        path = os.fspath(path)
        if not path.endswith(".npz"):
            path += ".npz"
        with atomic_output(path, force=True) as tmp, MXFileWriter(tmp) as writer:
            writer.add(None, self)

    @classmethod
    def load(cls, path: str | os.PathLike[str], name: str | None = None) -> MXArray:
        """Read an MX file (written by :meth:`save` or ``neuron-kernels quantize``); ``name`` picks
        one array of a file that holds several. A corrupt or inconsistent file raises ``ValueError``."""
        from .mxfile import read_mx_file

        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        arrays = read_mx_file(path)
        names = ", ".join(sorted(map(str, arrays))) if None not in arrays else "one unnamed array (no name= needed)"
        if name is None and len(arrays) > 1:
            raise ValueError(f"{path} holds {len(arrays)} MX arrays; pick one with name= ({names})")
        key = next(iter(arrays)) if name is None else name
        if key not in arrays:
            raise ValueError(f"{path} has no MX array named {name!r}; it has {names}")
        return arrays[key].load()

    @classmethod
    def from_parts(
        cls,
        codes: Any,
        scales: Any,
        fmt: Any,
        block_size: Any,
        axis: Any,
        shape: Any,
        packed: Any,
        where: str = "MXArray",
    ) -> MXArray:
        """An MXArray from its fields, checked for consistency (``ValueError`` naming ``where``)."""
        from .mxfile import layout_error

        if not isinstance(codes, np.ndarray) or not isinstance(scales, np.ndarray):
            raise TypeError(f"{where}: codes and scales must be numpy arrays")
        problem = layout_error(
            fmt, block_size, axis, shape, packed, (codes.shape, codes.dtype), (scales.shape, scales.dtype)
        )
        if problem:
            raise ValueError(f"{where}: {problem}")
        element = MX_FORMATS[fmt].element_format
        if (
            element is not None
            and not packed
            and codes.size
            and element.bits < 8
            and int(codes.max()) >= 1 << element.bits
        ):
            raise ValueError(
                f"{where}: codes hold values above {(1 << element.bits) - 1}, the largest "
                f"{element.bits}-bit code of {fmt}"
            )
        return cls(
            np.ascontiguousarray(codes), np.ascontiguousarray(scales).view(_E8M0), fmt, block_size, axis, shape, packed
        )


def quantize_mx(
    x: Any,
    fmt: str = "mxfp8_e4m3",
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pack: bool = True,
) -> MXArray:
    """Quantise an array to an MX format.

    Parameters
    ----------
    x
        float32, float16, bfloat16 or float64 array of any shape (float64 is rounded to float32
        first; float16 and bfloat16 are exact in float32).
    fmt
        ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp4_e2m1``, ``mxint8``.
    block_size
        Elements per block along ``axis``; the last block may be partial.
    axis
        The block axis (any; the last is the fastest).
    scale_mode
        ``floor`` (OCP), ``ceil``, ``even``, ``rceil`` (NVIDIA), ``neuron`` (Neuron's quantize_mx).
    rounding
        ``nearest_even``, ``nearest_away``, ``toward_zero``, ``stochastic`` (with ``seed``; the
        random bits of an element depend on its C-order index only). Elements always saturate.
    pack
        Store mxfp4 codes two per byte along the block axis.
    """
    mxf = _mx_format(fmt)
    arr, src = _input_array(x)
    job = mx_job(
        mxf.name,
        arr.ndim,
        block_size=block_size,
        axis=axis,
        scale_mode=scale_mode,
        rounding=rounding,
        seed=seed,
        pack=pack,
    )
    return job.quantize(arr, src)


def _result_buffer(
    out: np.ndarray | None, shape: tuple[int, ...], dtype: Any, *inputs: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """(a plain view of the validated ``out``, or None; the C-contiguous array the kernel writes)."""
    if out is None:
        return None, np.empty(shape, dtype)
    target = check_out(out, shape, np.dtype(dtype), *inputs)
    return target, target if target.flags.c_contiguous else np.empty(shape, dtype)


def _deliver(out: np.ndarray | None, target: np.ndarray | None, values: np.ndarray) -> np.ndarray:
    """The result: ``values``, or ``out`` once ``values`` are in it."""
    if out is None or target is None:
        return values
    if values is not target:
        target[...] = values
    return out


def dequantize_mx(mx: MXArray, dtype: Any = np.float32, *, out: np.ndarray | None = None) -> np.ndarray:
    """The values X * P of an MX array, in ``dtype`` (float32 by default; float64, float16 and
    bfloat16 are rounded from the exact float32 values). A block with scale byte 0xff is NaN.

    ``out``: an array of the MX array's shape and ``dtype`` to write the values into (reusing
    one saves the operating system's zeroing of fresh pages, most of the time of a large call).
    """
    if not isinstance(mx, MXArray):
        raise TypeError(f"dequantize_mx takes an MXArray, got {type(mx).__name__}")
    out_fmt = get_format(dtype)
    if out_fmt.name not in _INPUT_DTYPES:
        raise TypeError(f"dequantize_mx writes float32, float64, float16 or bfloat16; got {out_fmt.name}")
    from .kernels import mx_kernels

    outer, length, inner = _geometry(mx.shape, mx.axis)
    code_len = mx.codes.shape[mx.axis]
    nblocks = mx.scales.shape[mx.axis]
    narrow = out_fmt.name in ("float16", "bfloat16")  # computed in float32, then cast into out
    wide = np.dtype("float64" if out_fmt.name == "float64" else "float32")
    target, values = _result_buffer(None if narrow else out, mx.shape, wide, mx.codes, mx.scales)
    if values.size:
        last = inner == 1
        kernel = mx_kernels.dequantize_kernel(mx.fmt, mx.packed, last)
        arrays = _blocked(
            last, outer, inner, (mx.codes, code_len), (mx.scales.view(np.uint8), nblocks), (values, length)
        )
        run_tasks(kernel, outer * nblocks, values.size, (*arrays, min(mx.block_size, length)))
    if narrow:
        from .casting import cast

        return cast(values, out_fmt.name, out=out)
    return _deliver(out, target, values)


def fake_quantize_mx(
    x: Any,
    fmt: str = "mxfp8_e4m3",
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``dequantize_mx(quantize_mx(x, ...))`` in one pass, bit for bit, as a float32 array
    (written into ``out``, a float32 array of x's shape, if given)."""
    mxf = _mx_format(fmt)
    arr, src = _input_array(x)
    job = mx_job(
        mxf.name, arr.ndim, block_size=block_size, axis=axis, scale_mode=scale_mode, rounding=rounding, seed=seed
    )
    target, values = _result_buffer(out, arr.shape, np.float32, arr)
    job.fake_quantize(arr, src, values)
    return _deliver(out, target, values)


def mx_matmul(a: MXArray, b: MXArray) -> np.ndarray:
    """The float32 product of two dequantised MX operands.

    ``a`` (M x K) must be blocked along its last axis and ``b`` (K x N) along its first, with the
    same block size, as an MX matmul unit consumes them. The product is ``numpy.matmul`` of the
    exact float32 values, accumulated in float32 (the summation order is numpy's/BLAS's).
    """
    for name, m in (("a", a), ("b", b)):
        if not isinstance(m, MXArray):
            raise TypeError(f"mx_matmul: {name} must be an MXArray, got {type(m).__name__}")
        if len(m.shape) != 2:
            raise ValueError(f"mx_matmul: {name} must be 2-D, got shape {m.shape}")
    if a.axis != 1:
        raise ValueError(f"mx_matmul: a must be blocked along its last axis (K), got axis {a.axis}")
    if b.axis != 0:
        raise ValueError(f"mx_matmul: b must be blocked along its first axis (K), got axis {b.axis}")
    if a.block_size != b.block_size:
        raise ValueError(f"mx_matmul: block sizes differ ({a.block_size} vs {b.block_size})")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"mx_matmul: inner dimensions differ ({a.shape} @ {b.shape})")
    return np.matmul(a.dequantize(np.float32), b.dequantize(np.float32))


@dataclass(frozen=True)
class QuantizationError:
    """What a quantisation did to an array, computed in float64 over the finite inputs of the
    blocks with a finite scale (a block holding a NaN or an infinity dequantises to NaN as a
    whole: its elements are left out).

    ``sqnr_db``: 10 log10(sum x^2 / sum (x - dq)^2) (inf when exact); ``mse``; ``max_abs_error``;
    ``max_rel_error`` (over non-zero inputs); ``saturated``: fraction of elements whose magnitude
    exceeded the largest element times their block's scale; ``flushed``: fraction of non-zero
    inputs that dequantise to zero.
    """

    sqnr_db: float
    mse: float
    max_abs_error: float
    max_rel_error: float
    saturated: float
    flushed: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class ErrorStats:
    """Running sums of :class:`QuantizationError`, fed piece by piece (:meth:`add`), so that the
    statistics of an array of any size take memory for one piece only."""

    def __init__(self) -> None:
        self.count = 0
        self.signal = 0.0
        self.noise = 0.0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.saturated = 0
        self.flushed = 0

    def add(self, x: np.ndarray, mx: MXArray) -> None:
        """Fold in ``x`` (float32/16/bfloat16/64, C-contiguous) and its quantisation ``mx``, in
        pieces of about a million elements (the float64 temporaries are ~60 bytes an element)."""
        pieces = Pieces.of(x.shape, mx.axis, mx.block_size, mx.packed)
        flat = x.reshape(-1)
        for cut in pieces.cuts(1 << 20):
            start, stop, shape = pieces.values(cut)
            self._add(flat[start:stop].reshape(shape), pieces.mx_piece(mx, cut))

    def _add(self, x: np.ndarray, mx: MXArray) -> None:
        from .kernels.mx_kernels import error_sums

        if x.size == 0:
            return
        outer, length, inner = _geometry(x.shape, mx.axis)
        xv = x.astype(np.float32) if x.dtype.name == "bfloat16" else x
        xv = np.ascontiguousarray(xv, dtype=np.float64).reshape(outer, length, inner)
        dq = mx.dequantize(np.float32).reshape(outer, length, inner)
        scales = np.ascontiguousarray(mx.scales.view(np.uint8)).reshape(outer, mx.scales.shape[mx.axis], inner)
        count, signal, noise, max_abs, max_rel, saturated, flushed = error_sums(
            xv, dq, scales, min(mx.block_size, max(length, 1)), float(mx.format.max_element)
        )
        self.count += count
        self.signal += signal
        self.noise += noise
        self.max_abs = max(self.max_abs, max_abs)
        self.max_rel = max(self.max_rel, max_rel)
        self.saturated += saturated
        self.flushed += flushed

    def result(self) -> QuantizationError:
        n = max(self.count, 1)
        if self.noise == 0:
            sqnr = float("inf")
        else:
            sqnr = float(10 * np.log10(self.signal / self.noise)) if self.signal > 0 else float("-inf")
        return QuantizationError(
            sqnr_db=sqnr,
            mse=self.noise / n,
            max_abs_error=self.max_abs,
            max_rel_error=self.max_rel,
            saturated=self.saturated / n,
            flushed=self.flushed / n,
        )


@dataclass(frozen=True)
class Pieces:
    """How to cut an array, seen as (outer, length, inner) with blocks along ``length``, and its MX
    codes and scales into matching pieces that are each contiguous in all three.

    A piece is rows ``[r0, r1)`` of ``outer`` whole, or, when one row exceeds the budget, the
    range ``[l0, l1)`` of the block axis within one row, cut on whole blocks (and on an even
    element where FP4 codes pack two per byte). It is quantised as an array of shape
    ``(r1 - r0, l1 - l0, inner)`` blocked along axis 1, whose codes and scales are the matching
    C-order ranges of the whole array's: so an array of any size can be processed piece by piece.
    """

    outer: int
    length: int
    inner: int
    block_size: int
    packed: bool

    @classmethod
    def of(cls, shape: tuple[int, ...], axis: int, block_size: int, packed: bool) -> Pieces:
        return cls(*_geometry(shape, axis), block_size, packed)

    def cuts(self, budget: int) -> list[tuple[int, int, int, int]]:
        """Pieces ``(r0, r1, l0, l1)`` of at most ``budget`` elements where possible (a piece is
        at least one block times ``inner``)."""
        row = self.length * self.inner
        if self.outer == 0 or row == 0:
            return [(0, self.outer, 0, self.length)]
        if row <= budget:
            rows = max(1, budget // row)
            return [(r, min(r + rows, self.outer), 0, self.length) for r in range(0, self.outer, rows)]
        align = self.block_size * (2 if self.packed and self.block_size % 2 else 1)
        step = max(align, (budget // self.inner) // align * align)
        return [
            (r, r + 1, lo, min(lo + step, self.length)) for r in range(self.outer) for lo in range(0, self.length, step)
        ]

    def _span(self, n: int, cut: tuple[int, int, int, int], lo: int, hi: int) -> tuple[int, int, tuple[int, ...]]:
        r0, r1, _, _ = cut
        start = (r0 * n + lo) * self.inner
        return start, start + (r1 - r0) * (hi - lo) * self.inner, (r1 - r0, hi - lo, self.inner)

    def values(self, cut: tuple[int, int, int, int]) -> tuple[int, int, tuple[int, ...]]:
        """(start, stop, shape): the piece's flat range and 3-D shape in the array."""
        return self._span(self.length, cut, cut[2], cut[3])

    def codes(self, cut: tuple[int, int, int, int]) -> tuple[int, int, tuple[int, ...]]:
        """(start, stop, shape) of the piece in the codes."""
        if self.packed:
            return self._span((self.length + 1) // 2, cut, cut[2] // 2, (cut[3] + 1) // 2)
        return self._span(self.length, cut, cut[2], cut[3])

    def scales(self, cut: tuple[int, int, int, int]) -> tuple[int, int, tuple[int, ...]]:
        """(start, stop, shape) of the piece in the scales."""
        b = self.block_size
        return self._span(-(-self.length // b), cut, cut[2] // b, -(-cut[3] // b))

    def mx_piece(self, mx: MXArray, cut: tuple[int, int, int, int]) -> MXArray:
        """The piece of ``mx`` as a 3-D MXArray of views (blocked along axis 1)."""
        (c0, c1, cshape), (s0, s1, sshape) = self.codes(cut), self.scales(cut)
        return MXArray(
            mx.codes.reshape(-1)[c0:c1].reshape(cshape),
            mx.scales.reshape(-1)[s0:s1].reshape(sshape),
            mx.fmt,
            mx.block_size,
            1,
            self.values(cut)[2],
            mx.packed,
        )


def quantization_error(x: Any, mx: MXArray) -> QuantizationError:
    """Error statistics of ``mx`` as a quantisation of ``x`` (see :class:`QuantizationError`)."""
    if not isinstance(mx, MXArray):
        raise TypeError(f"quantization_error takes an MXArray, got {type(mx).__name__}")
    arr, _ = _input_array(x)
    if arr.shape != mx.shape:
        raise ValueError(f"x has shape {arr.shape} but the MX array has shape {mx.shape}")
    stats = ErrorStats()
    stats.add(arr, mx)
    return stats.result()
