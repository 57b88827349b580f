"""What the runtimes are known to load wrong from a valid checkpoint, said in the command's summary.

Each entry is a runtime's own bug met with the layout as written, pinned by a strict ``xfail`` in
``tests/test_checkpoints_architectures.py`` so that a release that fixes it is noticed:

- transformers (checked with 5.25) dequantises compressed-tensors NVFP4 MoE experts, which it
  merges into stacked parameters on load, without their ``weight_global_scale``: their values come
  out about ``448 * 6 / amax`` times too large, silently;
- transformers (5.25) refuses compressed-tensors MXFP8 MoE experts (their [out, in / 32] scales do
  not fit its merged parameters), and FP8 ones in 128 x 128 tiles (``integrations/compressed_tensors.py``
  multiplies the codes by their tile scales without expanding them).

MXFP4 MoE experts load exactly there, and vLLM, whose fused MoE reads each expert's Linear
tensors, loads all three.

- transformers (5.25) reads a fine-grained FP8 weight's block as its shape divided by the scale
  grid's (``Fp8Dequantize``), so it refuses a weight whose rows or columns are not a multiple of
  the block (DeepSeek's 576-row ``kv_a_proj_with_mqa``), and would read the wrong block where that
  division happens to be exact; vLLM allocates the grid with a ceiling and loads them (pinned in
  ``tests/test_checkpoints_runtimes.py``).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from ..formats import BLOCK_FORMATS

__all__ = [
    "expert_notes", "partial_blocks_notes", "TRANSFORMERS_EXPERT_BUGS", "transformers_version", "LARGEST_DIVISOR",
    "LARGEST_MULTIPLIER", "fused_scale_rule", "fused_scale_ratio",
]  # fmt: skip

#: format -> what transformers does with that format's MoE experts in compressed-tensors.
TRANSFORMERS_EXPERT_BUGS: dict[str, str] = {
    "nvfp4": "dequantises NVFP4 MoE experts without their weight_global_scale (values far too large, silently)",
    "mxfp8_e4m3": "refuses MXFP8 MoE experts (their scales do not fit its merged expert parameters)",
    "fp8_block": "refuses FP8 MoE experts in 128 x 128 tiles (their scales do not fit its merged expert parameters)",
}
#: The last release the entries were checked with.
CHECKED_WITH = "5.25"


def transformers_version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


#: transformers' compressed route (``CompressedTensorsConfig()``, run_compressed) allocates a
#: pack-quantized module's ``weight_zero_point`` unpacked, [out, groups], and refuses the packed
#: [ceil(out * b / 32), groups] compressed-tensors writes (llm-compressor's own W4A16_ASYM too;
#: tests/test_checkpoints_runtimes.py holds it as a strict xfail). Its ``dequantize=True`` route and
#: vLLM read them.
ZERO_POINT_BUG = (
    "loads zero points (the _asym formats) only with CompressedTensorsConfig(run_compressed=False); its compressed "
    "route refuses the packed weight_zero_point compressed-tensors writes, as it refuses llm-compressor's own "
    "W4A16_ASYM"
)


#: The widths vLLM's ``CompressedTensorsWNA16`` runs (``WNA16_SUPPORTED_BITS`` in
#: vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py).
VLLM_WNA16_BITS = (4, 8)


def integer_notes(fmt: str) -> list[str]:
    """The summary's notes on integer formats: transformers' reading of zero points, for a format
    that has them; vLLM's widths, for one it does not run."""
    from ..formats import BLOCK_FORMATS

    bf = BLOCK_FORMATS[fmt]
    notes = []
    if bf.integer and bf.element_bits not in VLLM_WNA16_BITS:
        notes.append(
            f"vLLM runs compressed-tensors integer weights of {' and '.join(map(str, VLLM_WNA16_BITS))} bits only "
            f"(CompressedTensorsWNA16's WNA16_SUPPORTED_BITS); these {bf.element_bits}-bit ones load in transformers"
        )
    if bf.zero_points:
        notes.append(f"{_transformers()} {ZERO_POINT_BUG} (a bug known through {CHECKED_WITH}; vLLM loads them)")
    return notes


