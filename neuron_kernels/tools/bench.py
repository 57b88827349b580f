"""Throughput measurement shared by ``neuron-kernels bench``.

GB/s = (bytes read + bytes written) / time, median of ``repeat`` runs after one warm-up.
Every figure of one report is measured in the same process, back to back, so that ratios are
meaningful on a noisy machine even when absolute GB/s drift.

Casts (:func:`bench_casts`, one :class:`BenchRow` per (source, target) pair):

- ``copy``: ``np.copyto`` float32 -> float32 into a preallocated array (the bandwidth baseline);
- ``ours (out=)``: ``cast(x, dtype, out=preallocated)``, compared with the copy baseline;
- ``ours``: ``cast(x, dtype)`` allocating its result, compared with the peer, which allocates too;
- the peer: ml_dtypes ``astype`` (where ml_dtypes has the target), else numpy code (tfloat32
  rounding, packing of ml_dtypes codes).

A few pairs are measured again under ``rounding="stochastic"`` (:data:`STOCHASTIC_PAIRS`); no peer
rounds stochastically, so their peer is ml_dtypes' round-to-nearest ``astype`` ("ml_dtypes RNE").

Block formats (:func:`bench_blocks`, one :class:`BlockBenchRow` per case of :data:`BLOCK_CASES`: every
MX format with the floor scale, NVFP4 with its per-tensor scale from the amax (an extra pass) or
given, NVFP4's policies and rotation, FP8 with float scales (128 x 128 tiles, per row, per
matrix), and a few formats from bfloat16 input; blocks along the last axis; bytes are those of
the input dtype):

- ``copy``: as above, measured again for every case; ``fresh``: ``x.copy()`` (a new array, whose
  pages the operating system zeroes on first touch), the ceiling of an allocating call;
- quantise: ``quantize`` allocating its result, compared with the fresh ceiling and with the
  peer, :func:`numpy_reference_quantize` / :func:`numpy_reference_nvfp4` /
  :func:`numpy_reference_fp8` (numpy + ml_dtypes), which allocates too; both move ``x.nbytes +
  q.nbytes``; and with torchao's ``to_mx`` / ``nvfp4_quantize`` on the CPU when torch and torchao
  are installed (for FP8, torch's own division and float8 cast, as compressed-tensors quantises on
  a CPU);
- dequantise: into a reused ``out=`` array (``x.nbytes + q.nbytes``);
- fake-quantise: into a reused ``out=`` array (``2 * x.nbytes``);
- SQNR: :func:`~neuron_kernels.quantization_error` of the built-in data with its NaN and
  infinities (in its first block) set to zero: a block holding one dequantises to NaN throughout,
  which for one scale per tensor would be every element;
- binding: which binding of the kernels quantised: ``specialised`` (every loop with the source,
  format, block length and rounding compiled in), or ``generic`` and the loop that is not.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..api import cast, fake_quantize, quantization_error, quantize
from ..blocks.job import input_array
from ..blocks.nibbles import pack
from ..blocks.scheme import block_job
from ..dtypes import get_format
from ..errors import InvalidValueError
from ..formats import BLOCK_FORMATS, FORMATS, MX_FORMATS

__all__ = [
    "BenchRow",
    "BLOCK_CASES",
    "BlockBenchRow",
    "measure",
    "synthetic_input",
    "default_pairs",
    "bench_casts",
    "format_table",
    "numpy_reference_quantize",
    "numpy_reference_nvfp4",
    "numpy_reference_fp8",
    "numpy_reference_int",
    "benched_formats",
    "peer_of",
    "torchao_peer",
    "bench_blocks",
    "format_block_table",
]


#: The peer of a pair that has none (see :func:`peer_of`).
NO_PEER = "-"


@dataclass
class BenchRow:
    source: str
    target: str
    elements: int
    ours_gbs: float
    ours_out_gbs: float
    copy_gbs: float
    peer: str
    peer_gbs: float
    rounding: str = "nearest_even"

    @property
    def label(self) -> str:
        mode = "" if self.rounding == "nearest_even" else f" ({self.rounding})"
        return f"{self.source} -> {self.target}{mode}"

    @property
    def vs_copy(self) -> float:
        return self.ours_out_gbs / self.copy_gbs

    @property
    def vs_peer(self) -> float:
        return self.ours_gbs / self.peer_gbs

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "vs_copy": self.vs_copy, "vs_peer": self.vs_peer}


def measure(fn: Callable[[], Any], nbytes: int, repeat: int) -> float:
    """Median GB/s of ``fn`` moving ``nbytes`` per call, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def synthetic_input(n: int, dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    """Built-in data: normal values times powers of two across 40 binades, a few specials."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    x *= np.exp2(rng.integers(-20, 20, n, dtype=np.int8).astype(np.float32))
    if n >= 4:
        x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return x if dtype is np.float32 else cast(x, dtype)


def _numpy_tfloat32(values: np.ndarray) -> np.ndarray:
    """float32 rounded to 10 mantissa bits, ties to even, in numpy (the peer for tfloat32)."""
    u = values.astype(np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        r = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    nan = (u & np.uint32(0x80000000)) | np.uint32(0x7FC00000)
    return np.where((u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000), nan, r).view(np.float32)


def peer_of(source: str, target: str, rounding: str = "nearest_even") -> tuple[str, Callable[[np.ndarray], Any] | None]:
    """The peer of a pair: ml_dtypes ``astype``, or numpy code where ml_dtypes lacks the target.

    Packed targets: ml_dtypes ``astype`` to the element, then numpy packing of the codes. Other
    rounding modes: the same peer, which rounds to nearest (none rounds otherwise). ``("-", None)``
    where the installed ml_dtypes has no dtype for the source or the target (float8_e5m3fnu before
    ml_dtypes 0.7): there is nothing to compare with.
    """
    s, t = get_format(source), get_format(target)
    element = get_format(t.element) if t.element is not None else None
    if s.numpy_name is None or (
        t.numpy_name is None
        and not (t.float32_values or t.float32_items)
        and (element is None or element.numpy_name is None)
    ):
        return NO_PEER, None
    if t.numpy_name is not None:

        def astype(a: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                return a.astype(t.result_dtype)

        return ("ml_dtypes" if rounding == "nearest_even" else "ml_dtypes RNE"), astype
    if t.float32_values:
        return "numpy", lambda a: a.astype(np.float32)
    if t.float32_items:  # tfloat32: float32 arrays of values with 10 mantissa bits
        return "numpy", _numpy_tfloat32
    element_dtype = element.result_dtype  # type: ignore[union-attr]
    lane_bits = 8 * t.itemsize // t.lanes

    def pack(a: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            codes = a.astype(element_dtype)
        codes = codes.view(np.uint8).reshape(-1, 4).astype(t.result_dtype)
        mask = t.result_dtype.type((1 << lane_bits) - 1)
        out = codes[:, 0] & mask
        for lane in range(1, 4):
            out |= (codes[:, lane] & mask) << t.result_dtype.type(lane * lane_bits)
        return out

    return "ml_dtypes+numpy", pack


def default_pairs() -> list[tuple[str, str]]:
    """The pairs users ask about: float32 to every format and back, and a few other sources."""
    small = [f.name for f in FORMATS.values() if f.kind == "float" and f.name not in ("float32", "float64")]
    packed = [f.name for f in FORMATS.values() if f.kind == "packed"]
    encode = [("float32", t) for t in small + packed]
    decode = [(s, "float32") for s in small if not FORMATS[s].float32_items]
    others = [
        ("float64", "bfloat16"),
        ("float64", "float8_e4m3fn"),
        ("bfloat16", "float8_e4m3fn"),
        ("float16", "float8_e4m3fn"),
        ("float8_e5m2", "float8_e4m3fn"),
    ]
    return encode + decode + others


#: Pairs measured again under ``rounding="stochastic"`` (seed 0).
STOCHASTIC_PAIRS: list[tuple[str, str]] = [
    ("float32", "bfloat16"),
    ("float32", "float8_e4m3fn"),
    ("float32", "float4_e2m1fn"),
    ("float64", "bfloat16"),
]


def default_cases() -> list[tuple[str, str, str]]:
    """(source, target, rounding) of every row of ``neuron-kernels bench``."""
    return [(s, t, "nearest_even") for s, t in default_pairs()] + [(s, t, "stochastic") for s, t in STOCHASTIC_PAIRS]


def bench_casts(
    n: int,
    repeat: int = 5,
    pairs: list[tuple[str, str]] | None = None,
    progress: Callable[[str], None] | None = None,
    stochastic: list[tuple[str, str]] | None = None,
) -> list[BenchRow]:
    """Measure ``pairs`` and, under stochastic rounding, ``stochastic`` on ``n`` built-in elements
    (default: :func:`default_cases`; with ``pairs`` given, ``stochastic`` defaults to none)."""
    if pairs is None:
        pairs, stochastic = default_pairs(), STOCHASTIC_PAIRS if stochastic is None else stochastic
    cases = [(s, t, "nearest_even") for s, t in pairs] + [(s, t, "stochastic") for s, t in stochastic or []]
    base = synthetic_input(n)
    copy_dst = np.empty_like(base)
    rows = []
    sources: dict[str, np.ndarray] = {"float32": base}
    for source, target, rounding in cases:
        if progress:
            progress(f"{source} -> {target}")
        if source not in sources:
            sources[source] = cast(base, source)
        x = sources[source]
        options: dict[str, Any] = {"rounding": rounding, "seed": 0} if rounding == "stochastic" else {}
        out = cast(x, target, **options)
        moved = x.nbytes + out.nbytes
        copy_gbs = measure(lambda: np.copyto(copy_dst, base), 2 * base.nbytes, repeat)
        ours_out = measure(lambda: cast(x, target, out=out, **options), moved, repeat)
        ours = measure(lambda: cast(x, target, **options), moved, repeat)
        peer_name, peer = peer_of(source, target, rounding)
        peer_gbs = math.nan if peer is None else measure(lambda: peer(x), moved, max(1, min(repeat, 3)))
        rows.append(BenchRow(source, target, n, ours, ours_out, copy_gbs, peer_name, peer_gbs, rounding))
    return rows


def format_table(rows: list[BenchRow]) -> str:
    width = max([28] + [len(r.label) + 2 for r in rows])
    head = (
        f"{'cast':<{width}}{'GB/s':>8}{'out= GB/s':>11}{'copy GB/s':>11}{'vs copy':>9}"
        f"{'peer':>15}{'peer GB/s':>11}{'vs peer':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.label:<{width}}{r.ours_gbs:>8.1f}{r.ours_out_gbs:>11.1f}"
            f"{r.copy_gbs:>11.1f}{r.vs_copy:>8.2f}x{r.peer:>15}"
            + (f"{r.peer_gbs:>11.2f}{r.vs_peer:>8.1f}x" if r.peer != NO_PEER else f"{'-':>11}{'-':>9}")
        )
    if any(r.peer == NO_PEER for r in rows):
        lines.append(f"-: no peer; the installed ml_dtypes {ml_dtypes.__version__} has no dtype for the format")
    return "\n".join(lines)


@dataclass
class BlockBenchRow:
    """GB/s of one block-format case (see the module docstring) and the SQNR of its quantisation.
    ``torchao_gbs``: torchao's quantiser on the CPU, when torch and torchao are installed and
    have the format (else None)."""

    label: str
    fmt: str
    elements: int
    quantize_gbs: float
    dequantize_gbs: float
    fake_gbs: float
    copy_gbs: float
    peer_gbs: float
    sqnr_db: float
    torchao_gbs: float | None = None
    fresh_gbs: float = float("nan")
    #: The kernels' binding that quantised (``specialised``, or ``generic`` and why; see
    #: :func:`neuron_kernels.kernels.block_kernels.binding`).
    binding: str = ""

    @property
    def vs_copy(self) -> float:
        return self.quantize_gbs / self.copy_gbs

    @property
    def vs_fresh(self) -> float:
        """Allocating ``quantize`` against its ceiling, ``x.copy()``."""
        return self.quantize_gbs / self.fresh_gbs

    @property
    def dequantize_vs_copy(self) -> float:
        return self.dequantize_gbs / self.copy_gbs

    @property
    def fake_vs_copy(self) -> float:
        return self.fake_gbs / self.copy_gbs

    @property
    def vs_peer(self) -> float:
        return self.quantize_gbs / self.peer_gbs

    @property
    def vs_torchao(self) -> float | None:
        return None if self.torchao_gbs is None else self.quantize_gbs / self.torchao_gbs

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "vs_copy": self.vs_copy,
            "vs_fresh": self.vs_fresh,
            "dequantize_vs_copy": self.dequantize_vs_copy,
            "fake_vs_copy": self.fake_vs_copy,
            "vs_peer": self.vs_peer,
            "vs_torchao": self.vs_torchao,
        }


#: A per-tensor scale given by the caller, in :data:`BLOCK_CASES`: the one the amax gives, computed
#: before the timing (static calibration).
GIVEN = "given"

#: The block-format rows of ``neuron-kernels bench``: (label, format, options of ``quantize``).
#: The input dtype of a case of :data:`BLOCK_CASES`, when it is not float32 (the built-in data cast).
SOURCE = "source"

#: The block-format rows of ``neuron-kernels bench``: (label, format, options of ``quantize``).
BLOCK_CASES: list[tuple[str, str, dict[str, Any]]] = [
    *((name, name, {}) for name in MX_FORMATS),
    ("nvfp4", "nvfp4", {}),
    ("nvfp4 pts given", "nvfp4", {"per_tensor_scale": GIVEN}),
    ("nvfp4 4/6", "nvfp4", {"four_over_six": "mse"}),
    ("nvfp4 mse", "nvfp4", {"scale_search": "mse"}),
    ("nvfp4 rht", "nvfp4", {"rht": True}),
    ("mxfp8_e4m3 bf16", "mxfp8_e4m3", {SOURCE: "bfloat16"}),
    ("mxfp4_e2m1 bf16", "mxfp4_e2m1", {SOURCE: "bfloat16"}),
    ("nvfp4 bf16", "nvfp4", {SOURCE: "bfloat16"}),
    *((name, name, {}) for name, f in BLOCK_FORMATS.items() if f.float_scales and not f.integer),
    ("fp8_block bf16", "fp8_block", {SOURCE: "bfloat16", "scale_dtype": "bfloat16"}),
    # integers (docs/integers.md): each kind (groups, channels; with zero points or not) once, from
    # bfloat16 too; the widths share one kernel (the width is an argument)
    *((name, name, {}) for name in ("int4_group", "int4_group_asym", "int8_channel", "int8_channel_asym")),
    ("int4_group bf16", "int4_group", {SOURCE: "bfloat16", "scale_dtype": "bfloat16"}),
    ("int8_group bf16", "int8_group", {SOURCE: "bfloat16", "scale_dtype": "bfloat16"}),
]


def benched_formats() -> set[str]:
    """The block formats :data:`BLOCK_CASES` measures: every one, the integer ones one width per
    kind (per group or channel, with zero points or not: the widths share a kernel)."""
    return {fmt for _, fmt, _ in BLOCK_CASES}


def numpy_reference_quantize(x: np.ndarray, fmt: str, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX quantisation (floor scale, blocks along the last axis) in plain numpy + ml_dtypes.

    Returns ``(codes, scale_bytes)``: codes of x's shape in the element's ml_dtypes dtype (int8
    for mxint8), uint8 biased exponents of shape ``x.shape[:-1] + (blocks,)``. A partial last
    block is padded with zeros. On finite data equal to ``quantize_mx(x, fmt, pack=False)``,
    except blocks holding a NaN or an infinity (quantize_mx: scale byte 0xff) and all-zero blocks
    (quantize_mx: 0x00). Non-finite inputs raise numpy warnings: call under ``np.errstate``.
    """
    mxf = MX_FORMATS[fmt]
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise InvalidValueError("cannot quantise a 0-d array: MX blocks run along an axis")
    blocks, length = _blocks_of(x, block)
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    _, e = np.frexp(amax)
    shared = np.clip(e - 1 - mxf.emax_elem, -127, 127)
    scaled = blocks * np.exp2(-shared.astype(np.float32))
    lim = np.float32(mxf.max_element)
    scaled = np.clip(scaled, -lim, lim)
    element = mxf.element_format
    if element.kind == "fixed":  # two's complement c / 2^mbits
        step = 1 << element.mbits
        codes = np.clip(np.rint(scaled * step), -element.max_code, element.max_code).astype(element.result_dtype)
    else:
        codes = scaled.astype(element.result_dtype)
    codes = codes.reshape(codes.shape[:-2] + (-1,))[..., :length]
    return codes, (shared[..., 0] + 127).astype(np.uint8)


def _blocks_of(x: np.ndarray, block: int) -> tuple[np.ndarray, int]:
    """x's last axis padded with zeros to whole blocks, as (..., blocks, block); and its length."""
    length = x.shape[-1]
    tail = -length % block
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, tail)]) if tail else x
    return padded.reshape(padded.shape[:-1] + (-1, block)), length


