"""The file subcommands end to end, each run as the command (in this process, ``cli_runner``):
quantize, dequantize, cast, error.

Every result is compared with the in-memory functions; bad input must give exit status 2, one
line on stderr, no traceback and no output file.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk

from .cli_runner import run
from .helpers import child_env

#: Of the interrupted runs' processes: warnings are errors; the child imports this checkout whatever
#: its working directory.
ENV = child_env(PYTHONWARNINGS="error")


def fails(*args, cwd, message):
    """Exit 2, one line on stderr naming the problem, and no file created in ``cwd``."""
    before = set(os.listdir(cwd))
    r = run(*args, cwd=cwd, check=False)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in lines[0], lines[0]
    assert set(os.listdir(cwd)) == before
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((300, 96)) * np.exp2(rng.integers(-8, 8, (300, 96)))).astype(np.float32)
    np.save(d / "x.npy", x)
    np.savez(d / "m.npz", w=x, b=x[:7, :40].astype(np.float16))
    from safetensors.numpy import save_file

    save_file({"w": x.astype(ml_dtypes.bfloat16), "v": x[:, :33].copy()}, d / "t.safetensors")
    return d, x


def test_quantize_npy_equals_quantize_mx(files):
    d, x = files
    r = run(
        "quantize",
        "x.npy",
        "q.npz",
        "--format",
        "mxfp4_e2m1",
        "--axis",
        "0",
        "--block-size",
        "7",
        "--rounding",
        "stochastic",
        "--seed",
        "9",
        "--chunk-mb",
        "1",
        cwd=d,
    )
    want = nk.quantize_mx(x, "mxfp4_e2m1", axis=0, block_size=7, rounding="stochastic", seed=9)
    got = nk.load_blocks(d / "q.npz")
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
    assert (got.fmt, got.axis, got.block_size, got.shape) == ("mxfp4_e2m1", 0, 7, x.shape)
    stats = nk.quantization_error(x, want)
    assert f"{stats.sqnr_db:.2f}" in r.stdout and "x.npy" in r.stdout


def test_quantize_containers_keep_names(files):
    d, x = files
    run("quantize", "m.npz", "qm.npz", "--format", "mxfp8_e4m3", "--scale-mode", "rceil", cwd=d)
    for name, arr in [("w", x), ("b", x[:7, :40].astype(np.float16))]:
        got = nk.load_blocks(d / "qm.npz", name=name)
        want = nk.quantize_mx(arr, "mxfp8_e4m3", scale_mode="rceil")
        np.testing.assert_array_equal(got.codes, want.codes)
    with pytest.raises(ValueError, match="holds 2 block arrays; pick one with name="):
        nk.load_blocks(d / "qm.npz")
    run("quantize", "t.safetensors", "qt.npz", "--format", "mxint8", "--name", "w", cwd=d)
    got = nk.load_blocks(d / "qt.npz", name="w")
    np.testing.assert_array_equal(got.codes, nk.quantize_mx(x.astype(ml_dtypes.bfloat16), "mxint8").codes)


@pytest.mark.parametrize(
    "options, kwargs",
    [
        ([], {}),
        (["--per-tensor-scale", "none", "--rounding", "stochastic", "--seed", "3"], {"per_tensor_scale": None,
         "rounding": "stochastic", "seed": 3}),
        (["--per-tensor-scale", "0.002", "--scale-search", "mse"], {"per_tensor_scale": 0.002, "scale_search": "mse"}),
        (["--four-over-six", "mse", "--rht"], {"four_over_six": "mse", "rht": True}),
        (["--block-shape", "16x16"], {"block_shape": (16, 16)}),
        (["--axis", "0"], {"axis": 0}),
    ],
    ids=["amax", "single-stochastic", "given-mse", "4over6-rht", "tiles", "axis0"],
)  # fmt: skip
def test_quantize_nvfp4_in_pieces_equals_in_memory(tmp_path, options, kwargs):
    # Several pieces of 1 MiB; the per-tensor scale from the amax takes a first pass over them.
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((1600, 512)) * np.exp2(rng.integers(-6, 6, (1600, 512)))).astype(np.float32)
    x[7, 3] = 300.0  # the tensor's amax sits in one piece only
    np.save(tmp_path / "x.npy", x)
    r = run("quantize", "x.npy", "q.npz", "--format", "nvfp4", "--chunk-mb", "1", *options, cwd=tmp_path)
    got = nk.load_blocks(tmp_path / "q.npz")
    want = nk.quantize_nvfp4(x, **kwargs)
    assert (got.per_tensor_scale, got.block_shape, got.rotation) == (
        want.per_tensor_scale,
        want.block_shape,
        want.rotation,
    )
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
    assert f"{nk.quantization_error(x, want).sqnr_db:.2f}" in r.stdout
    run("dequantize", "q.npz", "dq.npy", "--chunk-mb", "1", cwd=tmp_path)
    np.testing.assert_array_equal(np.load(tmp_path / "dq.npy").view(np.uint32), want.dequantize().view(np.uint32))


@pytest.mark.parametrize(
    "output, dtype", [("dq.npz", "float32"), ("dq.safetensors", "bfloat16"), ("dq.npz", "float64")]
)
def test_dequantize(files, output, dtype):
    d, x = files
    run("quantize", "m.npz", "deq_in.npz", "--format", "mxfp6_e3m2", "--force", cwd=d)
    run("dequantize", "deq_in.npz", output, "--dtype", dtype, "--chunk-mb", "1", "--force", cwd=d)
    if output.endswith(".npz"):
        got = dict(np.load(d / output))
    else:
        from safetensors.numpy import load_file

        got = load_file(d / output)
    for name in ("w", "b"):
        want = nk.load_blocks(d / "deq_in.npz", name=name).dequantize(dtype)
        assert got[name].dtype == want.dtype
        np.testing.assert_array_equal(got[name].view(np.uint8), want.view(np.uint8))


def test_dequantize_one_array_to_npy(files):
    d, x = files
    run("quantize", "x.npy", "one.npz", "--format", "mxfp8_e5m2", cwd=d)
    run("dequantize", "one.npz", "one.npy", cwd=d)
    np.testing.assert_array_equal(np.load(d / "one.npy"), nk.quantize_mx(x, "mxfp8_e5m2").dequantize())
    run("quantize", "m.npz", "two.npz", "--format", "mxfp8_e5m2", cwd=d)
    fails("dequantize", "two.npz", "two.npy", cwd=d, message="a .npy file holds one array and there are 2")


def test_cast(files):
    d, x = files
    run(
        "cast",
        "x.npy",
        "c.npy",
        "--to",
        "float8_e4m3fn",
        "--rounding",
        "stochastic",
        "--seed",
        "4",
        "--chunk-mb",
        "1",
        cwd=d,
    )
    want = nk.cast(x, "float8_e4m3fn", rounding="stochastic", seed=4)
    np.testing.assert_array_equal(np.load(d / "c.npy"), want.view(np.uint8))
    run("cast", "m.npz", "c.safetensors", "--to", "bfloat16", cwd=d)
    from safetensors.numpy import load_file

    got = load_file(d / "c.safetensors")
    assert got["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got["w"].view(np.uint16), nk.cast(x, "bfloat16").view(np.uint16))
    run("cast", "x.npy", "x4.npy", "--to", "float8_e4m3fn_x4", "--saturate", cwd=d)
    np.testing.assert_array_equal(np.load(d / "x4.npy"), nk.cast(x, "float8_e4m3fn_x4", saturate=True))


def test_error_table_sorted_best_first(files):
    d, x = files
    r = run(
        "error", "x.npy", "--formats", "mxfp8_e4m3,mxfp4_e2m1", "--scale-modes", "floor,rceil,neuron",
        "--policies", "plain", cwd=d,
    )  # fmt: skip
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert len(rows) == 6 and {row[1] for row in rows} == {"mxfp8_e4m3", "mxfp4_e2m1"}
    assert all(len(row) == 9 for row in rows)  # nine columns that never run together
    sqnr = [float(row[4]) for row in rows]
    assert sqnr == sorted(sqnr, reverse=True)
    want = nk.quantization_error(x, nk.quantize_mx(x, "mxfp4_e2m1", scale_mode="neuron")).sqnr_db
    assert any(row[1:4] == ["mxfp4_e2m1", "neuron", "plain"] and row[4] == f"{want:.2f}" for row in rows)


def test_error_table_compares_policies(files):
    d, x = files
    r = run("error", "x.npy", "--formats", "nvfp4,mxfp4_e2m1", "--scale-modes", "floor,nearest", cwd=d)
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    found = {tuple(row[1:4]): float(row[4]) for row in rows}
    assert set(found) == {("nvfp4", "nearest", p) for p in ("plain", "mse", "4/6-mae", "4/6-mse")} | {
        ("mxfp4_e2m1", "floor", p) for p in ("plain", "mse")
    }
    for key, kwargs in [
        (("nvfp4", "nearest", "4/6-mse"), {"four_over_six": "mse"}),
        (("mxfp4_e2m1", "floor", "mse"), {"scale_search": "mse"}),
    ]:
        want = nk.quantization_error(x, nk.quantize(x, key[0], **kwargs)).sqnr_db
        assert found[key] == float(f"{want:.2f}")
    # the policies never do worse than the plain rule (their block errors are never larger)
    assert found[("nvfp4", "nearest", "4/6-mse")] >= found[("nvfp4", "nearest", "plain")]
    assert found[("mxfp4_e2m1", "floor", "mse")] >= found[("mxfp4_e2m1", "floor", "plain")]


def test_error_table_takes_fp8_with_float_scales(files, tmp_path):
    """FP8 in tiles, per row and per matrix beside the 1-D formats (a second read for the tiles,
    each on pieces of whole rows of tiles: --chunk-mb 1 cuts the matrix), each scale rule, no policy;
    every figure what the in-memory statistics give."""
    d, _ = files
    x = np.random.default_rng(3).standard_normal((700, 384)).astype(np.float32)
    np.save(tmp_path / "w.npy", x)
    formats = "fp8_block,fp8_channel,fp8_tensor,mxfp8_e4m3"
    r = run("error", "w.npy", "--formats", formats, "--scale-modes", "floor,divide,reciprocal", "--chunk-mb", "1",
            cwd=tmp_path)  # fmt: skip
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    found = {tuple(row[1:4]): row[4] for row in rows}
    fp8 = {(f, m, "plain") for f in formats.split(",")[:3] for m in ("divide", "reciprocal")}
    assert set(found) == fp8 | {("mxfp8_e4m3", "floor", p) for p in ("plain", "mse")}
    for fmt, mode, _ in fp8:
        want = nk.quantization_error(x, nk.quantize(x, fmt, scale_mode=mode)).sqnr_db
        assert found[(fmt, mode, "plain")] == f"{want:.2f}", (fmt, mode)


def test_error_plot(files):
    pytest.importorskip("matplotlib")
    d, _ = files
    run("error", "x.npy", "--formats", "mxfp8_e4m3,mxfp4_e2m1", "--plot", "hist.png", cwd=d)
    assert (d / "hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_existing_output_needs_force(files):
    d, _ = files
    (d / "taken.npz").write_bytes(b"keep me")
    fails("quantize", "x.npy", "taken.npz", "--format", "mxint8", cwd=d, message="exists; pass --force")
    assert (d / "taken.npz").read_bytes() == b"keep me"
    run("quantize", "x.npy", "taken.npz", "--format", "mxint8", "--force", cwd=d)
    assert nk.load_blocks(d / "taken.npz").fmt == "mxint8"
    fails("cast", "x.npy", "x.npy", "--to", "bfloat16", "--force", cwd=d, message="is also the input")


def test_bad_input(files):
    d, _ = files
    (d / "junk.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    np.save(d / "whole.npy", np.zeros(1000, np.float32))
    (d / "trunc.npy").write_bytes((d / "whole.npy").read_bytes()[:2000])
    (d / "junk.safetensors").write_bytes(b"\xff" * 64)
    (d / "junk.npz").write_bytes(b"PK\x03\x04 not really")
    np.save(d / "ints.npy", np.arange(10))
    np.save(d / "complex.npy", np.ones(4, np.complex64))
    (d / "x.txt").write_text("1 2 3")
    q = ("--format", "mxfp8_e4m3")
    fails("quantize", "missing.npy", "o.npz", *q, cwd=d, message="missing.npy: no such file")
    fails("quantize", "x.txt", "o.npz", *q, cwd=d, message="unsupported input file type '.txt'; use one of .npy")
    fails("quantize", "junk.npy", "o.npz", *q, cwd=d, message="junk.npy: not a valid .npy array")
    fails("quantize", "trunc.npy", "o.npz", *q, cwd=d, message="trunc.npy: truncated")
    fails("quantize", "junk.safetensors", "o.npz", *q, cwd=d, message="not a valid .safetensors file")
    fails("quantize", "junk.npz", "o.npz", *q, cwd=d, message="junk.npz: cannot read it as .npz")
    fails("quantize", "ints.npy", "o.npz", *q, cwd=d, message="dtype int64 is not a float array; float32")
    fails("cast", "complex.npy", "o.npy", "--to", "bfloat16", cwd=d, message="complex64")
    fails("quantize", "x.npy", "o.npz", "--format", "mxfp9", cwd=d, message="invalid choice: 'mxfp9'")
    fails("quantize", "x.npy", "o.npz", *q, "--scale-mode", "round", cwd=d, message="invalid choice: 'round'")
    fails("quantize", "x.npy", "o.npy", *q, cwd=d, message="OUTPUT must be a .npz file")
    fails("quantize", "x.npy", "o.npz", *q, "--block-size", "0", cwd=d, message="give a positive integer")
    fails("quantize", "x.npy", "o.npz", *q, "--axis", "5", cwd=d, message="axis 5 is out of range")
    fails("quantize", "m.npz", "o.npz", *q, "--name", "nope", cwd=d, message="has no array named 'nope'; it has w, b")
    fails("cast", "x.npy", "o.npy", "--to", "float9", cwd=d, message="float9")
    fails("cast", "x.npy", "o.csv", "--to", "bfloat16", cwd=d, message="unsupported output file type '.csv'")
    fails("dequantize", "x.npy", "o.npy", cwd=d, message="a block file is a .npz file")
    fails("dequantize", "m.npz", "o.npy", cwd=d, message="not a block file")
    fails("quantize", "x.npy", "no/such/dir/o.npz", *q, cwd=d, message="does not exist")
    fails("error", "x.npy", "--plot", "hist.jpg", cwd=d, message="ending in .png")


def test_an_interrupt_inside_the_compiler_waits_until_it_is_left():
    """A signal landing while numba's compiler runs (compiling, or loading a kernel from the cache)
    is acted on once the compiler is left, not inside it (where native objects are half-built)."""
    script = textwrap.dedent(
        """
        import os, signal, time
        from numba.core.compiler_lock import global_compiler_lock
        from neuron_kernels import cli
        cli_stop = vars(cli)["_stop"]
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, cli_stop)
            try:
                with global_compiler_lock:
                    os.kill(os.getpid(), signum)
                    time.sleep(0.3)
                    print("left the compiler", flush=True)
                time.sleep(5)
                print("not interrupted")
            except KeyboardInterrupt:
                print("interrupted after", flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:4] == ["left the compiler", "interrupted after"] * 2, r.stdout


