"""Casts of arrays in memory: ``cast``, and ``pack_x4`` / ``unpack_x4`` for Neuron's packed containers.

They validate, allocate and pick the kernel from the registry; the kernels only compute. What the
file commands share with them is public within the package: :func:`cast_options` (validated
options), :func:`source_format` and :class:`CastPlan` (a pair's kernel and options, applied to
whole arrays or to pieces of one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._parallel import read_only, run_chunked
from ._random import check_seed, draw_seed
from .dtypes import DTypeLike, get_format
from .errors import InvalidTypeError, InvalidValueError
from .formats import FORMATS, Format
from .registry import ROUNDING_MODES, CastKernel, CastOptions, lookup_cast

__all__ = ["cast", "pack_x4", "unpack_x4"]

#: Elements handed to a kernel at a time when the input or output is not contiguous.
_BUFFER_ELEMENTS = 1 << 16


def cast_options(rounding: str, saturate: bool, seed: int | None) -> CastOptions:
    """Validated options of :func:`cast` (a fresh seed drawn for stochastic rounding without one)."""
    if not isinstance(rounding, str) or rounding not in ROUNDING_MODES:
        raise InvalidValueError(f"unknown rounding mode {rounding!r}; accepted: {', '.join(ROUNDING_MODES)}")
    if not isinstance(saturate, (bool, np.bool_)):
        raise InvalidTypeError(f"saturate must be True or False, got {saturate!r}")
    check_seed(seed)
    if rounding == "stochastic" and seed is None:
        seed = draw_seed()
    return CastOptions(rounding, bool(saturate), None if seed is None else int(seed))


def source_format(x: np.ndarray) -> Format:
    """The table row of an array's dtype, or a TypeError naming the dtypes that can be cast."""
    try:
        return get_format(x.dtype)
    except TypeError:
        raise InvalidTypeError(
            f"cannot cast an array of dtype {x.dtype}: the sources are float and integer arrays "
            "(float16/32/64, bfloat16, the float8/6/4 types, int8..int64, uint8..uint64)"
        ) from None


