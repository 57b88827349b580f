"""The producers' recipes: for each tool that writes block-scaled checkpoints, the arithmetic by
which it turns the same weights into its own bytes (docs/recipes.md), declared once, as data.

A recipe is a named set of rules, one :class:`RecipeRule` per block format it writes: the block
scale's rule, how an element meets its block's scale, the dtype intermediate results are rounded
to, the sign of an element that rounds to zero and the global (per-tensor) scale's rule. The
kernels take the rules as numbers (their positions in the tuples below), so adding a recipe is a
row of :data:`RECIPES`, not a branch in a kernel. The package's own rules (no recipe) stay the
default; a recipe never changes what the default writes.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RECIPES", "Recipe", "RecipeRule", "SCALE_RULES", "ELEMENT_RULES", "ZERO_SIGNS", "GLOBAL_RULES"]

#: Block scale rules, from the block's largest magnitude ``a`` (in the weight's dtype, exact in
#: float32); ``max`` is the largest element, ``W(.)`` rounds to the intermediate dtype, ``g`` is
#: the global scale (a divisor for ``ct_e4m3``, a multiplier for ``modelopt_e4m3``):
#:
#: - ``package``: the package's own kernels with the rule's ``scale_mode`` (torchao's arithmetic);
#: - ``ct_e4m3`` (compressed-tensors NVFP4): ``e4m3(clamp(g * W(a / 6), -448, 448))``, a zero scale
#:   replaced by float8_e4m3fn's epsilon (0.125); elements divided by ``float32(s / g)``;
#: - ``modelopt_e4m3`` (ModelOpt NVFP4 export): ``t = a / float32(6 * g)``, 0 -> 1.0, clamped to
#:   [2^-9, 448] (subnormal scales kept), rounded to e4m3fn; elements divided by ``float32(s * g)``;
#: - ``ggml_ue4m3`` (llama.cpp's ``quantize_row_nvfp4_ref``): ``ggml_fp32_to_ue4m3(a / 6)``: its
#:   mantissa rounded half up, subnormals too, and every value from 256 up mapped to 448;
#: - ``ct_e8m0`` (compressed-tensors MX): ``a``'s significand rounded to ``bump_bits`` bits (bumped
#:   to the next power of two from 1.75 with one bit), ``127 + floor(log2(.)) - emax`` clamped to
#:   [0, 255]; elements divided by ``W(2^(e - 127))``;
#: - ``ggml_e8m0`` (llama.cpp's ``quantize_row_mxfp4_ref``): ``floorf(log2f(a)) - 2 + 127`` in
#:   float32 (one step high where ``a`` is just below a power of two and log2f rounds up to it),
#:   0 for an all-zero block;
#: - ``modelopt_e8m0`` (ModelOpt MXFP8): ``clamp(ceil(log2(a / max)), -127, 127)`` in float32, -127
#:   for an all-zero block; elements multiplied by ``2^-e``;
#: - ``ct_float`` (compressed-tensors FP8, NxD's FP8 per tensor): ``s = W(a / max)``, the dtype's
#:   epsilon for a zero scale; stored in the weight's dtype; elements divided by ``s``;
#: - ``nxd_float`` (NxD's FP8 per channel): ``s = max(a / max, floor)`` in float32 (``floor``: the
#:   rule's ``scale_floor``); elements divided by ``s``;
#: - ``torch_int`` (torch.ao's observers and ``quantize_per_channel``, which NxD's int8 uses): ``s =
#:   max(a / qmax, float32 epsilon)``; codes ``round(x * float32(1 / s))`` to nearest even, clamped
#:   (the integer kernels; ``qmax`` 127 for int8).
SCALE_RULES: tuple[str, ...] = (
    "package", "ct_e4m3", "modelopt_e4m3", "ggml_ue4m3", "ct_e8m0", "ggml_e8m0", "modelopt_e8m0", "ct_float",
    "nxd_float", "torch_int",
)  # fmt: skip

#: How an element becomes a code: ``divide`` (``x / v`` in float32, then rounded to the
#: intermediate dtype, clamped and rounded to nearest even), ``multiply`` (``x * v``, likewise) or
#: ``ggml`` (llama.cpp's ``best_index_mxfp4``: the code whose value times the half scale is nearest
#: ``x`` in float32 arithmetic, the lower index on a tie: ties to the smaller magnitude).
ELEMENT_RULES: tuple[str, ...] = ("divide", "multiply", "ggml")

#: The sign of an element that rounds to zero: ``kept`` (the sign of the scaled value, -0.0
#: included: a cast), ``negative`` (the -0 code only where the scaled value is below zero:
#: compressed-tensors' ``torch.sign`` and ModelOpt's ``x < 0``), ``positive`` (always +0: ggml).
ZERO_SIGNS: tuple[str, ...] = ("kept", "negative", "positive")

#: The global (per-tensor) scale from the tensor's (or its fused layer's) amax: ``package``
#: (``amax / (448 * 6)`` in float32: torchao, ModelOpt's ``weight_scale_2``), ``ct``
#: (compressed-tensors' ``2688 / amax`` as torch computes it in the weight's dtype: the reciprocal
#: rounded, then multiplied), or ``none`` (one level: ggml).
GLOBAL_RULES: tuple[str, ...] = ("package", "ct", "none")

#: The intermediate dtypes: ``float32``, or ``weight`` (the weight's own, float32 or bfloat16, as
#: torch computes on a CPU where the producer keeps the weight's dtype).
INTERMEDIATES: tuple[str, ...] = ("float32", "weight")


class RecipeRule(NamedTuple):
    """One producer's arithmetic for one block format (the vocabularies above)."""

    scale: str
    elements: str = "divide"
    #: The dtype of the scale's arithmetic, and of the element's quotient (``x / v``, ``x * v``).
    intermediate: str = "float32"
    zero_sign: str = "kept"
    per_tensor: str = "none"
    quotient: str = "float32"
    #: ``package`` rules: the scale mode of the package's kernels; ``ct_e8m0``: ``bump_bits``.
    scale_mode: str = ""
    bump_bits: int = 0
    #: ``nxd_float``: the smallest scale (a float32 value).
    scale_floor: float = 0.0
    #: The producer's source lines this rule follows.
    source: str = ""


