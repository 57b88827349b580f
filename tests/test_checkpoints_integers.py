"""compressed-tensors' integer checkpoints read (docs/integers.md): llm-compressor's own W4A16,
W4A16_ASYM, W8A16, W3A16 and W8A8 against compressed-tensors' decompression and the slow
references, the older padded packing, act-order's g_idx, the command on them, and the files it
refuses."""

from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from tests.checkpoint_helpers import read_safetensors, write_safetensors
from tests.cli_runner import run
from tests.reference_integers import (
    ct_dequantize_ref,
    ct_pack_dense,
    ct_pack_padded,
    ct_pack_zero_points,
    ct_quantize_ref,
    ct_unpack_dense,
    ct_unpack_zero_points,
)

BF16 = ml_dtypes.bfloat16
FIXTURES = "tests/fixtures/llmcompressor"


def open_text(path) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


#: folder -> (bits, zero points, int-quantized)
LLMCOMPRESSOR = {
    "w4a16": (4, False, False),
    "w4a16_asym": (4, True, False),
    "w8a16": (8, False, False),
    "w3a16": (3, False, False),
    "w8a8": (8, False, True),
}


@pytest.mark.parametrize("folder", list(LLMCOMPRESSOR))
def test_llm_compressor_checkpoints_read_as_the_reference_decodes_them(folder):
    """Every weight: the codes, scales and zero points unpacked by the reference, dequantised by
    the reference (in the scales' bfloat16), equal to the package's reading, 0 differing values."""
    bits, asym, plain = LLMCOMPRESSOR[folder]
    tensors, _ = read_safetensors(f"{FIXTURES}/{folder}/model.safetensors")
    arrays = nk.load_checkpoint(f"{FIXTURES}/{folder}")
    read = {n: a for n, a in arrays.items() if isinstance(a, nk.BlockArray)}
    assert len(read) == 7
    for name, q in read.items():
        base = name[: -len(".weight")]
        out, cols = q.shape
        codes = tensors[f"{base}.weight"] if plain else ct_unpack_dense(tensors[f"{base}.weight_packed"], bits, cols)
        scale = tensors[f"{base}.weight_scale"]
        zp = ct_unpack_zero_points(tensors[f"{base}.weight_zero_point"], bits, out) if asym else None
        size = None if plain else 32
        assert q.fmt == f"int{bits}_{'channel' if plain else 'group'}{'_asym' if asym else ''}"
        np.testing.assert_array_equal(q.integer_codes(), codes)
        want = ct_dequantize_ref(codes, scale, zp, size)
        np.testing.assert_array_equal(q.dequantize("bfloat16").view(np.uint16), want.view(np.uint16), err_msg=name)


@pytest.mark.parametrize("folder", list(LLMCOMPRESSOR))
def test_llm_compressor_checkpoints_read_as_compressed_tensors_decompresses_them(folder):
    """compressed-tensors' own decompressor (its pack-quantized / int-quantized compressor, run
    here) gives every weight the package's values, 0 differing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    config = json.loads(open_text(f"{FIXTURES}/{folder}/config.json"))["quantization_config"]
    scheme = QuantizationScheme(**config["config_groups"]["group_0"])
    packed = config["format"] == "pack-quantized"
    compressor = PackedQuantizationCompressor if packed else IntQuantizationCompressor
    state = load_file(f"{FIXTURES}/{folder}/model.safetensors")
    arrays = nk.load_checkpoint(f"{FIXTURES}/{folder}")
    compared = 0
    for name, q in arrays.items():
        if not isinstance(q, nk.BlockArray):
            continue
        base = name[: -len(".weight")]
        params = {k[len(base) + 1 :]: v for k, v in state.items() if k.startswith(base + ".")}
        theirs = compressor.decompress(params, scheme)["weight"]
        np.testing.assert_array_equal(q.dequantize("bfloat16").view(np.int16), theirs.view(torch.int16).numpy())
        compared += theirs.numel()
    assert compared == 40960


def _integer_checkpoint(folder, weights: dict, config_weights: dict, version: str | None = "0.19.0", **extra):
    """A compressed-tensors checkpoint of ``weights`` (name -> tensors of a module) with one group."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(open_text("tests/fixtures/modelopt/bf16/config.json"))
    group = {"targets": ["Linear"], "weights": {"type": "int", "dynamic": False, **config_weights}, "format": None}
    qc = {"quant_method": "compressed-tensors", "format": extra.get("format", "pack-quantized"),
          "config_groups": {"group_0": group}, "ignore": []}  # fmt: skip
    if version is not None:
        qc["version"] = version
    config["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", weights)
    return folder


