"""How an array is quantised: :class:`Scheme`, a block format with every option of its
quantisation, validated once, here, against the format table.

The public functions (:func:`neuron_kernels.quantize` and the family functions), the command and
the checkpoint code build a scheme from what they were given; :meth:`Scheme.job` checks each
option, names what is accepted, and gives the :class:`~.job.BlockJob` that quantises arrays of a
number of dimensions. A scheme's fields are the options of :func:`neuron_kernels.quantize`, with
its defaults (None: the format's own); :data:`OPTIONS` is their list, the one the package keeps.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict

import numpy as np

from .._random import check_seed, draw_seed, stream_key
from ..dtypes import get_format
from ..errors import InvalidTypeError, InvalidValueError, NotApplicableError, UnknownFormatError
from ..formats import BLOCK_FORMATS, BlockFormat
from ..modes import BLOCK_ROUNDING_MODES, FOUR_OVER_SIX, SCALE_MODES, SCALE_SEARCHES
from .job import BlockJob
from .recipe_options import recipe_options, weight_dtype
from .rotation import rotation_signs

__all__ = [
    "DEFAULT", "OPTIONS", "Scheme", "SchemeOptions", "MXOptions", "NVFP4Options", "FakeMXOptions", "block_format",
    "block_job", "choice", "scheme_of",
]  # fmt: skip


class _Default:
    """The marker of options left at the format's default (a value no caller passes by chance)."""

    def __repr__(self) -> str:
        return "<the format's default>"


#: The default of options whose default depends on the format (``per_tensor_scale``; ``block_size``,
#: ``scale_mode`` and ``scale_bound`` take None too).
DEFAULT: Any = _Default()


