"""Explicit numpy/ml_dtypes implementations for the pairs that have no compiled kernel yet.

Every pair that :func:`~neuron_kernels.promote_type` can ask :func:`~neuron_kernels.auto_cast`
for resolves to a kernel: these fill the gaps, one generic function per pair built from the
format table, registered with ``impl="fallback"`` so that users and benchmarks can tell them
apart. Values go through ml_dtypes' ``astype``, so they equal ml_dtypes by construction:
float64 sources round to float32 first and then to the target, ``float8_e8m0fnu`` ties round
up. The package-only targets are derived: ``float32r`` is float32, ``tfloat32`` is float32
rounded to 10 mantissa bits (ties to even), the ``*_x4`` containers pack the element codes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..formats import FORMATS, Format
from ..registry import _REGISTRY, CastOptions, register_cast


def pack_codes(codes: np.ndarray, lane_bits: int, container: np.dtype) -> np.ndarray:
    """Pack groups of four element codes (uint8, 1-D) into containers, lane i at bits [i*w, (i+1)*w)."""
    c = codes.reshape(-1, 4).astype(container)
    mask = container.type((1 << lane_bits) - 1)
    out = c[:, 0] & mask
    for lane in range(1, 4):
        out |= (c[:, lane] & mask) << container.type(lane * lane_bits)
    return out


def unpack_codes(packed: np.ndarray, lane_bits: int) -> np.ndarray:
    """The inverse of :func:`pack_codes`: containers (1-D) to uint8 codes, four per container."""
    mask = (1 << lane_bits) - 1
    lanes = [(packed >> packed.dtype.type(lane * lane_bits)) & packed.dtype.type(mask) for lane in range(4)]
    return np.stack(lanes, axis=-1).reshape(-1).astype(np.uint8)


def _round_tfloat32(values: np.ndarray) -> np.ndarray:
    u = values.astype(np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        r = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    nan = (u & np.uint32(0x80000000)) | np.uint32(0x7FC00000)
    return np.where((u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000), nan, r).view(np.float32)


def _lane_bits(fmt: Format) -> int:
    return 8 * fmt.itemsize // fmt.lanes


def _to_values(src: np.ndarray, fmt: Format) -> np.ndarray:
    """Source array -> values numpy/ml_dtypes can ``astype``.

    Floats narrower than float64 are decoded to float32 (exact), so that every target is reached
    with one rounding even where ml_dtypes has no direct cast (float8_e8m0fnu to float8, ...);
    packed containers are unpacked first. float64 and integers go to ``astype`` as they are.
    """
    if fmt.kind == "packed":
        element = FORMATS[fmt.element]  # type: ignore[index]
        return unpack_codes(src, _lane_bits(fmt)).view(element.result_dtype).astype(np.float32)
    if fmt.kind == "float" and fmt.itemsize < 8:
        return src.astype(np.float32)
    return src


def _from_values(values: np.ndarray, fmt: Format) -> np.ndarray:
    """Values -> the target's array (same number of elements, or a quarter for packed targets)."""
    if fmt.kind == "packed":
        element = FORMATS[fmt.element]  # type: ignore[index]
        codes = values.astype(element.result_dtype).view(np.uint8)
        return pack_codes(codes, _lane_bits(fmt), fmt.result_dtype)
    if fmt.name == "tfloat32":
        return _round_tfloat32(values)
    return values.astype(fmt.result_dtype)


def make_fallback(source: Format, target: Format) -> Callable[[np.ndarray, np.ndarray, CastOptions, int], None]:
    """The fallback kernel for ``source -> target``."""

    def fallback(src: np.ndarray, dst: np.ndarray, options: CastOptions, start: int) -> None:
        with np.errstate(invalid="ignore", over="ignore"):
            dst[...] = _from_values(_to_values(src, source), target)

    fallback.__name__ = f"{source.name}_to_{target.name}_fallback"
    return fallback


def _wanted_pairs() -> list[tuple[Format, Format]]:
    """Every numeric source to every float or packed target, and integer to integer."""
    pairs = []
    for s in FORMATS.values():
        for t in FORMATS.values():
            if t.kind in ("float", "packed") or (s.kind == "int" and t.kind == "int"):
                pairs.append((s, t))
    return pairs


def _register_all() -> None:
    for s, t in _wanted_pairs():
        if (s.name, t.name) not in _REGISTRY:
            register_cast(s.name, t.name, impl="fallback", parallel=False)(make_fallback(s, t))


_register_all()
