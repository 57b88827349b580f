"""The package's compiled kernels: one registry entry for every pair of the format table that has a meaning.

Sources: every float format, the packed ``*_x4`` containers and the integers. Targets: every float
format and the packed containers; integers also go to integers. Each entry is a thin wrapper that
views the arrays as the kernel wants them (codes and float32 patterns as unsigned ints) and picks
the specialisation for the call's rounding mode and saturation; beside it, every elementwise pair
(no packed container) has its NumPy ufunc, made on first use from the same plan
(:func:`_plan`, :mod:`.ufuncs`). The registry asks
:func:`builtin_kernels` for the entries on its first use; the numba modules are imported on an
entry's first call, so loading the entries costs nothing and ``import neuron_kernels`` compiles
nothing.

Which options an entry implements:

- casts that can round (to a narrower float) implement every rounding mode and ``saturate``,
  except from integers wider than 16 bits (they are converted to float32 first, like ml_dtypes;
  only the default mode is implemented for them) and to float32 from float64 (the default only);
- exact casts (decoding, widening) accept every mode and ``saturate``: nothing rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._random import stream_key
from ..formats import FORMATS, Format
from ..modes import ROUNDING_MODES

_ALL_MODES = ROUNDING_MODES


def _element(fmt: Format) -> Format:
    return FORMATS[fmt.element] if fmt.kind == "packed" else fmt  # type: ignore[index]


def _is_exact(source: Format, target: Format) -> bool:
    """Whether every value of ``source`` is a value of ``target`` (nothing rounds or overflows)."""
    s, t = _element(source), _element(target)
    if t.float32_values:
        t = FORMATS["float32"]
    if s.float32_values:
        s = FORMATS["float32"]
    if s.kind == "int":
        if t.kind == "int":
            return t.signed >= s.signed and t.bits - t.signed >= s.bits - s.signed
        return t.kind == "float" and t.mbits + 1 >= s.bits - s.signed and t.max >= s.max
    if t.kind != "float" or t.specials == "e8m0":
        return s.name == t.name
    if s.specials == "e8m0":
        return t.emin - t.mbits <= s.emin and t.emax >= s.emax
    return (
        (t.signed or not s.signed)
        and s.mbits <= t.mbits
        and t.emax >= s.emax
        and t.emin - t.mbits <= s.emin - s.mbits
        and (t.has_inf or not s.has_inf)
        and (t.has_nan or not s.has_nan)
    )


def _make_entry(source: Format, target: Format) -> Callable[[np.ndarray, np.ndarray, Any, int], None]:
    """The registry function of ``source -> target``."""
    s_el, t_el = _element(source), _element(target)
    fp4_in = source.kind == "packed" and s_el.bits == 4
    fp4_out = target.kind == "packed" and t_el.bits == 4
    kernels: dict[tuple[str, bool], Any] = {}

    def kernel_for(options: Any) -> Any:
        key = (options.rounding, options.saturate)
        k = kernels.get(key)
        if k is None:
            k = kernels[key] = _build(source, target, s_el, t_el, fp4_in, fp4_out, *key)
        return k

    def view_in(a: np.ndarray) -> np.ndarray:
        if s_el.kind == "int" or s_el.float64_items:
            return a
        return a.view(np.uint8 if source.kind == "packed" else s_el.storage_dtype)

    def view_out(a: np.ndarray) -> np.ndarray:
        if t_el.kind == "int" or t_el.float64_items:
            return a
        return a.view(np.uint8 if target.kind == "packed" else t_el.storage_dtype)

    tables: dict[tuple[str, bool], np.ndarray] = {}
    by_table = _by_table(source, target)

    def cast_kernel(src: np.ndarray, dst: np.ndarray, options: Any, start: int) -> None:
        if by_table and options.rounding != "stochastic":
            key_ = (options.rounding, options.saturate)
            table = tables.get(key_)
            if table is None:
                table = tables[key_] = _table(s_el, t_el, *key_)
            from . import cast_loops

            cast_loops.look_up_items(view_in(src), table, view_out(dst))
            return
        key = stream_key(options.seed or 0)
        kernel_for(options)(view_in(src), view_out(dst), key, start)

    cast_kernel.__name__ = f"{source.name}_to_{target.name}"
    cast_kernel.__doc__ = f"Compiled cast {source.name} -> {target.name}."
    return cast_kernel


def _by_table(source: Format, target: Format) -> bool:
    """Whether ``source -> target`` casts through a table of the results of every source code
    (:func:`_table`): float sources cast elementwise, of one-byte items to codes of one or two
    bytes. Measured at 16 Mi elements, one thread, alternating runs, against the element loop:
    float8_e5m2 -> float8_e4m3fn 15.0 -> 7.3 ms, float8_e8m0fnu -> float8_e5m2 24.6 -> 6.3 ms.
    Where the loop is as fast or faster, it stays: to float32 and float64 (a decode without a
    table), from the 16-bit formats, whose element loops vectorise (float16 -> each one-byte
    format, 64 Mi elements, two threads: 13.1-14.6 ms against 15.9-17.3 through the table of
    65,536 entries, normal data; bfloat16's decode is a shift)."""
    if source.name == target.name or source.kind != "float" or target.kind != "float" or target.float32_items:
        return False  # a copy moves the bits, NaN payloads included
    return source.itemsize == 1 and target.itemsize <= 2


def _table(s_el: Format, t_el: Format, rounding: str, saturate: bool) -> np.ndarray:
    """The results of ``s_el -> t_el`` (any rounding but stochastic) for every source code: each
    decoded to its float32 pattern by the cast to float32, then encoded by the cast from float32.
    The element loop of the pair computes ``store(load(code))`` with the same two functions, so
    the table holds its results bit for bit, and only kernels that the float32 casts share are
    compiled."""
    f32 = FORMATS["float32"]
    codes = np.arange(1 << (8 * s_el.itemsize), dtype=np.uint32).astype(s_el.storage_dtype)
    patterns = np.empty(codes.size, np.uint32)
    _build(s_el, f32, s_el, f32, False, False, "nearest_even", False)(codes, patterns, 0, 0)
    table = np.empty(codes.size, t_el.storage_dtype)
    _build(f32, t_el, f32, t_el, False, False, rounding, saturate)(patterns, table, 0, 0)
    return table


def _plan(
    source: Format,
    target: Format,
    s_el: Format,
    t_el: Format,
    fp4_in: bool,
    fp4_out: bool,
    rounding: str,
    saturate: bool,
) -> tuple[str, tuple[Any, ...]]:
    """What computes ``source -> target`` for one rounding mode and saturation: ``("copy", ())``
    (items moved as they are, or integers converted), ``("pack", ())`` / ``("unpack", ())`` (4-bit
    codes in and out of bytes, bits unchanged), or ``("codec", (src_kind, src_codec, tgt_kind,
    tgt_codec, mode, saturate, layout))``: the arguments of :func:`~.cast_loops.make_cast_kernel`."""
    from . import cast_loops, codec, loaders

    if s_el.name == t_el.name and not saturate:
        # The same values in another container: move the bits (NaN payloads included).
        if fp4_in == fp4_out:
            return "copy", ()
        return ("unpack", ()) if fp4_in else ("pack", ())
    if s_el.kind == "int" and t_el.kind == "int":
        return "copy", ()
    mode = codec.mode_id(rounding)
    if s_el.kind == "int":
        # to a float32 target, numpy's conversion; to a narrower one, one rounding of the integer
        # (ml_dtypes 0.7.0), through float32 rounded to odd
        narrower = not (t_el.float32_values or t_el.float64_items)
        src_kind, src_codec = (loaders.SOURCE_INT_ODD if narrower else loaders.SOURCE_INT), codec.NO_CODEC
    elif s_el.float32_items:
        src_kind, src_codec = loaders.SOURCE_F32, codec.NO_CODEC
    elif s_el.float64_items:
        # Every mode rounds the float64 value once (as ml_dtypes 0.7.0 and numpy's float16 do),
        # which rounding to float32 "to odd" first preserves. Stochastic rounding needs every bit
        # below the target's ulp (to 2^-32 of it), which a float32 rounded to odd loses.
        src_kind = loaders.SOURCE_F64_SPLIT if rounding == "stochastic" else loaders.SOURCE_F64_ODD
        src_codec = codec.NO_CODEC
        if target.float64_items:
            return "copy", ()
    else:
        src_kind, src_codec = loaders.source_of_codes(s_el), codec.codec_of(s_el)
    if t_el.float32_values:
        tgt_kind, tgt_codec = cast_loops.TARGET_F32, codec.NO_CODEC
    elif t_el.float64_items:
        tgt_kind, tgt_codec = cast_loops.TARGET_F64, codec.NO_CODEC
    else:
        tgt_kind, tgt_codec = cast_loops.TARGET_CODES, codec.codec_of(t_el)
    layout = (
        cast_loops.UNPACK_NIBBLES
        if fp4_in and not fp4_out
        else cast_loops.PACK_NIBBLES
        if fp4_out and not fp4_in
        else cast_loops.ELEMENTWISE
    )
    if fp4_in and fp4_out:
        return "copy", ()
    return "codec", (src_kind, src_codec, tgt_kind, tgt_codec, mode, bool(saturate), layout)


def _build(
    source: Format,
    target: Format,
    s_el: Format,
    t_el: Format,
    fp4_in: bool,
    fp4_out: bool,
    rounding: str,
    saturate: bool,
) -> Any:
    from . import cast_loops, nibble_kernels

    how, args = _plan(source, target, s_el, t_el, fp4_in, fp4_out, rounding, saturate)
    if how == "codec":
        return cast_loops.make_cast_kernel(*args)
    return {
        "copy": cast_loops.copy_items,
        "pack": nibble_kernels.pack_nibbles,
        "unpack": nibble_kernels.unpack_nibbles,
    }[how]


def _ufunc_dtype(fmt: Format) -> str:
    """The dtype of a format's items in its ufuncs (see :mod:`.ufuncs`): float32, float64 and the
    integers as they are, every other format as its unsigned integer codes."""
    if fmt.kind == "int" or fmt.float64_items:
        return fmt.result_dtype.name
    if fmt.float32_items:
        return "float32"
    return fmt.storage_dtype.name


def _make_ufuncs(source: Format, target: Format) -> Callable[[str, bool], Any] | None:
    """``ufunc_for(rounding, saturate)`` of an elementwise pair (None for packed containers, whose
    items are not elements): the NumPy ufunc of the cast, built on first use."""
    if source.kind == "packed" or target.kind == "packed":
        return None
    name = f"{source.name}_to_{target.name}"
    in_dtype, out_dtype = _ufunc_dtype(source), _ufunc_dtype(target)

    def ufunc_for(rounding: str, saturate: bool) -> Any:
        from . import ufuncs

        how, args = _plan(source, target, source, target, False, False, rounding, saturate)
        if how == "copy":
            return ufuncs.make_copy_ufunc(name, in_dtype, out_dtype)
        return ufuncs.make_cast_ufunc(name, in_dtype, out_dtype, *args[:6])

    return ufunc_for


def _options_for(source: Format, target: Format) -> tuple[tuple[str, ...], bool]:
    """Which rounding modes and whether saturation an entry implements (see the module docstring)."""
    if _is_exact(source, target):
        return _ALL_MODES, True
    s, t = _element(source), _element(target)
    if t.kind == "int" or (s.kind == "int" and s.bits > 16) or (s.float64_items and t.float32_values):
        return ("nearest_even",), False
    return _ALL_MODES, True


def builtin_kernels() -> Iterator[
    tuple[str, str, Callable[..., None], tuple[str, ...], bool, Callable[[str, bool], Any] | None]
]:
    """(source, target, function, roundings, saturate, ufuncs) of every pair, for the registry
    (whose ``CastOptions`` the functions take as ``options``; ``ufuncs(rounding, saturate)`` gives
    the pair's NumPy ufunc, None for packed containers): floats and packed containers to each
    other, integers to everything (nothing casts a float to an integer)."""
    # fixed-point and narrow integer rows are block elements only
    castable = [f for f in FORMATS.values() if f.kind not in ("fixed", "qint")]
    for s in castable:
        for t in castable:
            if t.kind == "int" and s.kind != "int":
                continue
            roundings, saturate = _options_for(s, t)
            yield s.name, t.name, _make_entry(s, t), roundings, saturate, _make_ufuncs(s, t)
