"""GGUF models (llama.cpp's files): quantised to MXFP4 or NVFP4 in ggml's block types, read back.

- :func:`quantize_gguf`: a GGUF file in, a GGUF file out, one tensor at a time in pieces. The
  tensors quantised are those llama.cpp's ``llama-quantize`` quantises (:func:`gguf_decision`,
  its rules by name and shape, ``src/llama-quant.cpp`` ``tensor_allows_quantization``); every
  other tensor, the metadata and the tokenizer are copied as they are, and ``general.file_type``
  is set. NVFP4 has two levels where llama.cpp reads a per-tensor scale
  (:data:`NVFP4_SCALED`: the ``NAME.scale`` F32 tensor beside ``NAME.weight``, one per expert for
  the merged experts), and the codes and block scales are those of
  :func:`neuron_kernels.quantize` with the same options, bit for bit.
- :func:`load_gguf`: a GGUF file's tensors in memory, MXFP4 and NVFP4 as block arrays (with the
  per-tensor scale from ``NAME.scale``), other block types decoded by gguf-py.
- :func:`dequantize_gguf`: a GGUF file with every block tensor written as F32, F16 or BF16.

The contract: ``docs/gguf.md``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..blocks.array import BlockArray
from ..blocks.job import BlockJob
from ..blocks.layout import BlockLayout
from ..blocks.scheme import DEFAULT, block_job
from ..errors import InvalidValueError, NotApplicableError
from ..formats import BLOCK_FORMATS, BlockFormat
from ..io.arrays import FileFormatError
from ..io.file_jobs import quantized_pieces, resolved_job
from ..io.gguf_file import (
    UINT32,
    GgufFile,
    GgufOutput,
    GgufTensor,
    byte_pieces,
    mxfp4_blocks,
    mxfp4_codes,
    nvfp4_blocks,
    nvfp4_codes,
    open_gguf,
)
from ..io.outputs import atomic_output
from .reports import TensorReport, pipelined_stats

__all__ = [
    "GGUF_FORMATS",
    "GgufFormat",
    "NVFP4_SCALED",
    "dequantize_gguf",
    "gguf_decision",
    "load_gguf",
    "quantize_gguf",
]

Progress = Callable[[int], None]


@dataclass(frozen=True)
class GgufFormat:
    """A block format as ggml stores it: its ggml type, the ``general.file_type`` of a file of
    it (llama.cpp's ``LLAMA_FTYPE_MOSTLY_*``), ggml's block (elements), and how codes and
    scales are laid into blocks and back."""

    name: str
    ggml_type: str
    file_type: int
    block: int
    to_blocks: Callable[[np.ndarray, np.ndarray], np.ndarray]
    from_blocks: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    #: ggml reads the scale bytes as unsigned E4M3: bit 7 ignored, 0x7f zero (not NaN).
    unsigned_scales: bool = False

    @property
    def format(self) -> BlockFormat:
        return BLOCK_FORMATS[self.name]


#: The package's block formats that ggml stores, by the package's format name.
GGUF_FORMATS: dict[str, GgufFormat] = {
    "mxfp4_e2m1": GgufFormat("mxfp4_e2m1", "MXFP4", 38, 32, mxfp4_blocks, mxfp4_codes),
    "nvfp4": GgufFormat("nvfp4", "NVFP4", 39, 64, nvfp4_blocks, nvfp4_codes, unsigned_scales=True),
}
_BY_TYPE = {f.ggml_type: f for f in GGUF_FORMATS.values()}

#: Parts of names llama-quantize never quantises (``tensor_allows_quantization``): norms, expert
#: routers, small or positional tensors of particular architectures.
_NEVER = (
    (
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    )
    + tuple(
        f"time_mix_{n}.weight"
        for n in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2", "decay_w1", "decay_w2")
    )
    + ("time_mix_lerp_fused.weight",)
)
_NEVER_NAMES = ("position_embd.weight", "token_types.weight")

#: The weights llama.cpp reads an NVFP4 per-tensor scale for (``NAME.scale``, shape [1], or
#: [n_expert] for merged experts): ``src/llama-model.cpp``, the generic pass after each
#: architecture's tensors. Elsewhere NVFP4 has one level only.
NVFP4_SCALED = re.compile(
    r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|attn_qkv|attn_gate|ffn_gate|ffn_down|ffn_up"
    r"|ffn_gate_shexp|ffn_down_shexp|ffn_up_shexp|ffn_gate_exps|ffn_down_exps|ffn_up_exps"
    r"|ssm_in|ssm_out|ssm_alpha|ssm_beta|nextn\.eh_proj|nextn\.shared_head_head)\.weight"
)
_PLAIN_TYPES = ("F32", "F16", "BF16")
_OUTPUT = "output.weight"
_EMBEDDING = ("token_embd.weight", "per_layer_token_embd.weight")


def gguf_decision(tensor: GgufTensor, tied: bool, two_level: bool) -> str:
    """Why ``tensor`` is kept as it is, or ``""`` if it is quantised: llama-quantize's rules, then
    the package's (the output layer, which llama-quantize gives Q6_K or Q8_0, is kept; so are
    NVFP4 weights llama.cpp reads no per-tensor scale for, with two levels). ``tied``: the file
    has no ``output.weight`` (the token embedding is the output layer too)."""
    name = tensor.name
    if len(tensor.shape) < 2:
        return "one dimension (llama-quantize quantises 2-D and 3-D tensors)"
    if not tensor.size:
        return "no elements"
    if not name.endswith("weight"):
        return "not a weight (llama-quantize quantises NAME.weight only)"
    never = next((p for p in _NEVER if p in name), None) or (name if name in _NEVER_NAMES else None)
    if never is not None:
        return f"llama-quantize keeps {never!r} tensors"
    if tensor.type not in _PLAIN_TYPES:
        return f"stored as {tensor.type} (F32, F16 and BF16 are quantised; requantising is not done)"
    if name == _OUTPUT or (tied and name in _EMBEDDING):
        return "the output layer (llama-quantize gives it Q6_K or Q8_0; kept in its precision)"
    if two_level and not NVFP4_SCALED.fullmatch(name):
        return "llama.cpp reads no per-tensor scale for it (per_tensor_scale=None quantises it with one level)"
    return ""


def _options(fmt: str, options: dict[str, Any]) -> BlockJob:
    """The job of a GGUF format's tensors: ggml's blocks along rows, codes one per byte."""
    if fmt not in GGUF_FORMATS:
        raise NotApplicableError(f"GGUF stores {' and '.join(GGUF_FORMATS)} blocks; got format {fmt!r}")
    options = {k: None if k == "block_size" and v is DEFAULT else v for k, v in options.items()}
    unset = {"block_size": None, "block_shape": None, "axis": -1, "pack": True, "scale_dtype": None, "rht": False}
    own = {"block_size": BLOCK_FORMATS[fmt].block_size}
    chosen = [k for k, v in unset.items() if k in options and options.pop(k) not in (v, own.get(k, v))]
    if chosen:
        raise NotApplicableError(
            f"GGUF's {GGUF_FORMATS[fmt].ggml_type} blocks are ggml's (along each row, codes in ggml's order; "
            f"llama.cpp rotates nothing back): {', '.join(chosen)} cannot be chosen"
        )
    return block_job(fmt, 2, pack=False, formats=tuple(GGUF_FORMATS), what="GGUF block format", **options)


@dataclass
class _Plan:
    tensor: GgufTensor
    report: TensorReport
    out_type: str
    job: BlockJob | None = None
    scales: str | None = None  # the NAME.scale tensor written after it


def quantize_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    fmt: str,
    *,
    force: bool = False,
    chunk_bytes: int = 64 << 20,
    progress: Progress | None = None,
    stats: bool = True,
    **options: Any,
) -> list[TensorReport]:
    """Quantise the GGUF file ``src`` to ``fmt`` (``nvfp4`` or ``mxfp4_e2m1``) into the GGUF file
    ``dst`` (see the module docstring); returns a report per tensor of ``src``. ``options``: those
    of :func:`neuron_kernels.quantize` (``scale_mode``, ``rounding``, ``seed``,
    ``per_tensor_scale``, ``scale_bound``, ``four_over_six``, ``scale_search``); the blocks are
    ggml's. A weight whose rows are not whole blocks (64 elements for NVFP4, 32 for MXFP4) is an
    error, as in llama-quantize, and nothing is written."""
    src, dst = os.fspath(src), os.fspath(dst)
    job = _options(fmt, options)
    spec = GGUF_FORMATS[fmt]
    source = open_gguf(src)
    two_level = job.per_tensor_scale is not None
    tied = _OUTPUT not in source.tensors
    plans: list[_Plan] = []
    for t in source.tensors.values():
        why = gguf_decision(t, tied, two_level)
        report = TensorReport(t.name, t.shape, t.type, "kept" if why else "quantised", why)
        if why:
            plans.append(_Plan(t, report, t.type))
            continue
        if t.shape[-1] % spec.block:
            raise InvalidValueError(
                f"{src}[{t.name}]: rows of {t.shape[-1]} elements are not whole {spec.ggml_type} blocks of "
                f"{spec.block} (llama.cpp stores no partial block); nothing was written"
            )
        scaled = f"{t.name[: -len('weight')]}scale" if two_level else None
        if scaled is not None and scaled in source.tensors:
            raise InvalidValueError(f"{src}: {scaled} exists already; the per-tensor scale would replace it")
        report.dtype = spec.ggml_type
        report.outputs = (t.name,) + ((scaled,) if scaled else ())
        plans.append(_Plan(t, report, spec.ggml_type, job, scaled))
    changes = {"general.file_type": (spec.file_type, UINT32)}
    tick = progress or (lambda n: None)
    with atomic_output(dst, force, (src,)) as tmp, GgufOutput(tmp, source, changes) as out:
        for p in plans:
            out.add(p.tensor.name, p.tensor.shape, p.out_type)
            if p.scales:
                out.add(p.scales, p.tensor.shape[:-2] or (1,), "F32")
        out.begin()
        for p in plans:
            if p.job is None:
                for piece in byte_pieces(p.tensor, chunk_bytes):
                    out.write(piece)
                    tick(piece.nbytes)
                continue
            scales = _write_quantized(out, p, spec, chunk_bytes, tick, stats)
            if p.scales:
                out.write(np.asarray(scales, np.float32))
    return [p.report for p in plans]


def _write_quantized(
    out: GgufOutput, plan: _Plan, spec: GgufFormat, chunk_bytes: int, tick: Progress, stats: bool
) -> list[float]:
    """Write one weight's blocks (each matrix of merged experts with its own per-tensor scale);
    returns the per-tensor scales (one per matrix), its statistics into its report."""
    t, job = plan.tensor, plan.job
    assert job is not None
    entry = t.entry()
    per = t.shape[-2] * t.shape[-1]
    matrices = t.size // per
    scales: list[float] = []

    def pieces() -> Iterator[tuple[np.ndarray, BlockArray]]:
        from ..io.arrays import raw_entry

        # Each matrix as its rows, pieces of whole rows (whole ggml blocks); a row longer than a
        # piece (pieces then cut rows at the package's blocks) as rows of one ggml block.
        width = t.shape[-1] if t.shape[-1] * (entry.dtype.itemsize + 4) <= chunk_bytes else spec.block
        for m in range(matrices):
            offset = t.offset + m * per * entry.dtype.itemsize
            sub = raw_entry(t.path, t.name, (per // width, width), entry.dtype, offset)
            resolved = resolved_job(sub, job, chunk_bytes)
            scales.append(float(resolved.per_tensor_scale or 1.0))
            yield from quantized_pieces(sub, resolved, chunk_bytes, m * per)

    def write(mx: BlockArray) -> None:
        out.write(spec.to_blocks(mx.codes, mx.scales))

    plan.report.stats = pipelined_stats(pieces(), write, tick, stats)
    return scales


# ---- reading ------------------------------------------------------------------------------------------


def _scale_tensor(source: GgufFile, name: str) -> np.ndarray | None:
    """The per-tensor scales (one per matrix) of the weight ``name`` from its ``NAME.scale``: one
    finite value, or one per matrix of merged experts (llama.cpp reads shape [1] or [n_expert])."""
    if not name.endswith(".weight"):
        return None
    scale = source.tensors.get(f"{name[: -len('weight')]}scale")
    if scale is None:
        return None
    weight = source.tensors[name]
    matrices = math.prod(weight.shape[:-2])
    if scale.size not in (1, matrices):
        raise FileFormatError(
            f"{source.path}[{scale.name}]: {scale.size} per-tensor scales for {name}, which holds {matrices} "
            f"matri{'x' if matrices == 1 else 'ces'} (one scale, or one per matrix)"
        )
    values = np.asarray(scale.decoded(), np.float32).reshape(-1)
    if not np.isfinite(values).all():
        raise FileFormatError(f"{source.path}[{scale.name}]: a per-tensor scale of {name} is not finite")
    return values


def _block_arrays(t: GgufTensor, spec: GgufFormat, scales: np.ndarray | None) -> list[BlockArray]:
    """The FP4 tensor ``t`` as block arrays: one, or one per matrix of merged experts when their
    per-tensor scales differ. Codes one per byte; NVFP4's UE4M3 scale bytes as ggml reads them
    (bit 7 ignored, 0x7f zero) in float8_e4m3fn."""
    codes, scale_bytes = spec.from_blocks(t.rows())
    fmt, size = spec.name, spec.format.block_size
    if spec.unsigned_scales:
        scale_bytes = scale_bytes & 0x7F
        scale_bytes[scale_bytes == 0x7F] = 0
    stored = scale_bytes.view(spec.format.scale_format.result_dtype)
    per_matrix = scales if scales is not None and len(scales) else None
    if per_matrix is None or len(per_matrix) == 1 or np.all(per_matrix == per_matrix[0]):
        pts = None if per_matrix is None else float(per_matrix[0])
        layout = BlockLayout(fmt, t.shape, len(t.shape) - 1, size, 1, False)
        return [BlockArray(codes.reshape(t.shape), stored.reshape(layout.scales_shape), layout, per_tensor_scale=pts)]
    shape = t.shape[-2:]
    layout = BlockLayout(fmt, shape, 1, size, 1, False)
    n, k = shape[0] * shape[1], shape[0] * shape[1] // size
    return [
        BlockArray(
            codes[m * n : (m + 1) * n].reshape(shape),
            stored[m * k : (m + 1) * k].reshape(layout.scales_shape),
            layout,
            per_tensor_scale=float(s),
        )
        for m, s in enumerate(per_matrix)
    ]


def load_gguf(path: str | os.PathLike[str], names: Any = None) -> dict[str, Any]:
    """Read a GGUF file into memory: a :class:`BlockArray` for each MXFP4 or NVFP4 tensor (its
    ``NAME.scale`` as the per-tensor scale; merged experts whose scales differ as a list of block
    arrays, one per expert), numpy arrays for F32, F16 and BF16 tensors as stored, float32 for the
    other block types gguf-py decodes. ``NAME.scale`` tensors of FP4 weights are not returned on
    their own. ``names``: only these names."""
    source = open_gguf(path)
    wanted = None if names is None else set(names)
    used = {
        f"{n[: -len('weight')]}scale" for n, t in source.tensors.items() if t.type in _BY_TYPE and n.endswith(".weight")
    }
    out: dict[str, Any] = {}
    for name, t in source.tensors.items():
        if (wanted is not None and name not in wanted) or name in used:
            continue
        if t.type in _BY_TYPE:
            arrays = _block_arrays(t, _BY_TYPE[t.type], _scale_tensor(source, name))
            out[name] = arrays[0] if len(arrays) == 1 else arrays
        elif t.plain:
            out[name] = np.array(t.entry().read())
        else:
            out[name] = t.decoded()
    if wanted is not None and wanted - set(out):
        raise KeyError(f"{source.path}: no tensor named {', '.join(sorted(wanted - set(out)))}")
    return out


_OUT_TYPES = {"float32": ("F32", 0), "float16": ("F16", 1), "bfloat16": ("BF16", 32)}


def dequantize_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    dtype: str = "float32",
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> list[TensorReport]:
    """Write the GGUF file ``src`` to ``dst`` with every block tensor gguf-py decodes (MXFP4 and
    NVFP4 by the package's own decoding, with their ``NAME.scale`` applied and dropped) as
    ``dtype`` (float32, float16 or bfloat16); other tensors and the metadata copied, the file type
    set. One tensor in memory at a time."""
    from ..casting import cast

    src, dst = os.fspath(src), os.fspath(dst)
    if dtype not in _OUT_TYPES:
        raise InvalidValueError(f"a GGUF file is dequantised to {', '.join(_OUT_TYPES)}; got {dtype!r}")
    type_name, file_type = _OUT_TYPES[dtype]
    source = open_gguf(src)
    folded = {
        f"{n[: -len('weight')]}scale" for n, t in source.tensors.items() if t.type in _BY_TYPE and n.endswith(".weight")
    }
    reports: list[TensorReport] = []
    plan: list[tuple[GgufTensor, str]] = []
    for name, t in source.tensors.items():
        if name in folded:
            reports.append(TensorReport(name, t.shape, t.type, "kept", "applied to its weight and dropped"))
            continue
        decodable = t.type in _BY_TYPE or (not t.plain and _decodes(t))
        plan.append((t, type_name if decodable else t.type))
        action = "dequantised" if decodable else "kept"
        reports.append(TensorReport(name, t.shape, t.type, action, "" if decodable else "copied as stored"))
    changes = {"general.file_type": (file_type, UINT32)}
    tick = progress or (lambda n: None)
    with atomic_output(dst, force, (src,)) as tmp, GgufOutput(tmp, source, changes) as out:
        for t, kind in plan:
            out.add(t.name, t.shape, kind)
        out.begin()
        for t, kind in plan:
            if kind == t.type:
                for piece in byte_pieces(t, 64 << 20):
                    out.write(piece)
            else:
                if t.type in _BY_TYPE:
                    arrays = _block_arrays(t, _BY_TYPE[t.type], _scale_tensor(source, t.name))
                    values = np.concatenate([a.dequantize().reshape(-1) for a in arrays])
                else:
                    values = t.decoded().reshape(-1)
                out.write(values if dtype == "float32" else cast(values, dtype))
            tick(t.nbytes)
    return reports


def _decodes(t: GgufTensor) -> bool:
    """Whether gguf-py decodes blocks of ``t``'s type (tried on its first block)."""
    import gguf

    if not t.nbytes:
        return False
    try:
        gguf.quants.dequantize(t.raw(0, t.block[1]).reshape(1, -1), gguf.GGMLQuantizationType[t.type])
    except NotImplementedError:
        return False
    return True
