"""Checkpoints: a sharded checkpoint quantised into each layout, read back, decoded and dequantised.

The decoder (``tests/checkpoint_helpers.py``) is written from the layouts' description alone (E2M1
table, nibble order, e8m0 and float8_e4m3fn scales, compressed-tensors' ``w = fp4 * scale /
global_scale``), not from the package's code; every quantised weight must carry the codes and
scales of the in-memory ``nk.quantize`` bit for bit, and every other tensor its own bytes and dtype.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import neuron_kernels as nk
from neuron_kernels import BlockArray
from neuron_kernels.checkpoints import DEFAULT_EXCLUDES, tensor_decision

from .checkpoint_helpers import BF16, bits, decode_ct, decode_gptoss, read_dir
from .cli_runner import run

# ---- a synthetic checkpoint ---------------------------------------------------------------------------


def tensors_of_a_model(rng) -> dict[str, np.ndarray]:
    def w(*shape, dtype=BF16):
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 4, shape[:-1] + (1,)))
        return x.astype(dtype)

    return {
        "model.embed_tokens.weight": w(96, 64),
        "model.layers.0.input_layernorm.weight": w(64),
        "model.layers.0.self_attn.q_proj.weight": w(64, 64),
        "model.layers.0.self_attn.q_proj.bias": w(64),
        "model.layers.0.self_attn.o_proj.weight": w(64, 64, dtype=np.float32),
        "model.layers.0.mlp.gate.weight": w(4, 64),
        "model.layers.0.mlp.router.weight": w(4, 64),
        "model.layers.0.mlp.experts.down.weight": w(2, 32, 96),
        "model.layers.0.mlp.up_proj.weight": w(96, 64, dtype=np.float16),
        "model.layers.0.mlp.odd_proj.weight": w(64, 40),
        "model.layers.1.self_attn.k_proj.weight": w(32, 64),
        "model.rotary.inv_freq": np.arange(8, dtype=np.int32),
        "lm_head.weight": w(96, 64),
    }


#: The Linear weights of a Llama among them (config.json says llama): the router-like, expert and
#: odd names are no module of a Llama and are kept, as is the output head.
QUANTISED = {
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A checkpoint of two shards with an index, a config and a tokenizer file."""
    d = tmp_path_factory.mktemp("ckpt")
    src = d / "model"
    src.mkdir()
    t = tensors_of_a_model(np.random.default_rng(0))
    names = list(t)
    shards = {"model-00001-of-00002.safetensors": names[:6], "model-00002-of-00002.safetensors": names[6:]}
    for fname, keys in shards.items():
        save_file({k: t[k] for k in keys}, src / fname, metadata={"format": "pt"})
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (src / "tokenizer.json").write_text('{"version": "1.0"}')
    (src / "original").mkdir()  # a folder: not copied, and said so
    return d, t


LAYOUTS = [
    ("compressed-tensors", "nvfp4"),
    ("compressed-tensors", "mxfp4_e2m1"),
    ("compressed-tensors", "mxfp8_e4m3"),
]  # the gpt-oss layout ("mxfp4") holds experts only: tests/test_checkpoints_gptoss.py
IDS = ["ct-nvfp4", "ct-mxfp4", "ct-mxfp8"]


