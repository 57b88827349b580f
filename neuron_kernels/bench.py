"""Throughput measurement shared by ``neuron-kernels bench``.

GB/s = (bytes read + bytes written) / time, median of ``repeat`` runs after one warm-up.
Every figure of one report is measured in the same process, back to back, so that ratios are
meaningful on a noisy machine even when absolute GB/s drift:

- ``copy``: ``np.copyto`` float32 -> float32 into a preallocated array (the bandwidth baseline);
- ``ours (out=)``: ``cast(x, dtype, out=preallocated)``, compared with the copy baseline;
- ``ours``: ``cast(x, dtype)`` allocating its result, compared with the peer, which allocates too;
- the peer: ml_dtypes ``astype`` (where ml_dtypes has the target), else numpy code (tfloat32
  rounding, packing of ml_dtypes codes).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .casting import cast
from .formats import FORMATS, get_format

__all__ = ["BenchRow", "measure", "synthetic_input", "default_pairs", "bench_casts", "format_table"]


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


def _peer(source: str, target: str) -> tuple[str, Callable[[np.ndarray], Any]]:
    """The peer of a pair: ml_dtypes ``astype``, or numpy code where ml_dtypes lacks the target.

    Packed targets: ml_dtypes ``astype`` to the element, then numpy packing of the codes.
    """
    t = get_format(target)
    if t.numpy_name is not None:

        def astype(a: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                return a.astype(t.result_dtype)

        return "ml_dtypes", astype
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
    others = [("float64", "bfloat16"), ("float64", "float8_e4m3fn"), ("bfloat16", "float8_e4m3fn"),
              ("float16", "float8_e4m3fn"), ("float8_e5m2", "float8_e4m3fn")]
    return encode + decode + others


def bench_casts(n: int, repeat: int = 5, pairs: list[tuple[str, str]] | None = None,
                progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Measure ``pairs`` (default: :func:`default_pairs`) on ``n`` built-in elements."""
    if pairs is None:
        pairs = default_pairs()
    base = synthetic_input(n)
    copy_dst = np.empty_like(base)
    rows = []
    sources: dict[str, np.ndarray] = {"float32": base}
    for source, target in pairs:
        if progress:
            progress(f"{source} -> {target}")
        if source not in sources:
            sources[source] = cast(base, source)
        x = sources[source]
        out = cast(x, target)
        moved = x.nbytes + out.nbytes
        copy_gbs = measure(lambda: np.copyto(copy_dst, base), 2 * base.nbytes, repeat)
        ours_out = measure(lambda: cast(x, target, out=out), moved, repeat)
        ours = measure(lambda: cast(x, target), moved, repeat)
        peer_name, peer = _peer(source, target)
        peer_gbs = measure(lambda: peer(x), moved, max(1, min(repeat, 3)))
        rows.append(BenchRow(source, target, n, ours, ours_out, copy_gbs, peer_name, peer_gbs))
    return rows


def format_table(rows: list[BenchRow]) -> str:
    head = (f"{'cast':<28}{'GB/s':>8}{'out= GB/s':>11}{'copy GB/s':>11}{'vs copy':>9}"
            f"{'peer':>11}{'peer GB/s':>11}{'vs peer':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.source + ' -> ' + r.target:<28}{r.ours_gbs:>8.1f}{r.ours_out_gbs:>11.1f}"
                     f"{r.copy_gbs:>11.1f}{r.vs_copy:>8.2f}x{r.peer:>11}{r.peer_gbs:>11.2f}{r.vs_peer:>8.1f}x")
    return "\n".join(lines)
