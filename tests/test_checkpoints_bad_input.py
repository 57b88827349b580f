"""Checkpoints against bad input: each case is one line on stderr and exit status 2 (no traceback,
nothing under the output's name, the input untouched), or a stated decision in the summary.

A full disk is simulated with a file size limit in the child (``RLIMIT_FSIZE``, SIGXFSZ ignored, so
that a write past the limit fails with EFBIG).
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from .checkpoint_helpers import read_dir
from .cli_runner import run
from .command_checks import fails

BF16 = np.dtype(ml_dtypes.bfloat16)


def make(folder, tensors: dict, index: dict | None = None, shard="model.safetensors"):
    folder.mkdir()
    save_file(tensors, folder / shard, metadata={"format": "pt"})
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return folder


@pytest.fixture
def w(tmp_path):
    return {"a.weight": np.ones((32, 64), BF16), "b.weight": np.ones((8, 32), BF16)}


Q = ("quantize", "--format", "mxfp8_e4m3")


def q(src, dst, *extra):
    # the synthetic checkpoints here have no config.json: --only says what to quantise
    return ("quantize", src, dst, "--format", "mxfp8_e4m3", "--only", "*", *extra)


def test_missing_shard_and_missing_tensor(tmp_path, w):
    make(tmp_path / "m1", w, {"a.weight": "model.safetensors", "b.weight": "model-2.safetensors"})
    fails(*q("m1", "o"), cwd=tmp_path, message="model-2.safetensors: missing")
    make(tmp_path / "m2", w, {"a.weight": "model.safetensors", "c.weight": "model.safetensors"})
    fails(*q("m2", "o"), cwd=tmp_path, message="names tensor 'c.weight' in model.safetensors, which does not hold it")


def test_truncated_corrupt_and_overclaiming_shards(tmp_path, w):
    good = make(tmp_path / "good", w)
    raw = (good / "model.safetensors").read_bytes()
    (tmp_path / "trunc").mkdir()
    (tmp_path / "trunc" / "model.safetensors").write_bytes(raw[:-100])
    fails(*q("trunc", "o"), cwd=tmp_path, message="truncated file")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    fails(*q("junk", "o"), cwd=tmp_path, message="its header is not JSON")
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + raw[8:])
    fails(*q("huge", "o"), cwd=tmp_path, message="its header claims 1000000000000 bytes")
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["a.weight"]["shape"] = [320, 64]  # more than its byte range
    fake = json.dumps(header).encode()
    (tmp_path / "shape").mkdir()
    (tmp_path / "shape" / "model.safetensors").write_bytes(len(fake).to_bytes(8, "little") + fake + raw[8 + n :])
    fails(*q("shape", "o"), cwd=tmp_path, message="does not fit shape (320, 64)")
    (tmp_path / "empty").mkdir()
    fails(*q("empty", "o"), cwd=tmp_path, message="holds no .safetensors files")


def test_names_that_lead_outside(tmp_path, w):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file(w, outside / "model.safetensors")
    make(tmp_path / "up", w, {"a.weight": "../elsewhere/model.safetensors"})
    fails(*q("up", "o"), cwd=tmp_path, message="points outside the checkpoint folder")
    make(tmp_path / "abs", w, {"a.weight": str(outside / "model.safetensors")})
    fails(*q("abs", "o"), cwd=tmp_path, message="points outside the checkpoint folder")
    link = make(tmp_path / "link", w, {"a.weight": "sub/model.safetensors"})
    os.symlink(outside, link / "sub")
    fails(*q("link", "o"), cwd=tmp_path, message="leads outside the checkpoint folder (a symlink)")
    np.savez  # noqa: B018 - the npz layout refuses member names that climb out of the file
    make(tmp_path / "climb", {"../../x.weight": np.ones((4, 32), BF16)})
    fails(*q("climb", "o.npz", "--layout", "npz"), cwd=tmp_path, message="would make a file member outside the file")


def test_outputs_that_would_touch_the_input(tmp_path, w):
    make(tmp_path / "m", w)
    fails(*q("m", "m/out"), cwd=tmp_path, message="lies inside the input folder")
    fails(*q("m", "m", "--force"), cwd=tmp_path, message="is also the input")
    fails(*q("..", "x"), cwd=tmp_path / "m", message="lies inside the input folder")
    fails(*q("m", ".", "--force"), cwd=tmp_path, message="lies inside the input folder m (or holds it)")
    (tmp_path / "taken").mkdir()
    fails(*q("m", "taken"), cwd=tmp_path, message="exists; pass --force")


def test_wrong_options_for_a_layout(tmp_path, w):
    make(tmp_path / "m", w)
    fails(
        "quantize",
        "m",
        "o",
        "--format",
        "mxfp8_e4m3",
        "--layout",
        "mxfp4",
        cwd=tmp_path,
        message="the mxfp4 layout stores mxfp4_e2m1, not mxfp8_e4m3",
    )
    fails(*q("m", "o", "--block-size", "16"), cwd=tmp_path, message="need --layout npz")
    fails(*q("m", "o", "--axis", "0"), cwd=tmp_path, message="--axis must be -1")
    fails("quantize", "m", "o", "--format", "nvfp4", "--rht", cwd=tmp_path, message="has no place for a rotation")
    fails(*q("m", "o", "--max-shard-size", "lots"), cwd=tmp_path, message="invalid size 'lots'")
    fails(*q("m", "o.npz", "--layout", "npz", "--name", "a.weight"), cwd=tmp_path, message="--only / --ignore")


def test_quantised_and_plain_inputs_in_the_wrong_command(tmp_path, w):
    make(tmp_path / "m", w)
    assert run(*q("m", "q"), cwd=tmp_path).returncode == 0
    # a quantised checkpoint into the same layout and format: converted, its bytes copied
    assert "2 converted exactly (codes copied)" in run(*q("q", "qq"), cwd=tmp_path).stdout
    assert read_dir(tmp_path / "qq")[0].keys() == read_dir(tmp_path / "q")[0].keys()
    for name, value in read_dir(tmp_path / "q")[0].items():
        assert read_dir(tmp_path / "qq")[0][name].tobytes() == value.tobytes(), name
    fails("dequantize", "m", "d", cwd=tmp_path, message="not a quantised checkpoint")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization_config"]["format"] = "sparse-24-bitmask"  # a compressed-tensors format not read
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    fails("dequantize", "q", "d", cwd=tmp_path, message="is not one this package reads")
    (tmp_path / "q" / "config.json").write_text("{not json")
    fails("dequantize", "q", "d", cwd=tmp_path, message="cannot read it as JSON")


def test_kept_tensors_are_stated(tmp_path):
    tensors = {
        "odd.weight": np.ones((4, 48), BF16),
        "ints.weight": np.ones((4, 64), np.int32),
        "ok.weight": np.ones((4, 64), BF16),
    }
    make(tmp_path / "m", tensors)
    r = run(*q("m", "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "last axis 48 is not a multiple of the block size 32" in r.stdout
    assert "int32 (not a float)" in r.stdout
    assert "1 tensor(s) quantised, 2 kept" in r.stdout


def _file_size_limit(nbytes):
    def set_limit():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return set_limit


@pytest.mark.parametrize("layout", ["compressed-tensors", "npz"])
def test_full_disk_leaves_nothing(tmp_path, layout):
    """A write that fails for want of room: one line, exit 2, no output and no partial folder."""
    rng = np.random.default_rng(0)
    make(tmp_path / "m", {f"l{i}.weight": rng.standard_normal((256, 1024)).astype(BF16) for i in range(4)})
    out = "o.npz" if layout == "npz" else "o"
    fails(
        *q("m", out, "--layout", layout, "--chunk-mb", "1"),
        cwd=tmp_path,
        message="writing failed (File too large); no output was written",
        preexec=_file_size_limit(300_000),
    )


def test_a_compressed_tensors_checkpoint_that_is_not_what_its_config_says(tmp_path):
    """Tensors no quantised weight claims: a runtime would report an unexpected key; the package
    refuses. A Linear the config quantises stored plain (a runtime would initialise it at random):
    read, and reported by ``check``; the same ignored by the config: clean."""
    from safetensors.numpy import load_file

    rng = np.random.default_rng(4)
    (tmp_path / "m").mkdir()
    t = {f"l.{p}.weight": rng.standard_normal((32, 64)).astype(BF16) for p in ("o_proj", "down_proj")}
    save_file(t, tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "config.json").write_text("{}")
    assert run("quantize", "m", "q", "--format", "mxfp4_e2m1", "--only", "*", cwd=tmp_path).returncode == 0
    stored = load_file(tmp_path / "q" / "model.safetensors")
    config = json.loads((tmp_path / "q" / "config.json").read_text())

    def variant(name, tensors, ignore=()):
        (tmp_path / name).mkdir()
        save_file(tensors, tmp_path / name / "model.safetensors")
        qc = dict(config["quantization_config"], ignore=list(ignore))
        (tmp_path / name / "config.json").write_text(json.dumps(dict(config, quantization_config=qc)))

    variant("stray", stored | {"l.o_proj.input_scale": np.ones(1, np.float32)})
    fails("dequantize", "stray", "o", cwd=tmp_path, message="l.o_proj.input_scale belongs to no quantised weight")
    plain = {k: v for k, v in stored.items() if not k.startswith("l.down_proj.")} | {
        "l.down_proj.weight": t["l.down_proj.weight"]
    }
    variant("plain", plain)  # readable (its values are what they are), but a runtime would load it wrong
    assert run("dequantize", "plain", "o", cwd=tmp_path).returncode == 0
    r = run("check", "plain", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "quantises l.down_proj (a Linear not in ignore)" in r.stdout, r.stdout
    variant("ignored", plain, ignore=["re:.*down_proj$"])
    assert run("dequantize", "ignored", "o2", cwd=tmp_path).returncode == 0
    assert run("check", "ignored", cwd=tmp_path).returncode == 0
