"""The architecture matrix (docs/checkpoints.md, "Which tensors are quantised"): tiny random
models of 20 architectures (22 models: a tied Llama, DeepSeek-V2 with and without
``q_lora_rank``), built and saved by transformers' own classes
(``scripts/make_architecture_table.py``), quantised by the command to NVFP4, MXFP4, MXFP8 and
FP8 per channel and per tensor (compressed-tensors), and loaded back by transformers with
compressed-tensors.

For each: no missing, unexpected or mismatched key; every parameter of the loaded model equal to
that of the same model loaded from a plain bfloat16 checkpoint in which each quantised weight is
replaced by its expected dequantisation (the package's fake quantisation for MX, the runtime's
``fp4 * float32(scale) / global_scale`` rounded to bfloat16 for NVFP4, from a decoder written from
the layout's description), and the logits of the two equal (max difference 0). So nothing the
file holds plain is quantised on load, nothing is initialised at random, and every quantised
weight is what was predicted. GPT-2, whose only Linear is its tied head, is refused (nothing to
quantise). transformers' own MoE bugs are pinned by strict xfails (neuron_kernels/checkpoints/
runtimes.py). The table the package uses without transformers gives the same decisions and is
what transformers gives today. All loads run in one transformers process. ModelOpt FP8 per
channel, which transformers does not load, is checked for every model against vLLM's loading rule.
"""

import fnmatch
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import neuron_kernels as nk
from neuron_kernels.checkpoints.architecture import TABLE_PATH, architecture_of
from neuron_kernels.checkpoints.diff import diff_checkpoints
from neuron_kernels.checkpoints.doctor import check_checkpoint, repair_checkpoint

from . import vllm_ct_rules
from .checkpoint_helpers import BF16, decode_ct, read_dir, write_safetensors
from .cli_runner import run
from .modelopt_rules import vllm_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "make_architecture_table.py")
FORMATS = ["nvfp4", "mxfp4_e2m1", "mxfp8_e4m3", "fp8_channel", "fp8_block", "fp8_tensor"]
#: The models whose experts transformers merges into stacked parameters on load (its MoE bugs apply).
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v2_q_lora", "deepseek_v3", "olmoe", "glm4_moe",
       "jamba"}  # fmt: skip


