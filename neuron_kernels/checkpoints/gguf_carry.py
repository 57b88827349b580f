"""A Hugging Face checkpoint already in NVFP4 or MXFP4 carried into GGUF without re-quantising: its
codes and block scales re-laid into ggml's blocks byte for byte, its per-tensor scale as the
``NAME.scale`` tensor, into the tensor table and metadata of a GGUF file of the same model (the
template: its names, hyperparameters, tokenizer and every tensor not carried).

Each quantised weight is placed by gguf-py's table of tensor names for the template's
architecture (``gguf.get_tensor_name_map``) and then checked against the template's own tensor of
that name: the carried values must be the template's up to FP4 rounding (at least
:data:`MIN_MATCH_DB` of SQNR), as they are or with their rows in the order llama.cpp's converter
gives the rotary projections (its ``permute``, over the heads or the key-value heads). A weight
that matches in neither order is refused, never guessed; a weight of another format, or one the
template has no tensor for, is reported and the template's tensor kept.

The contract: ``docs/gguf.md`` ("Carried over without loss").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidValueError, NotApplicableError
from ..io.gguf_file import UINT32, GgufFile, GgufOutput, GgufTensor, byte_pieces, open_gguf
from ..io.outputs import atomic_output
from .gguf_convert import GGUF_FORMATS, NVFP4_SCALED
from .layouts import open_any, stored_weights
from .reports import TensorReport

__all__ = ["MIN_MATCH_DB", "carry_into_gguf"]

#: A per-expert weight (``...mlp.experts.3.gate_proj.weight``): its module, expert and projection.
_EXPERT = re.compile(r"(.+)\.experts\.(\d+)\.([^.]+)\.weight")

#: The SQNR (dB) between a carried weight's values and the template's own tensor below which the
#: two are not the same weight (FP4 of the same weight gives 17-21 dB; another weight, or the
#: right weight with its rows in another order, about 0 dB or less).
MIN_MATCH_DB = 10.0


def _rotary_rows(rows: int, heads: int) -> np.ndarray | None:
    """The row order llama.cpp's converter gives a rotary projection of ``heads`` heads (its
    ``permute``: each head's two halves interleaved), as indices into the checkpoint's rows."""
    if heads <= 0 or rows % (2 * heads):
        return None
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def _sqnr_db(reference: np.ndarray, values: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - values) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-300) / noise)


def _name_map(template: GgufFile) -> Callable[[str], str | None]:
    import gguf

    arch = template.architecture
    by_name = {name: arch_id for arch_id, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        raise NotApplicableError(f"{template.path}: gguf-py has no table of tensor names for architecture {arch!r}")
    blocks = template.count(f"{arch}.block_count", 0, len(template.tensors))  # a block holds a tensor or more
    table = gguf.get_tensor_name_map(by_name[arch], blocks)

    def gguf_name(hf_name: str) -> str | None:
        found = table.get_name(hf_name, try_suffixes=(".weight",))
        return found if found is None else str(found)

    return gguf_name


def carry_into_gguf(
    checkpoint: str | os.PathLike[str],
    template: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[TensorReport]:
    """Write ``dst``: the GGUF file ``template`` with every NVFP4 and MXFP4 weight (only those of
    ``fmt``, if given) of the quantised checkpoint ``checkpoint`` (compressed-tensors, ModelOpt,
    any layout the package reads with 1-D blocks along rows) carried into it as it is stored (see
    the module docstring). Returns a report per weight of the checkpoint not carried and per
    tensor of the output: ``converted`` (carried, bytes copied) or ``kept`` (with the reason)."""
    checkpoint, template, dst = os.fspath(checkpoint), os.fspath(template), os.fspath(dst)
    if fmt is not None and fmt not in GGUF_FORMATS:
        raise NotApplicableError(f"GGUF stores {' and '.join(GGUF_FORMATS)} blocks; got format {fmt!r}")
    tpl = open_gguf(template)
    ckpt, layout = open_any(checkpoint)
    if layout is None:
        raise NotApplicableError(f"{checkpoint}: holds no quantised weight to carry (quantize the GGUF file instead)")
    carry = _Carry(checkpoint, ckpt, tpl)
    notes = carry.weights(stored_weights(ckpt, layout), fmt)
    plan, reports = _plan(tpl, carry.carried, carry.inputs)
    file_type = {GGUF_FORMATS[arrays[0].fmt].file_type for arrays, _ in carry.carried.values()}
    changes = {"general.file_type": (file_type.pop(), UINT32)} if len(file_type) == 1 else {}
    _write(dst, force, (checkpoint, template), tpl, changes, plan, progress or (lambda n: None))
    return notes + reports


#: One tensor of the output: the template's tensor copied (its record), or None and the payload
#: written (a per-tensor scale's values, or the block arrays of a weight and its row order).
_Planned = tuple[GgufTensor | None, str, tuple[int, ...], str, Any]


class _Carry:
    """The weights of a checkpoint matched with the tensors of a GGUF template: ``carried`` (GGUF
    name -> the block arrays and their row order) and ``inputs`` (GGUF name -> the activations'
    per-tensor scales)."""

    def __init__(self, checkpoint: str, ckpt: Any, tpl: Any) -> None:
        self.checkpoint, self.ckpt, self.tpl = checkpoint, ckpt, tpl
        self.gguf_name = _name_map(tpl)
        arch = tpl.architecture
        self.heads = tpl.count(f"{arch}.attention.head_count", 0)
        self.kv_heads = tpl.count(f"{arch}.attention.head_count_kv", self.heads) or self.heads
        self.carried: dict[str, tuple[list[Any], np.ndarray | None]] = {}
        self.inputs: dict[str, list[float | None]] = {}

    def weights(self, stored: Any, wanted: str | None) -> list[TensorReport]:
        """Match every stored weight (of format ``wanted``, if given); the reports of those kept."""
        checkpoint, tpl, gguf_name = self.checkpoint, self.tpl, self.gguf_name
        heads, kv_heads = self.heads, self.kv_heads
        carried, inputs, ckpt = self.carried, self.inputs, self.ckpt
        notes: list[TensorReport] = []
        experts: dict[str, dict[int, Any]] = {}  # merged name (experts.PROJ.weight) -> expert -> weight
        for w in stored:
            fmt = w.layout.fmt
            if (
                fmt not in GGUF_FORMATS
                or (wanted is not None and fmt != wanted)
                or w.transpose
                or w.layout.block_rows != 1
                or len(w.layout.shape) != 2
            ):
                why = (
                    f"{fmt} weights are not carried ("
                    + (f"only {wanted}" if wanted else f"GGUF holds {' and '.join(GGUF_FORMATS)} blocks along rows")
                    + "); the template's tensor kept"
                )
                notes.append(TensorReport(w.name, w.layout.shape, fmt, "kept", why))
                continue
            spec = GGUF_FORMATS[fmt]
            if w.layout.shape[-1] % spec.block or w.layout.block_size != spec.format.block_size:
                raise InvalidValueError(
                    f"{checkpoint}[{w.name}]: blocks of {w.layout.block_size} over rows of {w.layout.shape[-1]} "
                    f"are not ggml's {spec.ggml_type} blocks ({spec.block} elements, a scale per "
                    f"{spec.format.block_size})"
                )
            expert = _EXPERT.fullmatch(w.name)
            if expert is not None:  # stacked with the layer's other experts, as llama.cpp stores them
                experts.setdefault(f"{expert[1]}.experts.{expert[3]}.weight", {})[int(expert[2])] = w
                continue
            target = gguf_name(w.name)
            if target is None or target not in tpl.tensors:
                why = f"the template has no tensor for {w.name}"
                notes.append(TensorReport(w.name, w.layout.shape, fmt, "kept", why))
                continue
            tensor = _template_tensor(checkpoint, w.name, tpl, target, w.layout.shape)
            ba = w.block_array()
            carried[target] = ([ba], _row_order(checkpoint, w.name, ba.dequantize(), tensor, heads, kv_heads))
            inputs[target] = [_input_scale(ckpt.tensors, w.dropped)]
        for merged, by_index in experts.items():
            notes += self._experts(merged, by_index)
        return notes

    def _experts(self, merged: str, by_index: dict[int, Any]) -> list[TensorReport]:
        """The experts of one layer, stacked as llama.cpp stores them."""
        checkpoint, tpl, ckpt = self.checkpoint, self.tpl, self.ckpt
        target = self.gguf_name(merged)
        first = next(iter(by_index.values()))
        shape = (len(by_index), *first.layout.shape)
        if target is None or target not in tpl.tensors:
            why = f"the template has no {merged}"
            return [TensorReport(w.name, w.layout.shape, w.layout.fmt, "kept", why) for w in by_index.values()]
        if sorted(by_index) != list(range(len(by_index))) or len({w.layout.fmt for w in by_index.values()}) > 1:
            raise InvalidValueError(
                f"{checkpoint}: the experts of {merged} are not experts 0 to {len(by_index) - 1} of one format"
            )
        tensor = _template_tensor(checkpoint, merged, tpl, target, shape)
        arrays = [by_index[e].block_array() for e in range(len(by_index))]
        values = np.stack([ba.dequantize() for ba in arrays])
        _row_order(checkpoint, merged, values, tensor, 0, 0)  # as they are: experts are not rotary
        self.carried[target] = (arrays, None)
        self.inputs[target] = [_input_scale(ckpt.tensors, by_index[e].dropped) for e in range(len(by_index))]
        return []


def _plan(
    tpl: Any, carried: dict[str, tuple[list[Any], np.ndarray | None]], inputs: dict[str, list[float | None]]
) -> tuple[list[_Planned], list[TensorReport]]:
    """The output's tensors in the template's order: each kept, or carried with its scales."""
    reports: list[TensorReport] = []
    plan: list[_Planned] = []
    for name, t in tpl.tensors.items():
        scale_of = name[: -len("scale")] + "weight" if name.endswith(".scale") else None
        input_of = name[: -len("input_scale")] + "weight" if name.endswith(".input_scale") else None
        if scale_of in carried or input_of in carried:
            continue  # the template's own scales of a weight carried: replaced below
        if name not in carried:
            plan.append((t, name, t.shape, t.type, None))
            reports.append(TensorReport(name, t.shape, t.type, "kept", "the template's"))
            continue
        arrays, order = carried[name]
        spec = GGUF_FORMATS[arrays[0].fmt]
        scales = [ba.per_tensor_scale for ba in arrays]
        two_level = spec.unsigned_scales and any(pts is not None for pts in scales)
        if two_level and not NVFP4_SCALED.fullmatch(name) and any(pts != 1 for pts in scales):
            plan.append((t, name, t.shape, t.type, None))
            reason = "llama.cpp reads no per-tensor scale for it; the template's kept"
            reports.append(TensorReport(name, t.shape, t.type, "kept", reason))
            continue
        plan.append((None, name, t.shape, spec.ggml_type, (arrays, order)))
        outputs = (name,)
        per = t.shape[:-2] or (1,)
        if two_level and NVFP4_SCALED.fullmatch(name):
            scale = name[: -len("weight")] + "scale"
            plan.append((None, scale, per, "F32", np.array([pts or 1 for pts in scales], np.float32)))
            outputs += (scale,)
            if all(v is not None for v in inputs[name]):
                input_scale = name[: -len("weight")] + "input_scale"
                plan.append((None, input_scale, per, "F32", np.array(inputs[name], np.float32)))
                outputs += (input_scale,)
        how = "codes and scales re-laid" + (" (rows in llama.cpp's rotary order)" if order is not None else "")
        how += f" ({len(arrays)} experts stacked)" if len(t.shape) == 3 else ""
        reports.append(TensorReport(name, t.shape, spec.ggml_type, "converted", how, outputs=outputs))
    return plan, reports


def _write(
    dst: str,
    force: bool,
    sources: tuple[str, str],
    tpl: Any,
    changes: dict[str, Any],
    plan: list[_Planned],
    tick: Callable[[int], None],
) -> None:
    """Write the planned tensors into ``dst``, whole or not at all."""
    with atomic_output(dst, force, sources) as tmp, GgufOutput(tmp, tpl, changes) as out:
        for _, name, shape, kind, _ in plan:
            out.add(name, shape, kind)
        out.begin()
        for source, _, _, _, payload in plan:
            if source is not None:
                for piece in byte_pieces(source, 64 << 20):
                    out.write(piece)
                    tick(piece.nbytes)
            elif isinstance(payload, np.ndarray):
                out.write(payload)
            else:
                arrays, order = payload
                for ba in arrays:
                    out.write(_blocks_of(ba, order))


def _input_scale(tensors: dict[str, Any], parts: tuple[str, ...]) -> float | None:
    """A weight's activation scale as llama.cpp's ``NAME.input_scale`` holds it (a multiplier):
    ModelOpt's ``input_scale`` as it is, compressed-tensors' ``input_global_scale`` inverted."""
    for part in parts:
        kind = part.rpartition(".")[2]
        if kind in ("input_scale", "input_global_scale") and part in tensors:
            value = np.asarray(tensors[part].read(), np.float32).reshape(-1)
            if value.size == 1:
                return float(value[0]) if kind == "input_scale" else float(np.float32(1) / value[0])
    return None


def _template_tensor(checkpoint: str, name: str, tpl: GgufFile, target: str, shape: tuple[int, ...]) -> GgufTensor:
    tensor = tpl.tensors[target]
    if tensor.shape != shape:
        raise InvalidValueError(
            f"{checkpoint}[{name}] is {shape}, the template's {target} is {tensor.shape}: not the same model"
        )
    return tensor


def _row_order(
    checkpoint: str, name: str, values: np.ndarray, tensor: GgufTensor, heads: int, kv_heads: int
) -> np.ndarray | None:
    """The order of the rows of ``values`` (a weight's, dequantised) that matches the template's
    ``tensor`` (None: as they are)."""
    reference = tensor.decoded().reshape(values.shape)
    tried = []
    for order in (None, _rotary_rows(values.shape[0], heads), _rotary_rows(values.shape[0], kv_heads)):
        if order is None and tried:
            continue
        db = _sqnr_db(reference, values if order is None else values[order])
        tried.append(f"{db:.1f} dB")
        if db >= MIN_MATCH_DB:
            return order
    raise InvalidValueError(
        f"{checkpoint}[{name}] does not match the template's {tensor.name} in any known row order "
        f"(SQNR {', '.join(tried)}; at least {MIN_MATCH_DB:g} dB expected): not the same model's weight"
    )


def _blocks_of(ba: Any, order: np.ndarray | None) -> np.ndarray:
    """ggml's blocks of a block array (rows reordered first where ``order`` says)."""
    spec = GGUF_FORMATS[ba.fmt]
    codes = ba.unpacked_codes()
    scales = ba.scales.view(np.uint8)
    if order is not None:
        codes, scales = codes[order], scales[order]
    return spec.to_blocks(codes, scales)
