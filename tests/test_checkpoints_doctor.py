"""The checkpoint doctor (docs/checkpoints.md "The checkpoint doctor"): ``check`` on a corpus of
broken checkpoints the tests make (each finding reported, clean checkpoints of every layout and of
ModelOpt report nothing), ``--repair`` judged by vLLM's fused-scale rule applied with a decoder
written from the layout (tests/checkpoint_helpers.py), and ``diff``.

vLLM's rule (``process_weights_after_loading`` of its compressed-tensors NVFP4 schemes): a fused
layer keeps the largest of its shards' ``weight_global_scale``; ModelOpt's keeps the largest
``weight_scale_2``.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from neuron_kernels.checkpoints.doctor import check_checkpoint

from .checkpoint_helpers import decode_ct, read_dir, read_safetensors, write_safetensors
from .cli_runner import run
from .modelopt_rules import BF16, make_llama

QKV = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
GATE_UP = ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
MODELOPT = Path(__file__).parent / "fixtures" / "modelopt"


def sqnr(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    noise = ((x - y) ** 2).sum()
    return np.inf if noise == 0 else 10 * np.log10((x**2).sum() / noise)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A bfloat16 Llama whose k_proj (layer 0) is 8x and up_proj (layer 1) 10x its fused siblings,
    quantised to NVFP4 with one scale per fused layer (``good``) and with a scale per shard
    (``nofuse``: the shipped checkpoints' mistake)."""
    d = tmp_path_factory.mktemp("doctor")
    dense = make_llama(d / "llama")
    for name, factor in ((QKV[1], 8), (GATE_UP[1], 10)):
        dense[f"{name}.weight"] = (dense[f"{name}.weight"].astype(np.float32) * factor).astype(BF16)
    write_safetensors(d / "llama" / "model.safetensors", dense)
    run("quantize", "llama", "good", "--format", "nvfp4", cwd=d)
    run("quantize", "llama", "nofuse", "--format", "nvfp4", "--no-fuse", cwd=d)
    return d, dense


def broken(corpus, name, change):
    """A copy of ``good`` with its tensors changed by ``change(tensors)``."""
    d, _ = corpus
    out = d / name
    if not out.exists():
        shutil.copytree(d / "good", out)
        tensors, meta = read_safetensors(out / "model.safetensors")
        tensors = {k: np.array(v) for k, v in tensors.items()}
        change(tensors)
        write_safetensors(out / "model.safetensors", tensors, meta)
    return out


def kinds(path):
    return sorted({f.kind for f in check_checkpoint(path).findings if f.severity != "note"})


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4_e2m1", "mxfp8_e4m3", "fp8_block"])
def test_clean_checkpoints_report_nothing(corpus, fmt):
    d, _ = corpus
    out = d / f"clean-{fmt}"
    if not out.exists():
        run("quantize", "llama", out.name, "--format", fmt, cwd=d)
    r = run("check", out.name, cwd=d)
    assert r.returncode == 0 and "0 error(s), 0 warning(s)" in r.stdout, r.stdout
    assert "14 quantised weight(s)" in r.stdout


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8", "fp8", "fp8_pb_wo", "fp8_pc_pt"])
def test_modelopts_own_checkpoints_report_nothing(name):
    """ModelOpt 0.47's exports (tests/fixtures/modelopt): clean, ModelOpt named as their producer."""
    checkup = check_checkpoint(MODELOPT / name)
    assert checkup.clean, checkup.findings
    assert checkup.layout == "modelopt" and (checkup.producer or "").startswith("modelopt")