def _module(w: np.ndarray, bits: int, size: int | None, asym: bool, packing=ct_pack_dense, g_idx=None) -> dict:
    q, s, z = ct_quantize_ref(w, bits, size, not asym, "bfloat16")
    out = {"weight_packed": packing(q, bits), "weight_scale": s, "weight_shape": np.array(w.shape, np.int64)}
    if asym:  # along the output dimension, in the same packing as the codes
        dense = packing is ct_pack_dense
        out["weight_zero_point"] = ct_pack_zero_points(z, bits) if dense else np.ascontiguousarray(packing(z.T, bits).T)
    if g_idx is not None:
        out["weight_g_idx"] = g_idx
    return out, (q, s, z)


@pytest.mark.parametrize("bits", [3, 5, 6, 7])
def test_the_padded_packing_of_earlier_releases_is_read(tmp_path, bits):
    """3, 5, 6 and 7-bit codes (and zero points) packed 32 // b to a word (compressed-tensors
    before 0.19), told apart from the dense packing by their width."""
    w = np.random.default_rng(bits).standard_normal((8, 64)).astype(BF16)
    tensors, (q, s, z) = _module(w, bits, 32, True, ct_pack_padded)
    folder = _integer_checkpoint(
        tmp_path / "ckpt",
        {f"model.layers.0.mlp.down_proj.{k}": v for k, v in tensors.items()},
        {"num_bits": bits, "strategy": "group", "group_size": 32, "symmetric": False},
        version="0.17.0",
    )
    (got,) = [a for a in nk.load_checkpoint(folder).values() if isinstance(a, nk.BlockArray)]
    np.testing.assert_array_equal(got.integer_codes(), q)
    np.testing.assert_array_equal(
        got.dequantize("bfloat16").view(np.uint16), ct_dequantize_ref(q, s, z, 32).view(np.uint16)
    )