class Recipe(NamedTuple):
    """A producer's recipes: its name, the release followed, and its rule per block format (an
    integer format's own, where it has one, before :attr:`integers`)."""

    name: str
    producer: str
    rules: dict[str, RecipeRule]
    #: Whether the producer gives the shards of a fused layer one global scale (their amax's).
    fuses: bool = True
    #: Its rule for every integer block format (``int4_group``, ...), if it writes them.
    integers: RecipeRule | None = None


_CT = "llm-compressor 0.14 (compressed-tensors 0.19.0; 0.20.1 the same)"
_CT_NVFP4 = RecipeRule(
    "ct_e4m3", "divide", "weight", "negative", "ct",
    source="compressed_tensors/quantization/utils/helpers.py generate_gparam, calculate_qparams; "
    "quantization/lifecycle/forward_helpers.py _quantize; quantization/utils/fp4_utils.py cast_to_fp4",
)  # fmt: skip
_CT_MX = "compressed_tensors/quantization/utils/mxfp_utils.py generate_mx_scales, round_to_power_2"
_CT_FP8 = RecipeRule(
    "ct_float", "divide", "weight", "kept", quotient="weight",
    source="compressed_tensors/quantization/utils/helpers.py calculate_qparams (amax / 448 in the weight's dtype); "
    "forward_helpers.py _quantize (x / scale in the weight's dtype on the CPU)",
)  # fmt: skip
#: compressed-tensors' integer rule is the package's (docs/integers.md), in the weight's dtype.
_CT_INT = RecipeRule(
    "package", intermediate="weight", scale_mode="divide",
    source="compressed_tensors/quantization/utils/helpers.py calculate_qparams; "
    "quantization/lifecycle/forward_helpers.py _quantize (every step in the weight's dtype on the CPU)",
)  # fmt: skip
_MO = "modelopt/torch/quantization/qtensor/nvfp4_tensor.py get_weights_scaling_factor(_2), _cast_fp4"
_GGML = "ggml/src/ggml-quants.c quantize_row_mxfp4_ref, quantize_row_nvfp4_ref, best_index_mxfp4; ggml-impl.h"
_NXD = "neuronx-distributed fbac349 (2.29), src/neuronx_distributed/quantization/"
_NXD_FP8 = (
    _NXD + "quantization_utils.py quantize_fp8_per_channel, quantize_fp8_per_tensor, QuantizedLinear.from_float; "
    "NxD Inference 4bcdc54 models/application_base.py generate_quantized_state_dict (the model loaded in float32)"
)
_TORCHAO = "torchao/prototype/mx_formats nvfp4_tensor.py nvfp4_quantize, mx_tensor.py to_mx"