def test_fused_scales_apart_are_found_with_the_runtimes_sqnr(corpus):
    d, dense = corpus
    checkup = check_checkpoint(d / "nofuse")
    fused = [f for f in checkup.findings if f.kind == "fused-scales"]
    assert {f.tensors for f in fused} >= {tuple(f"{n}.weight" for n in QKV), tuple(f"{n}.weight" for n in GATE_UP)}
    tensors = read_dir(d / "nofuse")[0]
    for finding in fused:
        group = [t[: -len(".weight")] for t in finding.tensors]
        g = max(float(tensors[f"{m}.weight_global_scale"][0]) for m in group)  # vLLM's rule
        for m in group:
            runtime = {**tensors, f"{m}.weight_global_scale": np.array([g], np.float32)}
            own, under_rule = decode_ct(tensors, m, "nvfp4"), decode_ct(runtime, m, "nvfp4")
            expected = np.inf if np.array_equal(own, under_rule) else sqnr(own, under_rule)
            assert finding.sqnr_db[f"{m}.weight"] == pytest.approx(expected, abs=0.01), m
    by_group = {f.tensors: f for f in fused}
    assert by_group[tuple(f"{n}.weight" for n in QKV)].sqnr_db[f"{QKV[1]}.weight"] < 2  # 8x: about 1 dB
    r = run("check", "nofuse", cwd=d, check=False)
    assert r.returncode == 1 and "error: fused-scales:" in r.stdout and "dB under the runtime's rule" in r.stdout


def test_repair_gives_every_shard_its_own_scales_sqnr_under_vllms_rule(corpus):
    """Repaired, vLLM's rule gives every shard within 0.5 dB of the SQNR (against the bfloat16
    weights) its own scale gave; only the repaired tensors change; the repaired layers check clean."""
    d, dense = corpus
    r = run("check", "nofuse", "--repair", "fixed", cwd=d, check=False)
    assert r.returncode == 1 and "repair done: fused-scales" in r.stdout, r.stdout
    before, _ = read_dir(d / "nofuse")
    after, _ = read_dir(d / "fixed")
    left = [f for f in check_checkpoint(d / "fixed").findings if f.kind == "fused-scales"]
    assert all(f.severity != "error" for f in left)  # groups of random weights a few % apart may stay
    assert not {f.tensors for f in left} & {tuple(f"{m}.weight" for m in g) for g in (QKV, GATE_UP)}
    for group in (QKV, GATE_UP):
        g = max(float(after[f"{m}.weight_global_scale"][0]) for m in group)
        assert all(float(after[f"{m}.weight_global_scale"][0]) == g for m in group)  # one scale: vLLM's rule is moot
        for m in group:
            x = dense[f"{m}.weight"].astype(np.float32)
            own, repaired = decode_ct(before, m, "nvfp4"), decode_ct(after, m, "nvfp4")
            assert sqnr(x, repaired) > sqnr(x, own) - 0.5, m
    changed = {n for n in before if before[n].tobytes() != after[n].tobytes()}
    fused = [f"model.layers.{i}.{m}" for i in range(2) for m in (*(f"self_attn.{p}_proj" for p in "qkv"),
             "mlp.gate_proj", "mlp.up_proj")]  # fmt: skip
    parts = {f"{m}.{p}" for m in fused for p in ("weight_packed", "weight_scale", "weight_global_scale")}
    assert changed and changed <= parts  # the shards of fused layers only (a repaired layer's)
    assert sorted(p.name for p in (d / "fixed").iterdir()) == sorted(p.name for p in (d / "nofuse").iterdir())
    assert (d / "fixed" / "config.json").read_bytes() == (d / "nofuse" / "config.json").read_bytes()


def test_close_scales_are_left_as_they_are(corpus):
    """Shards whose scales differ by a few percent lose less under vLLM's rule than requantising
    would cost: the repair declines and says so."""
    d, _ = corpus
    r = run("check", "good", cwd=d)
    assert r.returncode == 0
    from neuron_kernels.checkpoints.doctor import repair_checkpoint

    out = d / "near"

    def nudge(t):  # v_proj's scale 2% apart from q/k's, its values kept (block scales not changed: close)
        t[f"{QKV[2]}.weight_global_scale"] = t[f"{QKV[2]}.weight_global_scale"] * np.float32(1.02)

    src = broken(corpus, "nudged", nudge)
    out.mkdir()
    repairs = repair_checkpoint(src, str(out))
    (repair,) = [x for x in repairs if x.kind == "fused-scales"]
    assert not repair.done and "kept as it is" in repair.why
    assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def nan_scales(t):
    t[f"{QKV[0]}.weight_scale"].view(np.uint8)[0, :3] = 0x7F


