"""The Neuron compiler's implicit dtype promotion lattice (``promote_type`` and friends).

Pure Python: this module never imports numba and works on dtype descriptions, not arrays.
The rules, in the order they are applied (the README's "Promotion rules in brief" says the same):

1. ``promote_type(t0, t1)`` splits on whether each operand is floating (:func:`is_floating`):
   both floating -> the float rule; exactly one -> the float operand; neither -> the integer rule
   when both are integers, else ``TypeError("unexpected dtype: ...")``.
2. Float rule: ``float8_e8m0fnu`` is a scale, not a value: against anything else the other operand
   wins (two e8m0 give e8m0). Then the wider itemsize wins. On equal itemsize the first rung of
   ``float64 > float32r > float32 > bfloat16 > float16 > float8_e4m3 > float8_e4m3fn > float8_e5m2``
   equal to either operand wins; no rung matching is the "no path" error.
3. Integer rule: same signedness -> the wider (the first on a tie). Mixed: the signed one if it is
   strictly wider, else int16 for uint8, int32 for uint16, else float32.

There is no short cut for equal operands: ``promote_type("float4_e2m1fn", "float4_e2m1fn")``
raises the no-path error, exactly like the compiler.

Like the compiler, the "exactly one floating" branch does not check what the other operand is:
``promote_type("float32", "bool")`` is float32. Arrays of such dtypes are still refused by
``auto_cast`` because no cast kernel takes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DTypeLike, as_dtype
from ..errors import InvalidTypeError, NeuronKernelsError
from ..formats import FORMATS, NKDType

__all__ = [
    "NoPromotionPathError",
    "Promotion",
    "FLOAT_PRECEDENCE",
    "promote_type",
    "explain_promotion",
    "promotion_table",
    "is_floating",
    "merge_type",
    "can_merge_type",
    "is_x4_dtype",
    "get_x1_from_x4",
    "get_x4_from_x1",
    "launder_x4_dtype",
]

#: The equal-itemsize precedence ladder, highest first.
FLOAT_PRECEDENCE: tuple[str, ...] = (
    "float64",
    "float32r",
    "float32",
    "bfloat16",
    "float16",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e5m2",
)

#: The compiler's custom float types: floating even though numpy does not say so.
CUSTOM_FLOATS: frozenset[str] = frozenset(
    name for name, f in FORMATS.items() if f.kind == "float" and name not in ("float16", "float32", "float64")
)

_E8M0 = "float8_e8m0fnu"


class NoPromotionPathError(NeuronKernelsError, TypeError):
    """Two floating dtypes of equal itemsize that no rung of the precedence ladder covers."""


@dataclass(frozen=True)
class Promotion:
    """Which rule decided a pair, and what it gave.

    ``result`` is the promoted dtype, or ``None`` when the pair is an error; ``rule`` is a short
    identifier, ``reason`` a sentence; ``error`` is the exception ``promote_type`` raises.
    """

    t0: Any
    t1: Any
    result: Any
    rule: str
    reason: str
    error: BaseException | None = None

    def __str__(self) -> str:
        out = self.result if self.error is None else f"{type(self.error).__name__}: {self.error}"
        return f"promote_type({_name(self.t0)}, {_name(self.t1)}) -> {_name(out)}  [{self.rule}] {self.reason}"


def _name(t: Any) -> str:
    return t.name if isinstance(t, (np.dtype, NKDType)) else str(t)


def is_floating(t: DTypeLike) -> bool:
    """True for the package's custom float dtypes, or when numpy calls ``t`` floating."""
    dt = as_dtype(t)
    if dt.name in CUSTOM_FLOATS:
        return True
    if isinstance(dt, NKDType):
        return False
    return bool(np.issubdtype(dt, np.floating))


def _is_integer(dt: Any) -> bool:
    # kind, not issubdtype: numpy files timedelta64 under signedinteger
    return isinstance(dt, np.dtype) and dt.kind in "iu"


def is_x4_dtype(t: DTypeLike) -> bool:
    """True for the packed containers ``float8_e4m3fn_x4``, ``float8_e5m2_x4``, ``float4_e2m1fn_x4``."""
    dt = as_dtype(t)
    return isinstance(dt, NKDType) and dt.format.kind == "packed"


