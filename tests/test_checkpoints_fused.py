"""Fused layers share their per-tensor scale (docs/checkpoints.md, "Fused layers").

vLLM fuses q/k/v, gate/up, each expert's gate/up (w1/w3) and MLA's q_a/kv_a into one layer and
keeps one global scale for it. Its loading rules, applied here as written in its source
(vLLM 0.33.0, ``vllm/model_executor/layers/quantization/compressed_tensors/``):

- a fused Linear (``schemes/compressed_tensors_w4a4_nvfp4.py``, ``CompressedTensorsW4A4Fp4``, which
  also serves W4A16: ``process_weights_after_loading``) keeps ``weight_global_scale.max()`` over the
  shards (a warning if they differ) and dequantises every shard as ``fp4 * weight_scale / max``;
- an MoE layer (``compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py``,
  ``process_weights_after_loading``) keeps column 0 (w1, the gate) of ``w13_weight_global_scale``
  [E, 2] for both w1 and w3 of each expert; w2 keeps its own.

The checkpoint has deliberately unequal shards (``k_proj`` 8x ``q_proj``, ``up_proj`` 4x
``gate_proj``, an expert's up 4x its gate): quantised with a scale per shard, the vLLM rule gives
``k_proj`` at about 1 dB SQNR; with the shared scale every shard is as good as quantised alone.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import neuron_kernels as nk
from neuron_kernels.checkpoints import FUSED_SHARDS, fused_groups

from .checkpoint_helpers import BF16, bits, per_block, read_dir, unpack_fp4
from .cli_runner import run

L0, L1, L2 = "model.layers.0.", "model.layers.1.", "model.layers.2."


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2)))


def fused_model(rng) -> dict[str, np.ndarray]:
    def w(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain).astype(BF16)

    t = {
        "model.embed_tokens.weight": w(96, 64),
        L0 + "self_attn.q_proj.weight": w(64, 64),
        L0 + "self_attn.k_proj.weight": w(32, 64, 8.0),
        L0 + "self_attn.v_proj.weight": w(32, 64),
        L0 + "self_attn.o_proj.weight": w(64, 64, 3.0),
        L0 + "mlp.gate_proj.weight": w(96, 64),
        L0 + "mlp.up_proj.weight": w(96, 64, 4.0),
        L0 + "mlp.down_proj.weight": w(64, 96),
        # MLA (DeepSeek-V3): q_a_proj and kv_a_proj_with_mqa are one layer
        L1 + "self_attn.q_a_proj.weight": w(32, 64),
        L1 + "self_attn.kv_a_proj_with_mqa.weight": w(48, 64, 0.25),
        L1 + "self_attn.q_b_proj.weight": w(64, 32),
        L1 + "mlp.gate.weight": w(2, 64),
        L1 + "mlp.shared_experts.gate_proj.weight": w(32, 64, 2.0),
        L1 + "mlp.shared_experts.up_proj.weight": w(32, 64),
        L1 + "mlp.shared_experts.down_proj.weight": w(64, 32),
        "lm_head.weight": w(96, 64),
    }
    for e, gain in enumerate((4.0, 0.5)):  # Qwen / DeepSeek experts
        t[f"{L1}mlp.experts.{e}.gate_proj.weight"] = w(32, 64)
        t[f"{L1}mlp.experts.{e}.up_proj.weight"] = w(32, 64, gain)
        t[f"{L1}mlp.experts.{e}.down_proj.weight"] = w(64, 32)
    for e in range(2):  # Mixtral experts
        t[f"{L2}block_sparse_moe.experts.{e}.w1.weight"] = w(32, 64, 0.125)
        t[f"{L2}block_sparse_moe.experts.{e}.w3.weight"] = w(32, 64)
        t[f"{L2}block_sparse_moe.experts.{e}.w2.weight"] = w(64, 32)
    return t


#: The Linear weights of the model, by name (its config names no architecture).
ONLY = [a for p in ("*_proj", "*_proj_with_mqa", "*.w1", "*.w2", "*.w3") for a in ("--only", p)]

GROUPS = [
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
]
EXPECTED_GROUPS = (
    [tuple(L0 + m + ".weight" for m in g) for g in GROUPS]
    + [(L1 + "self_attn.q_a_proj.weight", L1 + "self_attn.kv_a_proj_with_mqa.weight")]
    + [(L1 + "mlp.shared_experts.gate_proj.weight", L1 + "mlp.shared_experts.up_proj.weight")]
    + [(f"{L1}mlp.experts.{e}.gate_proj.weight", f"{L1}mlp.experts.{e}.up_proj.weight") for e in range(2)]
    + [(f"{L2}block_sparse_moe.experts.{e}.w1.weight", f"{L2}block_sparse_moe.experts.{e}.w3.weight") for e in range(2)]
)
GROUPS_0 = tuple(L0 + m + ".weight" for m in GROUPS[0])


def test_fused_groups_from_the_table():
    t = fused_model(np.random.default_rng(0))
    groups = fused_groups(t)
    assert sorted(set(groups.values())) == sorted(EXPECTED_GROUPS)
    assert {n for g in EXPECTED_GROUPS for n in g} == set(groups)
    assert fused_groups(["a.q_proj.weight", "b.k_proj.weight"]) == {}  # siblings only
    assert fused_groups(["a.q_proj", "a.v_proj"]) == {"a.q_proj": ("a.q_proj", "a.v_proj")} | {
        "a.v_proj": ("a.q_proj", "a.v_proj")
    }
    assert ("q_proj", "k_proj", "v_proj") in FUSED_SHARDS


def dequantise(got: dict, base: str, global_scale: np.float32) -> np.ndarray:
    """compressed-tensors NVFP4 with a given global scale: fp4 * f32(weight_scale) / global_scale."""
    scale = got[f"{base}.weight_scale"].astype(np.float32) / global_scale
    return unpack_fp4(got[f"{base}.weight_packed"]) * per_block(scale, 16)


def vllm_global_scale(got: dict, group: tuple[str, ...], name: str) -> np.float32:
    """The global scale vLLM applies to the shard ``name`` of the fused ``group``."""
    scales = [got[n[: -len(".weight")] + ".weight_global_scale"][0] for n in group]
    if ".experts." in name:  # MoE: column 0 (w1 / gate) of w13_weight_global_scale
        return np.float32(scales[0])
    return np.float32(max(scales))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fused")
    t = fused_model(np.random.default_rng(5))
    (d / "model").mkdir()
    save_file(t, d / "model" / "model.safetensors", metadata={"format": "pt"})
    # layers of three architectures in one file: no model has them all, so --only names the Linears
    (d / "model" / "config.json").write_text(json.dumps({"model_type": "fused_layers_of_three_models"}))
    fused = run("quantize", "model", "fused", "--format", "nvfp4", *ONLY, cwd=d).stdout
    alone = run("quantize", "model", "alone", "--format", "nvfp4", "--no-fuse", *ONLY, cwd=d).stdout
    return d, t, fused, alone


def test_every_fused_group_shares_one_global_scale(converted):
    d, t, stdout, _ = converted
    got, _ = read_dir(d / "fused")
    for group in EXPECTED_GROUPS:
        scales = {bits(got[n[: -len(".weight")] + ".weight_global_scale"])[0] for n in group}
        assert len(scales) == 1, group
        pts = nk.shared_per_tensor_scale([t[n] for n in group])
        amax = max(float(np.max(np.abs(t[n].astype(np.float32)))) for n in group)
        assert pts == float(np.float32(amax) / (np.float32(448) * np.float32(6)))  # the rule, from its definition
        assert scales == {np.float32(np.float32(1) / np.float32(pts)).view(np.uint32)}
        for n in group:  # every shard's codes: the in-memory quantisation with the shared scale
            q = nk.quantize(t[n], "nvfp4", per_tensor_scale=pts)
            np.testing.assert_array_equal(got[n[: -len(".weight")] + ".weight_packed"], q.codes, err_msg=n)
        assert f"one per-tensor scale (fused in the runtime): {', '.join(group)}" in stdout
    o_proj = L0 + "self_attn.o_proj.weight"  # in no group: its own scale
    assert got[L0 + "self_attn.o_proj.weight_global_scale"][0] == np.float32(1) / np.float32(
        nk.quantize(t[o_proj], "nvfp4").per_tensor_scale
    )


def test_the_vllm_rule_dequantises_every_shard_well(converted):
    d, t, _, _ = converted
    fused, _ = read_dir(d / "fused")
    alone, _ = read_dir(d / "alone")
    worst_alone = np.inf
    for group in EXPECTED_GROUPS:
        for n in group:
            x, base = t[n].astype(np.float32), n[: -len(".weight")]
            own = sqnr_db(x, dequantise(alone, base, alone[f"{base}.weight_global_scale"][0]))
            shared = sqnr_db(x, dequantise(fused, base, vllm_global_scale(fused, group, n)))
            assert shared > own - 0.5 and shared > 15, (n, shared, own)  # NVFP4's usual error
            worst_alone = min(worst_alone, sqnr_db(x, dequantise(alone, base, vllm_global_scale(alone, group, n))))
    # a scale per shard, loaded by the same rule: the failure this guards against
    k = L0 + "self_attn.k_proj"
    k_alone = sqnr_db(t[k + ".weight"].astype(np.float32), dequantise(alone, k, vllm_global_scale(alone, GROUPS_0, k)))
    assert k_alone < 3 and worst_alone < 3, (k_alone, worst_alone)


def test_no_fuse_gives_each_shard_its_own_scale(converted):
    d, t, _, stdout = converted
    got, _ = read_dir(d / "alone")
    for n in GROUPS_0:
        base = n[: -len(".weight")]
        want = np.float32(1) / np.float32(nk.quantize(t[n], "nvfp4").per_tensor_scale)
        assert got[f"{base}.weight_global_scale"][0] == want
    assert "one per-tensor scale" not in stdout


def test_npz_layout_shares_the_scale_too(converted, tmp_path):
    d, t, _, _ = converted
    run("quantize", d / "model", "q.npz", "--layout", "npz", "--format", "nvfp4", *ONLY, cwd=tmp_path)
    loaded = nk.load_checkpoint(tmp_path / "q.npz")
    for group in EXPECTED_GROUPS:
        assert len({loaded[n].per_tensor_scale for n in group}) == 1, group


def test_a_fused_layer_quantised_in_part_is_refused(converted, tmp_path):
    d, _, _, _ = converted
    r = run("quantize", d / "model", "q", "--format", "nvfp4", "--ignore", "*.k_proj", *ONLY, cwd=tmp_path,
            check=False)  # fmt: skip
    assert r.returncode == 2 and "--ignore all of them or none" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "q").exists()
    ignore = ("--ignore", "model.layers.0.self_attn.*")
    r = run("quantize", d / "model", "q", "--format", "nvfp4", *ignore, *ONLY, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr  # every shard kept
    kept = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["ignore"]
    assert {L0 + "self_attn." + m for m in ("q_proj", "k_proj", "v_proj", "o_proj")} <= set(kept)


def test_shared_per_tensor_scale_in_memory():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((8, 32)).astype(np.float32), 8 * rng.standard_normal((4, 32)).astype(BF16)
    both = np.concatenate([q.ravel(), k.astype(np.float32).ravel()])
    pts = nk.shared_per_tensor_scale([q, k])
    assert pts == nk.quantize(both, "nvfp4").per_tensor_scale
    assert nk.shared_per_tensor_scale([q]) == nk.quantize(q, "nvfp4").per_tensor_scale
    assert (
        nk.shared_per_tensor_scale([q, k], scale_bound=256.0)
        == nk.quantize(both, "nvfp4", scale_bound=256.0).per_tensor_scale
    )
    with pytest.raises(ValueError, match="empty"):
        nk.shared_per_tensor_scale([])
    with pytest.raises(ValueError, match="per-tensor scale"):
        nk.shared_per_tensor_scale([q], "mxfp8_e4m3")
    with pytest.raises(TypeError, match="sequence of arrays"):
        nk.shared_per_tensor_scale(q)
