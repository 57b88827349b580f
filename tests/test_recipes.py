"""Producers' recipes (docs/recipes.md): ``recipe=`` and ``--recipe`` give each producer's own bytes,
checked against the producers themselves: compressed-tensors' functions, llm-compressor's and
ModelOpt's checkpoints (tests/fixtures), torchao's quantisers and llama.cpp's ggml quantiser."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.errors import InvalidValueError, NotApplicableError
from neuron_kernels.formats import BLOCK_FORMATS
from neuron_kernels.recipes import RECIPES

from .cli_runner import run
from .helpers import import_runtime, runtime_missing

FIXTURES = Path(__file__).parent / "fixtures"
BF16_LLAMA = FIXTURES / "modelopt" / "bf16"
#: llm-compressor's schemes of tests/fixtures/llmcompressor (scripts/make_llmcompressor_fixtures.py).
LLMC_SCHEMES = {"nvfp4": "nvfp4", "mxfp4": "mxfp4_e2m1", "mxfp8": "mxfp8_e4m3", "fp8_dynamic": "fp8_channel"}
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("o_proj",), ("down_proj",))


def _tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of a .safetensors file as (dtype, shape, bytes), read from the format itself."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    return {
        k: (v["dtype"], v["shape"], data[v["data_offsets"][0] : v["data_offsets"][1]])
        for k, v in header.items()
        if k != "__metadata__"
    }


def _bf16(entry: tuple[str, list[int], bytes]) -> np.ndarray:
    assert entry[0] == "BF16"
    return np.frombuffer(entry[2], ml_dtypes.bfloat16).reshape(entry[1])


def _weights() -> dict[str, np.ndarray]:
    t = _tensors(BF16_LLAMA / "model.safetensors")
    return {k: _bf16(v) for k, v in t.items() if k.endswith("proj.weight")}


def _groups(weights: dict[str, np.ndarray]) -> list[list[str]]:
    return [[n for n in weights if any(n.endswith(f"{m}.weight") for m in g)] for g in FUSED]


@pytest.mark.parametrize("scheme", list(LLMC_SCHEMES))
def test_llm_compressor_checkpoint_byte_for_byte(tmp_path, scheme):
    """The command with --recipe llm-compressor writes every tensor of llm-compressor 0.14's own
    model_free_ptq output byte for byte (codes, block scales, fused layers' global scales, and
    every tensor kept), from the same bfloat16 Llama; the same tensor set, nothing missing or extra."""
    out = tmp_path / "out"
    r = run(
        "quantize", BF16_LLAMA, out, "--layout", "compressed-tensors", "--format", LLMC_SCHEMES[scheme],
        "--recipe", "llm-compressor", "--ignore", "lm_head", "--ignore", "model.embed_tokens", "--quiet",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    want = _tensors(FIXTURES / "llmcompressor" / scheme / "model.safetensors")
    got = _tensors(out / "model.safetensors")
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    group = next(iter(config["config_groups"].values()))
    theirs = json.loads((FIXTURES / "llmcompressor" / scheme / "config.json").read_text())["quantization_config"]
    assert config["format"] == theirs["format"]
    assert group["format"] in (None, config["format"])  # None: the document's format (FP8's group)


def test_default_differs_from_llm_compressor():
    """The recipe is not the default: the package's own NVFP4 of the same weights differs from
    llm-compressor's (the reason recipes exist), and passing no recipe still gives the default."""
    want = _tensors(FIXTURES / "llmcompressor" / "nvfp4" / "model.safetensors")
    w = _weights()["model.layers.0.mlp.down_proj.weight"]
    ours = nk.quantize(w, "nvfp4")
    assert (
        ours.codes.reshape(-1) != np.frombuffer(want["model.layers.0.mlp.down_proj.weight_packed"][2], np.uint8)
    ).any()
    assert np.array_equal(nk.quantize(w, "nvfp4", recipe=None).codes, ours.codes)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3"])