def get_x1_from_x4(t: DTypeLike) -> np.dtype:
    """The element dtype of a packed ``*_x4`` type (``TypeError`` for any other type)."""
    dt = as_dtype(t)
    if not is_x4_dtype(dt):
        raise InvalidTypeError(f"{_name(dt)} is not a packed x4 dtype; x4 dtypes are: {', '.join(_X4)}")
    return as_dtype(dt.format.element)  # type: ignore[union-attr,arg-type,return-value]


def get_x4_from_x1(t: DTypeLike) -> NKDType:
    """The packed ``*_x4`` type whose lanes hold ``t`` (``TypeError`` where there is none)."""
    dt = as_dtype(t)
    for name in _X4:
        if FORMATS[name].element == dt.name and not isinstance(dt, NKDType):
            return as_dtype(name)  # type: ignore[return-value]
    elements = ", ".join(str(FORMATS[n].element) for n in _X4)
    raise InvalidTypeError(f"{_name(dt)} has no packed x4 form; only {elements} do")


def launder_x4_dtype(t: DTypeLike) -> Any:
    """The element dtype of a packed ``*_x4`` type; any other dtype is returned (normalised)."""
    dt = as_dtype(t)
    return get_x1_from_x4(dt) if is_x4_dtype(dt) else dt


_X4: tuple[str, ...] = tuple(n for n, f in FORMATS.items() if f.kind == "packed")


def _decide_floats(t0: Any, t1: Any) -> Promotion:
    if t0.name == _E8M0 or t1.name == _E8M0:
        if t0.name == _E8M0 and t1.name == _E8M0:
            return Promotion(t0, t1, t0, "e8m0-guard", "both operands are the e8m0 scale type")
        other = t1 if t0.name == _E8M0 else t0
        return Promotion(
            t0, t1, other, "e8m0-guard", "float8_e8m0fnu is a block scale, not a value: the other operand wins"
        )
    if t0.itemsize != t1.itemsize:
        wide = t0 if t0.itemsize > t1.itemsize else t1
        return Promotion(t0, t1, wide, "wider-itemsize", f"{wide.name} is wider ({t0.itemsize} vs {t1.itemsize} bytes)")
    for rung in FLOAT_PRECEDENCE:
        if t0.name == rung or t1.name == rung:
            res = t0 if t0.name == rung else t1
            return Promotion(
                t0,
                t1,
                res,
                "precedence-ladder",
                f"equal itemsize; {rung} is the highest rung present on the ladder " + " > ".join(FLOAT_PRECEDENCE),
            )
    err = NoPromotionPathError(
        f"No available implicit dtype promotion path between {t0.name} and {t1.name}: both are "
        f"{t0.itemsize}-byte floats and neither is on the precedence ladder "
        f"({' > '.join(FLOAT_PRECEDENCE)}); cast one of them explicitly"
    )
    return Promotion(t0, t1, None, "no-path", "equal itemsize and no ladder rung matches", err)


def _decide_ints(t0: np.dtype, t1: np.dtype) -> Promotion:
    u0 = np.issubdtype(t0, np.unsignedinteger)
    u1 = np.issubdtype(t1, np.unsignedinteger)
    if u0 == u1:
        res = t0 if t0.itemsize >= t1.itemsize else t1
        return Promotion(t0, t1, res, "int-same-sign", "same signedness: the wider wins (the first on a tie)")
    s, u = (t1, t0) if u0 else (t0, t1)
    if s.itemsize > u.itemsize:
        return Promotion(
            t0, t1, s, "int-mixed-signed-wider", f"{s.name} is wider than {u.name} and holds all its values"
        )
    for cand in (np.dtype("int16"), np.dtype("int32")):
        if cand.itemsize > u.itemsize:
            return Promotion(
                t0,
                t1,
                cand,
                "int-mixed-widen",
                f"{cand.name} is the smallest of int16/int32 holding {s.name} and {u.name}",
            )
    return Promotion(
        t0, t1, np.dtype("float32"), "int-mixed-float32", f"no integer type holds both {s.name} and {u.name}: float32"
    )