def test_act_order_g_idx_picks_each_columns_group(tmp_path):
    """``weight_g_idx`` (actorder group): column c dequantised with group g_idx[c]'s scale and zero
    point; the command's dequantisation writes the same values."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 64)).astype(BF16)
    g_idx = rng.permutation(np.arange(64) // 32).astype(np.int32)
    tensors, (q, s, z) = _module(w, 4, 32, True, g_idx=g_idx)
    folder = _integer_checkpoint(
        tmp_path / "ckpt",
        {f"model.layers.0.mlp.down_proj.{k}": v for k, v in tensors.items()},
        {"num_bits": 4, "strategy": "group", "group_size": 32, "symmetric": False, "actorder": "group"},
    )
    (got,) = [a for a in nk.load_checkpoint(folder).values() if isinstance(a, nk.BlockArray)]
    want = ct_dequantize_ref(q, s, z, 32, g_idx)
    assert got.group_index is not None
    np.testing.assert_array_equal(got.dequantize("bfloat16").view(np.uint16), want.view(np.uint16))
    run("dequantize", folder, tmp_path / "plain", cwd=tmp_path)
    plain, _ = read_safetensors(next((tmp_path / "plain").glob("*.safetensors")))
    np.testing.assert_array_equal(plain["model.layers.0.mlp.down_proj.weight"].view(np.uint16), want.view(np.uint16))


def test_an_integer_checkpoint_converts_to_another_format(tmp_path):
    """W4A16 -> FP8 per channel: each weight dequantised (exactly, as compressed-tensors does)
    and quantised anew, the summary saying where it came from."""
    out = run("quantize", f"{FIXTURES}/w4a16", tmp_path / "fp8", "--format", "fp8_channel", cwd=".").stdout
    assert "dequantised from int4 (pack-quantized)" in out, out
    src = nk.load_checkpoint(f"{FIXTURES}/w4a16")
    dst = nk.load_checkpoint(tmp_path / "fp8")
    name = "model.layers.0.mlp.up_proj.weight"
    assert dst[name].scales.dtype == np.float32  # the dequantised weight is float32 (bfloat16 values)
    want = nk.quantize(src[name].dequantize("float32"), "fp8_channel")
    assert np.array_equal(dst[name].codes, want.codes) and np.array_equal(dst[name].scales, want.scales)


def _corrupt(tmp_path, edit) -> tuple[int, str]:
    folder = tmp_path / "bad"
    shutil.copytree(f"{FIXTURES}/w4a16_asym", folder)
    tensors, _ = read_safetensors(folder / "model.safetensors")
    tensors = dict(tensors)
    config = json.loads(open_text(folder / "config.json"))
    edit(tensors, config["quantization_config"])
    write_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps(config))
    r = run("dequantize", folder, tmp_path / "out", cwd=tmp_path, check=False)
    doctor = run("check", folder, cwd=tmp_path, check=False)  # the doctor names it as a finding
    assert doctor.returncode in (1, 2), doctor
    return r.returncode, r.stderr


M = "model.layers.0.mlp.down_proj"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t, c: t.__setitem__(f"{M}.weight_packed", t[f"{M}.weight_packed"][:, :-1].copy()), "weight_packed"),
        (lambda t, c: t.__setitem__(f"{M}.weight_scale", t[f"{M}.weight_scale"].astype(np.int32)), "weight_scale"),
        (lambda t, c: t.__setitem__(f"{M}.weight_shape", np.array([64, 100], np.int64)), "weight_packed"),
        (lambda t, c: t.__setitem__(f"{M}.weight_shape", np.array([64.0, 128.0], np.float32)), "weight_shape"),
        (lambda t, c: t.pop(f"{M}.weight_shape"), "weight_shape"),
        (lambda t, c: t.pop(f"{M}.weight_zero_point"), "weight_zero_point"),
        (lambda t, c: t.__setitem__(f"{M}.weight_zero_point", np.zeros((8, 3), np.int32)), "weight_zero_point"),
        (lambda t, c: t.__setitem__(f"{M}.weight_g_idx", np.full(128, 9, np.int32)), "g_idx"),
        (lambda t, c: t.__setitem__(f"{M}.weight_g_idx", np.zeros(5, np.int32)), "g_idx"),
        (lambda t, c: c["config_groups"]["group_0"]["weights"].update(symmetric=True), "symmetrically"),
        (lambda t, c: c["config_groups"]["group_0"]["weights"].update(num_bits=9), "9 bits"),
        (lambda t, c: c["config_groups"]["group_0"]["weights"].update(strategy="block"), "strategy"),
        (lambda t, c: c["config_groups"]["group_0"]["weights"].update(group_size=0), "group_size"),
    ],
    ids=[
        "short-words", "scale-dtype", "shape-columns", "shape-dtype", "no-shape", "no-zero-points", "zero-point-shape",
        "g_idx-range", "g_idx-length", "zero-points-but-symmetric", "bits", "strategy", "group-size",
    ],
)  # fmt: skip
def test_inconsistent_integer_checkpoints_are_refused_in_one_line(tmp_path, edit, message):
    status, err = _corrupt(tmp_path, edit)
    assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, (status, err)
    assert "Traceback" not in err


def test_a_width_both_packings_give_without_a_version_is_refused(tmp_path):
    """7-bit codes of 5 columns fill two words densely and as four to a word alike, placed
    differently: without the config's version the package does not guess."""
    w = np.random.default_rng(2).standard_normal((4, 5)).astype(BF16)
    tensors, _ = _module(w, 7, None, False, ct_pack_padded)
    folder = _integer_checkpoint(
        tmp_path / "ckpt",
        {f"model.layers.0.mlp.down_proj.{k}": v for k, v in tensors.items()},
        {"num_bits": 7, "strategy": "channel", "group_size": None, "symmetric": True},
        version=None,
    )
    r = run("dequantize", folder, tmp_path / "out", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "does not guess" in r.stderr, r.stderr


def test_quantize_state_dict_writes_what_llm_compressor_writes():
    """In memory (``quantize_state_dict``): the tensors of llm-compressor's W4A16_ASYM in groups of
    32, byte for byte, and its config group's group size."""
    tensors, _ = read_safetensors("tests/fixtures/modelopt/bf16/model.safetensors")
    config = json.loads(open_text("tests/fixtures/modelopt/bf16/config.json"))
    out, qc = nk.quantize_state_dict(tensors, "int4_group_asym", config=config, block_size=32)
    theirs, _ = read_safetensors(f"{FIXTURES}/w4a16_asym/model.safetensors")
    assert set(out) == set(theirs)
    for name, value in theirs.items():
        assert np.asarray(out[name]).tobytes() == value.tobytes(), name
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 32