def test_interrupted_run_leaves_no_output(tmp_path):
    """SIGINT and SIGTERM in the middle of a run: exit 130, no output, no partial file."""
    np.save(tmp_path / "big.npy", np.ones(24 << 20, np.float32))  # 96 MiB, read in 1 MiB pieces
    interrupted = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        # A process of its own: the signal goes to the command's process, which must exit with 130.
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "neuron_kernels",
                "quantize",
                "big.npy",
                "o.npz",
                "--format",
                "mxfp8_e4m3",
                "--chunk-mb",
                "1",
            ],
            cwd=tmp_path,
            env={**ENV, "PYTHONFAULTHANDLER": "1"},  # a crash shows where it happened
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Signalled once the partial file has grown past its header (the first piece written): in
        # the streaming loop, not during the start-up's imports, where Python itself reports the
        # interrupted read of a module's source as an unclosed file under PYTHONWARNINGS=error.
        deadline, header = time.monotonic() + 120, None
        while p.poll() is None:
            assert time.monotonic() < deadline, "the run never started writing"
            partial = [n for n in os.listdir(tmp_path) if n.startswith(".partial-")]
            size = os.path.getsize(tmp_path / partial[0]) if partial else None
            if header is not None and size is not None and size > header:
                break
            header = size if header is None else header
            time.sleep(0.01)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        if p.returncode == 0:  # finished before the signal landed: nothing to test this round
            os.remove(tmp_path / "o.npz")
            continue
        assert p.returncode == 130, err
        assert "interrupted; no output written" in err and "Traceback" not in err
        assert sorted(os.listdir(tmp_path)) == ["big.npy"]
        interrupted.append(sig)
    assert interrupted, "every run finished before its signal landed"


