"""What a block kernel is specialised on, as the kernels need it: the source (:class:`Source`),
the element format (:class:`Element`) and the scale format (:class:`Scale`); the ids of the scale
modes and policies, bound by name; the flags a kernel passes its helpers (:func:`_flags`); the
block length a kernel reduces as one vector (:func:`vector_length`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._parallel import read_only
from ...formats import FORMATS, BlockFormat
from ...modes import FOUR_OVER_SIX, SCALE_MODES, SCALE_SEARCHES
from .. import codec as C
from .. import loaders as S

#: Scale-mode ids, bound by name: an id is the mode's index in ``modes.SCALE_MODES``.
FLOOR, CEIL, EVEN, RCEIL, NEURON, NEAREST, DIVIDE, RECIPROCAL, POW2 = (
    SCALE_MODES.index(m)
    for m in ("floor", "ceil", "even", "rceil", "neuron", "nearest", "divide", "reciprocal", "pow2")
)

#: How a kernel scales its elements (``Scale.scaling``, a constant the helpers branch on): by the
#: multiplier of a float8_e4m3fn scale (NVFP4) or of an e8m0 one (MX), or by a float scale: each
#: element divided by it (``divide``, and ``pow2``, whose scale is a power of two) or multiplied by
#: its reciprocal's multiplier (``reciprocal``).
BY_E4M3, BY_E8M0, BY_DIVISION, BY_RECIPROCAL, BY_POW2 = 0, 1, 2, 3, 4

#: Scale policies, as the kernels number them: the plain rule, four-over-six by each error
#: measure of ``modes.FOUR_OVER_SIX``, then each search of ``modes.SCALE_SEARCHES``.
POLICIES: tuple[tuple[str, str] | None, ...] = (
    None,
    *(("four_over_six", m) for m in FOUR_OVER_SIX),
    *(("scale_search", m) for m in SCALE_SEARCHES),
)

PLAIN, FOUR_SIX_MAE, FOUR_SIX_MSE, SEARCH_MSE = (
    POLICIES.index(p) for p in (None, ("four_over_six", "mae"), ("four_over_six", "mse"), ("scale_search", "mse"))
)

#: Where a tile kernel stores two 4-bit codes per byte: not at all, along R or along C.
PACK_NONE, PACK_ROWS, PACK_COLS = 0, 1, 2


def scale_mode_id(scale_mode: str) -> int:
    return SCALE_MODES.index(scale_mode)


def policy_id(four_over_six: str | None, scale_search: str | None) -> int:
    """The kernels' id of a scale policy (at most one of the two is set)."""
    if four_over_six is not None:
        return POLICIES.index(("four_over_six", four_over_six))
    if scale_search is not None:
        return POLICIES.index(("scale_search", scale_search))
    return PLAIN


class Source(NamedTuple):
    """How a kernel reads its input: the codec's source kind and codec, and whether blocks of 16,
    32 or 64 are reduced as one vector (float32 patterns, and float16/bfloat16 codes, whose
    magnitudes order as their values do: the largest code is decoded once)."""

    kind: int
    codec: C.Codec
    vector: bool


def source_of(dtype_name: str) -> Source:
    """The :class:`Source` of an input dtype (float32, float64, or 16-bit float codes)."""
    if dtype_name == "float32":
        return Source(S.SOURCE_F32, C.NO_CODEC, True)
    if dtype_name == "float64":
        return Source(S.SOURCE_F64_NEAREST, C.NO_CODEC, False)
    fmt = FORMATS[dtype_name]
    return Source(S.source_of_codes(fmt), C.codec_of(fmt), fmt.itemsize == 2)


def input_view(x: np.ndarray) -> np.ndarray:
    """The array as the kernels read it, read-only (see :func:`~neuron_kernels._parallel.read_only`):
    float32 patterns, 16-bit float codes, or float64."""
    return read_only(x if x.dtype == np.float64 else x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16))


class Element(NamedTuple):
    """The element format, as the kernels need it.

    ``top``: the largest element; ``min_normal`` the smallest normal, ``magic`` a float whose ulp is
    the smallest subnormal, ``rebias`` ``(127 - B) << M`` (mod 2^32): the constants of
    :func:`~.elements.nearest_even`. ``nan_code``: the code of every element of a NaN block.
    """

    codec: C.Codec
    mode: int
    top: np.float32
    min_normal: np.float32
    magic: np.float32
    rebias: int
    nan_code: int


