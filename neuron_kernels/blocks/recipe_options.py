"""Quantisation by a producer's recipe (``recipe=``; the table is :data:`neuron_kernels.recipes.RECIPES`):
the options a recipe fixes, checked (:func:`recipe_options`); its global scale from an amax
(:func:`ct_global_scale`). The codes and scales of an array by the recipe kernels are the
launcher's (:func:`neuron_kernels.kernels.launch.recipe_quantize`)."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import InvalidValueError, NotApplicableError
from ..formats import BlockFormat
from ..recipes import RECIPES, Recipe, RecipeRule

__all__ = [
    "recipe_of",
    "recipe_rule",
    "recipe_options",
    "ct_global_scale",
    "weight_dtype",
    "check_finite",
]


def recipe_of(name: Any) -> Recipe:
    if not isinstance(name, str) or name not in RECIPES:
        raise InvalidValueError(f"unknown recipe {name!r}; accepted: {', '.join(RECIPES)} (or None: the package's own)")
    return RECIPES[name]


def recipe_rule(name: str, bf: BlockFormat) -> RecipeRule:
    """The rule of recipe ``name`` for the format ``bf``, or a :class:`NotApplicableError` naming
    the formats the recipe writes."""
    recipe = recipe_of(name)
    if bf.name in recipe.rules:
        return recipe.rules[bf.name]
    if bf.integer and recipe.integers is not None:
        return recipe.integers
    if bf.name not in recipe.rules:
        writes = ", ".join(recipe.rules) + (" and the integer formats" if recipe.integers is not None else "")
        raise NotApplicableError(f"recipe {name!r} ({recipe.producer}) does not write {bf.name}; it writes: {writes}")
    return recipe.rules[bf.name]


def weight_dtype(rule: RecipeRule, dtype: Any, recipe: str, bf: BlockFormat | None = None) -> str:
    """The dtype a recipe's intermediate results are rounded to, for input of ``dtype`` (a name,
    or None where unknown: float32); the integer formats' kernels compute in float16 too."""
    name = "float32" if dtype is None else str(dtype)
    if rule.intermediate == "float32" or name in ("float32", "float64"):
        return "float32"
    if bf is not None and bf.integer and name == "float16":
        return name
    if name != "bfloat16":
        raise NotApplicableError(
            f"recipe {recipe!r} computes in the weight's dtype; it is followed for float32 and bfloat16 "
            f"weights, got {name}"
        )
    return name


def recipe_options(name: str, bf: BlockFormat, options: dict[str, Any], given: set[str]) -> RecipeRule:
    """The rule of recipe ``name`` for ``bf``, after checking that none of the options in ``given``
    (those the caller set) is one the recipe fixes: a recipe is a producer's whole arithmetic."""
    rule = recipe_rule(name, bf)
    fixed = {"scale_mode", "rounding", "scale_bound", "four_over_six", "scale_search", "rht"}
    if rule.per_tensor == "none":  # otherwise a given one is a fused layer's (shared_per_tensor_scale)
        fixed.add("per_tensor_scale")
    if bf.integer:  # the groups are the user's (not a per-channel rule's); the scales are in the weight's dtype
        fixed.add("scale_dtype")
        if rule.scale != "package":
            fixed |= {"block_size", "block_shape"}
    elif rule.scale != "package" or bf.float_scales:
        fixed |= {"block_size", "block_shape", "scale_dtype"}
    clash = sorted(given & fixed)
    if clash:
        raise InvalidValueError(
            f"recipe {name!r} fixes {', '.join(clash)} ({RECIPES[name].producer}'s arithmetic); "
            "give the recipe or these options, not both"
        )
    if rule.scale != "package" and options.get("axis", -1) not in (-1, None) and options["axis"] != options["ndim"] - 1:
        raise InvalidValueError(
            f"recipe {name!r} blocks the last axis, as its producer does; got axis {options['axis']}"
        )
    return rule


def _round(value: float, dtype: str) -> float:
    """``value`` rounded to float32, then to ``dtype`` (float32 or bfloat16), as torch rounds a result."""
    return float(np.float32(value) if dtype == "float32" else ml_dtypes.bfloat16(np.float32(value)))


def ct_global_scale(amax: float, dtype: str, bound: float, max_element: float) -> float:
    """compressed-tensors' NVFP4 global scale ``448 * 6 / amax`` from the finite amax of the tensor
    or its fused layer, as torch computes it in the weight's dtype (``dtype``): the amax's
    reciprocal rounded to that dtype, times 2688, rounded again; 1.0 where not finite. Returned as
    the per-tensor scale the package's block arrays hold (a multiplier): its reciprocal in double
    precision, so that the float32 reciprocal a layout stores is the global scale exactly."""
    tiny = float(np.finfo(np.float32).tiny)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        a = _round(max(float(amax), tiny), dtype)
        reciprocal = _round(float(np.float32(1) / np.float32(a)), dtype)
        gs = _round(float(np.float32(reciprocal) * (np.float32(bound) * np.float32(max_element))), dtype)
    return 1.0 / gs if math.isfinite(gs) else 1.0


def check_finite(amax_pattern: int, recipe: str) -> None:
    """Refuse input whose largest |x| pattern (of all values) is an infinity's or a NaN's: the
    producers' arithmetic has no rule for it."""
    if amax_pattern >= 0x7F800000:
        raise InvalidValueError(
            f"recipe {recipe!r}: the input holds NaN or infinity, for which its producer has no rule; "
            "quantise it without a recipe (the package's rules give such blocks a NaN scale)"
        )