def expected_tensors(layout: str, fmt: str, name: str, shape: tuple) -> dict[str, tuple[str, tuple]]:
    """The tensors the layout's description gives a quantised NAME.weight of ``shape``: name -> (dtype, shape)."""
    *lead, out, inn = shape
    lead = tuple(lead)
    base = name[: -len(".weight")]
    if fmt == "nvfp4":
        return {
            f"{base}.weight_packed": ("uint8", lead + (out, inn // 2)),
            f"{base}.weight_scale": ("float8_e4m3fn", lead + (out, inn // 16)),
            f"{base}.weight_global_scale": ("float32", (1,)),
        }
    if fmt == "mxfp4_e2m1":
        return {
            f"{base}.weight_packed": ("uint8", lead + (out, inn // 2)),
            f"{base}.weight_scale": ("uint8", lead + (out, inn // 32)),
        }
    return {
        f"{base}.weight": ("float8_e4m3fn", lead + (out, inn)),
        f"{base}.weight_scale": ("uint8", lead + (out, inn // 32)),
    }


@pytest.fixture(scope="module")
def written(ckpt):
    """Each layout written once by the command (small shards, so that there are several)."""
    d, _ = ckpt
    outs = {}
    for (layout, fmt), key in zip(LAYOUTS, IDS):
        r = run("quantize", "model", key, "--layout", layout, "--format", fmt, "--max-shard-size", "40KB", cwd=d)
        outs[key] = (d / key, r.stdout)
    return outs


@pytest.mark.parametrize("layout, fmt", LAYOUTS, ids=IDS)
def test_layout_names_dtypes_shapes_and_values(ckpt, written, layout, fmt):
    d, t = ckpt
    key = IDS[LAYOUTS.index((layout, fmt))]
    out, stdout = written[key]
    got, where = read_dir(out)
    want_names = set()
    for name, x in t.items():
        if name not in QUANTISED:
            want_names.add(name)
            assert got[name].dtype == x.dtype and got[name].shape == x.shape, name
            np.testing.assert_array_equal(bits(got[name]), bits(x), err_msg=name)  # copied bit for bit
            continue
        expect = expected_tensors(layout, fmt, name, x.shape)
        want_names |= set(expect)
        for tname, (dtype, shape) in expect.items():
            assert (got[tname].dtype.name, got[tname].shape) == (dtype, shape), tname
        assert len({where[n] for n in expect}) == 1, "a weight's tensors share one shard"
        q = nk.quantize(x, fmt)
        base = name[: -len(".weight")]
        codes = got[f"{base}.weight" if fmt == "mxfp8_e4m3" else f"{base}.weight_packed"]
        np.testing.assert_array_equal(codes.view(np.uint8), q.codes)
        np.testing.assert_array_equal(got[f"{base}.weight_scale"].view(np.uint8), q.scales.view(np.uint8))
        if fmt == "nvfp4":
            gs = got[f"{base}.weight_global_scale"]
            assert bits(gs)[0] == bits(np.float32(1) / np.float32(q.per_tensor_scale))
        values = decode_ct(got, base, fmt)
        ref = q.dequantize()
        if fmt == "nvfp4":  # s / global_scale against the package's P * (pts * s): within an ulp
            np.testing.assert_allclose(values, ref, rtol=2**-22, atol=0)
        else:
            np.testing.assert_array_equal(bits(values), bits(ref), err_msg=name)
        assert name in stdout and f"{nk.quantization_error(x, q).sqnr_db:.2f}" in stdout
    assert set(got) == want_names
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == where and len(set(where.values())) > 1
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in got.values())
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}' and not (out / "original").exists()
    assert "not copied: original/" in stdout


@pytest.mark.parametrize("layout, fmt", LAYOUTS, ids=IDS)
def test_layout_config(ckpt, written, layout, fmt):
    out, _ = written[IDS[LAYOUTS.index((layout, fmt))]]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 64
    qc = config["quantization_config"]
    # the head, and the weights of no module of a Llama (listed, so that no runtime quantises them)
    kept = ["model.layers.0.mlp.gate", "model.layers.0.mlp.router", "model.layers.0.mlp.experts.down",
            "model.layers.0.mlp.odd_proj", "lm_head"]  # fmt: skip
    names = {"nvfp4": "nvfp4-pack-quantized", "mxfp4_e2m1": "mxfp4-pack-quantized", "mxfp8_e4m3": "mxfp8-quantized"}
    assert (qc["quant_method"], qc["format"], qc["quantization_status"]) == (
        "compressed-tensors",
        names[fmt],
        "compressed",
    )
    assert qc["ignore"] == kept
    (group,) = qc["config_groups"].values()
    assert group["targets"] == ["Linear"] and group.get("input_activations") is None
    w = group["weights"]
    nv = fmt == "nvfp4"
    assert (w["num_bits"], w["type"], w["symmetric"], w["dynamic"]) == (4 if "fp4" in fmt else 8, "float", True, False)
    assert (w["strategy"], w["group_size"], w["scale_dtype"]) == (
        ("tensor_group", 16, "torch.float8_e4m3fn") if nv else ("group", 32, "torch.uint8")
    )


@pytest.mark.parametrize("layout, fmt", LAYOUTS, ids=IDS)
def test_dequantize_back_to_a_plain_checkpoint(ckpt, written, layout, fmt):
    d, t = ckpt
    key = IDS[LAYOUTS.index((layout, fmt))]
    run("dequantize", key, f"{key}.bf16", cwd=d)
    got, _ = read_dir(d / f"{key}.bf16")
    assert set(got) == set(t)
    for name, x in t.items():
        if name in QUANTISED:
            want = nk.quantize(x, fmt).dequantize("bfloat16")
            assert got[name].dtype == BF16 and got[name].shape == x.shape
            np.testing.assert_array_equal(bits(got[name]), bits(want), err_msg=name)
        else:
            np.testing.assert_array_equal(bits(got[name]), bits(x), err_msg=name)
    config = json.loads((d / f"{key}.bf16" / "config.json").read_text())
    assert config == {"model_type": "llama", "hidden_size": 64}
    assert (d / f"{key}.bf16" / "tokenizer.json").exists()


@pytest.mark.parametrize("layout, fmt", LAYOUTS, ids=IDS)
def test_load_checkpoint_gives_block_arrays(ckpt, written, layout, fmt):
    _, t = ckpt
    out, _ = written[IDS[LAYOUTS.index((layout, fmt))]]
    loaded = nk.load_checkpoint(out)
    assert set(loaded) == set(t)
    for name, x in t.items():
        if name in QUANTISED:
            got, want = loaded[name], nk.quantize(x, fmt)
            assert isinstance(got, BlockArray)
            assert (got.fmt, got.shape, got.block_size, got.per_tensor_scale) == (
                want.fmt, want.shape, want.block_size, want.per_tensor_scale,
            )  # fmt: skip
            np.testing.assert_array_equal(got.codes, want.codes)
            np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
        else:
            np.testing.assert_array_equal(bits(loaded[name]), bits(x))


@pytest.mark.parametrize("fmt", ["fp8_channel", "int4_group_asym"])
def test_npz_layout_of_float_scales_and_zero_points(ckpt, fmt, tmp_path):
    """The npz layout of a format with float scales (their bits stored as unsigned integers) and of
    one with zero points: the command dequantises and checks the file as quantised in memory."""
    d, t = ckpt
    run("quantize", d / "model", "q.npz", "--layout", "npz", "--format", fmt, "--no-stats", cwd=tmp_path)
    run("dequantize", "q.npz", "back", "--dtype", "float32", cwd=tmp_path)
    got, _ = read_dir(tmp_path / "back")
    assert got and set(got) <= set(t)
    for name in got:
        want = nk.quantize(t[name], fmt).dequantize(np.float32)
        np.testing.assert_array_equal(bits(got[name]), bits(want))
    r = run("check", "q.npz", cwd=tmp_path, check=False)
    assert r.returncode == 0 and f"{len(got)} quantised weight(s): 0 error(s), 0 warning(s)" in r.stdout, r.stdout


def test_npz_layout_and_single_file_input(ckpt, tmp_path):
    d, t = ckpt
    one = tmp_path / "one.safetensors"
    save_file({k: v for k, v in t.items()}, one)
    only = [a for p in ("*.q_proj", "*.o_proj", "*.up_proj", "*.k_proj") for a in ("--only", p)]  # no config: say
    r = run("quantize", one, "q.npz", "--layout", "npz", "--format", "nvfp4", "--scale-search", "mse", *only,
            cwd=tmp_path)  # fmt: skip
    for name in QUANTISED:
        got = nk.load_blocks(tmp_path / "q.npz", name=name)
        want = nk.quantize(t[name], "nvfp4", scale_search="mse")
        np.testing.assert_array_equal(got.codes, want.codes)
        np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
        assert got.per_tensor_scale == want.per_tensor_scale
    assert "not in the npz layout" in r.stdout
    run("dequantize", "q.npz", "back", "--dtype", "float32", cwd=tmp_path)
    got, _ = read_dir(tmp_path / "back")
    assert set(got) == QUANTISED
    for name in QUANTISED:
        want = nk.quantize(t[name], "nvfp4", scale_search="mse").dequantize()
        np.testing.assert_array_equal(bits(got[name]), bits(want))
    # a single .safetensors file into a folder layout: one shard, no index, a config of its own
    r = run("quantize", one, "ct", "--format", "mxfp8_e4m3", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "--only" in r.stderr and not (tmp_path / "ct").exists()  # no config: not guessed
    run("quantize", one, "ct", "--format", "mxfp8_e4m3", *only, cwd=tmp_path)
    assert sorted(os.listdir(tmp_path / "ct")) == ["config.json", "model.safetensors"]
    assert (
        json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["format"] == "mxfp8-quantized"
    )


def test_ignore_and_only(ckpt, tmp_path):
    d, t = ckpt
    r = run(
        "quantize", d / "model", "ig", "--format", "mxfp8_e4m3", "--ignore", "*.k_proj", "--ignore",
        "*up_proj", cwd=tmp_path,
    )  # fmt: skip
    got, _ = read_dir(tmp_path / "ig")
    assert "model.layers.1.self_attn.k_proj.weight_scale" not in got
    assert got["model.layers.1.self_attn.k_proj.weight"].dtype == BF16
    assert "--ignore *.k_proj" in r.stdout and "--ignore *up_proj" in r.stdout
    ignore = json.loads((tmp_path / "ig" / "config.json").read_text())["quantization_config"]["ignore"]
    assert {"model.layers.1.self_attn.k_proj", "model.layers.0.mlp.up_proj"} <= set(ignore)
    run(
        "quantize",
        d / "model",
        "only",
        "--format",
        "mxfp4_e2m1",
        "--only",
        "lm_head",
        "--only",
        "*q_proj*",
        cwd=tmp_path,
    )
    got, _ = read_dir(tmp_path / "only")
    assert {n for n in got if n.endswith("weight_packed")} == {
        "lm_head.weight_packed", "model.layers.0.self_attn.q_proj.weight_packed",
    }  # fmt: skip


def test_no_stats_writes_the_same_bytes(ckpt, written, tmp_path):
    """--no-stats: the same files as with the statistics, a summary without them; --require-exact
    still measures (and refuses a change); an array file job refuses the flag."""
    d, _ = ckpt
    r = run("quantize", d / "model", "ns", "--format", "nvfp4", "--max-shard-size", "40KB", "--no-stats", cwd=tmp_path)
    with_stats = written["ct-nvfp4"][0]
    assert sorted(os.listdir(tmp_path / "ns")) == sorted(os.listdir(with_stats))
    for name in os.listdir(with_stats):
        assert (tmp_path / "ns" / name).read_bytes() == (with_stats / name).read_bytes(), name
    head = r.stdout.splitlines()[1]
    assert head.split() == ["quantised", "shape", "dtype"] and "SQNR" not in r.stdout, r.stdout
    r = run("quantize", d / "model", "ex", "--format", "nvfp4", "--no-stats", "--require-exact", cwd=tmp_path,
            check=False)  # fmt: skip
    assert r.returncode == 2 and "--require-exact refuses" in r.stderr and not (tmp_path / "ex").exists()
    np.save(tmp_path / "a.npy", np.ones((4, 32), np.float32))
    r = run("quantize", "a.npy", "a.npz", "--format", "nvfp4", "--no-stats", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "--no-stats is for converting checkpoint folders" in r.stderr


def test_selection_rule():
    b = 32
    assert tensor_decision("x.weight", BF16, (64, 64), b) is None
    assert tensor_decision("x.weight", np.float64, (2, 3, 64), b) is None
    assert tensor_decision("x.weight", np.int8, (64, 64), b) == "int8 (not a float)"
    assert "float8_e4m3fn" in tensor_decision("x.weight", ml_dtypes.float8_e4m3fn, (64, 64), b)
    assert tensor_decision("x.bias", BF16, (64, 64), b) == "not a .weight"
    assert tensor_decision("x.weight", BF16, (64,), b) == "1-D"
    assert tensor_decision("x.weight", BF16, (64, 48), b) == "last axis 48 is not a multiple of the block size 32"
    for name, pattern in [
        ("model.embed_tokens.weight", "*embed*"),
        ("model.norm.weight", "*norm*"),
        ("lm_head.weight", "lm_head.*"),
        ("model.layers.3.mlp.router.weight", "*.router.*"),
        ("model.layers.3.mlp.gate.weight", "*.mlp.gate.weight"),
    ]:
        assert pattern in DEFAULT_EXCLUDES
        assert tensor_decision(name, BF16, (64, 64), b) == f"excluded by default ({pattern})"
    assert tensor_decision("model.layers.3.mlp.gate_proj.weight", BF16, (64, 64), b) is None
    assert tensor_decision("a.q.weight", BF16, (64, 64), b, ignore=("*.q",)) == "--ignore *.q"
    assert tensor_decision("lm_head.weight", BF16, (64, 64), b, only=("lm_head",)) is None
    assert tensor_decision("a.q.weight", BF16, (64, 64), b, only=("lm_head",)) == "not matched by --only"


def gptoss_checkpoint(path, rng):
    """A gpt-oss-style MXFP4 checkpoint: experts' gate_up_proj / down_proj as _blocks / _scales
    (no .weight), biases and attention in bfloat16, quant_method mxfp4."""
    e, hidden, inter = 3, 64, 32
    t = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": rng.integers(
            0, 256, (e, 2 * inter, hidden // 32, 16), dtype=np.uint8
        ),
        "model.layers.0.mlp.experts.gate_up_proj_scales": rng.integers(
            118, 130, (e, 2 * inter, hidden // 32), dtype=np.uint8
        ),
        "model.layers.0.mlp.experts.gate_up_proj_bias": rng.standard_normal((e, 2 * inter)).astype(BF16),
        "model.layers.0.mlp.experts.down_proj_blocks": rng.integers(
            0, 256, (e, hidden, inter // 32, 16), dtype=np.uint8
        ),
        "model.layers.0.mlp.experts.down_proj_scales": rng.integers(118, 130, (e, hidden, inter // 32), dtype=np.uint8),
        "model.layers.0.mlp.router.weight": rng.standard_normal((e, hidden)).astype(BF16),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((hidden, hidden)).astype(BF16),
    }
    path.mkdir()
    save_file(t, path / "model.safetensors", metadata={"format": "pt"})
    config = {
        "model_type": "gpt_oss",
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"],
        },
    }
    (path / "config.json").write_text(json.dumps(config))
    return t


def test_gpt_oss_checkpoint_dequantised_as_transformers_wants(tmp_path):
    t = gptoss_checkpoint(tmp_path / "oss", np.random.default_rng(3))
    r = run("dequantize", "oss", "oss.bf16", cwd=tmp_path)
    got, _ = read_dir(tmp_path / "oss.bf16")
    assert set(got) == {
        "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias",
        "model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.router.weight",
        "model.layers.0.self_attn.q_proj.weight",
    }  # fmt: skip
    for proj, (inn, out) in {"gate_up_proj": (64, 64), "down_proj": (32, 64)}.items():
        base = f"model.layers.0.mlp.experts.{proj}"
        decoded = decode_gptoss(t[f"{base}_blocks"], t[f"{base}_scales"])  # [E, out, in]
        want = np.swapaxes(decoded, 1, 2).astype(BF16)  # [E, in, out], as the model holds it
        assert got[base].shape == (3, inn, out) and got[base].dtype == BF16
        np.testing.assert_array_equal(bits(got[base]), bits(want))
    np.testing.assert_array_equal(
        bits(got["model.layers.0.mlp.router.weight"]), bits(t["model.layers.0.mlp.router.weight"])
    )
    config = json.loads((tmp_path / "oss.bf16" / "config.json").read_text())
    assert config == {"model_type": "gpt_oss"}
    assert "gate_up_proj" in r.stdout
    loaded = nk.load_checkpoint(tmp_path / "oss")
    block = loaded["model.layers.0.mlp.experts.down_proj"]
    assert isinstance(block, BlockArray) and block.shape == (3, 64, 32) and block.fmt == "mxfp4_e2m1"
    np.testing.assert_array_equal(
        block.dequantize(),
        decode_gptoss(
            t["model.layers.0.mlp.experts.down_proj_blocks"], t["model.layers.0.mlp.experts.down_proj_scales"]
        ),
    )