def test_modelopt_checkpoint_bytes(fmt):
    """recipe="modelopt" gives ModelOpt 0.47's export bytes (tests/fixtures/modelopt, made by
    scripts/make_modelopt_fixtures.py): codes, block scales and weight_scale_2, one per fused layer."""
    scheme = {"nvfp4": "nvfp4", "mxfp8_e4m3": "mxfp8"}[fmt]
    want = _tensors(FIXTURES / "modelopt" / scheme / "model.safetensors")
    weights = _weights()
    for group in _groups(weights):
        pts = None
        if BLOCK_FORMATS[fmt].per_tensor_scale:
            pts = nk.shared_per_tensor_scale([weights[n] for n in group], fmt, recipe="modelopt")
        for name in group:
            base = name[: -len("weight")]
            options = {} if pts is None else {"per_tensor_scale": pts}
            q = nk.quantize(weights[name], fmt, recipe="modelopt", **options)
            assert q.codes.tobytes() == want[base + "weight"][2], name
            assert q.scales.view(np.uint8).tobytes() == want[base + "weight_scale"][2], name
            if pts is not None:
                assert np.float32(q.per_tensor_scale).tobytes() == want[base + "weight_scale_2"][2], name


def _special(rng: np.random.Generator, rows: int = 48, cols: int = 64) -> np.ndarray:
    """Random rows over 12 decades, and the blocks where producers' rules part: all-zero, ties of
    every E2M1 midpoint, -0.0 and tiny negatives, amaxes just below a power of two, subnormal and
    huge amaxes, and amaxes at every e4m3 scale edge."""
    x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-6, 6, (rows, 1))).astype(np.float32)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.25, -0.75, -2.5, -5, 7, 8, -0.0, -1e-30], np.float32)
    x[0] = 0
    x[1] = np.tile(ties, cols // 16)
    x[2] = x[1] * np.float32(2**-130)
    x[3], x[3, 0] = 0, np.nextafter(np.float32(8), np.float32(0))
    x[4], x[4, 0] = 0, np.nextafter(np.float32(2**20), np.float32(0))
    x[5] = np.float32(1e-40) * rng.standard_normal(cols).astype(np.float32)
    x[6] = np.float32(3e38) * rng.uniform(-1, 1, cols).astype(np.float32)
    x[7], x[7, 0] = np.float32(-1e-30), 6
    for k in range(8, 40):
        x[k] = x[1] * np.float32(k / 7)
    return x


@pytest.mark.parametrize("fmt", list(RECIPES["ggml"].rules))
def test_ggml_quantiser_bytes(rng, fmt):
    """recipe="ggml" gives llama.cpp's own quantiser's blocks (ggml_quantize_chunk, through ctypes)
    byte for byte, on random weights and on the special blocks of :func:`_special`."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        runtime_missing(f"llama-cpp-python is not installed ({exc})")
    from neuron_kernels.io import gguf_file

    from .ggml_lib import MXFP4, NVFP4, ggml_quantize

    ggml_type, blocks = {"mxfp4_e2m1": (MXFP4, gguf_file.mxfp4_blocks), "nvfp4": (NVFP4, gguf_file.nvfp4_blocks)}[fmt]
    for x in (_special(rng), (rng.standard_normal((64, 512)) * 0.02).astype(np.float32)):
        q = nk.quantize(x, fmt, recipe="ggml", pack=False)
        assert q.per_tensor_scale is None
        got = blocks(q.codes.reshape(-1), q.scales.view(np.uint8).reshape(-1))
        want = ggml_quantize(x, ggml_type)
        assert np.array_equal(got.reshape(want.shape), want)


def _torch_bf16(torch, x: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)


def test_compressed_tensors_functions(rng):
    """recipe="llm-compressor" equals compressed-tensors' own functions on bfloat16 tensors over 12
    decades, with all-zero blocks, -0.0 and tiny negatives: NVFP4 (generate_gparam, calculate_qparams,
    _quantize, pack_fp4_to_uint8) and FP8 per channel, per 128 x 128 block and per tensor."""
    torch = import_runtime("torch")
    helpers = import_runtime("compressed_tensors.quantization.utils.helpers")
    forward = import_runtime("compressed_tensors.quantization.lifecycle.forward_helpers")
    nvfp4 = import_runtime("compressed_tensors.compressors.nvfp4.helpers")
    args_of = import_runtime("compressed_tensors.quantization").QuantizationArgs
    fp4 = args_of(num_bits=4, type="float", strategy="tensor_group", group_size=16, scale_dtype=torch.float8_e4m3fn)
    e2m1 = BLOCK_FORMATS["nvfp4"].max_element
    for _ in range(4):
        x = (rng.standard_normal((64, 256)) * 0.02 * 10.0 ** rng.uniform(-5, 5)).astype(ml_dtypes.bfloat16)
        x[0, :16], x[1, :16], x[1, 16] = 0, -1e-30, -0.0
        w = _torch_bf16(torch, x)
        amax = w.abs().amax()
        gs = helpers.generate_gparam(-amax.reshape(1), amax.reshape(1))
        g = w.reshape(64, -1, 16)
        bmax = g.abs().amax(-1)
        scale, _ = helpers.calculate_qparams(-bmax, bmax, fp4, global_scale=gs)
        scale = scale.to(torch.bfloat16)
        q = forward._quantize(
            g, scale.unsqueeze(-1), None, torch.tensor(-e2m1), torch.tensor(e2m1), fp4, global_scale=gs
        )
        mine = nk.quantize(x, "nvfp4", recipe="llm-compressor")
        assert np.float32(1.0 / mine.per_tensor_scale) == gs.numpy()[0]
        assert np.array_equal(mine.scales.view(np.uint8), scale.to(torch.float8_e4m3fn).view(torch.uint8).numpy())
        assert np.array_equal(mine.codes, nvfp4.pack_fp4_to_uint8(q.reshape(w.shape)).numpy())
    top = BLOCK_FORMATS["fp8_channel"].max_element
    x = (rng.standard_normal((300, 260)) * 0.02).astype(ml_dtypes.bfloat16)
    x[0], x[5] = 0, -1e-38
    w = _torch_bf16(torch, x)
    for fmt, strategy in (("fp8_channel", "channel"), ("fp8_block", "block"), ("fp8_tensor", "tensor")):
        blocks = {"block_structure": [128, 128]} if strategy == "block" else {}
        args = args_of(num_bits=8, type="float", strategy=strategy, **blocks)
        tile = {"fp8_channel": (1, 260), "fp8_block": (128, 128), "fp8_tensor": (300, 260)}[fmt]
        scales = np.empty((-(-300 // tile[0]), -(-260 // tile[1])), ml_dtypes.bfloat16)
        codes = np.empty((300, 260), np.uint8)
        for i in range(scales.shape[0]):
            for j in range(scales.shape[1]):
                t = w[i * tile[0] : (i + 1) * tile[0], j * tile[1] : (j + 1) * tile[1]]
                a = t.abs().amax().reshape(1)
                s, _ = helpers.calculate_qparams(-a, a, args)
                scales[i, j] = s.float().numpy()[0]
                c = forward._quantize(t, s, None, torch.tensor(-top), torch.tensor(top), args)
                block = c.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
                codes[i * tile[0] : (i + 1) * tile[0], j * tile[1] : (j + 1) * tile[1]] = block
        mine = nk.quantize(x, fmt, recipe="llm-compressor")
        assert mine.scales.dtype == ml_dtypes.bfloat16
        assert np.array_equal(mine.scales.view(np.uint16).reshape(scales.shape), scales.view(np.uint16)), fmt
        assert np.array_equal(mine.codes, codes), fmt


def test_torchao_quantisers(rng):
    """recipe="torchao" is torchao's to_mx (MX, its default floor scale) and nvfp4_quantize (NVFP4)."""
    torch = import_runtime("torch")
    mx = import_runtime("torchao.prototype.mx_formats.mx_tensor")
    ao_nvfp4 = import_runtime("torchao.prototype.mx_formats.nvfp4_tensor")
    x = (rng.standard_normal((64, 256)) * 10.0 ** rng.uniform(-4, 4, (64, 1))).astype(np.float32)
    x[0], x[1, :32], x[1, 32:64] = 0, -0.0, -1e-30
    dtypes = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp4_e2m1": torch.float4_e2m1fn_x2}
    for fmt, dtype in dtypes.items():
        scale, data = mx.to_mx(torch.from_numpy(x), dtype, 32)
        q = nk.quantize(x, fmt, recipe="torchao")
        assert np.array_equal(q.scales.view(np.uint8), scale.view(torch.uint8).numpy().reshape(q.scales.shape)), fmt
        assert np.array_equal(q.codes, data.view(torch.uint8).numpy().reshape(q.codes.shape)), fmt
    t = torch.from_numpy(x)
    pts = ao_nvfp4.per_tensor_amax_to_scale(t.abs().max())
    scale, data = ao_nvfp4.nvfp4_quantize(t, 16, pts)
    q = nk.quantize(x, "nvfp4", recipe="torchao")
    assert np.float32(q.per_tensor_scale) == pts.numpy()
    assert np.array_equal(q.scales.view(np.uint8), scale.view(torch.uint8).numpy().reshape(q.scales.shape))
    assert np.array_equal(q.codes, data.view(torch.uint8).numpy().reshape(q.codes.shape))


def test_fake_quantize_and_lazy_follow_the_recipe(rng):
    """fake_quantize with a recipe is the dequantisation of its codes; a Dask array gives the same
    block array; the family functions take it too."""
    import dask.array as da

    x = (rng.standard_normal((32, 128)) * 0.05).astype(ml_dtypes.bfloat16)
    q = nk.quantize(x, "nvfp4", recipe="llm-compressor")
    assert np.array_equal(nk.fake_quantize(x, "nvfp4", recipe="llm-compressor"), q.dequantize())
    lazy = nk.quantize(da.from_array(x, chunks=(8, 128)), "nvfp4", recipe="llm-compressor").compute()
    assert np.array_equal(lazy.codes, q.codes) and np.array_equal(lazy.scales.view(np.uint8), q.scales.view(np.uint8))
    assert lazy.per_tensor_scale == q.per_tensor_scale
    assert np.array_equal(nk.quantize_nvfp4(x, recipe="llm-compressor").codes, q.codes)
    mx = nk.quantize(x, "mxfp4_e2m1", recipe="ggml")
    assert np.array_equal(nk.quantize_mx(x, "mxfp4_e2m1", recipe="ggml").codes, mx.codes)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: nk.quantize(x, "nvfp4", recipe="gptq"), InvalidValueError, "unknown recipe 'gptq'; accepted: llm"),
        (lambda x: nk.quantize(x, "mxfp6_e3m2", recipe="ggml"), NotApplicableError, "does not write mxfp6_e3m2"),
        (lambda x: nk.quantize(x, "nvfp4", recipe="ggml", per_tensor_scale=0.5), InvalidValueError, "per_tensor_s"),
        (lambda x: nk.quantize(x, "nvfp4", recipe="modelopt", four_over_six="mse"), InvalidValueError, "four_over"),
        (lambda x: nk.quantize(x, "nvfp4", recipe="modelopt", per_tensor_scale=None), InvalidValueError, "computes"),
        (lambda x: nk.quantize(x, "mxfp4_e2m1", recipe="llm-compressor", block_size=16), InvalidValueError, "block_s"),
        (lambda x: nk.quantize(x, "mxfp4_e2m1", recipe="llm-compressor", axis=0), InvalidValueError, "last axis"),
        (lambda x: nk.quantize(x.astype(np.float16), "nvfp4", recipe="llm-compressor"), NotApplicableError, "float16"),
        (lambda x: nk.quantize(np.where(x > 1, np.nan, x), "nvfp4", recipe="ggml"), InvalidValueError, "NaN or inf"),
    ],
)
def test_recipe_refusals(rng, call, error, match):
    """A recipe and an option it fixes, a recipe for a format its producer does not write, an
    unknown recipe, float16 weights for a recipe computing in the weight's dtype, and NaN input
    are each refused with what is wrong and what is accepted."""
    x = rng.standard_normal((16, 64)).astype(np.float32)
    with pytest.raises(error, match=match):
        call(x)


