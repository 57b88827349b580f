"""The read-only ``awq`` (AutoAWQ GEMM) and ``gptq`` (AutoGPTQ / GPTQModel) layouts.

Checkpoints are built with the slow references' packers (tests/reference_integers.py: ``awq_pack``,
``gptq_pack``, written from the layouts' description, not from the package) on codes, zero points
and act-order ``g_idx`` drawn at random, and every weight the package reads must dequantise to the
references' ``awq_dequantize`` / ``gptq_dequantize`` bit for bit in float16. The producer fixtures
(tests/fixtures/gptq/, tests/fixtures/awq/: made by AutoGPTQ's and AutoAWQ's own code, their README
says how) are held against the producers' own dequantisation and the references. Bad files are
refused with one line naming the tensor, before their data is read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from neuron_kernels.checkpoints import load_checkpoint
from neuron_kernels.io.arrays import FileFormatError

from .checkpoint_helpers import read_safetensors, write_safetensors
from .cli_runner import run
from .reference_integers import awq_dequantize, awq_pack, gptq_default_g_idx, gptq_dequantize, gptq_pack

FIXTURES = Path(__file__).parent / "fixtures"
#: The quantised modules of every synthetic checkpoint, [out, in] (in = 80 leaves GPTQ's last group short).
MODULES = {"model.layers.0.self_attn.q_proj": (64, 128), "model.layers.0.mlp.down_proj": (40, 96)}
RAGGED = {"model.layers.0.mlp.down_proj": (40, 80)}
PLAIN = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.bias")


@dataclass(frozen=True)
class Case:
    """One synthetic checkpoint: its layout, bits, group size (-1: per channel), GPTQ's version,
    symmetry and act-order, whether ``g_idx`` is stored, and the shapes of its modules."""

    layout: str
    bits: int = 4
    group_size: int = 32
    version: str = "gptq"
    sym: bool = False
    act_order: bool = False
    g_idx: bool = True
    modules: tuple[tuple[str, tuple[int, int]], ...] = tuple(MODULES.items())

    @property
    def id(self) -> str:
        if self.layout == "awq":
            return f"awq-int4-g{self.group_size}"
        parts = [f"gptq-int{self.bits}", "v1" if self.version == "gptq" else "v2", "sym" if self.sym else "asym",
                 f"g{self.group_size}"]  # fmt: skip
        parts += ["act-order"] if self.act_order else [] if self.g_idx else ["no-g_idx"]
        parts += ["ragged"] if dict(self.modules) != MODULES else []
        return "-".join(parts)


CASES = [
    Case("awq"),
    Case("awq", group_size=-1),
    Case("gptq", 4, version="gptq", sym=True),
    Case("gptq", 4, version="gptq", sym=False, act_order=True),
    Case("gptq", 4, version="gptq_v2", sym=True, act_order=True),
    Case("gptq", 4, version="gptq_v2", sym=False),
    Case("gptq", 4, version="gptq", sym=False, g_idx=False),
    Case("gptq", 4, version="gptq", sym=False, act_order=True, modules=tuple({**MODULES, **RAGGED}.items())),
    Case("gptq", 8, version="gptq", sym=False, act_order=True),
    Case("gptq", 8, version="gptq_v2", sym=True),
    Case("gptq", 3, version="gptq", sym=False, act_order=True),
    Case("gptq", 3, version="gptq_v2", sym=True, g_idx=False),
    Case("gptq", 2, version="gptq", sym=True),
    Case("gptq", 2, version="gptq_v2", sym=False, act_order=True),
    Case("gptq", 4, group_size=-1, version="gptq", sym=False),
    Case("gptq", 3, group_size=-1, version="gptq_v2", sym=False, act_order=True),
]


def quantization_config(case: Case) -> dict:
    if case.layout == "awq":
        return {"quant_method": "awq", "zero_point": True, "group_size": case.group_size, "bits": 4,
                "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return {"quant_method": "gptq", "bits": case.bits, "group_size": case.group_size, "desc_act": case.act_order,
            "sym": case.sym, "checkpoint_format": case.version}  # fmt: skip


def write_folder(folder: Path, tensors: dict, qc: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float16",
              "quantization_config": qc}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


def make_checkpoint(folder: Path, case: Case, seed: int = 0) -> tuple[dict, dict]:
    """Write ``case``'s checkpoint; returns (its tensors, each weight as the reference dequantises it)."""
    rng = np.random.default_rng(seed)
    top = (1 << case.bits) - 1
    tensors: dict = {}
    want: dict = {}
    for module, (out, cols) in case.modules:
        size = cols if case.group_size == -1 else case.group_size
        groups = -(-cols // size)
        q = rng.integers(0, top + 1, (cols, out))
        z = np.full((groups, out), 1 << (case.bits - 1)) if case.sym else rng.integers(0, top + 1, (groups, out))
        if not case.sym:
            z[0, :2] = (0, top)  # v1 stores 0 as all ones (z - 1 masked): read back as 0
        s = (np.abs(rng.standard_normal((groups, out))) * 0.01 + 1e-4).astype(np.float16)
        if case.layout == "awq":
            qweight, qzeros, scales = awq_pack(q, z, s)
            tensors.update({f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales})
            want[f"{module}.weight"] = awq_dequantize(qweight, qzeros, scales, size)
            continue
        g_idx = gptq_default_g_idx(cols, size)
        if case.act_order:  # a permutation of the groups' members: not monotonic
            g_idx = rng.permutation(g_idx).astype(np.int32)
        qweight, qzeros, scales, g_idx = gptq_pack(q, z, s, g_idx, case.bits, case.version)
        tensors.update({f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales})
        if case.g_idx:
            tensors[f"{module}.g_idx"] = g_idx
        want[f"{module}.weight"] = gptq_dequantize(qweight, qzeros, scales, g_idx, case.bits, case.version)
    tensors[PLAIN[0]] = rng.standard_normal((16, 64)).astype(np.float16)
    tensors[PLAIN[1]] = rng.standard_normal(64).astype(np.float16)
    write_folder(folder, tensors, quantization_config(case))
    return tensors, want


def differing(got: np.ndarray, want: np.ndarray) -> int:
    assert got.dtype == want.dtype == np.float16 and got.shape == want.shape
    return int((got.view(np.uint16) != want.view(np.uint16)).sum())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_weight_reads_as_the_reference_dequantises_it(case, tmp_path):
    tensors, want = make_checkpoint(tmp_path / "ckpt", case)
    got = load_checkpoint(tmp_path / "ckpt")
    assert sorted(got) == sorted(list(want) + list(PLAIN))
    kind = "channel" if case.group_size == -1 else "group"
    for name, values in want.items():
        w = got[name]
        assert w.fmt == f"int{case.bits}_{kind}_asym", name
        assert w.shape == values.shape
        act_order = case.act_order and case.group_size != -1  # one group: every g_idx entry is 0, the default
        assert (w.group_index is not None) == act_order, name
        assert differing(w.dequantize("float16"), values) == 0, name
    for name in PLAIN:
        np.testing.assert_array_equal(got[name], tensors[name])


def test_gptqmodel_configs_name_the_version_format(tmp_path):
    """GPTQModel writes ``format`` (``checkpoint_format`` its older name), ``pack_dtype`` and ``dynamic``
    rules that skip modules: v2 read as v2."""
    case = CASES[5]  # v2, asymmetric: v1 would read every zero point one higher
    tensors, want = make_checkpoint(tmp_path / "good", case)
    qc = quantization_config(case)
    del qc["checkpoint_format"]
    qc.update({"format": "gptq_v2", "pack_dtype": "int32", "dynamic": {r"-:.*lm_head": {}}, "method": "gptq"})
    write_folder(tmp_path / "gptqmodel", tensors, qc)
    got = load_checkpoint(tmp_path / "gptqmodel")
    for name, values in want.items():
        assert differing(got[name].dequantize("float16"), values) == 0, name


def test_autoawq_spells_the_version_in_capitals(tmp_path):
    tensors, want = make_checkpoint(tmp_path / "good", CASES[0])
    write_folder(tmp_path / "caps", tensors, {**quantization_config(CASES[0]), "version": "GEMM"})
    got = load_checkpoint(tmp_path / "caps")
    assert all(differing(got[n].dequantize("float16"), v) == 0 for n, v in want.items())


@pytest.mark.parametrize("case", [CASES[0], CASES[10]], ids=lambda c: c.id)
def test_pieces_of_a_weight_make_the_whole(case, tmp_path):
    """The whole matrix is read at once, then cut into pieces of rows: the pieces (of the float32
    entry a conversion reads, and of the decoded values) make the whole, and the stored bytes are
    counted out among them."""
    from neuron_kernels.checkpoints.layouts import open_any, stored_weights

    _, want = make_checkpoint(tmp_path / "ckpt", case)
    ckpt, layout = open_any(str(tmp_path / "ckpt"))
    for w in stored_weights(ckpt, layout):
        whole = w.block_array().dequantize("float32")
        entry = w.decoded_entry()
        flat = np.concatenate([entry.read_flat(a, min(a + 1000, entry.size)) for a in range(0, entry.size, 1000)])
        np.testing.assert_array_equal(flat.reshape(entry.shape).view(np.uint32), whole.view(np.uint32))
        pieces = list(w.decoded_pieces("float16", 7 * w.shape[1] * 4))
        assert len(pieces) == -(-w.shape[0] // 7) and sum(n for _, n in pieces) == w.stored_bytes
        assert differing(np.concatenate([p for p, _ in pieces]), want[w.name]) == 0
        assert w.finite_amax() == float(np.abs(whole).max())


def test_the_labels_say_what_is_stored(tmp_path):
    from neuron_kernels.checkpoints.layouts import open_any, stored_weights

    labels = {}
    for case in (CASES[0], CASES[3], CASES[9]):
        make_checkpoint(tmp_path / case.id, case)
        ckpt, layout = open_any(str(tmp_path / case.id))
        labels[case.id] = (layout.name, sorted({w.label for w in stored_weights(ckpt, layout)}))
    assert labels == {
        "awq-int4-g32": ("awq", ["int4 (awq)"]),
        "gptq-int4-v1-asym-g32-act-order": ("gptq", ["int4 (gptq v1, asymmetric, act-order)"]),
        "gptq-int8-v2-sym-g32": ("gptq", ["int8 (gptq v2)"]),
    }


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[10]], ids=lambda c: c.id)
def test_the_command_dequantizes_the_checkpoint_exactly(case, tmp_path):
    tensors, want = make_checkpoint(tmp_path / "ckpt", case)
    (tmp_path / "ckpt" / "quantize_config.json").write_text(json.dumps(quantization_config(case)))
    r = run("dequantize", tmp_path / "ckpt", tmp_path / "plain", "--dtype", "float16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{len(want)} weight(s) dequantised to float16" in r.stdout
    plain, _ = read_safetensors(tmp_path / "plain" / "model.safetensors")
    assert sorted(plain) == sorted(list(want) + list(PLAIN))
    for name, values in want.items():
        assert differing(plain[name], values) == 0, name
    for name in PLAIN:
        np.testing.assert_array_equal(plain[name], tensors[name])
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert not (tmp_path / "plain" / "quantize_config.json").exists()  # the input's quantisation, not the output's
    r = run("dequantize", tmp_path / "ckpt", tmp_path / "bf16", cwd=tmp_path)  # bfloat16, the default
    assert r.returncode == 0, r.stderr


def test_act_order_weights_keep_their_group_index_in_the_package_file(tmp_path):
    """GPTQ's act-order weights, read, written to the package's block file (zero points and group
    index with them), and read back through the ``npz`` layout: the command dequantises the file to
    the reference's values, its pieces make the whole, and the doctor finds nothing wrong."""
    from neuron_kernels.checkpoints.layouts import open_any, stored_weights
    from neuron_kernels.io.blockfile import BlockFileWriter

    case = CASES[3]
    _, want = make_checkpoint(tmp_path / "ckpt", case)
    got = load_checkpoint(tmp_path / "ckpt")
    with BlockFileWriter(str(tmp_path / "q.npz")) as writer:
        for name in want:
            assert got[name].group_index is not None and got[name].zero_points is not None
            writer.add(name, got[name])
    r = run("dequantize", "q.npz", "plain", "--dtype", "float16", cwd=tmp_path)
    plain, _ = read_safetensors(tmp_path / "plain" / "model.safetensors")
    assert sorted(plain) == sorted(want)
    for name, values in want.items():
        assert differing(plain[name], values) == 0, name
    ckpt, layout = open_any(str(tmp_path / "q.npz"))
    for w in stored_weights(ckpt, layout):
        whole = w.block_array().dequantize("float32")
        entry = w.decoded_entry()
        flat = np.concatenate([entry.read_flat(a, min(a + 1000, entry.size)) for a in range(0, entry.size, 1000)])
        np.testing.assert_array_equal(flat.reshape(entry.shape), whole)
        pieces = [(p.copy(), n) for p, n in w.decoded_pieces("float16", 7 * w.shape[1] * 4)]  # buffers reused
        assert len(pieces) > 1 and differing(np.concatenate([p for p, _ in pieces]), want[w.name]) == 0
        assert w.finite_amax() == float(np.abs(whole).max())
    r = run("check", "q.npz", cwd=tmp_path, check=False)
    assert r.returncode == 0 and "npz layout, 2 quantised weight(s): 0 error(s), 0 warning(s)" in r.stdout, r.stdout


@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=lambda c: c.id)
def test_the_doctor_finds_nothing_wrong(case, tmp_path):
    make_checkpoint(tmp_path / "ckpt", case)
    r = run("check", tmp_path / "ckpt", cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{case.layout} layout, 2 quantised weight(s): 0 error(s), 0 warning(s)" in r.stdout


def test_it_is_not_a_layout_to_write(tmp_path):
    from neuron_kernels.checkpoints import quantize_checkpoint

    make_checkpoint(tmp_path / "ckpt", CASES[0])
    for layout in ("awq", "gptq"):
        r = run("quantize", tmp_path / "ckpt", tmp_path / "out", "--format", "mxfp4_e2m1", "--layout", layout,
                cwd=tmp_path, check=False)  # fmt: skip
        assert r.returncode == 2 and f"invalid choice: '{layout}'" in r.stderr
        (tmp_path / layout).mkdir()
        with pytest.raises(FileFormatError, match=f"the {layout} layout is read only"):
            quantize_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / layout), layout, "mxfp4_e2m1")


