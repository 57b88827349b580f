"""What the runtimes are known to load wrong from a valid checkpoint, said in the command's summary.

Each entry is a runtime's own bug met with the layout as written, pinned by a strict ``xfail`` in
``tests/test_checkpoints_architectures.py`` so that a release that fixes it is noticed:

- transformers (checked with 5.25) dequantises compressed-tensors NVFP4 MoE experts, which it
  merges into stacked parameters on load, without their ``weight_global_scale``: their values come
  out about ``448 * 6 / amax`` times too large, silently;
- transformers (5.25) refuses compressed-tensors MXFP8 MoE experts (their [out, in / 32] scales do
  not fit its merged parameters).

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

__all__ = ["runtime_notes", "TRANSFORMERS_EXPERT_BUGS", "transformers_version"]

#: format -> what transformers does with that format's MoE experts in compressed-tensors.
TRANSFORMERS_EXPERT_BUGS: dict[str, str] = {
    "nvfp4": "dequantises NVFP4 MoE experts without their weight_global_scale (values far too large, silently)",
    "mxfp8_e4m3": "refuses MXFP8 MoE experts (their scales do not fit its merged expert parameters)",
}
#: The last release the entries were checked with.
CHECKED_WITH = "5.25"


def transformers_version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def runtime_notes(layout: str, fmt: str, arch: Any, quantised: dict[str, tuple[int, ...]]) -> list[str]:
    """The summary's notes on the runtimes for a checkpoint written in ``layout`` / ``fmt``
    (``quantised``: the shape of each weight quantised)."""
    if layout == "fp8":
        return _partial_blocks_note(fmt, quantised)
    if layout != "compressed-tensors" or arch is None or fmt not in TRANSFORMERS_EXPERT_BUGS:
        return []
    experts = [n for n in quantised if arch.kind(n.rpartition(".")[0]) == "expert"]
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


def _partial_blocks_note(fmt: str, quantised: dict[str, tuple[int, ...]]) -> list[str]:
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