def test_cli_recipe_on_a_file_and_its_refusal(tmp_path, rng):
    """--recipe on an array file writes the recipe's block array; with an option it fixes, one line
    and exit 2, nothing written."""
    x = (rng.standard_normal((16, 64)) * 0.1).astype(np.float32)
    np.save(tmp_path / "w.npy", x)
    r = run(
        "quantize",
        tmp_path / "w.npy",
        tmp_path / "q.npz",
        "--format",
        "mxfp4_e2m1",
        "--recipe",
        "ggml",
        "--quiet",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    got = nk.load_checkpoint(tmp_path / "q.npz")
    q = next(iter(got.values()))
    assert np.array_equal(q.codes, nk.quantize(x, "mxfp4_e2m1", recipe="ggml").codes)
    r = run(
        "quantize",
        tmp_path / "w.npy",
        tmp_path / "r.npz",
        "--format",
        "nvfp4",
        "--recipe",
        "ggml",
        "--rht",
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 2 and "fixes rht" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "r.npz").exists()


@pytest.mark.parametrize("fmt", list(RECIPES["ggml"].rules))
def test_gguf_recipe_ggml_is_llama_quantisers_bytes(tmp_path, fmt):
    """A GGUF file quantised with --recipe ggml holds, in every quantised tensor, the blocks of ggml's
    own quantiser run on the same float32 values, and no .scale tensor (ggml's FP4 is one level)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        runtime_missing(f"llama-cpp-python is not installed ({exc})")
    from gguf import GGUFReader

    from .ggml_lib import MXFP4, NVFP4, ggml_quantize

    ggml_type = {"mxfp4_e2m1": MXFP4, "nvfp4": NVFP4}[fmt]
    source = FIXTURES / "gguf" / "llama-bf16.gguf"
    out = tmp_path / "out.gguf"
    run("quantize", source, out, "--format", fmt, "--recipe", "ggml", "--quiet", cwd=tmp_path)
    before = {t.name: t for t in GGUFReader(source).tensors}
    after = GGUFReader(out).tensors
    assert not [t.name for t in after if t.name.endswith(".scale")]
    checked = 0
    for t in after:
        if int(t.tensor_type) != ggml_type:
            continue
        s = before[t.name]
        raw = np.asarray(s.data)
        values = raw.view(ml_dtypes.bfloat16).astype(np.float32) if s.tensor_type.name == "BF16" else raw
        want = ggml_quantize(values.reshape(-1, int(s.shape[0])), ggml_type)
        assert np.array_equal(np.asarray(t.data).reshape(want.shape), want), t.name
        checked += 1
    assert checked >= 7


def test_float32_logarithms_of_the_e8m0_rules():
    """The e8m0 rules' ``floor(log2f(a))`` (ggml) and ``ceil(log2(r))`` (ModelOpt) take the exponent
    where the float32 logarithm cannot reach the next integer, the logarithm itself elsewhere:
    equal to the logarithm rounded to float32 on every exponent's significands nearest 1 and 2,
    subnormals included."""
    from numba import njit

    from neuron_kernels.kernels import recipe_kernels as R

    edges = np.concatenate([np.arange(0, 200), np.arange(0x7FF000 - 100, 0x800000)]).astype(np.uint32)
    patterns = (np.arange(0, 255, dtype=np.uint32)[:, None] << np.uint32(23) | edges[None, :]).ravel()[1:]
    values = patterns.view(np.float32)

    @njit
    def fast(values, floors, ceils):
        for i in range(values.size):
            floors[i], ceils[i] = R._floor_log2f(values[i]), R._ceil_log2f(values[i])

    floors, ceils = np.empty(values.size, np.int64), np.empty(values.size, np.int64)
    fast(values, floors, ceils)
    logs = np.log2(values.astype(np.float64)).astype(np.float32)
    assert np.array_equal(floors, np.floor(logs).astype(np.int64))
    assert np.array_equal(ceils, np.ceil(logs).astype(np.int64))