@pytest.mark.parametrize("case", [CASES[0], CASES[10]], ids=lambda c: c.id)
def test_it_quantises_into_another_layout_from_its_exact_values(case, tmp_path):
    """AWQ / GPTQ into compressed-tensors' FP8 per channel: each value within float8_e4m3fn's rounding
    of the reference's (half a unit in the last place of 3 mantissa bits, or of the subnormals)."""
    _, want = make_checkpoint(tmp_path / "ckpt", case)
    r = run("quantize", tmp_path / "ckpt", tmp_path / "fp8", "--format", "fp8_channel", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"dequantised from int{case.bits} ({case.layout}" in r.stdout
    got = load_checkpoint(tmp_path / "fp8")
    for name, values in want.items():
        assert got[name].fmt == "fp8_channel"
        v = values.astype(np.float32)
        scale = np.abs(v).max(axis=1, keepdims=True) / 448
        assert (np.abs(got[name].dequantize("float32") - v) <= np.abs(v) * 2.0**-4 + scale * 2.0**-9).all(), name


# ---- producer fixtures -----------------------------------------------------------------------------

PRODUCED = [FIXTURES / "gptq" / "autogptq_int4_actorder", FIXTURES / "gptq" / "autogptq_int3",
            FIXTURES / "awq" / "autoawq_gemm_int4"]  # fmt: skip


@pytest.mark.parametrize("folder", PRODUCED, ids=lambda p: p.name)
def test_producer_checkpoints_read_as_the_producers_dequantise_them(folder):
    """AutoGPTQ's and AutoAWQ's own packers and dequantisers (tests/fixtures/gptq/README.md)."""
    tensors, _ = read_safetensors(folder / "model.safetensors")
    expected, _ = read_safetensors(f"{folder}.expected.safetensors")
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    got = load_checkpoint(folder)
    assert sorted(got) == sorted(expected)
    for name, values in expected.items():
        m = name.removesuffix(".weight")
        if qc["quant_method"] == "awq":
            ref = awq_dequantize(tensors[f"{m}.qweight"], tensors[f"{m}.qzeros"], tensors[f"{m}.scales"], 32)
        else:
            ref = gptq_dequantize(tensors[f"{m}.qweight"], tensors[f"{m}.qzeros"], tensors[f"{m}.scales"],
                                  tensors[f"{m}.g_idx"], qc["bits"])  # fmt: skip
            assert (got[name].group_index is not None) == qc["desc_act"]
        assert differing(got[name].dequantize("float16"), values) == 0, name
        assert differing(ref, values) == 0, name


@pytest.mark.parametrize("folder", PRODUCED, ids=lambda p: p.name)
def test_producer_checkpoints_dequantize_and_check_clean(folder, tmp_path):
    expected, _ = read_safetensors(f"{folder}.expected.safetensors")
    r = run("dequantize", folder, tmp_path / "plain", "--dtype", "float16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plain, _ = read_safetensors(tmp_path / "plain" / "model.safetensors")
    assert {n: differing(plain[n], v) for n, v in expected.items()} == dict.fromkeys(expected, 0)
    assert not {"quantize_config.json", "quant_config.json"} & set(os.listdir(tmp_path / "plain"))
    r = run("check", folder, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- refusals ----------------------------------------------------------------------------------


Q = "model.layers.0.self_attn.q_proj"


def _truncated_qweight(t: dict, qc: dict) -> None:
    t[f"{Q}.qweight"] = t[f"{Q}.qweight"][:-1]


def _float32_scales(t: dict, qc: dict) -> None:
    t[f"{Q}.scales"] = t[f"{Q}.scales"].astype(np.float32)


def _g_idx_out_of_range(t: dict, qc: dict) -> None:
    t[f"{Q}.g_idx"] = t[f"{Q}.g_idx"].copy()
    t[f"{Q}.g_idx"][5] = 4  # 128 inputs in groups of 32: groups 0 to 3


def _stray_qzeros(t: dict, qc: dict) -> None:
    t["x.qzeros"] = np.zeros((1, 1), np.int32)


def _missing_g_idx_under_act_order(t: dict, qc: dict) -> None:
    del t[f"{Q}.g_idx"]
    qc["desc_act"] = True


def _five_bits(t: dict, qc: dict) -> None:
    qc["bits"] = 5


def _marlin(t: dict, qc: dict) -> None:
    qc["checkpoint_format"] = "marlin"


def _wrong_qzeros(t: dict, qc: dict) -> None:
    t[f"{Q}.qzeros"] = t[f"{Q}.qzeros"][:, :-1]


def _pack_dtype(t: dict, qc: dict) -> None:
    qc["pack_dtype"] = "int16"


def _dynamic_bits(t: dict, qc: dict) -> None:
    qc["dynamic"] = {r"-:.*lm_head": {}, r"+:.*down_proj": {"bits": 8}}


def _plain_weight_beside(t: dict, qc: dict) -> None:
    t[f"{Q}.weight"] = np.zeros((64, 128), np.float16)


def _gemv(t: dict, qc: dict) -> None:
    qc["version"] = "gemv"


def _awq_bits(t: dict, qc: dict) -> None:
    qc["bits"] = 8


def _awq_truncated(t: dict, qc: dict) -> None:
    t[f"{Q}.qweight"] = t[f"{Q}.qweight"][:, :-1]


def _awq_out_not_eight(t: dict, qc: dict) -> None:
    t[f"{Q}.scales"] = t[f"{Q}.scales"][:, :-4]


def _awq_without_qweight(t: dict, qc: dict) -> None:
    del t[f"{Q}.qweight"]


#: (case, how the checkpoint is spoilt, what the one line must say)
REFUSALS = [
    (
        CASES[3],
        _truncated_qweight,
        f"[{Q}.qweight]: the 4-bit codes of a [64, 128] weight must be int32 of shape "
        "[16, 64], found int32 of shape [15, 64]",
    ),
    (CASES[3], _float32_scales, f"[{Q}.scales]: GPTQ scales must be float16"),
    (CASES[3], _g_idx_out_of_range, f"[{Q}.g_idx]: g_idx holds groups 0 to 4; the scales have groups 0 to 3"),
    (CASES[3], _stray_qzeros, "x.qzeros belongs to no quantised module of the gptq layout"),
    (CASES[2], _missing_g_idx_under_act_order, f"{Q}.qweight has no {Q}.g_idx beside it, which desc_act"),
    (CASES[3], _five_bits, "GPTQ weights of 5 bits; 2, 3, 4 and 8 are read"),
    (CASES[3], _marlin, "GPTQ checkpoint_format 'marlin' is not read"),
    (CASES[3], _wrong_qzeros, f"[{Q}.qzeros]: the 4-bit zero points of 64 outputs must be int32 of shape [4, 8]"),
    (CASES[3], _pack_dtype, "GPTQ pack_dtype 'int16' (GPTQModel's words of other widths) is not read; int32 is"),
    (CASES[3], _dynamic_bits, "quantization_config dynamic gives modules '+:.*down_proj' bits or a group_size"),
    (CASES[3], _plain_weight_beside, f"{Q}.weight is stored beside {Q}.qweight"),
    (CASES[0], _plain_weight_beside, f"{Q}.weight is stored beside {Q}.qweight"),
    (CASES[0], _gemv, "AWQ version 'gemv' is not read; only 'gemm'"),
    (CASES[0], _awq_bits, "AWQ weights of 8 bits; 4 (AutoAWQ's GEMM) is read"),
    (CASES[0], _awq_truncated, f"[{Q}.qweight]: the 4-bit codes of a [64, 128] weight must be int32 of shape [128, 8]"),
    (CASES[0], _awq_out_not_eight, f"[{Q}.scales]: 60 outputs; AWQ's GEMM layout packs eight per word"),
    (CASES[0], _awq_without_qweight, f"{Q}.qzeros belongs to no quantised module of the awq layout"),
]


@pytest.mark.parametrize("case, spoil, message", REFUSALS, ids=[f"{c.layout}-{s.__name__[1:]}" for c, s, _ in REFUSALS])
def test_bad_checkpoints_are_refused_in_one_line(case, spoil, message, tmp_path):
    tensors, _ = make_checkpoint(tmp_path / "good", case)
    qc = quantization_config(case)
    spoil(tensors, qc)
    write_folder(tmp_path / "bad", tensors, qc)
    with pytest.raises(FileFormatError) as exc:
        load_checkpoint(tmp_path / "bad")
    assert message in str(exc.value)
    r = run("dequantize", tmp_path / "bad", tmp_path / "out", cwd=tmp_path, check=False)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_shape_is_refused_before_any_data_is_read(tmp_path, monkeypatch):
    """A qweight whose shape disagrees with the scales is refused from the headers alone."""
    from neuron_kernels.io.arrays import ArrayEntry

    tensors, _ = make_checkpoint(tmp_path / "good", CASES[3])
    _truncated_qweight(tensors, {})
    write_folder(tmp_path / "bad", tensors, quantization_config(CASES[3]))
    reads: list[str | None] = []
    original = ArrayEntry.read_flat
    monkeypatch.setattr(ArrayEntry, "read_flat", lambda self, a, b: reads.append(self.name) or original(self, a, b))
    with pytest.raises(FileFormatError, match="qweight"):
        load_checkpoint(tmp_path / "bad")
    assert not [n for n in reads if n and n.startswith(Q)]
