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
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidValueError, NotApplicableError
from ..formats import BLOCK_FORMATS
from ..io.gguf_file import UINT32, GgufFile, GgufOutput, GgufTensor, byte_pieces, open_gguf
from ..io.outputs import atomic_output
from .gguf_convert import GGUF_FORMATS, NVFP4_SCALED
from .layouts import open_any, stored_weights
from .reports import TensorReport

__all__ = ["MIN_MATCH_DB", "IntegerTarget", "carry_into_gguf", "integer_blocks", "integer_target"]

#: A per-expert weight (``...mlp.experts.3.gate_proj.weight``): its module, expert and projection.
_EXPERT = re.compile(r"(.+)\.experts\.(\d+)\.([^.]+)\.weight")

#: The SQNR (dB) between a carried weight's values and the template's own tensor below which the
#: two are not the same weight (FP4 of the same weight gives 17-21 dB; another weight, or the
#: right weight with its rows in another order, about 0 dB or less).
MIN_MATCH_DB = 10.0


@dataclass(frozen=True)
class IntegerTarget:
    """The ggml block type an integer weight goes into (``Q4_0``, ``Q4_1``, ``Q8_0``), its
    ``general.file_type``, and why it is not carried exactly (None: codes and scales as they are)."""

    ggml_type: str
    file_type: int
    inexact: str | None = None


#: ggml's integer blocks: 32 elements and a float16 scale ``d`` (Q4_1: and a float16 ``m``), as
#: ggml-common.h lays them out (``block_q4_0``, ``block_q4_1``, ``block_q8_0``).
GGML_INTEGER_BLOCK = 32


def integer_target(ba: Any) -> tuple[IntegerTarget | None, str]:
    """Where ggml's integer blocks hold the integer block array ``ba`` (a [rows, cols] matrix in
    groups along its rows): symmetric codes of up to 4 bits as Q4_0 (``(nibble - 8) * d``, the
    code + 8 in a nibble), of up to 8 bits as Q8_0 (``qs * d``), exactly when each scale is a
    float16 (``d``); codes of up to 4 bits with zero points as Q4_1 (``q * d + m``, ``m = -z * d``
    rounded to float16: not exact in general); None and why for any other."""
    fmt = ba.format
    bits, cols = fmt.element_bits, ba.shape[-1]
    if len(ba.shape) != 2 or ba.axis != 1 or ba.group_index is not None:
        return None, "GGUF's integer blocks hold matrices grouped along their rows, in column order (no g_idx)"
    if cols % GGML_INTEGER_BLOCK or min(ba.block_size, cols) % GGML_INTEGER_BLOCK:
        return None, f"its groups of {ba.block_size} over rows of {cols} are no whole ggml blocks of 32"
    with np.errstate(over="ignore", under="ignore"):
        d = ba.scales.astype(np.float32)
        exact = bool(np.array_equal(d.astype(np.float16).astype(np.float32), d))
    why = None if exact else "its scales are not all float16 values (rounded to float16)"
    if fmt.zero_points:
        if bits > 4:
            return None, f"ggml has no block of {bits}-bit codes with zero points"
        return IntegerTarget("Q4_1", 3, "Q4_1 holds the zero point as m = -z * d in float16"), ""
    if bits <= 4:
        return IntegerTarget("Q4_0", 2, why), ""
    return IntegerTarget("Q8_0", 7, why), ""