def _out_shape(shape: tuple[int, ...], source: Format, target: Format) -> tuple[int, ...]:
    """The result's shape (packing to or from ``*_x4`` containers changes the last axis)."""
    if source.kind == "packed" and target.kind != "packed":
        if not shape:
            raise InvalidValueError(f"a 0-d array of {source.name} containers cannot be unpacked")
        return shape[:-1] + (shape[-1] * 4,)
    if target.kind == "packed" and source.kind != "packed":
        if not shape or shape[-1] % 4:
            raise InvalidValueError(
                f"casting to {target.name} packs 4 consecutive elements of the last axis into one "
                f"container, so the last axis must be a multiple of 4; got shape {shape}"
            )
        return shape[:-1] + (shape[-1] // 4,)
    return shape


def check_out(out: object, shape: tuple[int, ...], dtype: np.dtype, *inputs: np.ndarray) -> np.ndarray:
    """``out`` as a plain ndarray view to write into, if it can receive a result of ``shape`` and
    ``dtype`` computed from ``inputs`` (subclasses such as numpy.matrix are written through a view
    of their memory; the caller returns the object it was given)."""
    if not isinstance(out, np.ndarray):
        raise InvalidTypeError(f"out must be a numpy array, got {type(out).__name__}")
    out = out.view(np.ndarray)
    if out.shape != shape:
        raise InvalidValueError(f"out has shape {out.shape}; the result has shape {shape}")
    if out.dtype != dtype:
        raise InvalidValueError(f"out has dtype {out.dtype}; the result has dtype {dtype}")
    if not out.flags.writeable:
        raise InvalidValueError("out is read-only; pass a writeable array")
    for x in inputs:
        # numpy's stubs admit only max_work -1 or 0; any non-negative bound is valid at run time
        if np.may_share_memory(out, x) and np.shares_memory(out, x, max_work=10**6):  # type: ignore[arg-type, unused-ignore]
            raise InvalidValueError("out overlaps the input; pass a separate array")
    return out


def _execute(
    x: np.ndarray,
    source: Format,
    target: Format,
    kernel: CastKernel,
    options: CastOptions,
    out: np.ndarray,
    index0: int = 0,
) -> None:
    """Run ``kernel`` over ``x`` into ``out`` (both already validated); ``index0`` is the index of
    x's first element in a larger array that is cast in pieces (stochastic bits depend on it)."""
    group = (
        (4, 1)
        if target.kind == "packed" and source.kind != "packed"
        else ((1, 4) if source.kind == "packed" and target.kind != "packed" else (1, 1))
    )
    native = x.dtype.isnative
    if x.flags.c_contiguous and native and out.flags.c_contiguous:
        if x.size:
            fn = kernel.function
            run_chunked(
                fn,
                read_only(x.reshape(-1)),
                out.reshape(-1),
                options,
                *group,
                elements_per_item=source.lanes,
                base=index0,
            )
        return
    if group != (1, 1):
        # Packing needs whole groups of the last axis: work on contiguous copies.
        src = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
        tmp = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        _execute(src, source, target, kernel, options, tmp, index0)
        if tmp is not out:
            out[...] = tmp
        return
    it = np.nditer(
        [x, out],
        flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
        op_flags=[["readonly"], ["writeonly"]],
        op_dtypes=[x.dtype.newbyteorder("="), out.dtype],
        order="C",
        casting="equiv",
        buffersize=_BUFFER_ELEMENTS,
    )
    with it:
        for a, b in it:
            if a.size:
                kernel.function(a, b, options, index0 + it.iterindex)


@dataclass(frozen=True)
class CastPlan:
    """A cast ``source -> target`` with validated options and its registry kernel.

    :meth:`run` casts an array (or a piece of a larger one: ``index0`` is the C-order index of
    its first element in the whole, which stochastic rounding depends on).
    """

    source: Format
    target: Format
    options: CastOptions
    kernel: CastKernel

    @classmethod
    def make(cls, source: Format, target: Format, options: CastOptions) -> CastPlan:
        """The plan of a pair; UnsupportedCastError without a kernel, NotImplementedError for an
        option the kernel does not implement."""
        kernel = lookup_cast(source.name, target.name)
        kernel.check_options(options)
        return cls(source, target, options, kernel)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the result for an input of ``shape`` (ValueError if it cannot be packed)."""
        return _out_shape(shape, self.source, self.target)

    def run(self, x: np.ndarray, out: np.ndarray | None = None, index0: int = 0) -> np.ndarray:
        """Cast ``x`` (an array of the source's dtype) into ``out`` (checked) or a new array."""
        shape = self.out_shape(x.shape)
        dtype = self.target.result_dtype
        if out is None:
            out = np.empty(shape, dtype)
            _execute(x, self.source, self.target, self.kernel, self.options, out, index0)
            return out
        _execute(x, self.source, self.target, self.kernel, self.options, check_out(out, shape, dtype, x), index0)
        return out


def cast_piece(x: np.ndarray, source: str, target: str, options: CastOptions, index0: int) -> np.ndarray:
    """The cast of ``x``, a piece of a larger array whose first element has C-order index ``index0``
    in the whole (what each chunk of a lazy array runs)."""
    return CastPlan.make(get_format(source), get_format(target), options).run(x, index0=index0)


def cast(
    x: Any,
    dtype: DTypeLike,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Cast an array to another number format, elementwise.

    Parameters
    ----------
    x
        An array of any shape and strides (or anything ``numpy.asarray`` accepts) of a float or
        integer dtype. Big-endian arrays are read correctly. Through the package's ``cast``
        (:mod:`neuron_kernels.api`), a Dask array gives a lazy Dask array (cast chunk by chunk, bit
        for bit the same, stochastic rounding included), and another object implementing
        ``__array_ufunc__`` (xarray) goes through the pair's ufunc (see :meth:`CastKernel.ufunc`)
        and stays lazy.
    dtype
        The target: a numpy dtype, an ml_dtypes type, a name such as ``"bfloat16"`` or
        ``"float8_e4m3fn"``, or one of the package's types (``"tfloat32"``, ``"float32r"``,
        ``"float8_e4m3fn_x4"``, ...).
    rounding
        One of ``nearest_even`` (default, bit-exact with ml_dtypes), ``nearest_away``,
        ``toward_zero``, ``toward_positive``, ``toward_negative``, ``stochastic``. A mode that the
        pair's kernel does not implement raises ``NotImplementedError``.
    saturate
        Map overflow to the largest finite value instead of the overflow code.
    seed
        Seed of the stochastic rounding (``None``: fresh entropy).
    out
        Optional output array of the result's shape and dtype; written in place (NumPy inputs).

    Returns
    -------
    numpy.ndarray or dask.array.Array
        Of the ml_dtypes/numpy dtype of the target; ``float32`` arrays for ``tfloat32`` and
        ``float32r``; ``uint32`` (FP8 lanes) or ``uint16`` (FP4 lanes) containers for the packed
        ``*_x4`` targets, whose last axis is a quarter of the input's.

    Raises
    ------
    TypeError
        An unknown or non-numeric dtype, or a pair with no kernel (the message lists the
        supported targets).
    ValueError
        An unknown rounding mode; an ``out`` of the wrong shape or dtype, read-only, or
        overlapping ``x``; a packed target whose last axis is not a multiple of 4.
    """
    target = get_format(dtype)
    options = cast_options(rounding, saturate, seed)
    arr = np.asarray(x)  # subclasses (matrix, memmap) as plain arrays
    return CastPlan.make(source_format(arr), target, options).run(arr, out)


def _x4_format(dtype: DTypeLike) -> Format:
    fmt = get_format(dtype)
    if fmt.kind != "packed":
        packed = ", ".join(n for n, f in FORMATS.items() if f.kind == "packed")
        raise InvalidTypeError(f"{fmt.name} is not a packed x4 type; expected one of: {packed}")
    return fmt


def pack_x4(codes: Any, dtype: DTypeLike) -> np.ndarray:
    """Pack an array of element codes into a packed ``*_x4`` container array, bits unchanged.

    ``codes`` must have the element dtype of ``dtype`` (``float8_e4m3fn`` for
    ``float8_e4m3fn_x4`` ...) and a last axis that is a multiple of 4; lane i of container j holds
    element 4j + i, element 0 in the least significant bits. No value is rounded: use
    :func:`cast` to convert values.
    """
    fmt = _x4_format(dtype)
    element = FORMATS[fmt.element]  # type: ignore[index]
    arr = codes if isinstance(codes, np.ndarray) else np.asarray(codes)
    if arr.dtype != element.result_dtype:
        raise InvalidTypeError(
            f"pack_x4 to {fmt.name} needs an array of {element.name} codes, got dtype "
            f"{arr.dtype}; cast(x, {fmt.name!r}) converts values"
        )
    return CastPlan.make(element, fmt, CastOptions()).run(arr)


def unpack_x4(packed: Any, dtype: DTypeLike) -> np.ndarray:
    """The element codes of a packed ``*_x4`` container array (the inverse of :func:`pack_x4`).

    The result has the element's ml_dtypes dtype and a last axis four times longer.
    """
    fmt = _x4_format(dtype)
    element = FORMATS[fmt.element]  # type: ignore[index]
    arr = packed if isinstance(packed, np.ndarray) else np.asarray(packed, dtype=fmt.result_dtype)
    if arr.dtype.newbyteorder("=") != fmt.result_dtype:
        raise InvalidTypeError(f"unpack_x4 of {fmt.name} needs a {fmt.result_dtype} array, got dtype {arr.dtype}")
    return CastPlan.make(fmt, element, CastOptions()).run(arr)