def test_interrupt_in_mid_compile_prints_no_traceback(tmp_path):
    """Ctrl-C inside a compile leaves objects whose finalisers fail when collected: one line, exit 130."""
    script = """
import sys
from neuron_kernels import cli
from neuron_kernels.cli.commands import COMMANDS


class HalfBuilt:  # as llvmlite's ModuleRef when the interrupt lands in its constructor
    def __del__(self):
        raise AttributeError("no attribute '_as_parameter_'")


def interrupted(args):
    left = [HalfBuilt()]
    left.append(left)  # a cycle: collected at exit, after main() has returned
    raise KeyboardInterrupt


COMMANDS["formats"] = interrupted
sys.exit(cli.main(["formats"]))
"""
    p = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, p.stderr
    assert p.stderr == "neuron-kernels formats: interrupted; no output written\n"


def test_one_long_row_is_cut_within_the_row(tmp_path):
    """A (1, N) array with --chunk-mb 1: pieces are block ranges of its one row, in all three commands."""
    x = np.random.default_rng(5).standard_normal((1, 3_000_001)).astype(np.float32)
    np.save(tmp_path / "row.npy", x)
    run(
        "quantize",
        "row.npy",
        "q.npz",
        "--format",
        "mxfp4_e2m1",
        "--block-size",
        "33",
        "--rounding",
        "stochastic",
        "--seed",
        "2",
        "--chunk-mb",
        "1",
        cwd=tmp_path,
    )
    want = nk.quantize_mx(x, "mxfp4_e2m1", block_size=33, rounding="stochastic", seed=2)
    got = nk.load_blocks(tmp_path / "q.npz")
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
    run("dequantize", "q.npz", "dq.npy", "--chunk-mb", "1", cwd=tmp_path)
    np.testing.assert_array_equal(np.load(tmp_path / "dq.npy"), want.dequantize())
    run(
        "cast",
        "row.npy",
        "c.npz",
        "--to",
        "float8_e5m2",
        "--rounding",
        "stochastic",
        "--seed",
        "3",
        "--chunk-mb",
        "1",
        cwd=tmp_path,
    )
    want = nk.cast(x, "float8_e5m2", rounding="stochastic", seed=3).view(np.uint8)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npz")["row.npy"], want)


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written to it."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        pass


def test_progress_bar_on_a_terminal_only(files, monkeypatch, capsys):
    from neuron_kernels.cli import main

    d, _ = files
    for quiet, shown in (([], True), (["--quiet"], False)):
        term = _Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        args = ["quantize", str(d / "x.npy"), str(d / "bar.npz"), "--format", "mxfp8_e4m3", "--force", *quiet]
        assert main(args) == 0
        assert ("quantize mxfp8_e4m3" in term.text and "B/s" in term.text and "100%" in term.text) is shown, term.text
    capsys.readouterr()


def test_tiles_of_an_array_with_no_rows(tmp_path):
    """2-D blocks over an array whose second-last axis is 0 (a fuzz finding: the pieces of no rows
    divided by zero): one empty piece, an empty block file, the same shape back."""
    np.save(tmp_path / "e.npy", np.zeros((3, 0, 64), np.float32))
    run("quantize", "e.npy", "e.npz", "--format", "mxfp8_e4m3", "--block-shape", "32x32", cwd=tmp_path)
    run("dequantize", "e.npz", "back.npy", cwd=tmp_path)
    assert np.load(tmp_path / "back.npy").shape == (3, 0, 64)
