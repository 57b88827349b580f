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
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import neuron_kernels as nk
from neuron_kernels.checkpoints.architecture import TABLE_PATH, architecture_of

from .checkpoint_helpers import BF16, decode_ct, read_dir
from .cli_runner import run
from .modelopt_rules import vllm_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "make_architecture_table.py")
FORMATS = ["nvfp4", "mxfp4_e2m1", "mxfp8_e4m3", "fp8_channel", "fp8_tensor"]
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v2_q_lora", "deepseek_v3"}


def _script():
    spec = importlib.util.spec_from_file_location("make_architecture_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ARCHS = list(_script().TINY)

LOAD = """
import sys, json, numpy as np, torch, transformers
from transformers import CompressedTensorsConfig
transformers.logging.set_verbosity_error()
args = sys.argv[1:]
ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])
def logits(model):
    with torch.no_grad():
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
        qs, fs = q.state_dict(), f.state_dict()
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
            written, _ = read_dir(out)
            quantised = [n for n in plain if n not in written or written[n].dtype != plain[n].dtype]
            fake = {n: (_expected(fmt, n, v, written) if n in quantised else v) for n, v in plain.items()}
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
KNOWN_BUGS = {
    "nvfp4": "transformers dequantises NVFP4 MoE experts without their weight_global_scale",
    "mxfp8_e4m3": "transformers refuses MXFP8 MoE experts (scales do not fit its merged parameters)",
}


@pytest.mark.parametrize(
    "arch, fmt",
    [
        pytest.param(a, f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[f]))
        if a in MOE and f in KNOWN_BUGS
        else (a, f)
        for a, f in CASES
        if a != "gpt2"
    ],
)
def test_transformers_loads_what_the_command_writes(matrix, arch, fmt):
    r, loaded = matrix[arch][fmt]
    assert r.returncode == 0, r.stderr
    _check_loaded(loaded)


@pytest.mark.parametrize("arch", sorted(MOE))
@pytest.mark.parametrize("fmt", sorted(KNOWN_BUGS))
def test_the_summary_names_transformers_moe_bugs(matrix, arch, fmt):
    r, _ = matrix[arch][fmt]
    assert r.returncode == 0, r.stderr
    assert "note: transformers" in r.stdout and "--format mxfp4_e2m1" in r.stdout, r.stdout
    assert "note:" not in matrix[arch]["mxfp4_e2m1"][0].stdout


def test_gpt2_has_nothing_to_quantise(matrix):
    """GPT-2's projections are Conv1D (weights stored [in, out]), which no runtime quantises; its one
    Linear is the tied head: refused, saying why, nothing written."""
    for fmt in FORMATS:
        r, _ = matrix["gpt2"][fmt]
        assert r.returncode == 2 and r.stdout == "", r
        assert "no tensor to quantise" in r.stderr and "Conv1D" in r.stderr, r.stderr


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
    if arch in MOE or arch == "gpt2":
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