class Scale(NamedTuple):
    """The scale format, as the kernels need it.

    ``e8m0``: power-of-two scales (MX) rather than float8_e4m3fn ones (NVFP4); ``scaling``: how
    elements are scaled (``BY_*``: the float scales' rule is compiled in). ``emax``, ``mbits``
    and ``rcp`` (float32(1 / max element)) serve the e8m0 rules; ``max_element`` and ``four``
    (2^emax: the map-to-4 divisor of four-over-six) the e4m3fn ones, with the scale's codec, its
    smallest normal (the lower clamp) and largest value, and ``nan_byte``, the scale of a block
    holding a NaN or an infinity (a float scale's: the float32 quiet NaN pattern). Float scales are
    float32 patterns in the kernels, rounded to the scale's dtype (``codec``); ``eps`` is the
    scale of a block whose scale would be zero (compressed-tensors' rule: the dtype's epsilon).
    ``policies``: whether the kernel evaluates scale policies at all (their code, even untaken,
    costs the plain kernels a quarter more instructions per element).
    """

    e8m0: bool
    scaling: int
    emax: int
    mbits: int
    rcp: np.float32
    max_element: np.float32
    four: np.float32
    codec: C.Codec
    lowest: np.float32
    highest: np.float32
    nan_byte: int
    eps: np.float32
    policies: bool


def element_of(bf: BlockFormat, rounding: str) -> Element:
    c = C.codec_of(bf.element_format)
    return Element(
        codec=c,
        mode=C.mode_id(rounding),
        top=np.float32(bf.max_element),
        min_normal=np.float32(2.0 ** (1 - c.bias)),
        magic=np.float32(2.0 ** (1 - c.bias - c.mbits + 23)),
        rebias=((127 - c.bias) << c.mbits) & 0xFFFFFFFF,
        nan_code=bf.nan_element_code,
    )


def _scaling(bf: BlockFormat, scale_mode: str) -> int:
    if bf.float_scales:
        return {"reciprocal": BY_RECIPROCAL, "pow2": BY_POW2}.get(scale_mode, BY_DIVISION)
    return BY_E8M0 if bf.is_mx else BY_E4M3


def scale_of(bf: BlockFormat, policies: bool = False, scale_mode: str = "") -> Scale:
    """The :class:`Scale` of a format (``scale_mode``: the float scales' rule, else ignored)."""
    sf = bf.scale_format
    wide = bf.float_scales
    return Scale(
        e8m0=bf.is_mx,
        scaling=_scaling(bf, scale_mode),
        emax=bf.emax_elem,
        mbits=bf.mbits,
        rcp=np.float32(1.0 / bf.max_element),
        max_element=np.float32(bf.max_element),
        four=np.float32(2.0**bf.emax_elem),
        codec=C.codec_of(sf),
        lowest=np.float32(sf.smallest_normal),
        highest=np.float32(sf.max),
        nan_byte=(0x7FC00000 if wide else sf.nan_code) or 0,
        eps=np.float32(sf.eps),
        policies=policies,
    )


def flags(source: Source, el: Element, sc: Scale) -> tuple[int, int, bool, int]:
    """The decisions the helpers branch on, as the separate constants a kernel passes them:
    the source kind, the rounding mode, fixed-point elements, how elements are scaled
    (``BY_*``)."""
    return source.kind, el.mode, el.codec.specials == C.FIXED, sc.scaling


def vector_length(source: str, fmt: BlockFormat) -> int:
    """The block length the plain scale loop of a kernel reduces as one vector (a compile-time
    constant): the format's own, for the sources that have the vector reduction; 0 for none.
    Other lengths take the scalar loop: one vector length per kernel compiles faster than all
    three, and the format's own block size is what nearly every call uses."""
    return own_length(fmt) if source_of(source).vector else 0


def own_length(fmt: BlockFormat) -> int:
    """The format's own block length where kernels specialise on it (16, 32 or 64), else 0 (the
    FP8 formats' rows and tiles of 128 or whole axes take the loops of any length)."""
    return fmt.block_size if fmt.block_size in (16, 32, 64) else 0


def _vector_lengths(source: Source) -> tuple[int, int, int]:
    return (16, 32, 64) if source.vector else (0, 0, 0)