def numpy_reference_nvfp4(
    x: np.ndarray, per_tensor_scale: float | None = None, block: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 quantisation (blocks along the last axis) in plain numpy + ml_dtypes, as one writes it
    from torchao's formulas: ``s = e4m3(clamp(amax / 6 [/ pts], 2^-6, 448))``, elements
    ``clamp(x * (1 / s), -6, 6)`` (two-level: ``x * ((1 / pts) / s)``) cast to float4_e2m1fn and
    packed two per byte. Returns ``(packed codes, scale codes)``."""
    nv = BLOCK_FORMATS["nvfp4"]
    emax, scales = np.float32(nv.max_element), nv.scale_format
    x = np.asarray(x, dtype=np.float32)
    blocks, length = _blocks_of(x, block)
    t = np.max(np.abs(blocks), axis=-1, keepdims=True) / emax
    if per_tensor_scale is not None:
        t = t / np.float32(per_tensor_scale)
    s = np.clip(t, np.float32(scales.smallest_normal), np.float32(scales.max)).astype(ml_dtypes.float8_e4m3fn)
    s32 = s.astype(np.float32)
    inv = np.float32(1.0) / s32 if per_tensor_scale is None else (np.float32(1.0) / np.float32(per_tensor_scale)) / s32
    v = np.clip(blocks * inv, -emax, emax)
    codes = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(v.shape[:-2] + (-1,))[..., :length]
    return pack(codes, -1), s.view(np.uint8)[..., 0]


def _tiles_of(x: np.ndarray, fmt: str) -> tuple[np.ndarray, tuple[int, int]]:
    """x (float32) as the 2-D matrix of its last axes padded with zeros to whole blocks of ``fmt``,
    seen as (tile rows, rows, tile columns, columns); and the matrix's shape."""
    bf = BLOCK_FORMATS[fmt]
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    rows, cols = x2.shape
    br, bc = min(bf.block_rows, rows), min(bf.block_size, cols)
    padded = np.pad(x2, [(0, -rows % br), (0, -cols % bc)])
    return padded.reshape(padded.shape[0] // br, br, padded.shape[1] // bc, bc), (rows, cols)


def numpy_reference_fp8(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """FP8 with float32 scales (``fp8_block``, ``fp8_channel``, ``fp8_tensor`` over the last two
    axes) in plain numpy + ml_dtypes, as one writes it from the producers' formulas: ``s = amax /
    448`` per tile (the epsilon for an all-zero tile), codes ``clip(x / s, -448, 448)`` cast to
    float8_e4m3fn. Returns ``(codes, scales)``."""
    top = np.float32(BLOCK_FORMATS[fmt].max_element)
    tiles, (rows, cols) = _tiles_of(np.asarray(x, dtype=np.float32), fmt)
    s = np.max(np.abs(tiles), axis=(1, 3), keepdims=True) / top
    s[s == 0] = np.finfo(np.float32).eps
    codes = np.clip(tiles / s, -top, top).astype(ml_dtypes.float8_e4m3fn)
    return codes.reshape(tiles.shape[0] * tiles.shape[1], -1)[:rows, :cols], s[:, 0, :, 0]


def numpy_reference_int(x: np.ndarray, layout: Any) -> tuple[np.ndarray, ...]:
    """The integer formats' rule (compressed-tensors') in vectorised numpy, in float32 (without the
    rounding of each step to the scale's dtype): codes, scales and zero points of groups along the
    last axis. The peer of the integer rows."""
    bf = layout.format
    low, high = bf.element_format.lowest, bf.element_format.max
    g = np.asarray(x, np.float32).reshape(-1, layout.scales_shape[-1], min(layout.block_size, layout.shape[-1]))
    lo = np.minimum(g.min(axis=2, keepdims=True), 0)
    hi = np.maximum(g.max(axis=2, keepdims=True), 0)
    if bf.zero_points:
        s = (hi - lo) / np.float32(high - low)
        s = np.where(s == 0, np.float32(2.0**-23), s)
        z = np.clip(np.rint(low - lo / s), low, high)
        q = np.clip(np.rint(g / s + z), low, high).astype(np.int8)
        return q, s, z.astype(np.int8)
    s = np.maximum(-lo, hi) / np.float32((high - low) / 2)
    s = np.where(s == 0, np.float32(2.0**-23), s)
    return np.clip(np.rint(g / s), low, high).astype(np.int8), s


def torchao_peer(
    fmt: str, options: dict[str, Any], shape: tuple[int, ...] | None = None
) -> Callable[[np.ndarray], Any] | None:
    """torchao's CPU quantiser of a case, when torch and torchao are installed and have it (for
    arrays of ``shape``: torchao takes whole blocks only)."""
    if shape is not None and (not shape or shape[-1] % min(BLOCK_FORMATS[fmt].block_size, shape[-1])):
        return None
    try:
        import torch
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    except Exception:  # noqa: BLE001 - any failure to import means the peer is absent
        return None
    if BLOCK_FORMATS[fmt].integer:  # torchao's integer layouts are its own (tinygemm): no like-for-like peer
        return None
    if BLOCK_FORMATS[fmt].float_scales:  # FP8: torch's own ops, as compressed-tensors runs them on a CPU
        top = BLOCK_FORMATS[fmt].max_element

        def fp8(a: np.ndarray) -> Any:
            t = torch.from_numpy(_tiles_of(a, fmt)[0])
            s = t.abs().amax(dim=(1, 3), keepdim=True) / top
            return (t / s).clamp(-top, top).to(torch.float8_e4m3fn), s

        return None if options else fp8
    if BLOCK_FORMATS[fmt].per_tensor_scale:  # NVFP4: torchao's nvfp4_quantize
        if set(options) - {"per_tensor_scale"}:
            return None
        pts_option = options.get("per_tensor_scale", "amax")

        def nvfp4(a: np.ndarray) -> Any:
            t = torch.from_numpy(a)
            if pts_option is None:
                return nvfp4_quantize(t, 16, None)
            if pts_option == "amax":
                return nvfp4_quantize(t, 16, per_tensor_amax_to_scale(t.abs().amax()))
            return nvfp4_quantize(t, 16, torch.tensor(pts_option, dtype=torch.float32))

        return nvfp4
    dtypes = {
        "mxfp8_e4m3": torch.float8_e4m3fn,
        "mxfp8_e5m2": torch.float8_e5m2,
        "mxfp4_e2m1": getattr(torch, "float4_e2m1fn_x2", None),
    }
    elem = dtypes.get(fmt)
    if elem is None or options:
        return None
    return lambda a: to_mx(torch.from_numpy(a), elem, 32)


def bench_blocks(
    n: int,
    repeat: int = 5,
    formats: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    cases: list[tuple[str, str, dict[str, Any]]] | None = None,
) -> list[BlockBenchRow]:
    """Measure block-format quantise, dequantise and fake-quantise on ``n`` built-in elements, as
    rows of 1024 when ``n`` is a multiple of 1024, else 1-D: every case of ``cases`` (default
    :data:`BLOCK_CASES`), or the plain rule of every format of ``formats``."""
    if cases is None:
        cases = BLOCK_CASES if formats is None else [(f, f, {}) for f in formats]
    x = synthetic_input(n)
    if n % 1024 == 0:
        x = x.reshape(-1, 1024)
    copy_dst = np.empty_like(x)
    dq_out = np.empty_like(x)
    fake_out = np.empty_like(x)
    rows = []
    for label, fmt, options in cases:
        if progress:
            progress(label)
        options = dict(options)
        source = x if SOURCE not in options else cast(x, options.pop(SOURCE))
        if options.get("per_tensor_scale") == GIVEN:
            options = {**options, "per_tensor_scale": quantize(source, fmt).per_tensor_scale}
        q = quantize(source, fmt, **options)
        moved = source.nbytes + q.nbytes
        copy_gbs = measure(lambda: np.copyto(copy_dst, x), 2 * x.nbytes, repeat)
        fresh_gbs = measure(lambda: x.copy(), 2 * x.nbytes, repeat)
        quantize_gbs = measure(lambda: quantize(source, fmt, **options), moved, repeat)
        dequantize_gbs = measure(lambda: q.dequantize(out=dq_out), x.nbytes + q.nbytes, repeat)
        fake = measure(lambda: fake_quantize(source, fmt, out=fake_out, **options), source.nbytes + x.nbytes, repeat)
        few = max(1, min(repeat, 3))
        with np.errstate(all="ignore"):
            if q.format.per_tensor_scale:
                pts = q.per_tensor_scale
                peer = measure(lambda: numpy_reference_nvfp4(source, pts), moved, few)
            elif q.format.integer:
                peer = measure(lambda: numpy_reference_int(source, q.layout), moved, few)
            elif q.format.float_scales:
                peer = measure(lambda: numpy_reference_fp8(source, fmt), moved, few)
            else:
                peer = measure(lambda: numpy_reference_quantize(source, fmt), moved, few)
        torchao = torchao_peer(fmt, options, x.shape) if source is x else None
        torchao_gbs = None if torchao is None else measure(lambda: torchao(x), moved, few)
        # on the data without its NaN and infinities, which would spoil every block of a per-tensor format
        finite = np.where(np.isfinite(source.astype(np.float32)), source, np.zeros_like(source))
        sqnr = quantization_error(finite, quantize(finite, fmt, **options)).sqnr_db
        speeds = (quantize_gbs, dequantize_gbs, fake, copy_gbs, peer)
        rows.append(BlockBenchRow(label, fmt, n, *speeds, sqnr, torchao_gbs, fresh_gbs, _binding(source, fmt, options)))
    return rows


def _binding(x: np.ndarray, fmt: str, options: dict[str, Any]) -> str:
    """The binding of the kernels that ``quantize(x, fmt, **options)`` runs."""
    arr, src = input_array(x)
    return block_job(fmt, arr.ndim, **options).resolved(arr, src).binding(arr.shape, src)


def format_block_table(rows: list[BlockBenchRow]) -> str:
    """The rows of :func:`bench_blocks` as a fixed-width table: allocating ``quantize`` against the fresh
    ceiling, the ``out=`` calls against copy."""
    head = (
        f"{'block format':<18}{'quantise':>10}{'vs fresh':>9}{'dequant out=':>14}{'vs copy':>9}"
        f"{'fake out=':>11}{'vs copy':>9}{'fresh':>8}{'copy':>8}{'peer':>8}{'vs peer':>9}{'torchao':>9}{'vs':>7}"
        f"{'SQNR dB':>9}  {'binding':<36}"
    )
    units = (
        f"{'':<18}{'GB/s':>10}{'':>9}{'GB/s':>14}{'':>9}{'GB/s':>11}{'':>9}{'GB/s':>8}{'GB/s':>8}{'GB/s':>8}"
        f"{'':>9}{'GB/s':>9}"
    )
    lines = [head, units, "-" * len(head)]
    for r in rows:
        ta = "-" if r.torchao_gbs is None else f"{r.torchao_gbs:.2f}"
        vs = "-" if r.vs_torchao is None else f"{r.vs_torchao:.1f}x"
        lines.append(
            f"{r.label:<18}{r.quantize_gbs:>10.1f}{r.vs_fresh:>8.2f}x{r.dequantize_gbs:>14.1f}"
            f"{r.dequantize_vs_copy:>8.2f}x{r.fake_gbs:>11.1f}{r.fake_vs_copy:>8.2f}x{r.fresh_gbs:>8.1f}{r.copy_gbs:>8.1f}"
            f"{r.peer_gbs:>8.2f}{r.vs_peer:>8.1f}x{ta:>9}{vs:>7}{r.sqnr_db:>9.2f}  {r.binding:<36}"
        )
    if all(r.torchao_gbs is None for r in rows):
        lines.append("(torchao peer: torch and torchao are not installed; pip install torch torchao to add it)")
    return "\n".join(lines)


def __getattr__(name: str) -> Any:
    from .._compat import renamed

    return renamed(__name__, name, globals())