#: The recipes, by the name ``recipe=`` and ``--recipe`` take.
RECIPES: dict[str, Recipe] = {
    "llm-compressor": Recipe(
        "llm-compressor",
        _CT,
        {
            "nvfp4": _CT_NVFP4,
            "mxfp4_e2m1": RecipeRule(
                "ct_e8m0", "divide", "weight", "negative", quotient="weight", bump_bits=1, source=_CT_MX
            ),
            "mxfp8_e4m3": RecipeRule(
                "ct_e8m0", "divide", "weight", "kept", quotient="weight", bump_bits=1, source=_CT_MX
            ),
            "fp8_channel": _CT_FP8,
            "fp8_block": _CT_FP8,
            "fp8_tensor": _CT_FP8,
        },
        integers=_CT_INT,
    ),
    "modelopt": Recipe(
        "modelopt",
        "ModelOpt 0.47 (export)",
        {
            "nvfp4": RecipeRule("modelopt_e4m3", "divide", "float32", "negative", "package", source=_MO),
            "mxfp8_e4m3": RecipeRule(
                "modelopt_e8m0", "multiply", source="modelopt/torch/quantization/qtensor/mxfp8_tensor.py"
            ),
        },
    ),
    "torchao": Recipe(
        "torchao",
        "torchao 0.18",
        {
            "nvfp4": RecipeRule("package", per_tensor="package", scale_mode="nearest", source=_TORCHAO),
            **{
                f: RecipeRule("package", scale_mode="floor", source=_TORCHAO)
                for f in ("mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2")
            },
        },
        fuses=False,
    ),
    "neuron": Recipe(
        "neuron",
        "NxD Inference 4bcdc54 with neuronx-distributed fbac349, on a CPU",
        {
            "fp8_e4m3_channel": RecipeRule("nxd_float", scale_floor=1e-5, source=_NXD_FP8),
            "fp8_e4m3_tensor": RecipeRule("ct_float", source=_NXD_FP8),
            "int8_channel": RecipeRule(
                "torch_int",
                "multiply",
                source=_NXD + "observer.py PerChannelAbsMaxObserver.calculate_qparams; quantization_utils.py "
                "quantize_pytorch_model_per_channel_symmetric; torch/ao/nn/quantized/dynamic/modules/linear.py "
                "_quantize_weight (torch.quantize_per_channel)",
            ),  # fmt: skip
        },
        fuses=False,
    ),
    "ggml": Recipe(
        "ggml",
        "llama.cpp (ggml 0c1e570)",
        {
            "nvfp4": RecipeRule("ggml_ue4m3", "ggml", zero_sign="positive", source=_GGML),
            "mxfp4_e2m1": RecipeRule("ggml_e8m0", "ggml", zero_sign="positive", source=_GGML),
        },
        fuses=False,
    ),
}