@dataclass(frozen=True)
class Scheme:
    """A block format and the options of its quantisation, as :func:`neuron_kernels.quantize`
    takes them (its documentation says what each means); ``format`` is the block format's name.
    Built as given: :meth:`job` validates it. ``block_size`` and ``scale_mode`` at
    :data:`DEFAULT` are the format's (:func:`neuron_kernels.quantize` takes None for them), as is
    ``scale_bound`` at None or :data:`DEFAULT`."""

    format: str
    block_size: Any = DEFAULT
    block_shape: tuple[int, ...] | None = None
    axis: int = -1
    scale_mode: Any = DEFAULT
    rounding: str = "nearest_even"
    seed: int | None = None
    pack: bool = True
    per_tensor_scale: Any = DEFAULT
    scale_bound: float | None = None
    four_over_six: str | None = None
    scale_search: str | None = None
    rht: Any = False
    scale_dtype: Any = None
    recipe: str | None = None

    @classmethod
    def of(cls, fmt: Any, given: dict[str, Any], none_is_default: bool = False) -> Scheme:
        """The scheme of ``fmt`` with the options among ``given`` (a function's arguments); with
        ``none_is_default``, a ``block_size`` or ``scale_mode`` of None is the format's default, as
        :func:`neuron_kernels.quantize` documents (elsewhere None is refused there)."""
        options = {name: given[name] for name in OPTIONS if name in given}
        if none_is_default:
            options.update({k: DEFAULT for k in ("block_size", "scale_mode") if options.get(k, DEFAULT) is None})
        return cls(fmt, **options)

    def options(self) -> dict[str, Any]:
        """The options, by name (every field but ``format``)."""
        return {name: getattr(self, name) for name in OPTIONS}

    def job(
        self, ndim: int, dtype: Any = None, formats: tuple[str, ...] = tuple(BLOCK_FORMATS), what: str = "block format"
    ) -> BlockJob:
        """The :class:`~.job.BlockJob` of this scheme for arrays of ``ndim`` dimensions, every
        option checked (``formats``: the formats accepted, named ``what`` in errors; ``dtype``:
        the input's, the intermediate dtype of a recipe that computes in the weight's).

        A job that draws nothing at random (nearest-even rounding, no rotation) is made once per
        scheme, option types, ``ndim``, ``dtype``, formats and ``what``, and then reused: a call's
        options are checked once, not on every call (:data:`_JOBS`)."""
        if self.rounding != "nearest_even" or self.rht is not False:
            return self._checked_job(ndim, dtype, formats, what)
        try:
            key = (self, tuple(_kind(getattr(self, n)) for n in OPTIONS), ndim, dtype, formats, what)
            job = _JOBS.get(key)
        except TypeError:  # an option that is no hashable value (a list): checked every time
            return self._checked_job(ndim, dtype, formats, what)
        if job is None:
            job = self._checked_job(ndim, dtype, formats, what)
            if len(_JOBS) >= _JOBS_KEPT:
                _JOBS.clear()
            _JOBS[key] = job
        return job

    def _checked_job(self, ndim: int, dtype: Any, formats: tuple[str, ...], what: str) -> BlockJob:
        if self.recipe is not None:
            return self._recipe_job(ndim, dtype, formats, what)
        return self._job(ndim, formats, what)

    def _recipe_job(self, ndim: int, dtype: Any, formats: tuple[str, ...], what: str) -> BlockJob:
        """A producer's recipe (:mod:`.recipe_options`) fixes the options of its arithmetic: those given
        too are refused; the rest (blocks, axis, packing) are checked as without one."""
        own = block_format(self.format, formats, what)
        left = (DEFAULT, None, False, "nearest_even", "amax", own.block_size)  # defaults, and family functions' own
        values = {name: getattr(self, name) for name in _RECIPE_FIXED}
        given = {k for k, v in values.items() if not any(v is d or (type(v) is type(d) and v == d) for d in left)}
        if self.per_tensor_scale is None:  # one level, which a recipe with a global scale does not write
            given.add("per_tensor_scale")
        recipe = str(self.recipe)
        rule = recipe_options(recipe, own, {"axis": self.axis, "ndim": ndim}, given)
        intermediate = weight_dtype(rule, dtype, recipe, own)
        plain = Scheme(
            self.format, block_size=self.block_size, block_shape=self.block_shape, axis=self.axis, pack=self.pack,
            scale_mode=rule.scale_mode if rule.scale == "package" else DEFAULT,
            scale_dtype=intermediate if (rule.scale != "package" or own.integer) and own.float_scales else None,
        )  # fmt: skip
        job = plain._job(ndim, formats, what)
        if rule.scale != "package" and rule.per_tensor == "none":
            job = replace(job, per_tensor_scale=None)
        elif "per_tensor_scale" in given:  # as given, in double precision (a recipe's global scale is exact)
            pts = self.per_tensor_scale
            _per_tensor(pts, job.fmt)
            if not isinstance(pts, (numbers.Real, np.floating)) or isinstance(pts, bool):
                raise InvalidValueError(
                    f"recipe {recipe!r} computes the per-tensor scale from the amax ('amax') or takes a fused "
                    f"layer's (a float, from shared_per_tensor_scale); got {pts!r}"
                )
            job = replace(job, per_tensor_scale=float(pts))
        return replace(job, recipe=recipe, intermediate=intermediate)

    def _job(self, ndim: int, formats: tuple[str, ...], what: str) -> BlockJob:
        bf = _with_scale_dtype(block_format(self.format, formats, what), self.scale_dtype)
        size, rows, ax = _blocks(self.block_size, self.block_shape, bf, self.axis, ndim)
        mode = _scale_mode(self.scale_mode, bf)
        rounding = choice(self.rounding, BLOCK_ROUNDING_MODES, "rounding mode")
        if not isinstance(self.pack, (bool, np.bool_)):
            raise InvalidTypeError(f"pack must be True or False, got {self.pack!r}")
        check_seed(self.seed)
        seed = draw_seed() if rounding == "stochastic" and self.seed is None else self.seed
        pts, bound = _per_tensor(self.per_tensor_scale, bf), _scale_bound(self.scale_bound, bf)
        _float_scales(bf, mode)
        _policies(bf, self.four_over_six, self.scale_search)
        rotation = rotation_signs(self.rht)
        if bf.integer:
            _integer(bf, rows, ax, ndim, rounding, rotation)
        if rotation is not None:
            if rows > 1:
                raise InvalidValueError("rht= rotates along the block axis of 1-D blocks, not 2-D tiles")
            if size % 16:
                raise InvalidValueError(
                    f"rht= rotates groups of 16 along the block axis; block_size must be a multiple of 16, got {size}"
                )
        return BlockJob(
            fmt=bf,
            block_size=size,
            block_rows=rows,
            axis=ax,
            scale_mode=mode,
            rounding=rounding,
            key=stream_key(0 if seed is None else seed),
            pack=bool(self.pack) and bf.packable,
            per_tensor_scale=pts,
            scale_bound=bound,
            four_over_six=self.four_over_six,
            scale_search=self.scale_search,
            rotation=rotation,
        )


