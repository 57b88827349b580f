"""``recipe="neuron"`` (docs/recipes.md): NxD Inference's own quantisation, bit for bit.

NxDI's ``save_quantized_state_dict`` loads the model in float32 (transformers 4.57's default) and
quantises each Linear weight on the CPU with neuronx-distributed's functions
(``quantization_utils.py``, ``observer.py``; NxD fbac349, NxDI 4bcdc54). The references below are
those functions transcribed line by line into numpy, and the same lines run in torch where it is
installed (torch's own ``quantize_per_channel`` is int8's oracle); the package's kernels are checked
against both on every code, the ties between codes and the blocks where the rules part (zero
rows, rows below NxD's scale floor, subnormal inputs, -0.0), and through the command."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.errors import InvalidValueError, NotApplicableError

from .checkpoint_helpers import read_safetensors
from .cli_runner import run
from .helpers import import_runtime
from .neuron_checkpoints import PROJ, bf16_model, write_model

E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.float32


def nxd_fp8_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_fp8_per_channel(tensor, float8_e4m3fn, channel_axis=0)``: float32, the amax over
    each row, ``/ 240`` (``DtypeBound.F8E4M3_MAX``), floored at float32(1e-05), the row divided,
    clamped to +-240, cast to float8_e4m3fn (nearest even). The scale [out, 1]."""
    t = w.astype(F32)
    scales = np.abs(t).max(axis=1, keepdims=True) / F32(240.0)
    scales = np.maximum(scales, np.ones(scales.shape, F32) * F32(1e-05))
    return np.clip(t / scales, F32(-240.0), F32(240.0)).astype(E4M3FN), scales


