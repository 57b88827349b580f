"""The public functions: the one place where the kind of the input picks the implementation.

In-memory arrays go to the numerics (:mod:`neuron_kernels.casting` for casts, :mod:`neuron_kernels.blocks`
for block formats), which handle NumPy arrays only; lazy arrays (Dask, and other array-likes that
implement ``__array_ufunc__`` for casts) go to :mod:`neuron_kernels.lazy`, whose results are bit
for bit those of the in-memory call. Nothing below this module imports the lazy layer. PyTorch
CPU tensors are read here as NumPy views of their memory (no copy) and results given back as
tensors (:mod:`neuron_kernels.interop`): ``cast`` and ``fake_quantize`` return tensors for tensors,
``quantize`` a :class:`BlockArray` (``to_torch()`` converts it).

Every block format goes through :func:`quantize` / :func:`fake_quantize` / :func:`dequantize` /
:func:`block_matmul`; ``quantize_mx`` and ``quantize_nvfp4`` (and their ``fake_`` forms) are the
same with each family's options and defaults. They build a
:class:`~neuron_kernels.blocks.scheme.Scheme`, which validates itself, and allocate; the kernels
compute. Given a Dask array, they return lazy results
(:mod:`neuron_kernels.lazy.block_arrays`: a ``LazyBlockArray``, a Dask array of values, a delayed
``QuantizationStats``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from . import casting
from .blocks.array import BlockArray, deliver, result_buffer
from .blocks.job import BlockJob, input_array
from .blocks.scheme import DEFAULT, OPTIONS, Scheme, block_job
from .blocks.stats import QuantizationStats
from .blocks.stats import quantization_error as _in_memory_error
from .dtypes import DTypeLike, get_format
from .errors import InvalidTypeError, InvalidValueError, NotApplicableError
from .formats import BLOCK_FORMATS, MX_FORMATS
from .interop import from_torch, is_torch, to_torch
from .lazy import is_lazy, is_lazy_blocks

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .blocks.scheme import FakeMXOptions, MXOptions, NVFP4Options, SchemeOptions
    from .lazy.block_arrays import LazyBlockArray

__all__ = [
    "cast",
    "quantize",
    "quantize_mx",
    "quantize_nvfp4",
    "dequantize",
    "dequantize_mx",
    "fake_quantize",
    "fake_quantize_mx",
    "fake_quantize_nvfp4",
    "block_matmul",
    "mx_matmul",
    "quantization_error",
    "shared_per_tensor_scale",
]


def _route(
    x: Any,
    out: Any,
    eager: Callable[[Any, Any], Any],
    lazy: Callable[[Any], Any],
    *,
    tensor_result: bool = True,
    is_lazy_input: bool | None = None,
) -> Any:
    """The one boundary every public function of an array goes through.

    A PyTorch tensor (``x`` or ``out``) is read as a NumPy view of its memory and ``eager`` runs
    on the views; the result is ``out`` when given, else a tensor for a tensor (``tensor_result``;
    a block array stays one). A lazy input (a Dask array; ``is_lazy_input`` overrides the test)
    goes to ``lazy``, which takes no ``out=``. Anything else goes to ``eager(x, out)``, which reads
    it as a NumPy array and validates it."""
    if is_torch(x) or is_torch(out):
        arr = from_torch(x) if is_torch(x) else x
        values = eager(arr, from_torch(out, "out") if is_torch(out) else out)
        if out is not None:
            return out
        return to_torch(values) if tensor_result and is_torch(x) else values
    if is_lazy(x) if is_lazy_input is None else is_lazy_input:
        if out is not None:
            raise InvalidTypeError(f"out= takes NumPy arrays; a {type(x).__name__} input gives a lazy result")
        return lazy(x)
    return eager(x, out)


@overload
def cast(
    x: np.ndarray,
    dtype: DTypeLike,
    *,
    rounding: str = ...,
    saturate: bool = ...,
    seed: int | None = ...,
    out: np.ndarray | None = ...,
) -> np.ndarray: ...
@overload
def cast(
    x: Any, dtype: DTypeLike, *, rounding: str = ..., saturate: bool = ..., seed: int | None = ..., out: Any = ...
) -> Any: ...
@functools.wraps(casting.cast)
def cast(
    x: Any,
    dtype: DTypeLike,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int | None = None,
    out: Any = None,
) -> Any:
    def lazy(x: Any) -> Any:
        from .lazy.casts import cast_lazy

        return cast_lazy(x, get_format(dtype), casting.cast_options(rounding, saturate, seed), casting.cast_piece)

    def eager(x: Any, out: Any) -> np.ndarray:
        return casting.cast(x, dtype, rounding=rounding, saturate=saturate, seed=seed, out=out)

    return _route(x, out, eager, lazy)


#: The formats each family of functions takes, and how its errors name one.
_ALL = (tuple(BLOCK_FORMATS), "block format")
_MX = (tuple(MX_FORMATS), "MX format")


def _job(x: Any, scheme: Scheme, family: tuple[tuple[str, ...], str]) -> tuple[np.ndarray, Any, BlockJob]:
    arr, src = input_array(x)
    job = scheme.job(arr.ndim, src.name, *family)
    return arr, src, job.resolved(arr, src)


def _lazy_job(x: Any, scheme: Scheme, family: tuple[tuple[str, ...], str]) -> BlockJob:
    from .lazy.block_arrays import as_dask

    x = as_dask(x, "block quantisation")
    return scheme.job(x.ndim, get_format(x.dtype).name, *family)


def _quantized(x: Any, scheme: Scheme, out: BlockArray | None = None, family: Any = _ALL) -> Any:
    """The quantisation of ``x`` by ``scheme``: a BlockArray (written into ``out``'s codes and
    scales if given), or a LazyBlockArray of a Dask array (which has the same interface)."""

    def lazy(x: Any) -> Any:
        from .lazy.block_arrays import quantize_lazy

        return quantize_lazy(x, _lazy_job(x, scheme, family))

    def eager(x: Any, out: BlockArray | None) -> BlockArray:
        arr, src, job = _job(x, scheme, family)
        return job.quantize(arr, src, out=out)

    return _route(x, out, eager, lazy, tensor_result=False)


def _fake_quantized(x: Any, scheme: Scheme, out: Any, family: Any = _ALL) -> Any:
    def lazy(x: Any) -> Any:
        from .lazy.block_arrays import fake_quantize_lazy

        return fake_quantize_lazy(x, _lazy_job(x, scheme, family))

    def eager(x: Any, out: np.ndarray | None) -> np.ndarray:
        arr, src, job = _job(x, scheme, family)
        return _fake(arr, src, job, out)

    return _route(x, out, eager, lazy)


@overload
def quantize(
    x: np.ndarray, fmt: str, *, out: BlockArray | None = ..., **options: Unpack[SchemeOptions]
) -> BlockArray: ...
@overload
def quantize(
    x: Any, fmt: str, *, out: BlockArray | None = ..., **options: Unpack[SchemeOptions]
) -> BlockArray | LazyBlockArray: ...


def quantize(
    x: Any,
    fmt: str,
    *,
    block_size: int | None = None,
    block_shape: tuple[int, ...] | None = None,
    axis: int = -1,
    scale_mode: str | None = None,
    rounding: str = "nearest_even",
    seed: int | None = None,
    pack: bool = True,
    per_tensor_scale: Any = DEFAULT,
    scale_bound: float | None = None,
    four_over_six: str | None = None,
    scale_search: str | None = None,
    rht: Any = False,
    scale_dtype: Any = None,
    recipe: str | None = None,
    out: BlockArray | None = None,
) -> Any:
    """Quantise an array to a block-scaled format (any of ``neuron_kernels.BLOCK_FORMATS``).

    Parameters
    ----------
    x
        float32, float16, bfloat16 or float64 array of any shape (float64 is rounded to float32
        first; float16 and bfloat16 are exact in float32).
    fmt
        ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp4_e2m1``, ``mxint8``
        (MX: e8m0 scales), ``nvfp4`` (float8_e4m3fn scales, optional per-tensor scale), or FP8
        E4M3 with float scales: ``fp8_block`` (one per 128 x 128 tile), ``fp8_channel`` (one per
        row) and ``fp8_tensor`` (one per matrix); integers with float scales, ``int2_group`` ...
        ``int8_group`` (groups of 128 along the last axis, or ``block_size``) and ``int2_channel``
        ... ``int8_channel`` (one per row), symmetric (``s = amax / ((qmax - qmin) / 2)``), or
        with a zero point per group (``int4_group_asym``, ...: ``s = (max - min) / (qmax -
        qmin)``, ``z = round(qmin - min / s)``), by compressed-tensors' rule (docs/integers.md).
    block_size, block_shape
        1-D blocks of ``block_size`` along ``axis`` (default: the format's, 32 for MX and 16 for
        NVFP4; the last block may be partial), or ``block_shape=(r, c)``: one scale per r x c tile
        of the last two axes (partial tiles at the edges), e.g. (16, 16) for NVFP4 weights or
        (8, 4) for Neuron's ``quantize_mx``. ``fp8_channel`` with a ``block_size`` is FP8 per
        group.
    axis
        The block axis of 1-D blocks (any; the last is the fastest).
    scale_mode
        MX: ``floor`` (OCP, the default), ``ceil``, ``even``, ``rceil`` (NVIDIA), ``neuron``
        (Neuron's ``quantize_mx``); NVFP4: ``nearest`` (its only rule); float scales: ``divide``
        (``s = amax / 448``, each element divided by ``s``: DeepSeek, compressed-tensors, vLLM;
        the default) or ``reciprocal`` (``m = 448 / amax``, each element multiplied by ``m``,
        ``1 / m`` stored: transformers' FineGrainedFP8). The formulas are in
        :data:`neuron_kernels.modes.SCALE_MODES`.
    rounding
        Elements: ``nearest_even``, ``nearest_away``, ``toward_zero``, ``stochastic`` (with
        ``seed``; an element's random bits depend on its C-order index only). Elements always
        saturate.
    pack
        Store 4-bit codes two per byte along the block axis (the last axis for 2-D tiles).
    per_tensor_scale
        NVFP4's second level: ``"amax"`` (the default: ``amax / (scale_bound * 6)`` over the
        tensor's finite elements, 1.0 if that is 0), a positive float (static calibration, used as
        is), or None (single level).
    scale_bound
        The largest block scale the computed per-tensor scale leaves room for: the scale format's
        largest value (None, the default: 448 for NVFP4's float8_e4m3fn), or 256 to
        leave room for four-over-six's map-to-4 scales (it has no effect where no per-tensor
        scale is computed from the amax).
    four_over_six
        NVFP4: quantise each block with its map-to-6 scale (the default rule) and its map-to-4
        scale (``amax / 4``) and keep the one with the smaller error, ``"mae"`` (sum |dq - x|) or
        ``"mse"`` (sum (dq - x)^2), in float64; a tie keeps map-to-6.
    scale_search
        ``"mse"``: also try the neighbouring scales (MX: the exponent above; NVFP4: the e4m3fn codes
        from two below to two above) and keep the smallest sum of squared errors; a tie keeps the
        plain scale.
    rht
        Rotate every 16-element group along the block axis by the random Hadamard transform
        before quantising: True (the default signs) or 16 signs (see :func:`neuron_kernels.rotate`).
    scale_dtype
        Float scales only: the dtype they are stored as, ``float32`` (the default), ``bfloat16`` or
        ``float16`` (compressed-tensors keeps the weight's dtype). The scale is rounded to it
        before the elements are divided by it.
    recipe
        Quantise as a producer does, bit for bit (docs/recipes.md): ``"llm-compressor"``,
        ``"modelopt"``, ``"torchao"`` or ``"ggml"``, each for the formats it writes. A recipe fixes
        the scale rule, the rounding, the per-tensor scale and, where its producer fixes them, the
        blocks: passing those options too is an error. None (the default): the package's rules.

    out
        A block array to write the codes and scales into instead of new arrays (a loop over pieces
        of the same shape then allocates nothing): it must have the result's format, shape, axis,
        blocks, packing and rotation. Returns ``out``, or, where the per-tensor scale differs from
        ``out``'s (NVFP4's from the amax), a block array sharing ``out``'s codes and scales with the
        new per-tensor scale (a block array's fields are fixed).

    A Dask array gives a ``LazyBlockArray`` (codes and scales as Dask arrays; ``.compute()`` gives
    this function's BlockArray bit for bit, stochastic rounding included). Chunks along the block
    axis that split a block are rechunked to whole blocks first; NVFP4's per-tensor scale from the
    amax is computed at once (a Dask reduction), then the quantisation stays lazy.
    """
    return _quantized(x, Scheme.of(fmt, locals(), none_is_default=True), out)


@overload
def quantize_mx(
    x: np.ndarray, fmt: str = ..., *, out: BlockArray | None = ..., **options: Unpack[MXOptions]
) -> BlockArray: ...
@overload
def quantize_mx(
    x: Any, fmt: str = ..., *, out: BlockArray | None = ..., **options: Unpack[MXOptions]
) -> BlockArray | LazyBlockArray: ...


def quantize_mx(
    x: Any,
    fmt: str = "mxfp8_e4m3",
    *,
    block_size: int | None = 32,
    axis: int = -1,
    scale_mode: str | None = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pack: bool = True,
    block_shape: tuple[int, ...] | None = None,
    scale_search: str | None = None,
    recipe: str | None = None,
    out: BlockArray | None = None,
) -> Any:
    """Quantise an array to an MX format (:func:`quantize` restricted to the MX formats, with their
    defaults: blocks of 32, the OCP ``floor`` scale).

    ``fmt``: ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp4_e2m1``,
    ``mxint8``. ``block_shape=(8, 4)`` with ``scale_mode="neuron"`` is Neuron's ``quantize_mx`` on
    a [P, F] tile. ``recipe``: a producer's arithmetic (see :func:`quantize`). ``out``: a block
    array to write into (see :func:`quantize`). A Dask array gives a lazy result (see
    :func:`quantize`).
    """
    scheme = Scheme.of(fmt, locals())
    # the family's default blocks give way to a block_shape, and its scale mode to a recipe's (which fixes it)
    family = replace(
        scheme,
        block_size=DEFAULT if block_shape is not None else block_size,
        scale_mode=DEFAULT if recipe is not None and scale_mode == "floor" else scale_mode,
    )
    return _quantized(x, family, out, _MX)


@overload
def quantize_nvfp4(x: np.ndarray, *, out: BlockArray | None = ..., **options: Unpack[NVFP4Options]) -> BlockArray: ...
@overload
def quantize_nvfp4(
    x: Any, *, out: BlockArray | None = ..., **options: Unpack[NVFP4Options]
) -> BlockArray | LazyBlockArray: ...


def quantize_nvfp4(
    x: Any,
    *,
    block_size: int | None = 16,
    block_shape: tuple[int, ...] | None = None,
    axis: int = -1,
    per_tensor_scale: Any = "amax",
    scale_bound: float | None = None,
    four_over_six: str | None = None,
    scale_search: str | None = None,
    rounding: str = "nearest_even",
    seed: int | None = None,
    pack: bool = True,
    rht: Any = False,
    recipe: str | None = None,
    out: BlockArray | None = None,
) -> Any:
    """Quantise an array to NVFP4 (:func:`quantize` with ``fmt="nvfp4"``): FP4 E2M1 elements, one
    float8_e4m3fn scale per 16 elements, and a float32 per-tensor scale (two levels) unless
    ``per_tensor_scale=None``. Bit for bit with torchao's ``nvfp4_quantize``; ``recipe``: another
    producer's arithmetic (see :func:`quantize`). ``out``: a block
    array to write into (see :func:`quantize`). A Dask array gives a lazy result (see
    :func:`quantize`)."""
    scheme = Scheme.of("nvfp4", locals())
    return _quantized(x, replace(scheme, block_size=DEFAULT if block_shape is not None else block_size), out)


def shared_per_tensor_scale(arrays: Any, fmt: Any = "nvfp4", **options: Any) -> float:
    """One per-tensor scale for several arrays quantised as one layer: the scale of the amax over
    all of them (``amax / (scale_bound * 6)`` for NVFP4), as runtimes that fuse layers need it.

    vLLM fuses q/k/v, gate/up and each expert's gate/up into one GEMM and keeps one per-tensor
    scale for it (the largest of the shards'), so shards quantised each with its own scale are
    dequantised wrongly; quantise each shard with ``per_tensor_scale=`` this value instead.
    ``options`` are :func:`quantize`'s that decide the amax and the scale (``scale_bound``,
    ``four_over_six``, ``rht``, ``axis``). An empty sequence or a format without a per-tensor scale
    is refused."""
    if isinstance(arrays, np.ndarray) or is_torch(arrays) or not hasattr(arrays, "__iter__"):
        raise InvalidTypeError(f"arrays must be a sequence of arrays (the shards), got {type(arrays).__name__}")
    arrays = list(arrays)
    if not arrays:
        raise InvalidValueError("arrays is empty: the shared per-tensor scale needs at least one array")
    options = {"per_tensor_scale": "amax", **options}
    amax, job = 0.0, None
    for x in arrays:
        if is_lazy(x):
            raise InvalidTypeError("shared_per_tensor_scale takes in-memory arrays; compute the shards' amax with Dask")
        arr, src = input_array(from_torch(x) if is_torch(x) else x)
        job = block_job(fmt, arr.ndim, dtype=src.name, **options)
        if not job.needs_amax:
            raise InvalidValueError(f"{job.fmt.name} has no per-tensor scale from the amax (it applies to nvfp4)")
        amax = max(amax, job.amax(arr, src))
    assert job is not None
    pts = job.with_amax(amax).per_tensor_scale
    assert isinstance(pts, float)
    return pts


@overload
def dequantize(q: BlockArray, dtype: Any = ..., *, out: np.ndarray | None = ...) -> np.ndarray: ...
@overload
def dequantize(q: Any, dtype: Any = ..., *, out: np.ndarray | None = ...) -> Any: ...
def dequantize(q: Any, dtype: Any = np.float32, *, out: np.ndarray | None = None) -> Any:
    """The values of a block array in ``dtype`` (see :meth:`BlockArray.dequantize`); of a
    ``LazyBlockArray``, a lazy Dask array."""
    if is_lazy_blocks(q):
        if out is not None:
            raise InvalidTypeError("out= takes NumPy arrays; a LazyBlockArray gives a lazy result")
        return q.dequantize(dtype)
    if not isinstance(q, BlockArray):
        raise InvalidTypeError(f"dequantize takes a BlockArray (a block-format array), got {type(q).__name__}")
    return q.dequantize(dtype, out=out)


@overload
def dequantize_mx(mx: BlockArray, dtype: Any = ..., *, out: np.ndarray | None = ...) -> np.ndarray: ...
@overload
def dequantize_mx(mx: Any, dtype: Any = ..., *, out: np.ndarray | None = ...) -> Any: ...
def dequantize_mx(mx: Any, dtype: Any = np.float32, *, out: np.ndarray | None = None) -> Any:
    """The values X * P of an MX array, in ``dtype`` (float32 by default; float64, float16 and
    bfloat16 are rounded from the exact float32 values). A block with scale byte 0xff is NaN.

    ``out``: an array of the MX array's shape and ``dtype`` to write the values into (reusing
    one saves the operating system's zeroing of fresh pages, most of the time of a large call).
    A ``LazyBlockArray`` gives a lazy Dask array.
    """
    if is_lazy_blocks(mx):
        return dequantize(mx, dtype, out=out)
    if not isinstance(mx, BlockArray):
        raise InvalidTypeError(f"dequantize_mx takes an MX BlockArray, got {type(mx).__name__}")
    _require_mx(mx, "dequantize_mx", "dequantize")
    return mx.dequantize(dtype, out=out)


def _require_mx(q: BlockArray, function: str, general: str) -> None:
    """The ``*_mx`` functions take MX arrays only; the general one takes every family."""
    if not q.format.is_mx:
        raise NotApplicableError(
            f"{function} takes MX arrays, not {q.format.family} ({q.fmt}); {general} takes every block format"
        )


def _fake(arr: np.ndarray, src: Any, job: BlockJob, out: np.ndarray | None) -> np.ndarray:
    target, values = result_buffer(out, arr.shape, np.float32, arr)
    job.fake_quantize(arr, src, values)
    return deliver(out, target, values)


@overload
def fake_quantize(x: np.ndarray, fmt: str, *, out: np.ndarray | None = None, **options: Any) -> np.ndarray: ...
@overload
def fake_quantize(x: Any, fmt: str, *, out: Any = None, **options: Any) -> Any: ...


def fake_quantize(x: Any, fmt: str, *, out: Any = None, **options: Any) -> Any:
    """``dequantize(quantize(x, fmt, **options))`` in one pass, bit for bit, as a float32 array
    (written into ``out``, a float32 array of x's shape, if given). The options are those of
    :func:`quantize` but ``pack``."""
    if "pack" in options:
        raise InvalidTypeError("fake_quantize takes the options of quantize except pack (no codes are stored)")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"fake_quantize() got unknown option(s) {', '.join(unknown)}; the options are quantize's")
    return _fake_quantized(x, Scheme.of(fmt, options, none_is_default=True), out)


@overload
def fake_quantize_mx(
    x: np.ndarray, fmt: str = ..., *, out: np.ndarray | None = ..., **options: Unpack[FakeMXOptions]
) -> np.ndarray: ...
@overload
def fake_quantize_mx(x: Any, fmt: str = ..., *, out: Any = ..., **options: Unpack[FakeMXOptions]) -> Any: ...


def fake_quantize_mx(
    x: Any,
    fmt: str = "mxfp8_e4m3",
    *,
    block_size: int | None = 32,
    axis: int = -1,
    scale_mode: str | None = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    out: Any = None,
    block_shape: tuple[int, ...] | None = None,
    scale_search: str | None = None,
) -> Any:
    """``dequantize_mx(quantize_mx(x, ...))`` in one pass, bit for bit, as a float32 array
    (written into ``out``, a float32 array of x's shape, if given). A Dask array gives a lazy Dask
    array."""
    scheme = Scheme.of(fmt, locals())
    return _fake_quantized(x, replace(scheme, block_size=DEFAULT if block_shape is not None else block_size), out, _MX)


@overload
def fake_quantize_nvfp4(x: np.ndarray, *, out: np.ndarray | None = None, **options: Any) -> np.ndarray: ...
@overload
def fake_quantize_nvfp4(x: Any, *, out: Any = None, **options: Any) -> Any: ...


def fake_quantize_nvfp4(x: Any, *, out: Any = None, **options: Any) -> Any:
    """``dequantize(quantize_nvfp4(x, **options))`` in one pass, bit for bit, as a float32 array."""
    return fake_quantize(x, "nvfp4", out=out, **options)


def block_matmul(a: BlockArray, b: BlockArray) -> np.ndarray:
    """The float32 product of two dequantised block-format operands (MX or NVFP4).

    ``a`` (M x K) must be blocked along K, its last axis (or tiled over both axes), and ``b``
    (K x N) along K, its first axis (or tiled), with the same block length along K, as a matmul
    unit consumes them. Operands rotated with ``rht=`` must both be, with the same signs: the
    rotations along K cancel in the product. The product is ``numpy.matmul`` of the float32
    values, accumulated in float32 (the summation order is numpy's/BLAS's).
    """
    return _matmul(a, b, "block_matmul")


def mx_matmul(a: BlockArray, b: BlockArray) -> np.ndarray:
    """The float32 product of two dequantised MX operands (see :func:`block_matmul`).

    ``a`` (M x K) must be blocked along its last axis and ``b`` (K x N) along its first, with the
    same block size, as an MX matmul unit consumes them. The product is ``numpy.matmul`` of the
    exact float32 values, accumulated in float32 (the summation order is numpy's/BLAS's).
    """
    for name, m in (("a", a), ("b", b)):
        if not isinstance(m, BlockArray):
            raise InvalidTypeError(f"mx_matmul: {name} must be an MX BlockArray, got {type(m).__name__}")
        _require_mx(m, "mx_matmul", "block_matmul")
    return _matmul(a, b, "mx_matmul")


def _matmul(a: BlockArray, b: BlockArray, function: str) -> np.ndarray:
    """:func:`block_matmul`'s checks and product; ``function`` names the caller in its errors."""
    for name, m in (("a", a), ("b", b)):
        if not isinstance(m, BlockArray):
            raise InvalidTypeError(
                f"{function}: {name} must be a BlockArray (a block-format array), got {type(m).__name__}"
            )
        if len(m.shape) != 2:
            raise InvalidValueError(f"{function}: {name} must be 2-D, got shape {m.shape}")
    if a.axis != 1:
        raise InvalidValueError(f"{function}: a must be blocked along its last axis (K), got axis {a.axis}")
    if b.axis != 0 and b.block_rows == 1:
        raise InvalidValueError(f"{function}: b must be blocked along its first axis (K), got axis {b.axis}")
    k_a = a.block_size
    k_b = b.block_rows if b.block_rows > 1 else b.block_size
    if k_a != k_b:
        raise InvalidValueError(f"{function}: block sizes differ along K ({k_a} vs {k_b})")
    if a.shape[1] != b.shape[0]:
        raise InvalidValueError(f"{function}: inner dimensions differ ({a.shape} @ {b.shape})")
    if a.rotation != b.rotation:
        raise InvalidValueError(f"{function}: both operands must be rotated with the same signs (rht=), or neither")
    product: np.ndarray = np.matmul(a.dequantize(np.float32), b.dequantize(np.float32))
    return product


@overload
def quantization_error(x: np.ndarray, q: BlockArray) -> QuantizationStats: ...
@overload
def quantization_error(x: Any, q: Any) -> Any: ...
def quantization_error(x: Any, q: Any) -> Any:
    """Error statistics of ``q`` as a quantisation of ``x`` (see
    :class:`~neuron_kernels.QuantizationStats`).

    For an array quantised with a rotation (``rht=``), ``x`` is compared with the dequantised
    values rotated back (the error of the whole round trip). With a Dask array or a
    ``LazyBlockArray`` the result is a ``dask.delayed`` object whose ``.compute()`` gives the
    statistics (see :func:`neuron_kernels.lazy.block_arrays.quantization_error_lazy`)."""

    def lazy(x: Any) -> Any:
        from .lazy.block_arrays import quantization_error_lazy

        return quantization_error_lazy(x, q)

    def eager(x: Any, _: None) -> QuantizationStats:
        return _in_memory_error(x, q)

    return _route(x, None, eager, lazy, tensor_result=False, is_lazy_input=is_lazy(x) or is_lazy_blocks(q))
