"""Stacked expert parameters as each layout's runtime loads them: split into per-expert Linear
weights, or stacked back.

transformers replaces some models' stacked experts (Llama 4's ``Llama4TextExperts``:
``gate_up_proj`` [E, H, 2I], ``down_proj`` [E, I, H]) by per-expert Linear modules when it loads a
compressed-tensors checkpoint, and vLLM reads such a checkpoint's experts per expert too
(:data:`~.runtime_modules.EXPERT_SPLITS`); a plain checkpoint, and the other layouts' runtimes,
hold them stacked. :func:`split_experts` gives the per-expert weights of a plain checkpoint's
stacked parameters and :func:`stack_experts` the stacked parameters of per-expert weights, both
as :class:`~neuron_kernels.io.arrays.ArrayEntry` read piece by piece, one expert in memory at a
time, so that every conversion streams as it does for any tensor.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..blocks.layout import BlockLayout
from ..io.arrays import ArrayEntry, FileFormatError
from .architecture import Architecture
from .fp8_range import OCP_E4M3
from .layouts.records import StoredWeight
from .runtime_modules import ExpertSplit

__all__ = ["split_experts", "stack_experts", "stacked_fp8_experts"]

#: The columns of a stacked parameter's [in, out] slice each part takes.
_PARTS: dict[str, Callable[[int], slice]] = {
    "whole": lambda n: slice(0, n),
    "first half": lambda n: slice(0, n // 2),
    "second half": lambda n: slice(n // 2, n),
}


class _OneExpert:
    """Parts of the [in, out] slices of a stacked [E, in, out] entry, transposed to [out, in]: the
    last slice read and the last part made are kept (an expert's parts are read one after the
    other, each piece by piece)."""

    def __init__(self, entry: ArrayEntry) -> None:
        self.entry = entry
        self.slice: tuple[int, np.ndarray] | None = None
        self.part: tuple[tuple[int, int, int], np.ndarray] | None = None

    def __call__(self, e: int, columns: slice) -> np.ndarray:
        key = (e, columns.start, columns.stop)
        if self.part is None or self.part[0] != key:
            if self.slice is None or self.slice[0] != e:
                _, rows, cols = self.entry.shape
                flat = np.asarray(self.entry.read_flat(e * rows * cols, (e + 1) * rows * cols))
                self.slice = (e, flat.reshape(rows, cols))
            self.part = (key, np.ascontiguousarray(self.slice[1][:, columns].T).reshape(-1))
        return self.part[1]


def split_experts(inputs: dict[str, ArrayEntry], arch: Architecture | None) -> dict[str, ArrayEntry]:
    """``inputs`` (tensor name -> entry, in order) with each stacked expert parameter that
    ``arch`` splits (:meth:`~.architecture.Architecture.split`) replaced, in place, by its
    per-expert Linear weights ``MODULE.E.LINEAR.weight`` ([out, in]), expert by expert."""
    if arch is None or not arch.splits:
        return inputs
    out: dict[str, ArrayEntry] = {}
    for name, entry in inputs.items():
        module, _, param = name.rpartition(".")
        split = arch.split(module)
        parts = dict(split.parameters).get(param) if split is not None else None
        if parts is None:
            out[name] = entry
            continue
        if len(entry.shape) != 3:
            raise FileFormatError(f"{entry.where}: stacked experts must be [experts, in, out], found {entry.shape}")
        experts, rows, cols = entry.shape
        one = _OneExpert(entry)
        for e in range(experts):
            for linear, part in parts:
                columns = _PARTS[part](cols)
                key = f"{module}.{e}.{linear}.weight"

                def read(
                    start: int, stop: int, e: int = e, columns: slice = columns, one: _OneExpert = one
                ) -> np.ndarray:
                    return one(e, columns)[start:stop]

                out[key] = ArrayEntry(entry.path, key, (columns.stop - columns.start, rows), entry.dtype, read)
    return out


_PER_EXPERT = re.compile(r"^(?P<module>.+)\.(?P<e>\d+)\.(?P<linear>[^.]+)\.weight$")


def stack_experts(inputs: dict[str, ArrayEntry], arch: Architecture | None, dtype: Any = None) -> dict[str, ArrayEntry]:
    """``inputs`` with the per-expert Linear weights of each module ``arch`` splits stacked back
    into the model's parameters (``MODULE.gate_up_proj`` [E, H, 2I], ``MODULE.down_proj``
    [E, I, H]), at the place of the module's first weight; ``dtype``: the stacked entries' dtype
    (the weights' where None: they must then agree). A set of experts that is not whole (an expert
    or a part missing, shapes that differ) is refused."""
    if arch is None or not arch.splits:
        return inputs
    found: dict[str, dict[tuple[int, str], ArrayEntry]] = {}
    for name, entry in inputs.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            continue
        split = arch.split(m["module"])
        if split is not None and m["linear"] in split.linears():
            found.setdefault(m["module"], {})[int(m["e"]), m["linear"]] = entry
    if not found:
        return inputs
    stacked = {module: _stacked(module, arch.split(module), parts, dtype) for module, parts in found.items()}
    out: dict[str, ArrayEntry] = {}
    for name, entry in inputs.items():
        m = _PER_EXPERT.match(name)
        if m is None or m["module"] not in stacked or (int(m["e"]), m["linear"]) not in found[m["module"]]:
            out[name] = entry
        else:
            out.update(stacked[m["module"]])
    return out


def _stacked(
    module: str, split: ExpertSplit | None, parts: dict[tuple[int, str], ArrayEntry], dtype: Any
) -> dict[str, ArrayEntry]:
    assert split is not None
    experts = 1 + max(e for e, _ in parts)
    for e in range(experts):
        for linear in split.linears():
            if (e, linear) not in parts:
                raise FileFormatError(
                    f"{module}.{e}.{linear}.weight is missing: the per-expert weights of {module} cannot be "
                    f"stacked back into the model's parameters ({experts} experts of {', '.join(split.linears())})"
                )
    out: dict[str, ArrayEntry] = {}
    for param, members in split.parameters:
        first = parts[0, members[0][0]]
        dtypes = {parts[e, linear].dtype for e in range(experts) for linear, _ in members}
        out_dtype = np.dtype(dtype) if dtype is not None else _common(module, dtypes)
        rows = first.shape[1]  # a Linear's in: the stacked slice's rows
        widths = [parts[0, linear].shape[0] for linear, _ in members]
        for e in range(experts):
            for (linear, _), width in zip(members, widths):
                if parts[e, linear].shape != (width, rows):
                    raise FileFormatError(
                        f"{parts[e, linear].where}: {parts[e, linear].shape}, where expert 0's is {(width, rows)}: "
                        f"the experts of {module} cannot be stacked"
                    )
        cols = sum(widths)
        name = f"{module}.{param}"

        def matrix(e: int, members: Any = members, out_dtype: np.dtype = out_dtype) -> np.ndarray:
            slab = [np.asarray(parts[e, linear].read()).astype(out_dtype).T for linear, _ in members]
            return np.concatenate(slab, axis=1) if len(slab) > 1 else slab[0]

        out[name] = ArrayEntry(first.path, name, (experts, rows, cols), out_dtype, _slab_reader(matrix, rows * cols))
    return out


def stacked_fp8_experts(stored: dict[str, Any], arch: Architecture | None) -> dict[str, Any]:
    """The stacked parameters (``MODULE.gate_up_proj`` [E, H, 2I], ``MODULE.down_proj`` [E, I, H]) of
    per-expert FP8 weights stored per channel (``stored``: the checkpoint's stored weights by
    name, as :class:`~.layouts.records.StoredWeight`), as stored weights of their codes moved
    without decoding: each expert's codes transposed and its row scales laid along the columns
    ([E, 1, out]), so that the stacked weight's values are the experts' exactly. Modules whose
    experts are not all such weights are left out (they stack dequantised)."""
    if arch is None or not arch.splits:
        return {}
    found: dict[str, dict[str, Any]] = {}
    for name, w in stored.items():
        m = _PER_EXPERT.match(name)
        split = arch.split(m["module"]) if m is not None else None
        if m is not None and split is not None and m["linear"] in split.linears():
            found.setdefault(m["module"], {})[name] = w
    out: dict[str, Any] = {}
    for weights in found.values():
        if not all(_per_channel_fp8(w) for w in weights.values()):
            continue
        codes = stack_experts({n: dataclasses.replace(w.codes, shape=w.shape) for n, w in weights.items()}, arch)
        rows = {n: dataclasses.replace(w.scales, shape=(w.shape[0], 1)) for n, w in weights.items()}
        scales = stack_experts(rows, arch)
        parts = tuple(p for w in weights.values() for p in w.parts)
        for param, entry in codes.items():
            if param in weights or param not in scales:
                continue
            layout = BlockLayout("fp8_channel", entry.shape, 1, entry.shape[1], 1, False)
            out[param] = StoredWeight(
                param, layout, None, entry, scales[param], parts, param, False, "fp8 experts per channel, stacked"
            )
    return out


def _per_channel_fp8(w: Any) -> bool:
    """A 2-D float8_e4m3fn weight stored with one float scale per output row."""
    lay = getattr(w, "layout", None)
    return (
        lay is not None
        and lay.format.element_format is OCP_E4M3
        and lay.format.float_scales
        and len(lay.shape) == 2
        and lay.axis == 1
        and lay.block_rows == 1
        and lay.block_size >= lay.shape[1]
        and not w.transpose
        and w.per_tensor_scale is None
        and w.scales.size == lay.shape[0]
    )


def _common(module: str, dtypes: set[np.dtype]) -> np.dtype:
    """The one dtype of the experts' weights, or float32 where they mix 16- and 32-bit floats (some
    dequantised, some stored plain), which holds each exactly."""
    if len(dtypes) == 1:
        return next(iter(dtypes))
    if all(d.name in ("float32", "float16", "bfloat16") for d in dtypes):
        return np.dtype(np.float32)
    raise FileFormatError(f"{module}: its experts' weights are of {sorted(map(str, dtypes))}; they cannot be stacked")


def _slab_reader(matrix: Callable[[int], np.ndarray], per: int) -> Callable[[int, int], np.ndarray]:
    """A reader of a stacked [E, in, out] array whose expert e is ``matrix(e)`` ([in, out] each),
    the last expert built kept."""
    last: list[tuple[int, np.ndarray]] = []

    def slab(e: int) -> np.ndarray:
        if not last or last[0][0] != e:
            last[:] = [(e, np.ascontiguousarray(matrix(e)).reshape(-1))]
        return last[0][1]

    def read(start: int, stop: int) -> np.ndarray:
        pieces = []
        while start < stop:
            e, offset = divmod(start, per)
            take = min(stop - start, per - offset)
            pieces.append(slab(e)[offset : offset + take])
            start += take
        return np.concatenate(pieces) if len(pieces) != 1 else pieces[0]

    return read
