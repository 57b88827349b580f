"""The command line against bad input: big-endian and Fortran-ordered members, non-finite data, a block
size beyond int64, a corrupt block file, an unexpected dtype.

Each run of the command (in this process: ``cli_runner``) either writes what the in-memory functions compute
or exits with status 2 and one line on stderr, without a traceback or an output file. The file subcommands'
other cases are in ``test_cli_files.py``; the bad-input tests of the functions behind them in
``test_cast_bad_input.py`` and ``test_mx_bad_input.py``.
"""

import os
import re
import subprocess
import sys

import numpy as np

import neuron_kernels as nk

from .cli_runner import run
from .helpers import (
    BASE,
    NONFINITE,
    X_MX,
    assert_same_bits,
    assert_same_mx,
    bits,
    meta_with,
    ml_cast,
    native,
    write_mx,
)
from .reference_mx import quantize_mx_ref


def test_cli_quantize_big_endian_fortran_and_nonfinite(tmp_path):
    """quantize of a big-endian Fortran-ordered member and of a member full of NaN/inf equals the in-memory
    result, special blocks included."""
    be = np.asfortranarray(BASE[:, :40].astype(">f4"))
    special = NONFINITE["some_blocks"]
    np.savez(tmp_path / "in.npz", be=be, special=special)
    r = run(
        "quantize", "in.npz", "q.npz", "--format", "mxfp8_e5m2", "--block-size", "8", "--chunk-mb", "1", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert_same_mx(
        nk.load_blocks(tmp_path / "q.npz", name="be"), nk.quantize_mx(native(be), "mxfp8_e5m2", block_size=8)
    )
    got = nk.load_blocks(tmp_path / "q.npz", name="special")
    codes, scales = quantize_mx_ref(special, "mxfp8_e5m2", 8, "floor")
    assert_same_bits(got.codes, codes)
    assert_same_bits(got.scales.view(np.uint8), scales)


def test_cli_cast_big_endian_integers(tmp_path):
    """cast of a big-endian int16 .npy equals ml_dtypes on the native values."""
    x = np.arange(-300, 300, 7, dtype=">i2")
    np.save(tmp_path / "i.npy", x)
    r = run("cast", "i.npy", "o.npy", "--to", "bfloat16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), bits(ml_cast(native(x), "bfloat16")))


def test_cli_quantize_huge_block_size(tmp_path):
    """--block-size beyond int64: one block per row, or status 2 and one line naming the block size; never a
    traceback."""
    np.save(tmp_path / "x.npy", X_MX)
    r = run("quantize", "x.npy", "q.npz", "--format", "mxint8", "--block-size", str(10**20), cwd=tmp_path, check=False)
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
    if r.returncode == 0:
        got = nk.load_blocks(tmp_path / "q.npz")
        want = nk.quantize_mx(X_MX, "mxint8", block_size=40)
        assert_same_bits(got.codes, want.codes)
        assert_same_bits(got.scales.view(np.uint8), want.scales.view(np.uint8))
        return
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and re.search("block.size", r.stderr), r.stderr
    assert not (tmp_path / "q.npz").exists()


def test_cli_dequantize_corrupt_metadata(tmp_path):
    """dequantize of a block file with an unsupported version: status 2, one line, no output."""
    write_mx(tmp_path / "v9.npz", meta=meta_with(version=9))
    r = run("dequantize", "v9.npz", "o.npy", cwd=tmp_path, check=False)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "block file version 9 is not supported" in lines[0], r.stderr
    assert not (tmp_path / "o.npy").exists()


def test_cli_promote_timedelta(tmp_path):
    """promote of timedelta64 and int8 is the 'unexpected dtype' error, as for complex64."""
    r = run("promote", "timedelta64", "int8", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "unexpected dtype" in r.stderr and r.stdout == "", (r.returncode, r.stdout, r.stderr)


def test_only_user_errors_are_one_line(tmp_path, monkeypatch, capsys):
    """The command line turns the package's own errors (NeuronKernelsError, OSError) into one line
    and exit status 2; anything else is a bug of the package and keeps its traceback (exit 1)."""
    import pytest

    from neuron_kernels import cli
    from neuron_kernels.cli.commands import COMMANDS

    np.save(tmp_path / "x.npy", np.ones(8, np.float32))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["cast", "x.npy", "y.npy", "--to", "float9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown dtype 'float9'" in err

    def broken(*args, **kwargs):
        raise ValueError("a bug inside the package")

    monkeypatch.setitem(COMMANDS, "cast", broken)
    with pytest.raises(ValueError, match="a bug inside the package"):
        cli.main(["cast", "x.npy", "y.npy", "--to", "bfloat16"])
    assert not (tmp_path / "y.npy").exists()


def test_a_closed_stdout_ends_the_command_quietly(tmp_path):
    """A reader that stops early (``neuron-kernels ... | head``): status 141, as a shell reports
    SIGPIPE, nothing on stderr (the output was complete; the summary had nowhere to go). A process
    of its own: the pipe's reader is closed before the command writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "neuron_kernels", "formats"], stdout=write, stderr=subprocess.PIPE,
                           text=True, cwd=tmp_path)  # fmt: skip
    finally:
        os.close(write)
    assert r.returncode == 141 and r.stderr == "", r.stderr