def explain_promotion(t0: DTypeLike, t1: DTypeLike) -> Promotion:
    """Say which rule decides ``promote_type(t0, t1)`` and what it gives (never raises for a dtype).

    Unknown dtype names still raise ``TypeError`` (from the name normaliser).
    """
    d0, d1 = as_dtype(t0), as_dtype(t1)
    for d in (d0, d1):
        if is_x4_dtype(d):
            err = InvalidTypeError(
                f"promote_type got the packed container {d.name}; launder it first "
                f"(launder_x4_dtype({d.name!r}) -> {get_x1_from_x4(d).name}) and promote the elements"
            )
            return Promotion(d0, d1, None, "x4-operand", "packed containers are not value types", err)
    f0, f1 = is_floating(d0), is_floating(d1)
    if f0 and f1:
        return _decide_floats(d0, d1)
    if f0 or f1:
        res = d0 if f0 else d1
        return Promotion(d0, d1, res, "float-int", "exactly one operand is floating: it wins, never widened")
    for d in (d0, d1):
        if not _is_integer(d):
            err = InvalidTypeError("unexpected dtype: " + repr(d))
            return Promotion(
                d0, d1, None, "unexpected-dtype", "neither operand is floating and one is not an integer", err
            )
    return _decide_ints(d0, d1)  # type: ignore[arg-type]


def promote_type(t0: DTypeLike, t1: DTypeLike) -> Any:
    """The single dtype both operands of a binary op are cast to, as the Neuron compiler picks it.

    Returns a ``numpy.dtype`` where numpy or ml_dtypes has the type, else the package's
    :class:`~neuron_kernels.formats.NKDType` (``float32r``, ``tfloat32``).

    Raises
    ------
    NoPromotionPathError
        (a ``TypeError``) for two equal-itemsize floats off the precedence ladder.
    TypeError
        ``unexpected dtype: ...`` when neither operand is floating and one is not an integer;
        for a packed ``*_x4`` operand (launder it first); for an unknown name.
    """
    p = explain_promotion(t0, t1)
    if p.error is not None:
        raise p.error
    return p.result


def merge_type(t0: DTypeLike, t1: DTypeLike) -> Any:
    """``t0`` when the two types are equal or are integers of one itemsize (a bit-cast merge).

    Raises ``AssertionError("Cannot merge type!")`` otherwise, as the compiler does.
    """
    if can_merge_type(t0, t1):
        return as_dtype(t0)
    raise AssertionError("Cannot merge type!")


def can_merge_type(t0: DTypeLike, t1: DTypeLike) -> bool:
    """Whether :func:`merge_type` would succeed (never raises for a valid dtype)."""
    d0, d1 = as_dtype(t0), as_dtype(t1)
    if d0 == d1:
        return True
    return _is_integer(d0) and _is_integer(d1) and d0.itemsize == d1.itemsize


#: Short column labels for the printed grid.
_SHORT = {
    "float64": "f64",
    "float32r": "f32r",
    "float32": "f32",
    "tfloat32": "tf32",
    "bfloat16": "bf16",
    "float16": "f16",
    "float8_e4m3": "e4m3",
    "float8_e4m3fn": "e4m3fn",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e4m3b11fnuz": "e4m3b11",
    "float8_e5m2": "e5m2",
    "float8_e5m2fnuz": "e5m2fnuz",
    "float8_e3m4": "e3m4",
    "float6_e2m3fn": "f6e2m3",
    "float6_e3m2fn": "f6e3m2",
    "float4_e2m1fn": "f4e2m1",
    "float8_e8m0fnu": "e8m0",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
}


def grid_dtypes() -> list[str]:
    """The dtypes of the promotion grid, in display order (floats widest first, then integers)."""
    return list(_SHORT)


def promotion_table(dtypes: list[str] | None = None) -> str:
    """The whole promotion grid as text: row ``t0``, column ``t1``, cell ``promote_type(t0, t1)``.

    Cells use short names (``bf16``, ``e4m3fn``, ``u8`` ...); ``-`` marks the no-path error.
    """
    names = dtypes or grid_dtypes()
    short = [_SHORT.get(n, n) for n in names]
    width = max(len(s) for s in short) + 1
    lines = ["t0 \\ t1".ljust(width) + "".join(s.rjust(width) for s in short)]
    for n, s in zip(names, short):
        cells = []
        for m in names:
            p = explain_promotion(n, m)
            cells.append("-" if p.error is not None else _SHORT.get(p.result.name, p.result.name))
        lines.append(s.ljust(width) + "".join(c.rjust(width) for c in cells))
    legend = "legend: " + ", ".join(f"{s}={n}" for n, s in zip(names, short)) + "; - = no promotion path"
    return "\n".join(lines + ["", legend])
