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

MX block-scale quantisation (:func:`bench_mx`, one :class:`MXBenchRow` per MX format, floor
scale, blocks of 32 along the last axis):

- ``copy``: as above, measured again for every format;
- quantise: ``quantize_mx`` allocating its result, compared with the copy baseline and with the
  peer, :func:`numpy_reference_quantize` (numpy + ml_dtypes), which allocates too; both move
  ``x.nbytes + mx.nbytes``;
- dequantise: ``dequantize_mx`` into a reused ``out=`` array (``x.nbytes + mx.nbytes``);
- fake-quantise: ``fake_quantize_mx`` into a reused ``out=`` array (``2 * x.nbytes``);
- SQNR: :func:`~neuron_kernels.quantization_error` of the built-in data (whose first block holds
  a NaN and infinities: it is left out, as it dequantises to NaN throughout).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .blocks import dequantize_mx, fake_quantize_mx, quantization_error, quantize_mx
from .casting import cast
from .formats import FORMATS, MX_FORMATS, get_format

__all__ = [
    "BenchRow",
    "MXBenchRow",
    "measure",
    "synthetic_input",
    "default_pairs",
    "bench_casts",
    "format_table",
    "numpy_reference_quantize",
    "bench_mx",
    "format_mx_table",
]


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


def _peer(source: str, target: str, rounding: str = "nearest_even") -> tuple[str, Callable[[np.ndarray], Any]]:
    """The peer of a pair: ml_dtypes ``astype``, or numpy code where ml_dtypes lacks the target.

    Packed targets: ml_dtypes ``astype`` to the element, then numpy packing of the codes. Other
    rounding modes: the same peer, which rounds to nearest (none rounds otherwise).
    """
    t = get_format(target)
    if t.numpy_name is not None:

        def astype(a: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                return a.astype(t.result_dtype)

        return ("ml_dtypes" if rounding == "nearest_even" else "ml_dtypes RNE"), astype
    if t.name == "tfloat32":
        return "numpy", _numpy_tfloat32
    if t.name == "float32r":
        return "numpy", lambda a: a.astype(np.float32)
    element = get_format(t.element).result_dtype  # type: ignore[arg-type]
    lane_bits = 8 * t.itemsize // t.lanes

    def pack(a: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            codes = a.astype(element)
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
    decode = [(s, "float32") for s in small if s not in ("float32r", "tfloat32")]
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
        peer_name, peer = _peer(source, target, rounding)
        peer_gbs = measure(lambda: peer(x), moved, max(1, min(repeat, 3)))
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
            f"{r.copy_gbs:>11.1f}{r.vs_copy:>8.2f}x{r.peer:>15}{r.peer_gbs:>11.2f}{r.vs_peer:>8.1f}x"
        )
    return "\n".join(lines)


@dataclass
class MXBenchRow:
    """GB/s of one MX format (see the module docstring) and the SQNR of its quantisation."""

    fmt: str
    elements: int
    quantize_gbs: float
    dequantize_gbs: float
    fake_gbs: float
    copy_gbs: float
    peer_gbs: float
    sqnr_db: float

    @property
    def vs_copy(self) -> float:
        return self.quantize_gbs / self.copy_gbs

    @property
    def dequantize_vs_copy(self) -> float:
        return self.dequantize_gbs / self.copy_gbs

    @property
    def fake_vs_copy(self) -> float:
        return self.fake_gbs / self.copy_gbs

    @property
    def vs_peer(self) -> float:
        return self.quantize_gbs / self.peer_gbs

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "vs_copy": self.vs_copy,
            "dequantize_vs_copy": self.dequantize_vs_copy,
            "fake_vs_copy": self.fake_vs_copy,
            "vs_peer": self.vs_peer,
        }


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
        raise ValueError("cannot quantise a 0-d array: MX blocks run along an axis")
    length = x.shape[-1]
    tail = -length % block
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, tail)]) if tail else x
    blocks = padded.reshape(padded.shape[:-1] + (-1, block))
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
    codes = codes.reshape(padded.shape)[..., :length]
    return codes, (shared[..., 0] + 127).astype(np.uint8)


def bench_mx(
    n: int, repeat: int = 5, formats: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> list[MXBenchRow]:
    """Measure MX quantise, dequantise and fake-quantise of ``formats`` (default: every MX format)
    on ``n`` built-in elements, as rows of 1024 when ``n`` is a multiple of 1024, else 1-D."""
    if formats is None:
        formats = list(MX_FORMATS)
    x = synthetic_input(n)
    if n % 1024 == 0:
        x = x.reshape(-1, 1024)
    copy_dst = np.empty_like(x)
    dq_out = np.empty_like(x)
    fake_out = np.empty_like(x)
    rows = []
    for fmt in formats:
        if progress:
            progress(fmt)
        mx = quantize_mx(x, fmt)
        moved = x.nbytes + mx.nbytes
        copy_gbs = measure(lambda: np.copyto(copy_dst, x), 2 * x.nbytes, repeat)
        quantize = measure(lambda: quantize_mx(x, fmt), moved, repeat)
        dequantize = measure(lambda: dequantize_mx(mx, out=dq_out), moved, repeat)
        fake = measure(lambda: fake_quantize_mx(x, fmt, out=fake_out), 2 * x.nbytes, repeat)
        with np.errstate(all="ignore"):
            peer = measure(lambda: numpy_reference_quantize(x, fmt), moved, max(1, min(repeat, 3)))
        sqnr = quantization_error(x, mx).sqnr_db
        rows.append(MXBenchRow(fmt, n, quantize, dequantize, fake, copy_gbs, peer, sqnr))
    return rows


def format_mx_table(rows: list[MXBenchRow]) -> str:
    """The rows of :func:`bench_mx` as a fixed-width table."""
    head = (
        f"{'MX format':<12}{'quantise':>10}{'vs copy':>9}{'dequant out=':>14}{'vs copy':>9}"
        f"{'fake out=':>11}{'vs copy':>9}{'copy':>8}{'peer':>8}{'vs peer':>9}{'SQNR dB':>9}"
    )
    units = f"{'':<12}{'GB/s':>10}{'':>9}{'GB/s':>14}{'':>9}{'GB/s':>11}{'':>9}{'GB/s':>8}{'GB/s':>8}"
    lines = [head, units, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.fmt:<12}{r.quantize_gbs:>10.1f}{r.vs_copy:>8.2f}x{r.dequantize_gbs:>14.1f}"
            f"{r.dequantize_vs_copy:>8.2f}x{r.fake_gbs:>11.1f}{r.fake_vs_copy:>8.2f}x{r.copy_gbs:>8.1f}"
            f"{r.peer_gbs:>8.2f}{r.vs_peer:>8.1f}x{r.sqnr_db:>9.2f}"
        )
    return "\n".join(lines)
