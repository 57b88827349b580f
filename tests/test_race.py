"""``scripts/race.py`` (docs/performance.md, "The conversion race") keeps working: on a tiny
checkpoint of the Llama's layout, without the peer, it makes its inputs (bfloat16 and fine-grained
FP8), times ``cat`` and the command for each format (with and without statistics), and the command's outputs are the
checkpoints the command writes (read back by the package)."""

import subprocess
import sys
from pathlib import Path

import neuron_kernels as nk

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "race.py"


def test_the_race_runs_on_a_tiny_checkpoint(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--layers", "1", "--hidden", "256", "--intermediate", "512",
         "--vocab", "512", "--repeat", "1", "--formats", "nvfp4,fp8_channel", "--no-stats"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    names = [" ".join(row[3:-3]) for row in rows]  # after "bf16 (0.01 GB)"
    assert names == ["cat", "neuron-kernels nvfp4", "neuron-kernels nvfp4 --no-stats", "neuron-kernels fp8_channel",
                     "neuron-kernels fp8_channel --no-stats", "cat", "neuron-kernels nvfp4",
                     "neuron-kernels nvfp4 --no-stats"]  # fmt: skip
    assert all(float(row[-3]) >= 0 and float(row[-1]) > 0 for row in rows), r.stdout  # seconds, peak MB
    fp8 = nk.load_checkpoint(tmp_path / "llama-1x256-fp8")
    assert fp8["model.layers.0.mlp.up_proj.weight"].fmt == "fp8_block"
    for kind in ("bf16", "fp8"):
        out = nk.load_checkpoint(tmp_path / f"out-{kind}-nvfp4")
        assert out["model.layers.0.mlp.down_proj.weight"].fmt == "nvfp4", kind


def test_the_gguf_race_runs_on_a_tiny_file(tmp_path):
    """``scripts/race_gguf.py`` on a tiny file: its rows, and outputs the package reads back."""
    script = SCRIPT.parent / "race_gguf.py"
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--layers", "1", "--hidden", "256", "--intermediate", "512",
         "--vocab", "512", "--repeat", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    names = [" ".join(row[3:-3]) for row in rows]  # after "NAME.gguf (0.01 GB)"
    assert names == ["cat", "neuron-kernels nvfp4", "neuron-kernels nvfp4 --no-stats", "neuron-kernels mxfp4_e2m1",
                     "neuron-kernels mxfp4_e2m1 --no-stats"]  # fmt: skip
    assert all(float(row[-3]) >= 0 and float(row[-1]) > 0 for row in rows), r.stdout
    out = nk.load_checkpoint(tmp_path / "out-nvfp4.gguf")
    assert out["blk.0.ffn_down.weight"].fmt == "nvfp4"
