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
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

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


def runtime_notes(layout: str, fmt: str, arch: Any, quantised: list[str]) -> list[str]:
    """The summary's notes on the runtimes for a checkpoint written in ``layout`` / ``fmt``."""
    if layout != "compressed-tensors" or arch is None or fmt not in TRANSFORMERS_EXPERT_BUGS:
        return []
    experts = [n for n in quantised if arch.kind(n.rpartition(".")[0]) == "expert"]
    if not experts:
        return []
    installed = transformers_version()
    which = f"transformers {installed} (installed)" if installed else "transformers"
    return [
        f"{which} {TRANSFORMERS_EXPERT_BUGS[fmt]}: {len(experts)} expert weight(s) here; a bug of transformers "
        f"(known through {CHECKED_WITH}), not of this checkpoint, which vLLM loads; for transformers, "
        f"--format mxfp4_e2m1 loads MoE experts exactly (docs/checkpoints.md)"
    ]