def _script():
    spec = importlib.util.spec_from_file_location("make_architecture_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ARCHS = list(_script().TINY)

LOAD = """
import sys, json, re, numpy as np, torch, transformers
from transformers import CompressedTensorsConfig
transformers.logging.set_verbosity_error()
args = sys.argv[1:]
ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])
def stacked(state):
    # Llama 4's experts as the plain model holds them: transformers' per-expert Linear modules
    # (SequentialLlama4TextExperts) of a compressed-tensors checkpoint stacked back, gate_up_proj
    # [E, H, 2I] = [gate.T | up.T] and down_proj [E, I, H] = down.T, as Llama4TextExperts.forward reads them
    out, experts = {}, {}
    for k, v in state.items():
        m = re.match(r"(.*[.]experts)[.](\\d+)[.](gate_proj|up_proj|down_proj)[.]weight$", k)
        if m:
            experts.setdefault(m[1], {})[int(m[2]), m[3]] = v
        else:
            out[k] = v
    for module, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        out[module + ".gate_up_proj"] = torch.stack([torch.cat([parts[e, "gate_proj"].T, parts[e, "up_proj"].T], 1)
                                                    for e in range(n)])
        out[module + ".down_proj"] = torch.stack([parts[e, "down_proj"].T for e in range(n)])
    return out
def logits(model):
    with torch.no_grad():
        if hasattr(model.config, "num_mel_bins"):  # an audio encoder's input: mel features
            n = model.config.num_mel_bins, 2 * model.config.max_source_positions
            features = torch.randn(1, *n, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            return model(input_features=features, decoder_input_ids=ids).logits.float().numpy()
        if model.config.is_encoder_decoder:
            return model(input_ids=ids, decoder_input_ids=ids).logits.float().numpy()
        return model(input_ids=ids).logits.float().numpy()
for quantised, fake, out in zip(args[0::3], args[1::3], args[2::3]):
    arch = json.load(open(fake + "/config.json"))["architectures"][0]
    cls = getattr(transformers, arch)
    result = {}
    try:
        q, info = cls.from_pretrained(quantised, dtype=torch.bfloat16, output_loading_info=True,
                                      quantization_config=CompressedTensorsConfig(run_compressed=False))
        result = {k: sorted(map(str, v)) for k, v in info.items()}
        f = cls.from_pretrained(fake, dtype=torch.bfloat16)
        qs, fs = stacked(q.state_dict()), f.state_dict()
        result["names"] = sorted(qs) == sorted(fs)
        result["differ"] = sorted(k for k in fs if k in qs and not torch.equal(qs[k].float(), fs[k].float()))
        result["logits"] = float(np.abs(logits(q) - logits(f)).max())
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    print(json.dumps(result))
"""


def _expected(fmt, name, value, written):
    """The dequantisation a runtime gives the quantised weight ``name`` (bfloat16)."""
    base = name[: -len(".weight")]
    if fmt == "nvfp4":  # the runtime's rule, from the layout's description
        return decode_ct(written, base, fmt).astype(BF16)
    if nk.BLOCK_FORMATS[fmt].float_scales:  # float-quantized keeps the scales in the weight's dtype, as llm-compressor
        return nk.fake_quantize(value, fmt, scale_dtype="bfloat16").astype(BF16)
    return nk.fake_quantize(value, fmt).astype(BF16)


def _fake(fmt, plain, written):
    """The plain checkpoint's tensors, each quantised weight replaced by its expected dequantisation;
    Llama 4's stacked experts, which compressed-tensors holds per expert as transformers splits them
    (``Llama4TextExperts``: expert e's gate and up Linear weights are ``gate_up_proj[e]``'s halves
    transposed, its down weight ``down_proj[e]`` transposed), stacked back from theirs."""
    fake = {}
    for n, v in plain.items():
        split = re.match(r"(.*[.]experts)[.](gate_up_proj|down_proj)$", n)
        if split and f"{split[1]}.0.down_proj.weight_scale" in written:

            def linear(e, name, value, module=split[1]):
                return _expected(fmt, f"{module}.{e}.{name}.weight", np.ascontiguousarray(value.T), written).T

            half = v.shape[2] // 2
            if split[2] == "gate_up_proj":
                parts = [
                    [linear(e, "gate_proj", v[e][:, :half]), linear(e, "up_proj", v[e][:, half:])]
                    for e in range(len(v))
                ]
                fake[n] = np.ascontiguousarray(np.stack([np.concatenate(p, axis=1) for p in parts]))
            else:
                fake[n] = np.ascontiguousarray(np.stack([linear(e, "down_proj", v[e]) for e in range(len(v))]))
        elif n not in written or written[n].dtype != v.dtype:
            fake[n] = _expected(fmt, n, v, written)
        else:
            fake[n] = v
    return fake


@pytest.fixture(scope="module")
def models(runtime, tmp_path_factory):  # noqa: F811
    """The folder of the tiny models (one folder each, by architecture), saved by transformers."""
    d = tmp_path_factory.mktemp("matrix")
    runtime(f"import runpy, sys; sys.argv = [{SCRIPT!r}, '--models', {str(d / 'models')!r}]; "
            f"runpy.run_path({SCRIPT!r}, run_name='__main__')")  # fmt: skip
    return d


@pytest.fixture(scope="module")
def matrix(runtime, models):  # noqa: F811
    """arch -> fmt -> (the command's result, transformers' load result or None)."""
    d = models
    results: dict = {}
    args: list = []
    for arch in ARCHS:
        src = d / "models" / arch
        plain = nk.load_checkpoint(src)
        config = json.loads((src / "config.json").read_text())
        for fmt in FORMATS:
            out = d / f"{arch}-{fmt}"
            r = run("quantize", src, out, "--format", fmt, cwd=d, check=False)
            results.setdefault(arch, {})[fmt] = [r, None]
            if r.returncode:
                continue
            fake = _fake(fmt, plain, read_dir(out)[0])
            (d / f"{arch}-{fmt}-fake").mkdir()
            save_file(fake, d / f"{arch}-{fmt}-fake" / "model.safetensors", metadata={"format": "pt"})
            (d / f"{arch}-{fmt}-fake" / "config.json").write_text(json.dumps(config))
            args += [out, d / f"{arch}-{fmt}-fake", f"{arch}/{fmt}"]
    lines = runtime(LOAD, *args).splitlines()[-(len(args) // 3) :]
    for key, line in zip(args[2::3], lines):
        arch, fmt = key.split("/")
        results[arch][fmt][1] = json.loads(line)
    return results


def _check_loaded(loaded):
    assert "error" not in loaded, loaded["error"]
    assert loaded["missing_keys"] == [] and loaded["unexpected_keys"] == [] and loaded["mismatched_keys"] == [], loaded
    assert loaded["names"] and loaded["differ"] == [], loaded
    assert loaded["logits"] == 0.0, loaded


CASES = [(a, f) for a in ARCHS for f in FORMATS]
#: Models with nothing a runtime would load quantised -> what the refusal names.
REFUSED = {"gpt2": "Conv1D", "mamba": "MambaMixer has no quant_config"}
KNOWN_BUGS = {
    "nvfp4": "transformers dequantises NVFP4 MoE experts without their weight_global_scale",
    "mxfp8_e4m3": "transformers refuses MXFP8 MoE experts (scales do not fit its merged parameters)",
    "fp8_block": "transformers refuses FP8 MoE experts in tiles (tile scales do not fit its merged parameters)",
}


@pytest.mark.parametrize(
    "arch, fmt",
    [
        pytest.param(a, f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[f]))
        if a in MOE and f in KNOWN_BUGS
        else (a, f)
        for a, f in CASES
        if a not in REFUSED
    ],
)
def test_transformers_loads_what_the_command_writes(matrix, arch, fmt):
    r, loaded = matrix[arch][fmt]
    assert r.returncode == 0, r.stderr
    _check_loaded(loaded)


@pytest.mark.parametrize("arch, fmt", [(a, f) for a, f in CASES if a not in REFUSED])
def test_vllm_loads_what_the_command_writes(matrix, arch, fmt):
    """vLLM's loading rules, from its source (tests/vllm_ct_rules.py): no module it builds
    unquantised holds quantised tensors, no quantised module is ignored, the shards of each layer
    it fuses agree and share one NVFP4 global scale (each expert's gate and up too), and stacked
    experts kept plain are ignored under the names its fused MoE looks them up by."""
    r, _ = matrix[arch][fmt]
    out = Path(r.args[2])
    model_type = json.loads((out / "config.json").read_text())["model_type"]
    assert vllm_ct_rules.check(out, model_type) == []


@pytest.mark.parametrize("arch, fmt", [(a, f) for a, f in CASES if a not in REFUSED])
def test_check_agrees_with_the_command(matrix, arch, fmt):
    """The doctor judges each module as the command decided it: nothing the command writes is an
    error (DBRX's ``wte``, GraniteMoE's stacked experts, Jamba's ``conv1d``, Whisper's convolutions
    among them); its only warnings are transformers' own MoE bugs."""
    r, _ = matrix[arch][fmt]
    checkup = check_checkpoint(r.args[2])
    assert [f.message for f in checkup.findings if f.severity == "error"] == []
    warnings = [f for f in checkup.findings if f.severity == "warning"]
    assert all(f.kind == "runtime" for f in warnings), warnings
    assert bool(warnings) == (arch in MOE and fmt in KNOWN_BUGS), warnings


@pytest.mark.parametrize("arch", sorted(MOE))
@pytest.mark.parametrize("fmt", sorted(KNOWN_BUGS))
def test_the_summary_names_transformers_moe_bugs(matrix, arch, fmt):
    r, _ = matrix[arch][fmt]
    assert r.returncode == 0, r.stderr
    assert "note: transformers" in r.stdout and "--format mxfp4_e2m1" in r.stdout, r.stdout
    assert "note:" not in matrix[arch]["mxfp4_e2m1"][0].stdout


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_models_with_nothing_to_quantise_are_refused(matrix, arch):
    """GPT-2's projections are Conv1D (weights stored [in, out]), which no runtime quantises, and
    its one Linear is the tied head; Mamba's projections are its mixer's, which vLLM builds
    unquantised (MambaMixer takes no quant config): refused, saying why, nothing written."""
    for fmt in FORMATS:
        r, _ = matrix[arch][fmt]
        assert r.returncode == 2 and r.stdout == "", r
        assert "no tensor to quantise" in r.stderr and REFUSED[arch] in r.stderr, r.stderr


def test_what_is_kept_and_ignored(matrix, tmp_path):
    """The issue's cases, by name: the tied head in ``ignore``; GPT-NeoX's ``embed_out`` kept and
    in ``ignore`` under both its names; Mixtral's router, T5's and BART's shared embedding, the
    Qwen2-MoE shared-expert gate kept; every expert quantised."""
    base = os.path.dirname(matrix["llama"]["nvfp4"][0].args[2])

    def config(arch):
        return json.loads(Path(base, f"{arch}-nvfp4", "config.json").read_text())["quantization_config"]

    def written(arch):
        return read_dir(os.path.join(base, f"{arch}-nvfp4"))[0]

    assert "lm_head" in config("llama_tied")["ignore"] and "lm_head.weight" not in written("llama_tied")
    assert {"embed_out", "lm_head"} <= set(config("gpt_neox")["ignore"])
    assert written("gpt_neox")["embed_out.weight"].dtype == BF16
    mixtral = written("mixtral")
    assert mixtral["model.layers.0.block_sparse_moe.gate.weight"].dtype == BF16
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight_packed" in mixtral
    assert written("t5")["shared.weight"].dtype == BF16 and written("bart")["model.shared.weight"].dtype == BF16
    qwen = written("qwen2_moe")
    assert qwen["model.layers.0.mlp.shared_expert_gate.weight"].dtype == BF16
    assert "model.layers.0.mlp.shared_expert_gate" in config("qwen2_moe")["ignore"]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_table_decides_as_transformers_does(matrix, arch, tmp_path):
    """The table (the default, which the matrix loads) writes the same checkpoint, config
    included, as the modules transformers builds (``--modules transformers``)."""
    r = matrix[arch]["mxfp8_e4m3"][0]
    src, out = r.args[1], r.args[2]
    t = run("quantize", src, tmp_path / "t", "--format", "mxfp8_e4m3", "--modules", "transformers", cwd=tmp_path,
            check=False)  # fmt: skip
    assert t.returncode == r.returncode, t.stderr
    if r.returncode:
        return
    assert json.loads((tmp_path / "t" / "config.json").read_text()) == json.loads(Path(out, "config.json").read_text())
    ours, _ = read_dir(tmp_path / "t")
    theirs, _ = read_dir(out)
    assert sorted(ours) == sorted(theirs)


def test_the_table_is_what_transformers_gives(runtime, tmp_path):  # noqa: F811
    """The shipped table, built again from the installed transformers (the script), is the same
    for every architecture (the transformers version it names aside)."""
    runtime(f"import runpy, sys; sys.argv = [{SCRIPT!r}]; sys.path.insert(0, {ROOT!r}); "
            f"import neuron_kernels.checkpoints.architecture as a; a.TABLE_PATH = {str(tmp_path / 't.json')!r}; "
            f"runpy.run_path({SCRIPT!r}, run_name='__main__')")  # fmt: skip
    fresh = json.loads((tmp_path / "t.json").read_text())
    shipped = json.loads(Path(TABLE_PATH).read_text())
    assert fresh["architectures"] == shipped["architectures"]
    assert len(shipped["architectures"]) >= 15


def test_an_unknown_architecture_is_refused(tmp_path):
    """No model_type either source knows: refused in one line naming --only; --only decides."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    (tmp_path / "m").mkdir()
    save_file({"blocks.0.proj.weight": w, "emb.weight": w}, tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "no_such_model"}))
    r = run("quantize", "m", "q", "--format", "mxfp8_e4m3", cwd=tmp_path, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r
    assert "no_such_model" in r.stderr and "--only" in r.stderr and not (tmp_path / "q").exists()
    run("quantize", "m", "q", "--format", "mxfp8_e4m3", "--only", "*.proj", cwd=tmp_path)
    got, _ = read_dir(tmp_path / "q")
    assert "blocks.0.proj.weight_scale" in got and "emb.weight_scale" not in got
    assert architecture_of({"model_type": "no_such_model"}, ["a.weight"]) is None


def test_quantize_state_dict_takes_the_modules_of_the_model(matrix):
    """``quantize_state_dict(model.state_dict(), fmt, model=model)`` decides from the model's own
    modules: the tied Llama's state dict gives the tensors and config the command writes for its
    checkpoint, ``lm_head`` (tied, its weight the embedding's) kept and in ``ignore``."""
    from .helpers import import_runtime

    torch = import_runtime("torch")
    transformers = import_runtime("transformers")
    out = Path(matrix["llama_tied"]["nvfp4"][0].args[2])
    model = transformers.LlamaForCausalLM.from_pretrained(out.parent / "models" / "llama_tied", dtype=torch.bfloat16)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    sd, qc = nk.quantize_state_dict(state, "nvfp4", model=model)
    written, _ = read_dir(out)
    assert sorted(sd) == sorted(written)
    for name, value in sd.items():
        raw = value.contiguous().reshape(-1).view(torch.uint8).numpy()
        np.testing.assert_array_equal(raw, written[name].reshape(-1).view(np.uint8), err_msg=name)
    assert qc["ignore"] == ["lm_head"]
    assert qc == json.loads((out / "config.json").read_text())["quantization_config"]


def test_a_config_unlike_the_tables_goes_to_transformers():
    """DeepSeek-V2-Lite's shape of DeepSeek (no ``q_lora_rank``: ``q_proj`` where the table's tiny
    model has ``q_a_proj``): the table has no module for ``q_proj``, so the model transformers
    builds from this config decides (a Linear); the table alone keeps it, as a weight of no module."""
    from .helpers import import_runtime

    import_runtime("transformers")
    config = {"model_type": "deepseek_v3", "q_lora_rank": None, "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 32, "qk_rope_head_dim": 32,
              "qk_nope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 4, "moe_intermediate_size": 64,
              "intermediate_size": 128, "vocab_size": 128, "n_group": 1, "topk_group": 1}  # fmt: skip
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight"]
    arch = architecture_of(config, names)
    assert arch.source.startswith("transformers") and arch.kind("model.layers.0.self_attn.q_proj") == "linear"
    assert architecture_of(config, names, "table").kind("model.layers.0.self_attn.q_proj") is None


@pytest.mark.parametrize("arch", ARCHS)
def test_modelopt_fp8_of_every_architecture_follows_vllms_rules(models, arch, tmp_path):
    """ModelOpt FP8_PER_CHANNEL_PER_TOKEN of each model of the matrix, under vLLM's loading rule
    (tests/test_checkpoints_modelopt_fp8.py; vLLM needs a GPU): every module with FP8 codes is
    quantised in vLLM's eyes (no ``exclude_modules`` entry matches it exactly, as a substring or
    as a wildcard) and holds exactly ``weight`` float8_e4m3fn [out, in] and ``weight_scale``
    float32 [out] (and its ``bias``), its values the package's quantisation; every module the file holds plain and
    the model has as a Linear is excluded; no other tensor. MoE models are refused (vLLM's
    ModelOpt FP8 MoE needs calibrated per-tensor scales), GPT-2 has nothing to quantise."""
    src = models / "models" / arch
    r = run("quantize", src, tmp_path / "out", "--layout", "modelopt", "--format", "fp8_channel", cwd=tmp_path,
            check=False)  # fmt: skip
    if arch in MOE or arch in REFUSED:
        assert r.returncode == 2 and ("MoE expert" in r.stderr or "no tensor to quantise" in r.stderr), r.stderr
        return
    assert r.returncode == 0, r.stderr
    _, exclude = vllm_config(tmp_path / "out")
    plain, written = nk.load_checkpoint(src), read_dir(tmp_path / "out")[0]
    arch_info = architecture_of(json.loads((src / "config.json").read_text()), nk.open_checkpoint(src).tensors)

    def excluded(module):
        return (
            module in exclude or any(e in module for e in exclude) or any(fnmatch.fnmatch(module, e) for e in exclude)
        )

    quantised = {n.rpartition(".")[0] for n, v in written.items() if v.dtype.name == "float8_e4m3fn"}
    assert quantised, arch
    for module in quantised:
        assert not excluded(module), module
        names = {n for n in written if n.rpartition(".")[0] == module}
        assert names - {f"{module}.bias"} == {f"{module}.weight", f"{module}.weight_scale"}, names  # a Linear's bias
        w, s = written[f"{module}.weight"], written[f"{module}.weight_scale"]
        assert s.dtype == np.float32 and s.shape == w.shape[:1], module
        want = nk.quantize(plain[f"{module}.weight"], "fp8_channel", scale_dtype="float32")
        values = w.astype(np.float32) * s[:, None]
        assert np.array_equal(values.view(np.uint32), want.dequantize().view(np.uint32)), module
    for name, value in written.items():
        module = name.rpartition(".")[0]
        if module in quantised:
            continue
        assert name in plain and value.tobytes() == plain[name].tobytes(), name  # copied as it was
        if name.endswith(".weight") and arch_info.kind(module) in ("linear", "head"):
            assert excluded(module), module


@pytest.mark.parametrize("arch", ARCHS)
def test_neuron_fp8_of_every_architecture_follows_nxds_rules(models, arch, tmp_path):
    """The neuron layout (FP8 within 240 per channel) of each model of the matrix, under NxD
    Inference's loading rule (tests/test_checkpoints_neuron.py; NxD needs Trainium): a module is
    converted unless a ``modules_to_not_convert`` entry is a substring of its path without
    ``model.`` (neuronx_distributed/quantization/quantize.py); each converted module holds exactly
    ``weight`` float8_e4m3fn [out, in] within +-240 and ``scale`` float32 [out, 1] (and its
    ``bias``), ``weight * scale`` the package's quantisation; Llama 4's stacked experts as NxDI's
    ``preprocess_llama4_FP8.py`` writes them (``PARAM`` float8_e4m3fn [E, in, out] and ``PARAM.scale``
    float32 [E, 1, out], one scale per expert and output column; ``quantization_type``
    ``expert_wise_per_channel_symmetric``); every Linear the file holds plain is not converted; no
    other tensor; the doctor finds nothing. Models whose other stacked experts NxDI has no layout
    for are refused in one line, GPT-2 and Mamba have nothing to quantise."""
    src = models / "models" / arch
    r = run("quantize", src, tmp_path / "out", "--layout", "neuron", "--format", "fp8_e4m3_channel", cwd=tmp_path,
            check=False)  # fmt: skip
    if r.returncode != 0:
        assert arch in MOE or arch in REFUSED, r.stderr
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "stacked experts" in r.stderr or "no tensor to quantise" in r.stderr, r.stderr
        return
    settings = json.loads((tmp_path / "out" / "neuron_quantization.json").read_text())
    keep = settings["modules_to_not_convert"]
    plain, written = nk.load_checkpoint(src), read_dir(tmp_path / "out")[0]
    arch_info = architecture_of(json.loads((src / "config.json").read_text()), nk.open_checkpoint(src).tensors)

    def converted(module):  # NxDI strips these prefixes (get_state_dict; Llama 4's conversion)
        for prefix in ("language_model.model.", "language_model.", "model."):
            if module.startswith(prefix):
                module = module[len(prefix) :]
                break
        return not any(entry in module for entry in keep)

    experts = {n for n, v in written.items() if v.dtype.name == "float8_e4m3fn" and v.ndim == 3}
    assert bool(experts) == (arch == "llama4"), arch
    assert (settings["quantization_type"] == "expert_wise_per_channel_symmetric") == bool(experts)
    for name in experts:  # gate_up_proj [E, H, 2I], down_proj [E, I, H]
        w, s = written[name], written[f"{name}.scale"]
        assert s.dtype == np.float32 and s.shape == (w.shape[0], 1, w.shape[2])
        assert np.abs(w.astype(np.float32)).max() <= 240
        want = nk.quantize(plain[name], "fp8_e4m3_channel", scale_dtype="float32", axis=1).dequantize()
        assert np.array_equal((w.astype(np.float32) * s).view(np.uint32), want.view(np.uint32)), name
        assert converted(name.rpartition(".")[0]), name
    quantised = {n.rpartition(".")[0] for n, v in written.items() if v.dtype.name == "float8_e4m3fn" and v.ndim == 2}
    assert quantised, arch
    for module in quantised:
        assert converted(module), module
        names = {n for n in written if n.rpartition(".")[0] == module}
        assert names - {f"{module}.bias"} == {f"{module}.weight", f"{module}.scale"}, names
        w, s = written[f"{module}.weight"], written[f"{module}.scale"]
        assert s.dtype == np.float32 and s.shape == (w.shape[0], 1) and np.abs(w.astype(np.float32)).max() <= 240
        want = nk.quantize(plain[f"{module}.weight"], "fp8_e4m3_channel", scale_dtype="float32")
        assert np.array_equal((w.astype(np.float32) * s).view(np.uint32), want.dequantize().view(np.uint32)), module
    for name, value in written.items():
        module = name.rpartition(".")[0]
        if module in quantised or name in experts or name.removesuffix(".scale") in experts:
            continue
        assert name in plain and value.tobytes() == plain[name].tobytes(), name  # copied as it was
        if name.endswith(".weight") and arch_info.kind(module) in ("linear", "head"):
            assert not converted(module), module
    assert check_checkpoint(tmp_path / "out").clean


def test_llama4_fp8_experts_fused_for_nxd_without_rounding_loss(models, tmp_path):
    """Llama 4 with FP8 experts per expert (compressed-tensors, as Meta's FP8 checkpoints hold
    them) into the neuron layout, as NxDI's ``preprocess_llama4_FP8.py`` lays them out
    (models/llama4/conversion_script, NxDI 4bcdc54): ``experts.gate_up_proj`` [E, H, 2I] holding
    expert e's ``[gate.T | up.T]`` and ``.scale`` [E, 1, 2I] their row scales side by side;
    ``experts.down_proj`` [E, I, H] = ``down.T`` with [E, 1, H]. Where the script re-rounds every
    code at 240/448 in bfloat16, the codes are moved and halved: every value equals the source's
    ``code * scale`` but the elements the report counts (the smallest subnormals), none beyond 240."""
    src = models / "models" / "llama4"
    run("quantize", src, tmp_path / "ct", "--layout", "compressed-tensors", "--format", "fp8_channel", "--quiet",
        cwd=tmp_path)  # fmt: skip
    r = run("quantize", tmp_path / "ct", tmp_path / "out", "--layout", "neuron", "--format", "fp8_e4m3_channel",
            cwd=tmp_path)  # fmt: skip
    ct, written = read_dir(tmp_path / "ct")[0], read_dir(tmp_path / "out")[0]
    settings = json.loads((tmp_path / "out" / "neuron_quantization.json").read_text())
    assert settings["quantization_type"] == "expert_wise_per_channel_symmetric"

    def value(linear):  # the source's value of one expert's Linear, [out, in]
        return ct[f"{linear}.weight"].astype(np.float32) * ct[f"{linear}.weight_scale"].astype(np.float32)

    changed_total = 0
    for layer in (0, 1):
        prefix = f"language_model.model.layers.{layer}.feed_forward.experts"
        experts = written[f"{prefix}.gate_up_proj"].shape[0]
        for param, linears in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            want = np.stack([np.concatenate([value(f"{prefix}.{e}.{lin}").T for lin in linears], axis=1)
                             for e in range(experts)])  # fmt: skip
            codes, scale = written[f"{prefix}.{param}"], written[f"{prefix}.{param}.scale"]
            assert codes.dtype.name == "float8_e4m3fn" and codes.shape == want.shape
            assert scale.dtype == np.float32 and scale.shape == (experts, 1, want.shape[2])
            assert np.abs(codes.astype(np.float32)).max() <= 240
            changed = int((codes.astype(np.float32) * scale != want).sum())
            line = next(x for x in r.stdout.splitlines() if x.startswith(f"{prefix}.{param} "))
            assert "codes halved, scales doubled" in line, line
            assert (f"{changed} element(s) not exact" in line) if changed else ("every value exact" in line), line
            changed_total += changed
        for e in range(experts):
            for lin in ("gate_proj", "up_proj", "down_proj"):
                assert f"{prefix}.{e}.{lin}.weight" not in written
    assert 0 < changed_total < 200
    assert check_checkpoint(tmp_path / "out").clean
    refusals = (
        (("--format", "int8_channel"), "FP8 per expert and output column only"),
        (("--format", "fp8_e4m3_channel", "--recipe", "neuron"), "--ignore them or drop --recipe"),
    )
    for args, message in refusals:  # NxD has no int8 experts; NxD's own quantisers leave stacked experts alone
        r = run("quantize", src, tmp_path / "no", "--layout", "neuron", *args, cwd=tmp_path, check=False)
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "no").exists()


def _copy(src, dst, ignore=None, tensors=None):
    """The checkpoint folder ``src`` copied to ``dst``, with another ``ignore`` and other tensors."""
    shutil.copytree(src, dst)
    if ignore is not None:
        config = json.loads((dst / "config.json").read_text())
        config["quantization_config"]["ignore"] = ignore
        (dst / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        write_safetensors(dst / "model.safetensors", tensors)
    return dst


def test_check_finds_what_the_command_would_not_write(matrix, tmp_path):
    """One fault planted in each of the command's outputs: BERT's query / key / value with a global
    scale each (vLLM fuses them and keeps one); DBRX's router quantised (vLLM builds it unquantised:
    its tensors have nowhere to go); DBRX's stacked experts missing from ``ignore``; a Llama module
    in ``ignore`` stored quantised (a runtime builds it plain and initialises it at random). Each is
    found, as the fault it is; the last two are repaired into checkpoints the doctor calls clean."""
    base = Path(matrix["llama"]["nvfp4"][0].args[2]).parent
    r = run("quantize", base / "models" / "bert", tmp_path / "bert", "--format", "nvfp4", "--no-fuse", cwd=tmp_path)
    split = check_checkpoint(tmp_path / "bert").findings
    assert {f.kind for f in split if f.severity == "error"} == {"fused-scales"}, split
    assert any("attention.self.query" in f.message and "attention.self.value" in f.message for f in split)
    assert r.returncode == 0 and vllm_ct_rules.check(tmp_path / "bert", "bert") != []

    dbrx = base / "dbrx-nvfp4"
    tensors, _ = read_dir(dbrx)
    ignore = json.loads((dbrx / "config.json").read_text())["quantization_config"]["ignore"]
    router = "transformer.blocks.0.ffn.router.layer"
    q = nk.quantize(np.asarray(tensors.pop(f"{router}.weight"), np.float32), "nvfp4")
    tensors |= {f"{router}.weight_packed": q.codes, f"{router}.weight_scale": q.scales,
                f"{router}.weight_global_scale": np.array([1 / q.per_tensor_scale], np.float32)}  # fmt: skip
    planted = _copy(dbrx, tmp_path / "router", [e for e in ignore if e != router], tensors)
    found = check_checkpoint(planted).findings
    assert [(f.kind, f.tensors) for f in found if f.severity == "error"] == [("module-kept", (f"{router}.weight",))]
    assert "MoE router" in found[0].message and vllm_ct_rules.check(planted, "dbrx") != []

    experts = "transformer.blocks.1.ffn.experts.mlp"
    planted = _copy(
        dbrx, tmp_path / "experts", [e for e in ignore if not e.startswith("transformer.blocks.1.ffn.experts")]
    )
    found = [f for f in check_checkpoint(planted).findings if f.severity == "error"]
    assert [(f.kind, f.tensors) for f in found] == [("module-experts", (f"{experts}.{w}",)) for w in ("v1", "w1", "w2")]
    assert vllm_ct_rules.check(planted, "dbrx") != []
    fixed = tmp_path / "experts-fixed"
    fixed.mkdir()
    assert all(r.done for r in repair_checkpoint(planted, str(fixed)))
    assert check_checkpoint(fixed).clean and vllm_ct_rules.check(fixed, "dbrx") == []

    llama = base / "llama-nvfp4"
    config = json.loads((llama / "config.json").read_text())["quantization_config"]
    planted = _copy(llama, tmp_path / "ignored", [*config["ignore"], "model.layers.1.self_attn.o_proj"])
    found = [f for f in check_checkpoint(planted).findings if f.severity == "error"]
    assert [(f.kind, f.tensors) for f in found] == [("module-ignored", ("model.layers.1.self_attn.o_proj.weight",))]
    fixed = tmp_path / "ignored-fixed"
    fixed.mkdir()
    assert all(r.done for r in repair_checkpoint(planted, str(fixed)))
    assert check_checkpoint(fixed).clean


def test_towers_are_kept_unless_asked(matrix, runtime, tmp_path):  # noqa: F811
    """Qwen2.5-VL's vision tower and merger and LLaVA's CLIP tower and projector are kept and in
    ``ignore`` by default, and the summary names them; ``--quantize-towers`` quantises them, and
    transformers loads the result exactly; Llama 4's vision model stays plain even then (vLLM
    builds it unquantised); Whisper's encoder is the model's own, not a tower: quantised."""
    base = Path(matrix["llama"]["nvfp4"][0].args[2]).parent
    for arch, tower in (("qwen2_5_vl", "visual.blocks.0.attn.qkv"), ("llava", "multi_modal_projector.linear_1")):
        r, _ = matrix[arch]["nvfp4"]
        assert f"towers kept in higher precision (as producers' recipes keep them): {tower.split('.')[0]}.*" in r.stdout
        written = read_dir(r.args[2])[0]
        assert written[f"{tower}.weight"].dtype == BF16
        assert tower in json.loads(Path(r.args[2], "config.json").read_text())["quantization_config"]["ignore"]
    args = []
    for arch in ("qwen2_5_vl", "llama4"):
        out = tmp_path / arch
        r = run("quantize", base / "models" / arch, out, "--format", "mxfp8_e4m3", "--quantize-towers", cwd=tmp_path)
        written = read_dir(out)[0]
        assert "towers kept" not in r.stdout
        if arch == "llama4":
            assert written["vision_model.model.layers.0.mlp.fc1.weight"].dtype == BF16
            assert "vision model, which vLLM builds unquantised" in r.stdout
            continue
        assert "visual.blocks.0.attn.qkv.weight_scale" in written and "visual.merger.mlp.0.weight_scale" in written
        assert vllm_ct_rules.check(out, "qwen2_5_vl") == [] and check_checkpoint(out).clean
        plain = nk.load_checkpoint(base / "models" / arch)
        (tmp_path / "fake").mkdir()
        save_file(
            _fake("mxfp8_e4m3", plain, written), tmp_path / "fake" / "model.safetensors", metadata={"format": "pt"}
        )
        shutil.copy(base / "models" / arch / "config.json", tmp_path / "fake" / "config.json")
        args += [out, tmp_path / "fake", "qwen2_5_vl/towers"]
    _check_loaded(json.loads(runtime(LOAD, *args).splitlines()[-1]))
    assert "model.encoder.layers.0.fc1.weight_scale" in read_dir(matrix["whisper"]["mxfp8_e4m3"][0].args[2])[0]


def test_llama4_experts_dequantise_to_the_models_parameters(matrix, runtime, tmp_path):  # noqa: F811
    """Llama 4's experts, written per expert for compressed-tensors, come back from ``dequantize``
    as the model's stacked parameters: transformers loads the plain checkpoint with no missing or
    unexpected key, each expert's slice the dequantisation of its Linear weight; ``diff`` against
    the plain model compares them expert by expert."""
    src = Path(matrix["llama4"]["nvfp4"][0].args[2])
    r = run("dequantize", src, tmp_path / "plain", cwd=tmp_path)
    assert "stacked from its experts' Linear weights" in r.stdout
    plain, _ = read_dir(tmp_path / "plain")
    stored = nk.load_checkpoint(src)
    module = "language_model.model.layers.1.feed_forward.experts"
    gate_up, down = plain[f"{module}.gate_up_proj"], plain[f"{module}.down_proj"]
    half = gate_up.shape[2] // 2
    for e in range(gate_up.shape[0]):
        for got, name in (
            (gate_up[e][:, :half], "gate_proj"),
            (gate_up[e][:, half:], "up_proj"),
            (down[e], "down_proj"),
        ):
            want = stored[f"{module}.{e}.{name}.weight"].dequantize("bfloat16")
            assert np.array_equal(got.T.view(np.uint16), want.view(np.uint16)), (e, name)
    assert not any(".experts.0." in n for n in plain)
    script = (
        "import sys, json, torch, transformers\n"
        "m, info = transformers.Llama4ForConditionalGeneration.from_pretrained(sys.argv[1], dtype=torch.bfloat16, "
        "output_loading_info=True)\n"
        "print(json.dumps({k: sorted(map(str, v)) for k, v in info.items()}))"
    )
    info = json.loads(runtime(script, tmp_path / "plain").splitlines()[-1])
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    d = diff_checkpoints(src.parent / "models" / "llama4", src)  # compared expert by expert
    assert d.only_a == [] and d.only_b == [] and f"{module}.3.up_proj.weight" in {t.name for t in d.tensors}


def test_transformers_splits_only_what_the_package_knows(runtime):  # noqa: F811
    """Every stacked-experts class transformers replaces by per-expert Linear modules for a
    compressed-tensors checkpoint has the package's split (so a release adding one is noticed)."""
    from neuron_kernels.checkpoints.runtime_modules import EXPERT_SPLITS

    script = (
        "import json\nfrom transformers.quantizers.base import MODULES_TO_PATCH_FOR_QUANTIZATION as m\n"
        "print(json.dumps(sorted(k for k, v in m.items() if any(getattr(q, 'value', q) == 'compressed-tensors' "
        "for q in v['quantization_methods']))))"
    )
    assert set(json.loads(runtime(script).splitlines()[-1])) == set(EXPERT_SPLITS)