def expert_notes(fmt: str, arch: Any, quantised: dict[str, tuple[int, ...]]) -> list[str]:
    """The summary's notes on transformers' MoE bugs (:data:`TRANSFORMERS_EXPERT_BUGS`) for the
    weights ``quantised`` (their shapes) of a compressed-tensors checkpoint in ``fmt``."""
    if arch is None or fmt not in TRANSFORMERS_EXPERT_BUGS:
        return []
    experts = [n for n in quantised if arch.merged_expert(n.rpartition(".")[0])]
    if not experts:
        return []
    return [
        f"{_transformers()} {TRANSFORMERS_EXPERT_BUGS[fmt]}: {len(experts)} expert weight(s) here; a bug of "
        f"transformers (known through {CHECKED_WITH}), not of this checkpoint, which vLLM loads; for transformers, "
        f"--format mxfp4_e2m1 loads MoE experts exactly (docs/checkpoints.md)"
    ]


def _transformers() -> str:
    """transformers as a note names it: with the installed version, if any."""
    installed = transformers_version()
    return f"transformers {installed} (installed)" if installed else "transformers"


def partial_blocks_notes(fmt: str, arch: Any, quantised: dict[str, tuple[int, ...]]) -> list[str]:
    """The summary's note on transformers' fine-grained FP8 in partial tiles for the weights
    ``quantised`` (their shapes) in ``fmt``."""
    bf = BLOCK_FORMATS[fmt]
    partial = [n for n, shape in quantised.items() if shape[-2] % bf.block_rows or shape[-1] % bf.block_size]
    if not partial:
        return []
    return [
        f"{_transformers()} refuses fine-grained FP8 weights whose rows or columns are not a multiple of "
        f"{bf.block_rows} x {bf.block_size} blocks (it derives the block from the scale grid): {len(partial)} "
        f"here, e.g. {partial[0]}; a bug of transformers (known through {CHECKED_WITH}), not of this checkpoint, "
        f"which vLLM loads; for transformers, --ignore them or choose --format fp8_channel (docs/checkpoints.md)"
    ]


#: How vLLM takes one NVFP4 per-tensor scale for the shards of a fused layer, by layout (each
#: layout's ``fused_scale``): (dense layers, MoE experts' w1/w3), as the multiplier ``pts``
#: (compressed-tensors stores its reciprocal): ``min`` / ``max`` of the shards', or ``first`` (the
#: gate's, w1). compressed-tensors: ``process_weights_after_loading`` of
#: ``compressed_tensors_w4a4_nvfp4.py`` / ``_w4a16_nvfp4.py`` keeps ``weight_global_scale.max()``
#: (the largest divisor, so the smallest ``pts``), and the MoE method
#: ``w13_weight_global_scale[:, 0]``; ModelOpt (``modelopt.py``): ``weight_scale_2.max()`` for a
#: Linear and ``w13_weight_scale_2[:, 0]`` for experts. Each only warns when they differ.
LARGEST_DIVISOR = ("min", "first")
LARGEST_MULTIPLIER = ("max", "first")


def fused_scale_rule(rules: tuple[str, str], group: tuple[str, ...]) -> str:
    """The rule of a layout's ``rules`` (dense, experts) for the fused ``group`` (tensor names)."""
    dense, experts = rules
    return experts if any(".experts." in n for n in group) else dense


def fused_scale_ratio(rules: tuple[str, str], group: tuple[str, ...], scales: list[float]) -> list[float]:
    """For the shards of a fused layer with per-tensor scales ``scales`` (multipliers): the factor
    each shard's values take when the runtime applies its one scale by a layout's ``rules`` (its
    own scale: 1)."""
    rule = fused_scale_rule(rules, group)
    shared = {"min": min(scales), "max": max(scales), "first": scales[0]}[rule]
    return [shared / s for s in scales]


def mixed_notes() -> list[str]:
    """The summary's note on transformers' dequantising loader for a compressed-tensors checkpoint
    of several schemes."""
    return [
        f"{_transformers()} with CompressedTensorsConfig(dequantize=True) (run_compressed=False) decompresses every "
        f"dense module of a mixed-precision checkpoint with one group's scheme (get_dense_scheme in "
        f"transformers/integrations/compressed_tensors.py) and fails on it; load it with CompressedTensorsConfig() "
        f"(compressed-tensors applies each module's group), or in vLLM (docs/checkpoints.md)"
    ]