def nxd_fp8_per_tensor(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_fp8_per_tensor(tensor, float8_e4m3fn)`` on the float32 weight: no floor."""
    t = w.astype(F32)
    scale = np.abs(t).max() / F32(240.0)
    return np.clip(t / scale, F32(-240.0), F32(240.0)).astype(E4M3FN), np.array([scale], F32)


def nxd_int8_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``PerChannelAbsMaxObserver`` (``max_val / quant_max``, floored at float32's epsilon) and
    torch's ``quantize_per_channel`` (``round(x * (1.0f / scale))`` to nearest even, clamped to
    [-128, 127]), as ``_quantize_weight`` calls it."""
    t = w.astype(F32)
    scales = np.maximum(np.abs(t).max(axis=1, keepdims=True) / F32(127.0), np.finfo(F32).eps)
    inv = F32(1.0) / scales
    return np.clip(np.rint(t * inv), -128, 127).astype(np.int8), scales


def torch_lines(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The same functions' lines run in torch itself (NxD's source, the int8 quantiser torch's)."""
    torch = import_runtime("torch")
    t = torch.from_numpy(w.astype(F32))
    if fmt == "int8_channel":
        eps = torch.tensor(torch.finfo(torch.float32).eps)
        scales = torch.max(torch.amax(torch.abs(t), dim=1, keepdim=True) / 127.0, eps)
        zero = torch.zeros(t.shape[0], dtype=torch.int64)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(t, scales.squeeze(1).to(torch.double), zero, 0, torch.qint8)
        return torch.int_repr(q).numpy(), scales.numpy()
    if fmt == "fp8_e4m3_channel":
        max_values = torch.amax(torch.abs(t), dim=(1,), keepdim=True)
        scales = max_values / 240.0
        scales = torch.max(scales, torch.ones(scales.shape) * 1e-05)
        q = torch.clamp(t / scales, -240.0, 240.0).to(torch.float8_e4m3fn)
    else:
        scales = (torch.max(torch.abs(t)) / 240.0).reshape(1)
        q = torch.clamp(t / scales, -240.0, 240.0).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy().view(E4M3FN), scales.numpy()


REFERENCES = {
    "fp8_e4m3_channel": nxd_fp8_per_channel,
    "fp8_e4m3_tensor": nxd_fp8_per_tensor,
    "int8_channel": nxd_int8_per_channel,
}


def every_code_rows(fmt: str, rng: np.random.Generator) -> np.ndarray:
    """Rows whose quotients are every code of the format and every midpoint between neighbours
    (ties), each also one float32 step either side, at scales over 60 binades; then rows where the
    rules part: all zero, one value, below NxD's FP8 scale floor (amax < 240e-5), float32
    subnormals, -0.0 among tiny negatives, and random rows over 12 decades."""
    if fmt.startswith("fp8"):
        values = np.arange(0, 256, dtype=np.uint8).view(E4M3FN).astype(F32)
        grid = np.unique(np.abs(values[np.isfinite(values) & (np.abs(values) <= 240)]))
    else:
        grid = np.arange(0, 129, dtype=F32)
    mids = (grid[:-1] + grid[1:]) / F32(2)
    base = np.concatenate([grid, mids, -grid, -mids])
    base = np.concatenate([base, np.nextafter(base, F32(np.inf)), np.nextafter(base, F32(-np.inf))])
    rows = [base * F32(2.0**e) * F32(1.5 if e % 2 else 1.0) for e in range(-40, 20, 3)]
    cols = base.size
    top = F32(grid[-1] if fmt.startswith("fp8") else 127)
    for a in (rng.uniform(1, 2, 20) * 2.0 ** rng.integers(-30, 10, 20)).astype(F32):
        # near-ties at a scale of many significant bits, where x / s and x * (1 / s) part
        s = a / top
        inside = mids[mids < top]  # a is the row's amax
        near = (inside * s).astype(F32)
        off = (inside * s * (1 + rng.uniform(-3, 3, inside.size) * 2.0**-24)).astype(F32)  # a few ulps off
        row = np.concatenate([near, np.nextafter(near, F32(np.inf)), np.nextafter(near, F32(0)), off])
        row = np.resize(np.concatenate([row, -row]), cols)
        row[0] = a
        rows.append(row)
    special = np.zeros((10, cols), F32)
    special[1, 7] = F32(-3.0)
    special[2] = rng.uniform(-1, 1, cols).astype(F32) * F32(1e-3)  # amax / 240 below 1e-05
    special[3] = rng.uniform(-1, 1, cols).astype(F32) * F32(3e-40)  # float32 subnormals
    special[4] = -rng.uniform(0, 1, cols).astype(F32) * F32(1e-30)
    special[4, ::5] = -0.0
    special[4, 1] = F32(2.0)
    for k in range(5, 10):
        special[k] = (rng.standard_normal(cols) * 10.0 ** rng.uniform(-6, 6)).astype(F32)
    return np.concatenate([np.stack(rows), special])


def _as_bits(codes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(codes).view(np.uint8)


def _check(fmt: str, w: np.ndarray, q) -> None:
    want_codes, want_scales = REFERENCES[fmt](w)
    assert np.array_equal(_as_bits(q.codes), _as_bits(want_codes)), fmt
    assert np.array_equal(np.asarray(q.scales, F32).ravel(), want_scales.ravel()), fmt


@pytest.mark.parametrize("fmt", list(REFERENCES))
def test_every_code_and_special_rows(fmt, rng):
    """The package's codes and scales equal NxD's on every code, every tie and the special rows;
    per tensor, each row is a tensor of its own (its scale is the tensor's)."""
    x = every_code_rows(fmt, rng)
    if fmt == "fp8_e4m3_tensor":
        for row in x[np.abs(x).max(axis=1) > 0]:  # an all-zero tensor: below
            _check(fmt, row[None, :], nk.quantize(row[None, :], fmt, recipe="neuron"))
    else:
        _check(fmt, x, nk.quantize(x, fmt, recipe="neuron"))


@pytest.mark.parametrize("fmt", list(REFERENCES))
def test_the_references_are_nxds_torch_lines(fmt, rng):
    """The numpy references equal NxD's lines run in torch on the same rows, so that the package is
    checked against NxD's arithmetic and not against a reading of it only."""
    x = every_code_rows(fmt, rng)
    tensors = [row[None, :] for row in x if np.abs(row).max() > 0] if fmt == "fp8_e4m3_tensor" else [x]
    for w in tensors:
        codes, scales = torch_lines(w, fmt)
        want_codes, want_scales = REFERENCES[fmt](w)
        assert np.array_equal(_as_bits(codes), _as_bits(want_codes))
        assert np.array_equal(scales.ravel(), want_scales.ravel())


@pytest.mark.parametrize("fmt", list(REFERENCES))
def test_bfloat16_weights_are_widened_first(fmt, rng):
    """NxDI loads a bfloat16 checkpoint in float32, so its arithmetic is float32's on the widened
    values: the same codes as the float32 copy, whatever the input's dtype."""
    w = (rng.standard_normal((64, 320)) * 0.02).astype(ml_dtypes.bfloat16)
    q = nk.quantize(w, fmt, recipe="neuron")
    _check(fmt, w, q)
    assert np.array_equal(_as_bits(q.codes), _as_bits(nk.quantize(w.astype(F32), fmt, recipe="neuron").codes))


def test_the_recipe_is_not_the_default(rng):
    """The package's own rules differ (int8: amax / 127.5 and a division; FP8: no floor), and the
    recipe's FP8 per tensor of an all-zero tensor, which NxD divides 0 / 0 into NaN codes, is zero
    codes with float32's epsilon as the scale (the rule of compressed-tensors' FP8)."""
    w = (rng.standard_normal((32, 256)) * 0.02).astype(F32)
    for fmt, x in (("int8_channel", w), ("fp8_e4m3_channel", w * F32(1e-4))):
        assert not np.array_equal(nk.quantize(x, fmt).scales, nk.quantize(x, fmt, recipe="neuron").scales)
    zero = nk.quantize(np.zeros((4, 32), F32), "fp8_e4m3_tensor", recipe="neuron")
    assert not _as_bits(zero.codes).any() and np.asarray(zero.scales).ravel().tolist() == [2.0**-23]


@pytest.mark.parametrize(
    "fmt, options, error, match",
    [
        ("fp8_e4m3_block", {}, NotApplicableError, "it writes: fp8_e4m3_channel, fp8_e4m3_tensor, int8_channel"),
        ("int4_group", {}, NotApplicableError, "does not write int4_group"),
        ("int8_channel", {"block_size": 32}, InvalidValueError, "fixes block_size"),
        ("fp8_e4m3_channel", {"scale_dtype": "bfloat16"}, InvalidValueError, "fixes scale_dtype"),
    ],
)
def test_what_nxd_does_not_write_is_refused(fmt, options, error, match):
    with pytest.raises(error, match=match):
        nk.quantize(np.ones((4, 256), F32), fmt, recipe="neuron", **options)


def test_nan_is_refused(rng):
    w = rng.standard_normal((4, 64)).astype(F32)
    w[2, 3] = np.nan
    for fmt in REFERENCES:
        with pytest.raises(InvalidValueError, match="NaN or infinity"):
            nk.quantize(w, fmt, recipe="neuron")


@pytest.mark.parametrize("fmt", list(REFERENCES))
def test_the_command_writes_nxdis_checkpoint(fmt, tmp_path):
    """``--layout neuron --recipe neuron`` from a bfloat16 model: every weight and scale is what
    NxDI's save_quantized_state_dict computes from the float32-loaded weight, the other tensors kept."""
    t = bf16_model(np.random.default_rng(3))
    write_model(tmp_path / "bf16", t)
    r = run("quantize", "bf16", "out", "--layout", "neuron", "--format", fmt, "--recipe", "neuron", cwd=tmp_path)
    assert "the runtime's settings" in r.stdout
    tensors, _ = read_safetensors(tmp_path / "out" / "model.safetensors")
    settings = json.loads((tmp_path / "out" / "neuron_quantization.json").read_text())
    assert settings["quantization_dtype"] == ("int8" if fmt == "int8_channel" else "f8e4m3")
    for name in PROJ:
        module = name.removesuffix(".weight")
        codes, scales = REFERENCES[fmt](t[name])
        assert tensors[name].dtype == codes.dtype and np.array_equal(_as_bits(tensors[name]), _as_bits(codes)), name
        assert tensors[f"{module}.scale"].dtype == F32
        assert np.array_equal(tensors[f"{module}.scale"], scales.reshape(tensors[f"{module}.scale"].shape))
        assert tensors[f"{module}.scale"].shape == ((1,) if fmt == "fp8_e4m3_tensor" else (t[name].shape[0], 1))
