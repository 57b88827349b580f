"""Block-format throughput rows of ``neuron-kernels bench``, the numpy reference quantiser, and the PNG charts."""

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.tools.bench import (
    BLOCK_CASES,
    BenchRow,
    BlockBenchRow,
    bench_blocks,
    bench_casts,
    benched_formats,
    default_cases,
    format_block_table,
    format_table,
    numpy_reference_fp8,
    numpy_reference_nvfp4,
    numpy_reference_quantize,
    synthetic_input,
)
from neuron_kernels.tools.plots import (
    PlotUnavailable,
    bench_chart,
    error_histogram,
    relative_errors,
    require_matplotlib,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HINT = "plotting needs matplotlib: pip install 'neuron_kernels[plot]'"


@pytest.fixture(scope="module")
def mx_rows() -> list[BlockBenchRow]:
    return bench_blocks(4096, repeat=1)


def assert_png(path) -> None:
    with open(path, "rb") as fh:
        assert fh.read(8) == PNG_SIGNATURE
    assert os.path.getsize(path) > 1000


def test_bench_blocks_rows(mx_rows):
    assert [(r.label, r.fmt) for r in mx_rows] == [(label, fmt) for label, fmt, _ in BLOCK_CASES]
    # every block format; the integer ones each kind once (their widths share one kernel)
    floats = {n for n, f in nk.BLOCK_FORMATS.items() if not f.integer}
    assert floats <= {r.fmt for r in mx_rows} and {r.fmt for r in mx_rows} == benched_formats()
    kinds = {(nk.BLOCK_FORMATS[r.fmt].block_size, nk.BLOCK_FORMATS[r.fmt].zero_points) for r in mx_rows}
    assert {(f.block_size, f.zero_points) for f in nk.INTEGER_FORMATS.values()} <= kinds
    for r in mx_rows:
        assert r.elements == 4096
        for gbs in (r.quantize_gbs, r.dequantize_gbs, r.fake_gbs, r.copy_gbs, r.peer_gbs):
            assert math.isfinite(gbs) and gbs > 0
        assert math.isfinite(r.sqnr_db) and r.sqnr_db > 10
        d = r.as_dict()
        assert d["vs_copy"] == r.quantize_gbs / r.copy_gbs
        assert math.isfinite(r.fresh_gbs) and d["vs_fresh"] == r.quantize_gbs / r.fresh_gbs
        assert d["dequantize_vs_copy"] == r.dequantize_gbs / r.copy_gbs
        assert d["fake_vs_copy"] == r.fake_gbs / r.copy_gbs
        assert d["vs_peer"] == r.quantize_gbs / r.peer_gbs
        assert d["fmt"] == r.fmt and d["sqnr_db"] == r.sqnr_db
        assert (r.torchao_gbs is None) == (d["vs_torchao"] is None)


def test_bench_blocks_sqnr_grows_with_mantissa(mx_rows):
    sqnr = {r.label: r.sqnr_db for r in mx_rows}
    assert sqnr["mxfp4_e2m1"] < sqnr["mxfp6_e3m2"] < sqnr["mxfp6_e2m3"] < sqnr["mxint8"]


def test_bench_blocks_one_dimensional_partial_block():
    progress: list[str] = []
    rows = bench_blocks(1000, repeat=1, formats=["mxfp4_e2m1", "mxint8"], progress=progress.append)
    assert progress == ["mxfp4_e2m1", "mxint8"]
    assert [r.fmt for r in rows] == ["mxfp4_e2m1", "mxint8"]
    assert all(r.peer_gbs > 0 and math.isfinite(r.sqnr_db) for r in rows)


def test_format_block_table(mx_rows):
    table = format_block_table(mx_rows)
    lines = table.splitlines()
    for label, _, _ in BLOCK_CASES:
        assert sum(re.split(r"\s{2,}", line)[0] == label for line in lines) == 1
    assert "SQNR dB" in lines[0] and "vs peer" in lines[0] and "torchao" in lines[0]
    assert "GB/s" in lines[1]
    rows = [line for line in lines[2:] if not line.startswith("(")]  # a note on absent peers may follow
    assert len({len(line) for line in lines[:1] + rows}) == 1  # fixed width


def test_numpy_nvfp4_peer_equals_quantize_nvfp4():
    # The peer is an independent numpy + ml_dtypes transcription of the formulas: on finite data
    # its codes and scales are the package's, single and two level.
    x = ordinary_data(np.random.default_rng(5), (64, 96))
    for pts in (None, "amax"):
        q = nk.quantize_nvfp4(x, per_tensor_scale=pts)
        codes, scales = numpy_reference_nvfp4(x, q.per_tensor_scale)
        np.testing.assert_array_equal(codes, q.codes)
        np.testing.assert_array_equal(scales, q.scales.view(np.uint8))


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_channel", "fp8_tensor"])
def test_numpy_fp8_peer_equals_quantize(fmt):
    # The peer is the producers' formula in numpy + ml_dtypes: on finite data with partial tiles
    # its codes and float32 scales are the package's (an all-zero tile included).
    x = ordinary_data(np.random.default_rng(6), (300, 260)) * np.float32(2.0**-60)
    x[:128, :128] = 0
    q = nk.quantize(x, fmt)
    codes, scales = numpy_reference_fp8(x, fmt)
    np.testing.assert_array_equal(codes.view(np.uint8), q.codes)
    np.testing.assert_array_equal(scales.reshape(q.scales.shape), q.scales)


def ordinary_data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Finite float32 normals, no zeros: rows scaled by 2^-60 .. 2^60, elements spread over about
    12 binades, half of them with short mantissas (odd integers below 512 times a power of two) so
    that element rounding often meets exact ties."""
    n = math.prod(shape)
    wide = rng.standard_normal(n) * np.exp2(rng.integers(-8, 3, n))
    short = (2 * rng.integers(0, 256, n) + 1) * np.exp2(rng.integers(-14, -6, n)) * rng.choice([-1.0, 1.0], n)
    x = np.where(rng.random(n) < 0.5, wide, short).reshape(shape)
    x *= np.exp2(rng.integers(-60, 60, shape[:-1] + (1,)))
    x = x.astype(np.float32)
    assert np.all(np.isfinite(x)) and np.all(np.abs(x) >= np.finfo(np.float32).tiny)
    return x


@pytest.mark.parametrize("shape", [(64, 96), (5, 80)])
@pytest.mark.parametrize("fmt", list(nk.MX_FORMATS))
def test_numpy_reference_matches_quantize_mx(fmt, shape, rng):
    x = ordinary_data(rng, shape)
    codes, scales = numpy_reference_quantize(x, fmt)
    mx = nk.quantize_mx(x, fmt, scale_mode="floor")
    ours = mx.element_codes()
    assert codes.dtype == ours.dtype and codes.shape == x.shape
    assert scales.shape == mx.scales.shape
    np.testing.assert_array_equal(scales, mx.scales.view(np.uint8))
    np.testing.assert_array_equal(codes.view(np.uint8), ours.view(np.uint8))
    bits = nk.MX_FORMATS[fmt].element_bits
    assert len(np.unique(ours.view(np.uint8))) >= min(0.75 * 2**bits, 80)  # the data reaches most codes


def test_numpy_reference_differs_only_on_special_blocks():
    # quantize_mx gives a block holding NaN/inf the scale byte 0xff and an all-zero block 0x00;
    # the reference does not special-case them.
    x = synthetic_input(4096).reshape(-1, 1024)
    x[1, 64:96] = 0
    for fmt in ("mxfp8_e4m3", "mxint8"):
        with np.errstate(all="ignore"):
            _, scales = numpy_reference_quantize(x, fmt)
        ours = nk.quantize_mx(x, fmt).scales.view(np.uint8)
        assert ours[0, 0] == 0xFF and ours[1, 2] == 0x00
        differ = np.argwhere(scales != ours).tolist()
        assert differ == [[0, 0], [1, 2]]


def test_relative_errors():
    x = np.array([1.0, 0.0, -2.0, np.nan, 4.0, np.inf, 8.0], np.float32)
    dq = np.array([1.5, 0.0, -2.0, 1.0, 3.0, 1.0, 0.0], np.float32)
    r = relative_errors(x, dq)
    assert r.dtype == np.float64
    np.testing.assert_array_equal(r, [0.5, 0.0, 0.25, 1.0])
    big = np.arange(1, 10_001, dtype=np.float32)
    sample = relative_errors(big, big * np.float32(1.5), limit=1000)
    assert sample.size == 1000
    np.testing.assert_array_equal(sample, 0.5)
    np.testing.assert_array_equal(sample, relative_errors(big, big * np.float32(1.5), limit=1000))
    with pytest.raises(ValueError):
        relative_errors(x, dq[:3])


def test_relative_errors_of_narrow_inputs():
    x = np.array([[1.0, 0.0], [-3.0, 1.0]], np.float32)
    dq = np.array([[1.25, 0.0], [-2.0, 1.0]], np.float32)
    for dtype in ("bfloat16", "float16", "float64"):
        r = relative_errors(nk.cast(x, dtype), nk.cast(dq, dtype))
        np.testing.assert_array_equal(r, [0.25, 1 / 3, 0.0])


def small_cast_rows() -> list[BenchRow]:
    return bench_casts(4096, repeat=1, pairs=[("float32", "bfloat16"), ("float8_e4m3fn", "float32")])


def test_bench_casts_stochastic_rows():
    rows = bench_casts(4096, repeat=1, pairs=[("float32", "bfloat16")], stochastic=[("float64", "float8_e4m3fn")])
    assert [(r.label, r.rounding, r.peer) for r in rows] == [
        ("float32 -> bfloat16", "nearest_even", "ml_dtypes"),
        ("float64 -> float8_e4m3fn (stochastic)", "stochastic", "ml_dtypes RNE"),
    ]
    assert all(r.ours_out_gbs > 0 and r.peer_gbs > 0 for r in rows)
    assert "float64 -> float8_e4m3fn (stochastic)" in format_table(rows)
    cases = default_cases()
    assert ("float32", "bfloat16", "stochastic") in cases and ("float32", "bfloat16", "nearest_even") in cases


@pytest.mark.parametrize("pair", [("float32", "float8_e5m3fnu"), ("float8_e5m3fnu", "float32")])
def test_a_format_the_installed_ml_dtypes_lacks_has_no_peer(pair, monkeypatch):
    """With an ml_dtypes that has no dtype for a format (float8_e5m3fnu before 0.7, as the format
    table sees it then: codes in uint8), the bench measures the package and prints no peer."""
    import dataclasses

    from neuron_kernels.tools import bench

    lacking = dataclasses.replace(bench.get_format("float8_e5m3fnu"), numpy_name=None, container="uint8")
    real = bench.get_format
    monkeypatch.setattr(bench, "get_format", lambda n: lacking if str(n) == "float8_e5m3fnu" else real(n))
    assert bench.peer_of(*pair) == (bench.NO_PEER, None)
    rows = bench_casts(4096, repeat=1, pairs=[pair])
    assert rows[0].peer == bench.NO_PEER and math.isnan(rows[0].peer_gbs) and rows[0].ours_out_gbs > 0
    table = format_table(rows)
    assert "no peer; the installed ml_dtypes" in table and "nan" not in table


def test_bench_chart_png(tmp_path, mx_rows):
    pytest.importorskip("matplotlib")
    cast_rows = small_cast_rows()
    for name, casts, mx in (("both.png", cast_rows, mx_rows), ("mx.png", [], mx_rows), ("casts.png", cast_rows, [])):
        bench_chart(casts, mx, tmp_path / name)
        assert_png(tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == ["both.png", "casts.png", "mx.png"]
    with pytest.raises(ValueError):
        bench_chart([], [], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_error_histogram_png(tmp_path):
    pytest.importorskip("matplotlib")
    x = np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32)
    samples = {}
    for fmt in ("mxfp8_e4m3", "mxfp4_e2m1"):
        for mode in ("floor", "rceil"):
            samples[f"{fmt} {mode}"] = relative_errors(x, nk.fake_quantize_mx(x, fmt, scale_mode=mode))
    samples["exact"] = np.zeros(10)
    path = tmp_path / "errors.png"
    error_histogram(samples, path, "relative error, standard normal")
    assert_png(path)
    assert os.listdir(tmp_path) == ["errors.png"]


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    matplotlib_figure = pytest.importorskip("matplotlib.figure")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    path = tmp_path / "errors.png"
    path.write_bytes(b"old")
    monkeypatch.setattr(matplotlib_figure.Figure, "savefig", fail)
    with pytest.raises(OSError, match="disk full"):
        error_histogram({"a": np.array([0.1, 0.2])}, path, "t")
    assert os.listdir(tmp_path) == ["errors.png"] and path.read_bytes() == b"old"


def test_plot_unavailable_without_matplotlib(tmp_path, monkeypatch, mx_rows):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailable, match=re.escape(HINT)):
        require_matplotlib()
    with pytest.raises(PlotUnavailable, match=re.escape(HINT)):
        bench_chart([], mx_rows, tmp_path / "bench.png")
    with pytest.raises(PlotUnavailable, match=re.escape(HINT)):
        error_histogram({"a": np.array([0.1])}, tmp_path / "errors.png", "t")
    assert issubclass(PlotUnavailable, RuntimeError)
    assert os.listdir(tmp_path) == []


def test_plots_module_does_not_import_matplotlib():
    # A process of its own: which modules an import loads shows in a new interpreter only.
    r = subprocess.run(
        [sys.executable, "-c", "import sys, neuron_kernels.tools.plots; print('matplotlib' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