def _integer(bf: BlockFormat, rows: int, axis: int, ndim: int, rounding: str, rotation: Any) -> None:
    """What the integer formats take: groups along the last axis (a weight's input), rounded to
    nearest even, without a rotation."""
    if rows > 1 or axis != ndim - 1:
        raise NotApplicableError(f"{bf.name} groups the last axis (a weight's input columns), in 1-D blocks")
    if rounding != "nearest_even":
        raise NotApplicableError(f"{bf.name} rounds to nearest even (as its producers do); got rounding {rounding!r}")
    if rotation is not None:
        raise NotApplicableError(f"{bf.name} takes no rotation (rht=)")


def _kind(value: Any) -> Any:
    """The type of an option's value, and of each member of a tuple: equal values of other types
    (``16.0`` and ``16``, ``True`` and ``1``) are checked as themselves, not taken for each other."""
    return (tuple, tuple(_kind(v) for v in value)) if isinstance(value, tuple) else type(value)


#: The jobs of schemes already checked (see :meth:`Scheme.job`), and how many are kept.
_JOBS: dict[Any, BlockJob] = {}
_JOBS_KEPT = 512

#: The options of a quantisation, in the order of :func:`neuron_kernels.quantize`'s signature.
OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(Scheme))[1:]


class _Common(TypedDict, total=False):
    """The options every family of the public functions takes (as keyword arguments)."""

    block_size: int | None
    block_shape: tuple[int, ...] | None
    axis: int
    rounding: str
    seed: int | None
    scale_search: str | None


class _Stored(TypedDict, total=False):
    """The options of the functions that store codes (not of the fake-quantising ones)."""

    pack: bool
    recipe: str | None


class _TwoLevel(TypedDict, total=False):
    """NVFP4's own options: its per-tensor scale, four-over-six, the rotation."""

    per_tensor_scale: Any
    scale_bound: float | None
    four_over_six: str | None
    rht: Any


class FakeMXOptions(_Common, total=False):
    """``fake_quantize_mx``'s options."""

    scale_mode: str | None


class MXOptions(FakeMXOptions, _Stored, total=False):
    """``quantize_mx``'s options."""


class NVFP4Options(_Common, _Stored, _TwoLevel, total=False):
    """``quantize_nvfp4``'s options."""


class SchemeOptions(MXOptions, _TwoLevel, total=False):
    """A :class:`Scheme`'s options as keyword arguments (``quantize``'s): what the public
    functions' overloads declare, each option once in these classes (tests/test_structure.py holds
    them to :data:`OPTIONS` and to the functions' own keyword arguments)."""

    scale_dtype: Any


#: The options a producer's recipe fixes (the others choose blocks, packing, randomness and the recipe).
_RECIPE_FIXED = tuple(name for name in OPTIONS if name not in ("axis", "seed", "pack", "recipe"))


