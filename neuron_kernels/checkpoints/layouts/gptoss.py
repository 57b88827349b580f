"""The ``mxfp4`` layout: transformers' MXFP4, the layout of the gpt-oss checkpoints.

Per expert parameter ``NAME`` ([E, in, out]), ``NAME_blocks`` uint8 [E, out, in/32, 16] and
``NAME_scales`` uint8 [E, out, in/32]. Which tensors are quantised: gpt-oss's expert parameters
only (:func:`neuron_kernels.checkpoints.selection.expert_decision`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from ...blocks.layout import BlockLayout
from ...formats import BLOCK_FORMATS
from ...io.arrays import ArrayEntry, FileFormatError
from ...io.safetensors import TensorSpec
from ..folder import Checkpoint
from ..selection import GPTOSS_EXPERTS, GPTOSS_NOT_CONVERTED, expert_decision, is_expert
from .records import (
    CheckpointLayout,
    Output,
    StoredWeight,
    expect_tensor,
    stored_codes_dtype,
    stored_scales_dtype,
    uint8_view,
)

__all__ = ["LAYOUT"]

#: The one block format of the layout (MXFP4: E2M1 elements, e8m0 scales, blocks of 32).
_FORMAT = BLOCK_FORMATS["mxfp4_e2m1"]
#: The bytes of one block's codes, the last axis of ``NAME_blocks`` (16: 32 codes, two per byte).
_BLOCK_BYTES = _FORMAT.block_size * _FORMAT.element_bits // 8


def _gptoss_outputs(name: str, layout: BlockLayout, scale_dtype: str) -> list[Output]:
    groups = layout.scales_shape[-1]
    blocks = layout.shape[:-1] + (groups, _BLOCK_BYTES)
    return [
        (TensorSpec(f"{name}_blocks", stored_codes_dtype(_FORMAT), blocks), "codes"),
        (TensorSpec(f"{name}_scales", stored_scales_dtype(_FORMAT), layout.scales_shape), "scales"),
    ]


def _expert_modules(names: Any) -> set[str]:
    return {n.rpartition(".")[0] for n in names}


def _gptoss_config(fmt: str, kept: list[tuple[str, ArrayEntry]], ignore: list[str]) -> dict[str, Any]:
    """gpt-oss's ``modules_to_not_convert``, and the experts modules kept in bfloat16 (by --ignore)."""
    experts = sorted(_expert_modules(n for n, _ in kept if is_expert(n)))
    return {"quant_method": "mxfp4", "modules_to_not_convert": list(GPTOSS_NOT_CONVERTED) + experts}


def _gptoss_fits(ckpt: Checkpoint, quantised: dict[str, tuple[int, ...]], fmt: str, **context: Any) -> None:
    """transformers reads MXFP4 into gpt-oss's experts only: refuse what it would load wrong."""
    model_type = (ckpt.config or {}).get("model_type")
    fit = "--layout compressed-tensors (--format mxfp4_e2m1) suits other models"
    if model_type is not None and model_type != "gpt_oss":
        raise FileFormatError(
            f"{ckpt.path}: the mxfp4 layout is gpt-oss's (transformers reads it for model_type gpt_oss only), "
            f"not {model_type!r}; {fit}"
        )
    if not quantised:
        raise FileFormatError(
            f"{ckpt.path}: no gpt-oss expert parameters ({', '.join(GPTOSS_EXPERTS)}) to quantise; the mxfp4 "
            f"layout holds nothing else; {fit}"
        )
    done = set(quantised)
    half = _expert_modules(done) & _expert_modules(n for n in ckpt.tensors if n not in done and is_expert(n))
    if half:
        raise FileFormatError(
            f"{ckpt.path}: {sorted(half)[0]}: transformers converts an experts module whole; quantise both its "
            f"gate_up_proj and down_proj or neither (--ignore the module)"
        )


def _gptoss_detect(ckpt: Checkpoint) -> bool:
    qc = ckpt.quantization_config
    if qc is not None:
        return qc.get("quant_method") == "mxfp4"
    return any(n.endswith("_blocks") and n[: -len("_blocks")] + "_scales" in ckpt.tensors for n in ckpt.tensors)


def _not_converted(ckpt: Checkpoint) -> tuple[str, ...]:
    patterns = (ckpt.quantization_config or {}).get("modules_to_not_convert") or ()
    return tuple(p for p in patterns if isinstance(p, str))


def _gptoss_weights(ckpt: Checkpoint) -> list[StoredWeight]:
    found = []
    t = ckpt.tensors
    for name, blocks in t.items():
        if not name.endswith(("_blocks", "_scales")):
            continue
        base = name[: -len("_blocks")]  # as long as "_scales"
        if not is_expert(base):
            raise FileFormatError(
                f"{ckpt.path}: {name} is not an expert parameter ({', '.join(GPTOSS_EXPERTS)}), the only tensors "
                f"the mxfp4 layout stores in blocks; its runtime would not load it"
            )
        if name.endswith("_scales"):
            if f"{base}_blocks" not in t:
                raise FileFormatError(f"{ckpt.path}: {name} has no {base}_blocks beside it")
            continue
        sname = f"{base}_scales"
        if sname not in t:
            raise FileFormatError(f"{ckpt.path}: {name} has no {sname} beside it")
        codes_dtype, size = stored_codes_dtype(_FORMAT).name, _FORMAT.block_size
        if blocks.dtype.name != codes_dtype or len(blocks.shape) != 4 or blocks.shape[-1] != _BLOCK_BYTES:
            raise FileFormatError(
                f"{blocks.where}: MXFP4 blocks must be {codes_dtype} of shape [experts, out, in/{size}, "
                f"{_BLOCK_BYTES}], found {blocks.dtype} of shape {blocks.shape}"
            )
        shape = blocks.shape[:-2] + (blocks.shape[-2] * size,)
        layout = BlockLayout(_FORMAT.name, shape, len(shape) - 1, size, 1, _FORMAT.packable)
        expect_tensor(t[sname], stored_scales_dtype(_FORMAT).name, layout.scales_shape, "the e8m0 scales")
        found.append(
            StoredWeight(
                base,
                layout,
                None,
                uint8_view(blocks, layout.codes_shape),
                uint8_view(t[sname]),
                (name, sname),
                base,
                transpose=True,
            )
        )
    if ckpt.quantization_config is not None:
        kept, stored = _not_converted(ckpt), {w.name for w in found}
        for name in t:
            module = name.rpartition(".")[0]
            if is_expert(name) and not any(_module_matches(module, p) for p in kept) and name not in stored:
                raise FileFormatError(
                    f"{ckpt.path}: quantization_config (mxfp4) promises {name} in MXFP4 ({module} is not in "
                    f"modules_to_not_convert), but it is a plain {t[name].dtype} tensor"
                )
    return found


def _module_matches(module: str, pattern: str) -> bool:
    """transformers' test of a module against a ``modules_to_not_convert`` entry: the pattern
    (shell wildcards) names the module or one of its parents."""
    return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")


LAYOUT = CheckpointLayout(
    "mxfp4",
    "transformers MXFP4, the gpt-oss layout (NAME_blocks, NAME_scales)",
    (_FORMAT.name,),
    _gptoss_outputs,
    _gptoss_config,
    _gptoss_detect,
    _gptoss_weights,
    decide=expert_decision,
    transpose=True,
    fits=_gptoss_fits,
    part_suffixes=("_blocks", "_scales"),
)
