"""The vocabularies of options: one tuple per kind of mode, from which every id is derived.

Kernels number a mode by its position in its tuple; public functions accept the strings and
list them in their error messages. Nothing here imports anything.
"""

from __future__ import annotations

__all__ = [
    "ROUNDING_MODES",
    "BLOCK_ROUNDING_MODES",
    "SCALE_MODES",
    "E8M0_SCALE_MODES",
    "FLOAT_SCALE_MODES",
    "FOUR_OVER_SIX",
    "SCALE_SEARCHES",
]

#: How a value is rounded to a format (casts: every mode; see README "Casting rules").
ROUNDING_MODES: tuple[str, ...] = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
)

#: The rounding modes of block-format elements (which always saturate).
BLOCK_ROUNDING_MODES: tuple[str, ...] = ("nearest_even", "nearest_away", "toward_zero", "stochastic")

#: How the scale of a block is chosen from its largest magnitude ``amax``; ``emax`` is the
#: exponent of the element's largest normal value, ``max`` the largest element:
#:
#: - ``floor`` (OCP MX v1.0): exponent ``floor(log2(amax)) - emax``;
#: - ``ceil``: ``ceil(log2(amax)) - emax``;
#: - ``even``: amax's significand rounded to the element's mantissa width (half an element ulp
#:   added to the bit pattern, then masked: ties away), then ``floor(log2(.)) - emax``;
#: - ``rceil`` (NVIDIA): ``d = float32(amax * float32(1 / max))`` rounded up to a power of two on
#:   its bits (biased exponent plus one if the mantissa is non-zero; a subnormal d gives 2^-127 up
#:   to 2^-127 itself, else 2^-126), at most 2^127;
#: - ``neuron`` (``nki.isa.quantize_mx``): ``floor(log2(amax)) - (emax - 1)``, so that the block's
#:   largest element never saturates;
#: - ``nearest`` (NVFP4's float8_e4m3fn scales): ``s = amax / max`` (divided by the per-tensor
#:   scale when there is one), clamped to [2^-6, 448] and rounded to the nearest e4m3fn value;
#: - ``divide`` (float scales: DeepSeek, compressed-tensors, vLLM): ``s = amax / max`` in float32,
#:   rounded to the scale's dtype; every element is divided by ``s``;
#: - ``reciprocal`` (float32 scales: transformers' FineGrainedFP8): ``m = max / amax`` in float32;
#:   every element is multiplied by ``m`` and the scale stored is ``1 / m``;
#: - ``pow2`` (float32 or bfloat16 scales: DeepSeek-V3.1's ``ue8m0`` scales): ``s`` the smallest
#:   power of two with ``amax <= max * s`` (at least 2^-126); every element is divided by ``s``,
#:   exactly, so values already on a power-of-two grid (MX, FP4) keep their bits where they fit.
#:
#: The first five give e8m0 scales (exponents clamped to [-127, 127]), ``nearest`` e4m3fn ones,
#: the last three float ones.
SCALE_MODES: tuple[str, ...] = (
    "floor", "ceil", "even", "rceil", "neuron", "nearest", "divide", "reciprocal", "pow2"
)  # fmt: skip
E8M0_SCALE_MODES: tuple[str, ...] = SCALE_MODES[:5]
FLOAT_SCALE_MODES: tuple[str, ...] = SCALE_MODES[6:]

#: The error measures of the ``four_over_six`` scale policy (NVFP4): the block is quantised with
#: scales from ``amax / 6`` and from ``amax / 4`` and the one with the smaller error is kept.
FOUR_OVER_SIX: tuple[str, ...] = ("mae", "mse")

#: Scale searches: ``mse`` tries neighbouring scales of each block and keeps the one with the
#: smallest sum of squared errors.
SCALE_SEARCHES: tuple[str, ...] = ("mse",)