def negative_scales(t):
    t[f"{QKV[0]}.weight_scale"].view(np.uint8)[1, :2] |= 0x80


def zero_scales(t):
    t[f"{QKV[0]}.weight_scale"].view(np.uint8)[2, :4] = 0


def all_zero(t):
    t[f"{GATE_UP[0]}.weight_packed"][:] = 0


def reciprocal(t):  # ModelOpt's multiplier where compressed-tensors keeps the divisor
    t[f"{QKV[0]}.weight_global_scale"] = np.float32(1) / t[f"{QKV[0]}.weight_global_scale"]


def swap_nibbles(t):
    p = t[f"{QKV[0]}.weight_packed"]
    p[:] = (p << 4) | (p >> 4)


@pytest.mark.parametrize(
    "change, expected",
    [
        (nan_scales, {"nan-scales", "nan-values"}),  # a NaN scale makes its block's values NaN
        (negative_scales, {"negative-scales"}),
        (zero_scales, {"zero-scales"}),
        (all_zero, {"all-zero"}),
        (reciprocal, {"reciprocal", "fused-scales"}),  # q_proj's scale is then far from k's and v's
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_values_findings(corpus, change, expected):
    checkup = check_checkpoint(broken(corpus, change.__name__, change))
    assert {f.kind for f in checkup.findings} == expected
    for f in checkup.findings:
        assert f.severity == ("warning" if f.kind == "all-zero" else "error"), f
        assert (GATE_UP[0] if change is all_zero else QKV[0]) + ".weight" in f.tensors
    if change is nan_scales:
        assert "3 block scale(s)" in checkup.findings[0].message


def test_reciprocal_repaired(corpus):
    d, _ = corpus
    path = broken(corpus, "reciprocal", reciprocal)
    r = run("check", path.name, "--repair", "reciprocal-fixed", cwd=d, check=False)
    assert r.returncode == 1 and "repair done: reciprocal" in r.stdout, r.stdout
    assert kinds(d / "reciprocal-fixed") == []
    good, fixed = read_dir(d / "good")[0], read_dir(d / "reciprocal-fixed")[0]
    np.testing.assert_allclose(decode_ct(fixed, QKV[0], "nvfp4"), decode_ct(good, QKV[0], "nvfp4"), rtol=2**-22)


def dropped_scale(t):
    del t[f"{QKV[0]}.weight_scale"]


def orphan(t):
    t["model.layers.0.mlp.extra_proj.weight_scale"] = t[f"{QKV[0]}.weight_scale"].copy()


def stored_plain(t):  # o_proj's quantised tensors replaced by a plain weight the config still targets
    o = "model.layers.1.self_attn.o_proj"
    for part in ("weight_packed", "weight_scale", "weight_global_scale"):
        del t[f"{o}.{part}"]
    t[f"{o}.weight"] = np.zeros((256, 256), BF16)


def test_structure_findings_each_named_and_repaired_where_they_can_be(corpus):
    d, _ = corpus
    found = {c.__name__: check_checkpoint(broken(corpus, c.__name__, c)).findings for c in (dropped_scale, orphan,
             stored_plain)}  # fmt: skip
    assert {f.tensors for f in found["dropped_scale"]} == {
        (f"{QKV[0]}.weight_packed",), (f"{QKV[0]}.weight_global_scale",)}  # fmt: skip
    assert [f.tensors for f in found["orphan"]] == [("model.layers.0.mlp.extra_proj.weight_scale",)]
    assert [f.tensors for f in found["stored_plain"]] == [("model.layers.1.self_attn.o_proj.weight",)]
    assert all(f.severity == "error" for fs in found.values() for f in fs)
    assert [f.kind for n in ("dropped_scale", "orphan", "stored_plain") for f in found[n]] == [
        "structure", "structure", "structure", "module-plain"]  # fmt: skip
    for name, fixable, kind in (("orphan", True, "structure"), ("stored_plain", True, "module-plain"),
                                ("dropped_scale", False, "structure")):  # fmt: skip
        r = run("check", name, "--repair", f"{name}-fixed", cwd=d, check=False)
        assert r.returncode == 1 and (f"repair done: {kind}" in r.stdout) == fixable, r.stdout
        assert kinds(d / f"{name}-fixed") == ([] if fixable else ["structure"]), name
    assert "a part is missing" in run("check", "dropped_scale", "--repair", "x", cwd=d, check=False).stdout
    good, fixed = read_dir(d / "good")[0], read_dir(d / "orphan-fixed")[0]
    assert sorted(fixed) == sorted(good) and all(fixed[n].tobytes() == good[n].tobytes() for n in good)
    config = json.loads((d / "stored_plain-fixed" / "config.json").read_text())
    assert "model.layers.1.self_attn.o_proj" in config["quantization_config"]["ignore"]


def test_a_fused_layer_quantised_in_part_is_found(corpus):
    def q_plain(t):
        for part in ("weight_packed", "weight_scale", "weight_global_scale"):
            del t[f"{QKV[0]}.{part}"]
        t[f"{QKV[0]}.weight"] = np.zeros((256, 256), BF16)

    path = broken(corpus, "q_plain", q_plain)
    messages = [f.message for f in check_checkpoint(path).findings if f.kind == "structure"]
    assert any("one fused layer" in m or "quantises" in m for m in messages), messages


def test_command_exit_codes_and_json(corpus, tmp_path):
    d, _ = corpus
    r = run("check", d / "nofuse", "--json", cwd=tmp_path, check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["layout"] == "compressed-tensors" and not report["clean"]
    assert {f["kind"] for f in report["findings"]} == {"fused-scales"}
    assert json.loads(run("check", d / "good", "--json", cwd=tmp_path).stdout)["clean"] is True
    r = run("check", d / "llama", cwd=tmp_path)
    assert r.returncode == 0 and "plain" in r.stdout
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "model.safetensors").write_bytes(b"\x10\x00")
    r = run("check", "torn", cwd=tmp_path, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "taken").mkdir()
    r = run("check", d / "nofuse", "--repair", "taken", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "--force" in r.stderr and not any((tmp_path / "taken").iterdir())


def test_diff(corpus, tmp_path):
    d, dense = corpus
    r = run("diff", d / "good", d / "good", cwd=tmp_path)
    assert r.returncode == 0 and "with equal bytes" in r.stdout
    r = run("diff", d / "good", d / "nofuse", "--json", cwd=tmp_path, check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["same_values"]
    by = {t["name"]: t for t in report["tensors"]}
    for m in (QKV[0], QKV[2], GATE_UP[0]):  # the shards whose scale --no-fuse changed
        t = by[f"{m}.weight"]
        assert not t["values_equal"] and "per-tensor scales differ" in t["why"], t
    assert by[f"{QKV[1]}.weight"]["values_equal"]  # the largest shard: its own scale either way
    swapped = broken(corpus, "swap_nibbles", swap_nibbles)
    assert "nibble" not in " ".join(kinds(swapped))  # a swap inside bytes keeps every block's values: not visible
    r = run("diff", d / "good", swapped, cwd=tmp_path, check=False)
    assert r.returncode == 1 and f"{QKV[0]}.weight" in r.stdout and "codes differ in" in r.stdout
    r = run("diff", d / "llama", d / "good", "--json", cwd=tmp_path, check=False)
    t = {x["name"]: x for x in json.loads(r.stdout)["tensors"]}[f"{QKV[0]}.weight"]
    x = dense[f"{QKV[0]}.weight"].astype(np.float32)
    good = read_dir(d / "good")[0]
    assert t["sqnr_db"] == pytest.approx(sqnr(x, decode_ct(good, QKV[0], "nvfp4")), abs=0.01)
    assert t["why"].startswith("one is quantised, the other not; per-tensor scale: amax / (6 x 448)")


def test_modelopt_checkpoint_with_its_fused_scales_made_unequal(tmp_path):
    """ModelOpt's own NVFP4 export with k_proj's weight_scale_2 made 4x and its block scales a
    quarter (the same values, as a producer that skipped the fused-layer scale would write):
    vLLM's ModelOpt rule (the largest weight_scale_2) multiplies q's and v's values by 4 (-9.5 dB);
    repaired, the three share one weight_scale_2 and keep their values to within requantising."""
    src = tmp_path / "modelopt"
    shutil.copytree(MODELOPT / "nvfp4", src)
    tensors, meta = read_safetensors(src / "model.safetensors")
    tensors = {k: np.array(v) for k, v in tensors.items()}
    k = "model.layers.0.self_attn.k_proj"
    tensors[f"{k}.weight_scale_2"] = tensors[f"{k}.weight_scale_2"] * np.float32(4)
    tensors[f"{k}.weight_scale"] = (tensors[f"{k}.weight_scale"].astype(np.float32) / 4).astype(
        tensors[f"{k}.weight_scale"].dtype
    )
    write_safetensors(src / "model.safetensors", tensors, meta)
    (finding,) = [f for f in check_checkpoint(src).findings if f.kind == "fused-scales"]
    assert finding.severity == "error" and finding.sqnr_db[f"{k}.weight"] == np.inf
    assert finding.sqnr_db["model.layers.0.self_attn.q_proj.weight"] == pytest.approx(-20 * np.log10(3))
    r = run("check", "modelopt", "--repair", "fixed", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "repair done: fused-scales" in r.stdout, r.stdout
    fixed = read_safetensors(tmp_path / "fixed" / "model.safetensors")[0]
    shared = {float(fixed[f"model.layers.0.self_attn.{p}_proj.weight_scale_2"]) for p in "qkv"}
    assert len(shared) == 1
    assert not [f for f in check_checkpoint(tmp_path / "fixed").findings if f.severity == "error"]
    reference = read_safetensors(MODELOPT / "nvfp4.dequantized.safetensors")[0]  # ModelOpt's own values
    import neuron_kernels as nk

    repaired = nk.load_checkpoint(tmp_path / "fixed")
    for p in "qkv":
        name = f"model.layers.0.self_attn.{p}_proj.weight"
        assert sqnr(reference[name], repaired[name].dequantize()) > 25, name


def test_diff_names_the_per_tensor_scale_rule(corpus, tmp_path):
    """Against the plain weights, each NVFP4 weight's per-tensor scale is matched to a producer's
    rule (docs/checkpoints.md "Producers' recipes"), from its fused layer's amax or its own."""
    d, dense = corpus
    fused = json.loads(run("diff", d / "llama", d / "good", "--json", cwd=tmp_path, check=False).stdout)
    own = json.loads(run("diff", d / "llama", d / "nofuse", "--json", cwd=tmp_path, check=False).stdout)
    name = f"{QKV[0]}.weight"
    assert "amax / (6 x 448) in float32" in {t["name"]: t for t in fused["tensors"]}[name]["why"]
    assert "from its fused layer's amax" in {t["name"]: t for t in fused["tensors"]}[name]["why"]
    assert "from its own amax" in {t["name"]: t for t in own["tensors"]}[name]["why"]
    from neuron_kernels.checkpoints.diff import scale_rule

    amax = float(np.abs(dense[name].astype(np.float32)).max())
    assert "none of the known rules" in scale_rule(1e-3, amax, amax, False)


LLMCOMPRESSOR = Path(__file__).parent / "fixtures" / "llmcompressor"


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "mxfp8", "fp8_dynamic"])
def test_llm_compressors_own_checkpoints_report_nothing(scheme):
    """llm-compressor 0.14's model_free_ptq outputs (tests/fixtures/llmcompressor, made by
    scripts/make_llmcompressor_fixtures.py from the bfloat16 Llama of tests/fixtures/modelopt/bf16):
    clean, compressed-tensors named as their producer."""
    checkup = check_checkpoint(LLMCOMPRESSOR / scheme)
    assert checkup.clean and checkup.weights == 7, checkup.findings
    assert (checkup.producer or "").startswith("compressed-tensors")


def test_diff_tells_llm_compressors_global_scales(tmp_path):
    """Against the bfloat16 weights it was made from, every NVFP4 weight of llm-compressor's
    checkpoint has its global scale from llm-compressor's rule (over the fused layer for q/k/v and
    gate/up), and every weight of ModelOpt's from ModelOpt's."""
    source = MODELOPT / "bf16"
    for made, rule in ((LLMCOMPRESSOR / "nvfp4", "llm-compressor"), (MODELOPT / "nvfp4", "ModelOpt")):
        report = json.loads(run("diff", source, made, "--json", cwd=tmp_path, check=False).stdout)
        quantised = [t for t in report["tensors"] if t["b"] == "nvfp4"]
        assert len(quantised) == 7
        for t in quantised:
            assert rule in t["why"], (made, t["name"], t["why"])
            fused = any(p in t["name"] for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
            assert t["why"].endswith("from its fused layer's amax" if fused else "from its amax"), t


def test_what_a_runtime_loads_wrong_is_a_warning(tmp_path):
    """A valid checkpoint that a runtime is known to refuse (transformers and fine-grained FP8
    whose down_proj has 320 columns, partial 128 x 128 tiles; vLLM loads it): a runtime warning."""
    make_llama(tmp_path / "llama", intermediate=320)
    run("quantize", "llama", "fp8", "--layout", "fp8", "--format", "fp8_block", "--ignore", "*.gate_proj",
        "--ignore", "*.up_proj", cwd=tmp_path)  # fmt: skip
    checkup = check_checkpoint(tmp_path / "fp8")
    assert [(f.severity, f.kind) for f in checkup.findings] == [("warning", "runtime")]
    assert "transformers" in checkup.findings[0].message and "partial" not in checkup.findings[0].kind


def test_vllms_fused_scale_rules():
    """vLLM keeps, for a fused NVFP4 layer: compressed-tensors, the largest weight_global_scale
    (``weight_global_scale.max()``: the smallest multiplier); ModelOpt, the largest weight_scale_2;
    MoE experts' w1/w3, the gate's (``[:, 0]``). Each shard's values take the kept scale over its own."""
    from neuron_kernels.checkpoints import LAYOUTS
    from neuron_kernels.checkpoints.runtimes import fused_scale_ratio

    dense = ("m.q_proj.weight", "m.k_proj.weight")
    experts = ("m.experts.0.w1.weight", "m.experts.0.w3.weight")
    ct, modelopt = LAYOUTS["compressed-tensors"].fused_scale, LAYOUTS["modelopt"].fused_scale
    assert fused_scale_ratio(ct, dense, [1.0, 2.0]) == [1.0, 0.5]
    assert fused_scale_ratio(modelopt, dense, [1.0, 2.0]) == [2.0, 1.0]
    assert fused_scale_ratio(ct, experts, [2.0, 1.0]) == [1.0, 2.0]
    assert fused_scale_ratio(modelopt, experts, [1.0, 4.0]) == [1.0, 0.25]
