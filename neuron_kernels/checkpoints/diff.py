"""Two checkpoints of one model compared tensor by tensor (:func:`diff_checkpoints`), in any layouts
the package reads: whether their bytes are equal, whether their values are, the SQNR of the
second against the first and the largest difference, and where values differ, what differs in
how they were quantised (the per-tensor scale, the block scales, the codes)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..blocks.job import per_tensor_scale_of
from ..formats import BLOCK_FORMATS
from ..io.arrays import ArrayEntry
from .architecture import architecture_of
from .experts import split_experts
from .layouts import StoredWeight, open_any, stored_weights
from .selection import fused_groups

__all__ = ["TensorDiff", "CheckpointDiff", "diff_checkpoints", "scale_rule"]

_NVFP4 = BLOCK_FORMATS["nvfp4"]
#: NVFP4's largest block scale and element (448 and 6), whose product the per-tensor scale rules divide by.
_BOUND, _FP4_MAX = _NVFP4.scale_format.max, _NVFP4.max_element


@dataclass(frozen=True)
class TensorDiff:
    """One tensor in both checkpoints: what each holds (dtype or block format), whether the
    stored bytes are equal (None: stored differently, not comparable byte for byte), whether the
    values are (as float32, NaNs equal), the SQNR of B's values against A's (inf when equal),
    the largest absolute difference, and what explains a difference."""

    name: str
    a: str
    b: str
    bytes_equal: bool | None
    values_equal: bool
    sqnr_db: float
    max_abs_diff: float
    why: str = ""


@dataclass
class CheckpointDiff:
    """The tensors of both (:class:`TensorDiff`), and those only one of them holds."""

    tensors: list[TensorDiff]
    only_a: list[str]
    only_b: list[str]

    @property
    def same_values(self) -> bool:
        return not self.only_a and not self.only_b and all(t.values_equal for t in self.tensors)


def _contents(path: str) -> tuple[dict[str, StoredWeight | ArrayEntry], dict[str, Any] | None]:
    """Every tensor of a checkpoint by its plain name (a quantised weight as its stored weight,
    every other tensor as its entry), and its config."""
    ckpt, layout = open_any(path)
    weights = stored_weights(ckpt, layout)
    taken = {p for w in weights for p in w.parts}
    out: dict[str, StoredWeight | ArrayEntry] = {w.out_name: w for w in weights}
    out |= {n: e for n, e in ckpt.tensors.items() if n not in taken}
    return out, ckpt.config


def _experts_as_in(
    side: dict[str, StoredWeight | ArrayEntry], other: dict[str, StoredWeight | ArrayEntry], arch: Any
) -> dict[str, StoredWeight | ArrayEntry]:
    """``side`` with its plain stacked experts split per expert where ``other`` holds them so
    (compressed-tensors' Llama 4, :mod:`.experts`), so that the two compare expert by expert."""
    plain = {n: e for n, e in side.items() if isinstance(e, ArrayEntry)}
    split = split_experts(plain, arch)
    if not any(n in other and n not in side for n in split):
        return side
    return {**{n: e for n, e in side.items() if n in split or not isinstance(e, ArrayEntry)}, **split}


def _shape(t: StoredWeight | ArrayEntry) -> tuple[int, ...]:
    if isinstance(t, StoredWeight):
        s = t.shape
        return s[:-2] + (s[-1], s[-2]) if t.transpose else s
    return t.shape


def _label(t: StoredWeight | ArrayEntry) -> str:
    return t.label if isinstance(t, StoredWeight) else t.dtype.name


def _pieces(t: StoredWeight | ArrayEntry, chunk_bytes: int) -> Iterator[np.ndarray]:
    """The values as float32 in C order (of the plain tensor's orientation), piece by piece."""
    if isinstance(t, StoredWeight):
        for values, _ in t.decoded_pieces("float32", chunk_bytes):
            yield values.reshape(-1)
        return
    step = max(1, chunk_bytes // max(t.dtype.itemsize, 1))
    for start in range(0, t.size, step):
        yield np.asarray(t.read_flat(start, min(start + step, t.size))).astype(np.float32)


def _aligned(a: Iterator[np.ndarray], b: Iterator[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pieces of two streams of the same length cut to equal lengths."""
    ra, rb = np.empty(0, np.float32), np.empty(0, np.float32)
    while True:
        if not ra.size:
            ra = next(a, None)  # type: ignore[arg-type]
        if not rb.size:
            rb = next(b, None)  # type: ignore[arg-type]
        if ra is None or rb is None:
            return
        n = min(ra.size, rb.size)
        yield ra[:n], rb[:n]
        ra, rb = ra[n:], rb[n:]


def _bytes_equal(x: StoredWeight | ArrayEntry, y: StoredWeight | ArrayEntry, chunk_bytes: int) -> bool | None:
    """Whether both store the same bytes the same way (None: stored differently)."""
    if isinstance(x, StoredWeight) and isinstance(y, StoredWeight):
        if (x.layout, x.transpose) != (y.layout, y.transpose):
            return None
        same_pts = x.per_tensor_scale == y.per_tensor_scale
        # integer weights: their zero points and act-order index too (each both or neither)
        extra = [(getattr(x, f, None), getattr(y, f, None)) for f in ("zeros", "g_idx")]
        if any((a is None) != (b is None) for a, b in extra):
            return None
        return (
            same_pts
            and _entries_equal(x.codes, y.codes, chunk_bytes)
            and _entries_equal(x.scales, y.scales, chunk_bytes)
            and all(a is None or _entries_equal(a, b, chunk_bytes) for a, b in extra)
        )
    if isinstance(x, ArrayEntry) and isinstance(y, ArrayEntry):
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            return None
        return _entries_equal(x, y, chunk_bytes)
    return None


def _entries_equal(x: ArrayEntry, y: ArrayEntry, chunk_bytes: int) -> bool:
    if (x.dtype.itemsize, x.size) != (y.dtype.itemsize, y.size):
        return False
    step = max(1, chunk_bytes // max(x.dtype.itemsize, 1))
    for start in range(0, x.size, step):
        stop = min(start + step, x.size)
        if np.asarray(x.read_flat(start, stop)).tobytes() != np.asarray(y.read_flat(start, stop)).tobytes():
            return False
    return True


def _why(x: StoredWeight | ArrayEntry, y: StoredWeight | ArrayEntry, chunk_bytes: int) -> str:
    """What differs in how the two were quantised, where both are quantised in one block layout."""
    if not (isinstance(x, StoredWeight) and isinstance(y, StoredWeight)):
        return "" if isinstance(x, ArrayEntry) and isinstance(y, ArrayEntry) else "one is quantised, the other not"
    if x.layout.fmt != y.layout.fmt:
        return f"different formats ({x.label} and {y.label})"
    if (x.layout, x.transpose) != (y.layout, y.transpose):
        return "different block layouts"
    parts = []
    if x.per_tensor_scale != y.per_tensor_scale:
        parts.append(f"per-tensor scales differ ({x.per_tensor_scale:.6g} and {y.per_tensor_scale:.6g}): another rule")
    sx, sy = np.asarray(x.scales.read_flat(0, x.scales.size)), np.asarray(y.scales.read_flat(0, y.scales.size))
    blocks = int((sx.view(np.uint8).reshape(sx.size, -1) != sy.view(np.uint8).reshape(sy.size, -1)).any(axis=1).sum())
    if blocks:
        parts.append(f"block scales differ in {blocks} of {sx.size} blocks")
    codes = 0
    step = max(1, chunk_bytes)
    for start in range(0, x.codes.size, step):
        stop = min(start + step, x.codes.size)
        codes += int((np.asarray(x.codes.read_flat(start, stop)) != np.asarray(y.codes.read_flat(start, stop))).sum())
    if codes:
        parts.append(f"codes differ in {codes} of {x.codes.size} bytes")
    return "; ".join(parts)


def _compare(name: str, x: Any, y: Any, chunk_bytes: int) -> TensorDiff:
    if _shape(x) != _shape(y):
        return TensorDiff(name, _label(x), _label(y), None, False, -math.inf, math.inf,
                          f"shapes differ ({_shape(x)} and {_shape(y)})")  # fmt: skip
    signal = noise = 0.0
    biggest = 0.0
    equal = True
    for u, v in _aligned(_pieces(x, chunk_bytes), _pieces(y, chunk_bytes)):
        same = (u == v) | (np.isnan(u) & np.isnan(v))
        if same.all():
            signal += float(np.square(u[np.isfinite(u)], dtype=np.float64).sum())
            continue
        equal = False
        finite = np.isfinite(u) & np.isfinite(v)
        d = u[finite].astype(np.float64) - v[finite]
        signal += float(np.square(u[finite], dtype=np.float64).sum())
        noise += float(np.square(d).sum()) + (math.inf if not (same | finite).all() else 0.0)
        biggest = max(biggest, float(np.abs(d).max(initial=0.0)))
    if equal:
        sqnr = math.inf
    elif noise == 0:
        sqnr = math.inf if signal else -math.inf
    else:
        sqnr = 10 * math.log10(signal / noise) if signal > 0 and math.isfinite(noise) else -math.inf
    why = "" if equal else _why(x, y, chunk_bytes)
    stored = _bytes_equal(x, y, chunk_bytes)
    if equal and stored is not True:
        why = "the same values, stored differently" if stored is None else "the same values in other bytes"
    return TensorDiff(name, _label(x), _label(y), stored, equal, sqnr, biggest, why)


def diff_checkpoints(
    a: str | os.PathLike[str], b: str | os.PathLike[str], chunk_bytes: int = 64 << 20
) -> CheckpointDiff:
    """Compare the checkpoints ``a`` and ``b`` (folders or files in any layout the package reads,
    or plain) tensor by tensor, reading pieces of ``chunk_bytes``: see :class:`TensorDiff`. Where
    ``a`` is plain and ``b`` holds NVFP4 weights, each one's per-tensor scale is matched against
    the producers' rules (:func:`scale_rule`), from ``a``'s amax of the weight or of its fused layer."""
    (x, cx), (y, cy) = _contents(os.fspath(a)), _contents(os.fspath(b))
    arch = architecture_of(cy or cx, list(y) or list(x))
    x, y = _experts_as_in(x, y, arch), _experts_as_in(y, x, arch)
    common = [n for n in x if n in y]
    tensors = [_compare(n, x[n], y[n], chunk_bytes) for n in common]
    amaxes: dict[str, float] = {}
    for k, t in enumerate(tensors):
        xa, yb = x[t.name], y[t.name]
        if isinstance(xa, ArrayEntry) and isinstance(yb, StoredWeight) and yb.per_tensor_scale is not None:
            group = fused_groups([n for n in common if isinstance(y[n], StoredWeight)], arch).get(t.name, (t.name,))
            for n in group:
                if n not in amaxes:
                    amaxes[n] = _amax(x[n], chunk_bytes) if isinstance(x[n], ArrayEntry) else math.nan
            rule = scale_rule(yb.per_tensor_scale, amaxes[t.name], max(amaxes[n] for n in group), len(group) > 1)
            tensors[k] = dataclasses.replace(t, why="; ".join(w for w in (t.why, rule) if w))
    return CheckpointDiff(tensors, [n for n in x if n not in y], [n for n in y if n not in x])


def _amax(entry: ArrayEntry, chunk_bytes: int) -> float:
    amax = 0.0
    for piece in _pieces(entry, chunk_bytes):
        finite = piece[np.isfinite(piece)]
        if finite.size:
            amax = max(amax, float(np.abs(finite).max()))
    return amax


def _rules(amax: float) -> dict[str, float]:
    """The producers' NVFP4 per-tensor scale rules (docs/checkpoints.md "Producers' recipes"):
    what each calls it -> the per-tensor scale (the decode multiplier) it gives for ``amax``."""
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    ours = per_tensor_scale_of(amax, _BOUND, _FP4_MAX)
    # llm-compressor 0.14 (compressed-tensors 0.19) on the CPU, in the weight's dtype: 448 x (6 / amax),
    # each step rounded to bfloat16 (what its NVFP4A16 checkpoints hold: tests/fixtures/llmcompressor)
    gs = np.float32(bf16(bf16(_BOUND) * bf16(bf16(_FP4_MAX) / bf16(amax))))
    return {
        "amax / (6 x 448) in float32 (this package, torchao, ModelOpt's weight_scale_2)": ours,
        "448 x (6 / amax) in bfloat16 (llm-compressor's global scale)": float(np.float32(1) / gs) if gs else math.nan,
    }


def scale_rule(pts: float, own: float, fused: float, grouped: bool) -> str:
    """Which producer's rule gives the per-tensor scale ``pts`` (or its float32 reciprocal, as
    compressed-tensors stores it), from the tensor's own amax or its fused layer's; "" if none."""
    reciprocal = float(np.float32(1) / np.float32(pts))
    for where, amax in (("its fused layer's", fused), ("its own", own)) if grouped else (("its", own),):
        if not math.isfinite(amax) or amax <= 0:
            continue
        for rule, value in _rules(amax).items():
            if pts == value or reciprocal == float(np.float32(1) / np.float32(value)):
                return f"per-tensor scale: {rule}, from {where} amax"
    return "per-tensor scale: none of the known rules from the plain weights' amax"