def integer_blocks(ba: Any, target: IntegerTarget, order: np.ndarray | None) -> np.ndarray:
    """ggml's blocks (rows, blocks of 32 elements, their bytes) of the integer array ``ba`` (its
    rows reordered first where ``order`` says), as ``target`` stores them."""
    q = ba.integer_codes().astype(np.int16)
    rows, cols = q.shape
    per = cols // GGML_INTEGER_BLOCK
    group = np.minimum(np.arange(cols) // min(ba.block_size, cols), ba.scales.shape[-1] - 1)[::GGML_INTEGER_BLOCK]
    scale = ba.scales.astype(np.float32)[:, group]  # each ggml block's scale: its group's
    zeros = ba.zero_points[:, group].astype(np.int16) if ba.zero_points is not None else None
    if order is not None:
        q, scale = q[order], scale[order]
        zeros = zeros[order] if zeros is not None else None
    blocks = q.reshape(rows, per, GGML_INTEGER_BLOCK)
    d = np.ascontiguousarray(scale.astype(np.float16)).view(np.uint8).reshape(rows, per, 2)
    if target.ggml_type == "Q8_0":
        return np.concatenate([d, blocks.astype(np.int8).view(np.uint8)], axis=2)
    if target.ggml_type == "Q4_1":  # unsigned codes q - qmin, and the zero point folded into m
        low = 1 << (ba.format.element_bits - 1)
        assert zeros is not None
        nibbles = (blocks + low).astype(np.uint8)
        m = (-(zeros + low).astype(np.float32) * scale.astype(np.float16).astype(np.float32)).astype(np.float16)
        head = np.concatenate([d, np.ascontiguousarray(m).view(np.uint8).reshape(rows, per, 2)], axis=2)
    else:
        nibbles = (blocks + 8).astype(np.uint8)
        head = d
    packed = nibbles[:, :, :16] | (nibbles[:, :, 16:] << 4)  # byte j: elements j and j + 16
    return np.concatenate([head, packed], axis=2)


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
    require_exact: bool = False,
) -> list[TensorReport]:
    """Write ``dst``: the GGUF file ``template`` with every NVFP4 and MXFP4 weight (only those of
    ``fmt``, if given) of the quantised checkpoint ``checkpoint`` (compressed-tensors, ModelOpt,
    any layout the package reads with 1-D blocks along rows) carried into it as it is stored, and
    every integer weight in ggml's integer blocks (:func:`integer_target`; see the module
    docstring). Returns a report per weight of the checkpoint not carried and per tensor of the
    output: ``converted`` (carried) or ``kept`` (with the reason). ``require_exact``: refuse,
    before writing, a weight whose values change on the way (an integer one that ggml's blocks
    do not hold exactly)."""
    checkpoint, template, dst = os.fspath(checkpoint), os.fspath(template), os.fspath(dst)
    if fmt is not None and fmt not in GGUF_FORMATS and not (fmt in BLOCK_FORMATS and BLOCK_FORMATS[fmt].integer):
        raise NotApplicableError(
            f"GGUF stores {' and '.join(GGUF_FORMATS)} blocks, and the integer formats as Q4_0, Q4_1 or Q8_0; "
            f"got format {fmt!r}"
        )
    tpl = open_gguf(template)
    ckpt, layout = open_any(checkpoint)
    if layout is None:
        raise NotApplicableError(f"{checkpoint}: holds no quantised weight to carry (quantize the GGUF file instead)")
    carry = _Carry(checkpoint, ckpt, tpl)
    notes = carry.weights(stored_weights(ckpt, layout), fmt)
    if require_exact:
        inexact = [(name, t.inexact) for name, t in carry.integers.items() if t.inexact is not None]
        if inexact:
            raise InvalidValueError(
                f"{checkpoint}: {inexact[0][0]} is not carried exactly ({inexact[0][1]}), which --require-exact "
                f"refuses; nothing written"
            )
    plan, reports = _plan(tpl, carry.carried, carry.inputs, carry.integers)
    file_type = {
        carry.integers[name].file_type if name in carry.integers else GGUF_FORMATS[arrays[0].fmt].file_type
        for name, (arrays, _) in carry.carried.items()
    }
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
        #: The integer weights carried: GGUF name -> the ggml block type they go into.
        self.integers: dict[str, IntegerTarget] = {}

    def weights(self, stored: Any, wanted: str | None) -> list[TensorReport]:
        """Match every stored weight (of format ``wanted``, if given); the reports of those kept."""
        checkpoint, tpl, gguf_name = self.checkpoint, self.tpl, self.gguf_name
        heads, kv_heads = self.heads, self.kv_heads
        carried, inputs, ckpt = self.carried, self.inputs, self.ckpt
        notes: list[TensorReport] = []
        experts: dict[str, dict[int, Any]] = {}  # merged name (experts.PROJ.weight) -> expert -> weight
        for w in stored:
            fmt = w.layout.fmt
            if w.layout.format.integer and (wanted is None or fmt == wanted):
                notes += self._integer(w)
                continue
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

    def _integer(self, w: Any) -> list[TensorReport]:
        """An integer weight into ggml's integer blocks (:func:`integer_target`), or kept and why."""
        fmt, shape = w.layout.fmt, w.layout.shape
        target_name = self.gguf_name(w.name)
        if target_name is None or target_name not in self.tpl.tensors or _EXPERT.fullmatch(w.name):
            why = f"the template has no tensor for {w.name}" + (
                " (experts of integers are not carried)" if _EXPERT.fullmatch(w.name) else ""
            )
            return [TensorReport(w.name, shape, fmt, "kept", why)]
        ba = w.block_array()
        target, why = integer_target(ba)
        if target is None:
            return [TensorReport(w.name, shape, fmt, "kept", f"{why}; the template's tensor kept")]
        tensor = _template_tensor(self.checkpoint, w.name, self.tpl, target_name, shape)
        order = _row_order(self.checkpoint, w.name, ba.dequantize(), tensor, self.heads, self.kv_heads)
        self.carried[target_name] = ([ba], order)
        self.inputs[target_name] = [None]
        self.integers[target_name] = target
        return []

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
    tpl: Any,
    carried: dict[str, tuple[list[Any], np.ndarray | None]],
    inputs: dict[str, list[float | None]],
    integers: dict[str, IntegerTarget],
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
        if name in integers:
            plan.append((None, name, t.shape, integers[name].ggml_type, (arrays, order, integers[name])))
            reports.append(_integer_report(name, t.shape, arrays[0], integers[name], order))
            continue
        spec = GGUF_FORMATS[arrays[0].fmt]
        scales = [ba.per_tensor_scale for ba in arrays]
        two_level = spec.unsigned_scales and any(pts is not None for pts in scales)
        if two_level and not NVFP4_SCALED.fullmatch(name) and any(pts != 1 for pts in scales):
            plan.append((t, name, t.shape, t.type, None))
            reason = "llama.cpp reads no per-tensor scale for it; the template's kept"
            reports.append(TensorReport(name, t.shape, t.type, "kept", reason))
            continue
        plan.append((None, name, t.shape, spec.ggml_type, (arrays, order, None)))
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
                arrays, order, integer = payload
                for ba in arrays:
                    out.write(_blocks_of(ba, order) if integer is None else integer_blocks(ba, integer, order))