def scheme_of(fmt: Any, options: dict[str, Any]) -> Scheme:
    """``Scheme(fmt, **options)``, an option of another name refused as a function refuses an
    unknown keyword argument."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(OPTIONS)}")
    return Scheme(fmt, **options)


def block_job(
    fmt: Any,
    ndim: int,
    *,
    dtype: Any = None,
    formats: tuple[str, ...] = tuple(BLOCK_FORMATS),
    what: str = "block format",
    **options: Any,
) -> BlockJob:
    """``Scheme(fmt, **options).job(ndim, dtype, formats, what)``: the validated job of the options
    of :func:`neuron_kernels.quantize` (:data:`OPTIONS`) for arrays of ``ndim`` dimensions."""
    return scheme_of(fmt, options).job(ndim, dtype, formats, what)


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


def _unset(value: Any) -> bool:
    """Whether an option whose default is the format's was left at it."""
    return value is DEFAULT


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
        size = fmt.block_size if _unset(block_size) else _positive_int(block_size, "block_size")
        ax = _axis(axis, ndim)
        if _unset(block_size) and fmt.block_rows > 1 and ndim >= 2 and ax == ndim - 1:
            return size, fmt.block_rows, ax
        return size, 1, ax
    if (
        isinstance(block_shape, (str, bytes))
        or not isinstance(block_shape, (tuple, list))
        or not 1 <= len(block_shape) <= 2
    ):
        raise InvalidTypeError(f"block_shape must be a tuple of one or two positive ints, got {block_shape!r}")
    dims = [_positive_int(v, "block_shape") for v in block_shape]
    if not _unset(block_size) and _positive_int(block_size, "block_size") != dims[-1]:
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


def _scale_mode(scale_mode: Any, bf: BlockFormat) -> str:
    """The scale rule: one of the format's (its first by default)."""
    mode = bf.scale_modes[0] if _unset(scale_mode) else scale_mode
    if isinstance(mode, str) and mode in SCALE_MODES and mode not in bf.scale_modes:
        raise NotApplicableError(f"scale mode {mode!r} is not valid for {bf.name} (valid: {', '.join(bf.scale_modes)})")
    if not isinstance(mode, str) or mode not in bf.scale_modes:
        raise InvalidValueError(f"unknown scale mode {mode!r}; accepted: {', '.join(bf.scale_modes)} ({bf.name})")
    return mode


def _float_scales(bf: BlockFormat, mode: str) -> None:
    """The scale rules that need a scale dtype: the reciprocal's float32, pow2's powers of two."""
    if bf.float_scales and mode == "reciprocal" and bf.scale != "float32":
        raise NotApplicableError(
            f"scale mode 'reciprocal' stores float32 scales (transformers' rule); got scale_dtype {bf.scale!r}"
        )
    if bf.float_scales and mode == "pow2" and bf.scale == "float16":
        raise NotApplicableError(
            "scale mode 'pow2' stores float32 or bfloat16 scales (float16 holds too few powers of two); "
            f"got scale_dtype {bf.scale!r}"
        )


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


def _scale_bound(scale_bound: Any, bf: BlockFormat) -> float:
    """The largest block scale a per-tensor scale from the amax leaves room for (the scale
    format's largest value by default)."""
    largest = bf.scale_format.max
    if scale_bound is None or scale_bound is DEFAULT:
        return float(largest)
    if isinstance(scale_bound, bool) or not isinstance(scale_bound, numbers.Real):
        raise InvalidTypeError(f"scale_bound must be a float in (0, {largest:g}], got {scale_bound!r}")
    bound = float(scale_bound)
    if not (math.isfinite(bound) and 0 < bound <= largest and np.float32(bound) > 0):
        raise InvalidValueError(
            f"scale_bound must be a float in (0, {largest:g}] (the largest {bf.scale} value, the default; "
            f"256 with four_over_six), got {scale_bound}"
        )
    return bound


def _policies(bf: BlockFormat, four_over_six: Any, scale_search: Any) -> None:
    """The scale policies: four-over-six (NVFP4) or a search (e4m3fn or e8m0 scales), one of them."""
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
