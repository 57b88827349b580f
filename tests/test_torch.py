"""PyTorch tensors in and out (docs/torch.md), each entry point against the NumPy path on the same
data: identical bits, no copy of the input (data pointers compared), for every torch dtype the
package reads, strided, 0-d and empty tensors; results in torch's dtype of the format; block arrays
into torchao's own tensors, whose ``dequantize()`` equals the package's; bad input one clear error.
torch and torchao come with the ``runtimes`` extra (CI installs it and fails these tests if they skip).
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.dtypes import get_format
from neuron_kernels.errors import InvalidTypeError
from neuron_kernels.interop import from_torch

from .checkpoint_helpers import bits, read_dir, read_safetensors, write_safetensors
from .cli_runner import run
from .helpers import import_runtime


@pytest.fixture(scope="module")
def torch():
    return import_runtime("torch")


def values(shape=(8, 64), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, -0.0, 448.0]
    return x


READ = ["float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
        "float8_e5m2fnuz", "float8_e8m0fnu", "int8", "int32", "uint8", "int64"]  # fmt: skip


def tensor_of(torch, name: str, x: np.ndarray):
    """A tensor of torch dtype ``name`` holding ``x`` converted by ml_dtypes (the NumPy side's data)."""
    np_dtype = get_format(name).dtype
    a = np.ascontiguousarray(np.clip(x, -100, 100).astype(np_dtype) if np_dtype.kind in "iu" else x.astype(np_dtype))
    t = torch.from_numpy(a.view(f"u{a.dtype.itemsize}" if a.dtype.kind not in "iu" else a.dtype).copy())
    return t.view(getattr(torch, name)) if np_dtype.kind not in "iu" else t


def tensor_bytes(torch, t) -> bytes:
    """The bytes of ``t``'s elements in C order."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def data_pointer(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("name", READ)
def test_tensors_are_read_without_a_copy(torch, name):
    t = tensor_of(torch, name, values())
    for view in (t, t[:, ::3], t.T, t[2, 5], t[:0]):
        a = from_torch(view)
        assert a.shape == tuple(view.shape) and a.dtype == get_format(name).dtype
        if view.numel():
            assert data_pointer(a) == view.data_ptr()
            assert np.ascontiguousarray(a).tobytes() == tensor_bytes(torch, view)


def test_packed_fp4_tensors_are_unpacked(torch):
    codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
    t = torch.from_numpy(codes.copy()).view(torch.float4_e2m1fn_x2)
    unpacked = np.stack((codes & 15, codes >> 4), axis=-1).reshape(4, 128).view(get_format("float4_e2m1fn").dtype)
    got = nk.cast(t, "float32")
    assert got.dtype == torch.float32 and tuple(got.shape) == (4, 128)
    assert tensor_bytes(torch, got) == nk.cast(unpacked, "float32").tobytes()


TARGETS = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float8_e8m0fnu": "float8_e8m0fnu",
           "float16": "float16", "float6_e2m3fn": "uint8", "float32": "float32"}  # fmt: skip


@pytest.mark.parametrize("source", ["float32", "bfloat16", "float16", "float8_e4m3fn", "int8"])
def test_cast_of_a_tensor_is_a_tensor_with_the_numpy_path_bits(torch, source):
    t = tensor_of(torch, source, values(seed=1))[:, 1::2]  # strided
    for target, torch_dtype in TARGETS.items():
        got = nk.cast(t, target)
        want = nk.cast(from_torch(t), target)
        assert isinstance(got, torch.Tensor) and got.dtype == getattr(torch, torch_dtype), target
        assert tuple(got.shape) == want.shape
        assert tensor_bytes(torch, got) == np.ascontiguousarray(want).tobytes(), target
    # into a tensor given as out=, and 0-d / empty
    out = torch.empty(tuple(t.shape), dtype=torch.bfloat16)
    assert nk.cast(t, "bfloat16", out=out) is out
    assert nk.cast(tensor_of(torch, source, values())[3, 4], "float8_e4m3fn").shape == ()
    assert tuple(nk.cast(tensor_of(torch, source, values())[:0], "float8_e4m3fn").shape) == (0, 64)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3", "mxfp4_e2m1"])
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
def test_block_functions_take_tensors(torch, fmt, source):
    t = tensor_of(torch, source, values((16, 128), seed=2))[::2]  # strided rows
    a = from_torch(t)
    q, want = nk.quantize(t, fmt), nk.quantize(a, fmt)
    assert np.array_equal(q.codes, want.codes) and np.array_equal(q.scales, want.scales)
    assert q.per_tensor_scale == want.per_tensor_scale
    fake = nk.fake_quantize(t, fmt)
    assert isinstance(fake, torch.Tensor) and fake.dtype == torch.float32
    assert np.array_equal(bits(fake.numpy()), bits(nk.fake_quantize(a, fmt)))
    assert nk.quantization_error(t, q).sqnr_db == nk.quantization_error(a, want).sqnr_db
    if fmt == "nvfp4":
        assert nk.shared_per_tensor_scale([t, t[:1]]) == nk.shared_per_tensor_scale([a, a[:1]])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3", "mxfp4_e2m1"])
def test_block_arrays_become_torchao_tensors_that_dequantise_alike(torch, fmt):
    import_runtime("torchao.prototype.mx_formats")
    q = nk.quantize(values((8, 128), seed=3), fmt)
    parts = q.to_torch()
    assert parts.scale.dtype == (torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu)
    assert parts.qdata.dtype == (torch.float8_e4m3fn if fmt == "mxfp8_e4m3" else torch.uint8)
    assert parts.qdata.data_ptr() == data_pointer(q.codes)  # shared, not copied
    ao = q.to_torchao()
    assert type(ao).__name__ == ("NVFP4Tensor" if fmt == "nvfp4" else "MXTensor")
    assert np.array_equal(bits(ao.dequantize(torch.float32).numpy()), bits(q.dequantize()))


def test_bad_tensors_are_refused(torch):
    x = torch.ones(4, 32)
    cases = [
        (x.requires_grad_(True), "requires grad; pass tensor.detach()"),
        (torch.ones(4, 32, device="meta"), "on meta; the package computes on the CPU"),
        (torch.ones(4, 32, dtype=torch.complex64), "dtype torch.complex64, which the package does not read"),
        (torch.ones(4, 32, dtype=torch.bool), "dtype torch.bool"),
    ]
    for t, message in cases:
        for call in (
            lambda: nk.cast(t, "bfloat16"),
            lambda: nk.quantize(t, "nvfp4"),
            lambda: nk.fake_quantize(t, "nvfp4"),
        ):
            with pytest.raises(InvalidTypeError, match=re.escape(message)):
                call()
    with pytest.raises(ValueError, match="rotated block array has no torch form"):
        nk.quantize(values((4, 32)), "nvfp4", rht=True).to_torch()


LLAMA = Path(__file__).parent / "fixtures" / "modelopt" / "bf16"  # a tiny Llama saved by transformers


def llama_state_dict(torch) -> dict:
    """The tiny Llama's weights as transformers holds them: bfloat16 torch tensors."""
    tensors = read_safetensors(LLAMA / "model.safetensors")[0]
    return {k: torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16) for k, v in tensors.items()}


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3"])
def test_quantize_state_dict_is_what_the_command_writes(torch, fmt, tmp_path):
    state = llama_state_dict(torch)
    llama_config = json.loads((LLAMA / "config.json").read_text())
    quantised, config = nk.quantize_state_dict(state, fmt, config=llama_config)  # its modules from the config
    run("quantize", LLAMA, "out", "--format", fmt, cwd=tmp_path)
    written = read_dir(tmp_path / "out")[0]
    assert sorted(quantised) == sorted(written)
    for name, value in written.items():
        assert isinstance(quantised[name], torch.Tensor)
        assert tensor_bytes(torch, quantised[name]) == value.tobytes(), name
    assert config == json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert quantised["lm_head.weight"] is state["lm_head.weight"]  # kept tensors: the caller's own
    # NumPy in, NumPy out, the same bytes
    arrays = {k: from_torch(v) for k, v in state.items()}
    numpy_out, _ = nk.quantize_state_dict(arrays, fmt, config=llama_config)
    assert all(np.asarray(numpy_out[k]).tobytes() == v.tobytes() for k, v in written.items())
    # and back: what `dequantize` writes from the state dict saved as save_file would (without the
    # exact NVFP4 per-tensor scales the command keeps in its shards' metadata: 1 / weight_global_scale)
    plain = nk.dequantize_state_dict(quantised, config, "float32")
    (tmp_path / "saved").mkdir()
    write_safetensors(tmp_path / "saved" / "model.safetensors", {k: from_torch(v) for k, v in quantised.items()})
    shutil.copy(tmp_path / "out" / "config.json", tmp_path / "saved")
    run("dequantize", "saved", "plain", "--dtype", "float32", cwd=tmp_path)
    back = read_dir(tmp_path / "plain")[0]
    assert sorted(plain) == sorted(back)
    for name, value in back.items():
        assert tensor_bytes(torch, plain[name]) == value.tobytes(), name