def _integer_report(
    name: str, shape: tuple[int, ...], ba: Any, target: IntegerTarget, order: np.ndarray | None
) -> TensorReport:
    """What carrying an integer weight did: exactly (codes and scales as they are), or the error
    ggml's blocks cost against the weight's own values ``(q - z) * s`` (before any rounding)."""
    how = f"{ba.fmt} as {target.ggml_type}: "
    rows = " (rows in llama.cpp's rotary order)" if order is not None else ""
    if target.inexact is None:
        return TensorReport(name, shape, target.ggml_type, "converted", how + "codes and scales carried exactly" + rows)
    blocks = integer_blocks(ba, target, None)
    values = _decoded_integer_blocks(blocks, target.ggml_type).reshape(ba.shape)
    group = np.minimum(np.arange(ba.shape[-1]) // min(ba.block_size, ba.shape[-1]), ba.scales.shape[-1] - 1)
    zeros = ba.zero_points[:, group] if ba.zero_points is not None else 0
    source = (ba.integer_codes().astype(np.float64) - zeros) * ba.scales.astype(np.float64)[:, group]  # exact
    err = float(np.max(np.abs(values - source))) if source.size else 0.0
    how += f"not exact ({target.inexact}; max abs error {err:.3g})"
    return TensorReport(name, shape, target.ggml_type, "converted", how + rows)


def _decoded_integer_blocks(blocks: np.ndarray, ggml_type: str) -> np.ndarray:
    """The values (float64) ggml decodes from integer blocks (rows, blocks, bytes), as its
    ``dequantize_row_q4_0/q4_1/q8_0`` compute them in float32."""
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    if ggml_type == "Q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.float32)
        return (q * d).astype(np.float64)
    start = 4 if ggml_type == "Q4_1" else 2
    packed = blocks[..., start:]
    nibbles = np.concatenate([packed & 0xF, packed >> 4], axis=-1).astype(np.float32)
    if ggml_type == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
        return (nibbles * d + m).astype(np.float64)
    return ((nibbles - 8) * d).astype(np.float64)


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