def test_bad_state_dicts_are_refused(torch):
    state = llama_state_dict(torch)
    for bad, message in (
        ({**state, "step": 3}, "state_dict['step'] is a int, not a tensor or array; nothing was converted"),
        ([1, 2], "state_dict must be a mapping"),
        ({**state, "x": torch.ones(2, requires_grad=True)}, "requires grad"),
    ):
        with pytest.raises(InvalidTypeError, match=re.escape(message)):
            nk.quantize_state_dict(bad, "nvfp4")
    with pytest.raises(nk.FileFormatError, match="layout 'npz' is not one a state dict can take"):
        nk.quantize_state_dict(state, "nvfp4", layout="npz")
    with pytest.raises(nk.FileFormatError, match="only=, or the model= or config= it comes from"):
        nk.quantize_state_dict(state, "nvfp4")  # which tensors are Linear weights cannot be told


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fake_quantisation_in_a_training_step_passes_gradients_straight_through(torch, dtype):
    x = tensor_of(torch, dtype, values((4, 64), seed=5)).requires_grad_(True)
    y = nk.torch_fake_quantize(x, "nvfp4")
    want = nk.fake_quantize(from_torch(x.detach()), "nvfp4")
    assert y.dtype == x.dtype and y.requires_grad
    assert tensor_bytes(torch, y) == tensor_bytes(torch, torch.from_numpy(want).to(x.dtype))
    (y * torch.arange(64.0, dtype=x.dtype)).sum().backward()
    assert torch.equal(x.grad, torch.arange(64.0, dtype=x.dtype).expand(4, 64))
