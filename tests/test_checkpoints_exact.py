"""Exact conversions (docs/checkpoints.md "Exact conversions"): what a conversion keeps, checked
with decoders written from the layouts (tests/checkpoint_helpers.py), not with the package.

- MXFP4 into NVFP4 as its codes, each block's scale 2^k re-laid as float8_e4m3fn 2^(k - g) under
  one per-tensor 2^g per fused layer, when the exponents fit (18 binades); quantised anew,
  and said to be inexact, when they do not; ``--require-exact`` refuses that;
- MX into FP8 with float scales through power-of-two scales, and MXFP4 into MXFP8: every value kept;
- the summary says how many weights converted by quantising anew keep every value.
"""

import json

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.blocks import exact as E
from neuron_kernels.formats import BLOCK_FORMATS

from .checkpoint_helpers import decode_ct, read_dir, write_safetensors
from .cli_runner import run
from .command_checks import fails
from .modelopt_rules import BF16, make_llama

QUANTISED = [f"model.layers.{i}.{m}" for i in range(2) for m in
             ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
              "mlp.up_proj", "mlp.down_proj")]  # fmt: skip


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def decoded(folder, fmt):
    tensors = read_dir(folder)[0]
    return {m: decode_ct(tensors, m, fmt) for m in QUANTISED}, tensors


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory):
    """A 256 x 384 Llama in MXFP4 (compressed-tensors), with one weight whose block scales span more
    than NVFP4 holds (a row 2^-24 times the others) and a fused shard (k_proj) of a smaller range."""
    d = tmp_path_factory.mktemp("exact")
    dense = make_llama(d / "llama")
    wide = dense["model.layers.1.mlp.down_proj.weight"].astype(np.float32)
    wide[7] *= np.float32(2.0**-24)
    dense["model.layers.1.mlp.down_proj.weight"] = wide.astype(BF16)
    dense["model.layers.0.self_attn.k_proj.weight"] = (dense["model.layers.0.self_attn.k_proj.weight"] * 16).astype(
        BF16
    )
    write_safetensors(d / "llama" / "model.safetensors", dense)
    run("quantize", "llama", "mx", "--format", "mxfp4_e2m1", cwd=d)
    return d


def test_mxfp4_goes_into_nvfp4_as_its_codes(mxfp4):
    d = mxfp4
    r = run("quantize", "mx", "nv", "--format", "nvfp4", cwd=d)
    assert "13 converted exactly (codes copied)" in r.stdout and "1 tensor(s) quantised" in r.stdout, r.stdout
    assert "exact: 0 of the 1 converted by quantising anew keep every value" in r.stdout
    before, src = decoded(d / "mx", "mxfp4_e2m1")
    after, out = decoded(d / "nv", "nvfp4")
    for m in QUANTISED:
        if m == "model.layers.1.mlp.down_proj":
            assert "more than 18 binades" in r.stdout and f"{m}.weight" in r.stdout
            assert not np.array_equal(bits(after[m]), bits(before[m]))
            continue
        assert np.array_equal(bits(after[m]), bits(before[m])), m  # every value, as the runtimes decode it
        assert out[f"{m}.weight_packed"].tobytes() == src[f"{m}.weight_packed"].tobytes(), m
        g = out[f"{m}.weight_global_scale"]
        assert g.dtype == np.float32 and g[0] == 2.0 ** np.round(np.log2(g[0])), m  # a power of two
    # the shards of a fused layer keep one per-tensor scale (vLLM reads one for the fused GEMM)
    for i in range(2):
        qkv = {float(out[f"model.layers.{i}.self_attn.{p}_proj.weight_global_scale"][0]) for p in "qkv"}
        assert len(qkv) == 1, qkv


def test_the_re_laid_scales_against_a_reference():
    """:func:`nvfp4_scales` against a loop over blocks written from the rule, on random codes and
    scales with all-zero, NaN and edge-of-range blocks."""
    rng = np.random.default_rng(3)
    src, dst = BLOCK_FORMATS["mxfp4_e2m1"], BLOCK_FORMATS["nvfp4"]
    codes = rng.integers(0, 256, size=(6, 64), dtype=np.uint8)
    codes[0, :16] = 0  # an all-zero block
    codes[1, 16:32] = 0x88  # negative zeros only
    scales = rng.integers(118, 136, size=(6, 4)).astype(np.uint8)
    scales[2, 1] = 0xFF  # a NaN block
    scales[3, 0], scales[3, 1] = 135, 118  # the two ends of the 18 binades
    lo, hi, amax = E.mx_extremes(codes, scales, src)
    assert (lo, hi) == (118 - 127, 135 - 127)
    g = E.per_tensor_exponent(lo, hi)
    assert g == 0  # 2^8 at the top
    got = E.nvfp4_scales(codes, scales, src, dst, g)
    e4m3 = {2.0**e: nk.cast(np.float32([2.0**e]), "float8_e4m3fn").view(np.uint8)[0] for e in range(-9, 9)}
    for i in range(6):
        for b in range(4):
            block = codes[i, 16 * b : 16 * (b + 1)]
            if scales[i, b] == 0xFF:
                want = 0x7F
            elif not ((block & 0x77) != 0).any():
                want = 0x08  # 2^-6: what the package's NVFP4 gives an all-zero block
            else:
                want = e4m3[2.0 ** (int(scales[i, b]) - 127 - g)]
            assert got[i, 2 * b] == got[i, 2 * b + 1] == want, (i, b)
    assert E.per_tensor_exponent(117 - 127, 135 - 127) is None  # 19 binades
    values = [v for v in nk.dequantize(_mx(codes, scales)).reshape(-1).tolist() if np.isfinite(v)]
    assert amax == max(abs(v) for v in values)


def _mx(codes, scales):
    q = nk.quantize(np.zeros((6, 128), np.float32), "mxfp4_e2m1")
    return nk.BlockArray.from_parts(codes, scales.view(q.scales.dtype), q.layout, "test")


def test_require_exact_refuses_what_does_not_fit(mxfp4):
    fails("quantize", "mx", "no", "--format", "nvfp4", "--require-exact", cwd=mxfp4,
          message="model.layers.1.mlp.down_proj.weight: mxfp4_e2m1 to nvfp4 is not exact")  # fmt: skip


@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8_block", "mxfp8_e4m3"])
def test_mx_into_fp8_keeps_every_value(mxfp4, fmt):
    """Power-of-two float scales (the default from MX; DeepSeek-V3.1's rule) and MXFP8: exact where
    a block's binades fit (not the 128 x 128 tiles holding the row 2^-24 times the others), said so,
    and refused by --require-exact where not. The FP8 weights decode as code times scale."""
    d = mxfp4
    wide = "model.layers.1.mlp.down_proj"
    r = run("quantize", "mx", fmt, "--format", fmt, cwd=d)
    inexact = {wide} if fmt == "fp8_block" else set()
    assert f"exact: {14 - len(inexact)} of the 14 converted by quantising anew keep every value" in r.stdout, r.stdout
    before, _ = decoded(d / "mx", "mxfp4_e2m1")
    out = read_dir(d / fmt)[0]
    for m in QUANTISED:
        if fmt == "mxfp8_e4m3":
            values = decode_ct(out, m, fmt)
        else:
            w, s = out[f"{m}.weight"].astype(np.float32), out[f"{m}.weight_scale"].astype(np.float32)
            assert (s.view(np.uint32) & 0x7FFFFF == 0).all(), m  # powers of two
            grid = np.repeat(s, -(-w.shape[0] // s.shape[0]), axis=0)[: w.shape[0]]
            values = w * np.repeat(grid, -(-w.shape[1] // s.shape[1]), axis=1)[:, : w.shape[1]]
        assert np.array_equal(bits(values), bits(before[m])) != (m in inexact), m
    if inexact:
        fails("quantize", "mx", "no", "--format", fmt, "--require-exact", cwd=d,
              message=f"{wide}.weight: mxfp4_e2m1 to {fmt} changes its values")  # fmt: skip
    else:
        run("quantize", "mx", f"{fmt}-exact", "--format", fmt, "--require-exact", cwd=d)


def test_a_scale_mode_given_is_the_users(mxfp4):
    """--scale-mode divide asks for amax / 448: quantised so, not exact, and said so."""
    r = run("quantize", "mx", "div", "--format", "fp8_channel", "--scale-mode", "divide", cwd=mxfp4)
    assert "exact: 0 of the 14" in r.stdout, r.stdout


def test_options_quantise_mxfp4_anew_with_the_amax_of_its_codes(mxfp4):
    """An option of its own (--four-over-six) quantises MXFP4 anew into NVFP4, with the per-tensor
    scale from the amax its codes and scales give (no decoding pass): the in-memory bytes."""
    d = mxfp4
    run("quantize", "mx", "fos", "--format", "nvfp4", "--four-over-six", "mse", "--no-fuse", cwd=d)
    mx, out = nk.load_checkpoint(d / "mx"), nk.load_checkpoint(d / "fos")
    for m in QUANTISED:
        want = nk.quantize(mx[f"{m}.weight"].dequantize(), "nvfp4", four_over_six="mse")
        got = out[f"{m}.weight"]
        assert got.per_tensor_scale == want.per_tensor_scale, m
        assert np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales), m


def test_require_exact_is_for_checkpoints(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((4, 32), np.float32))
    fails("quantize", "w.npy", "w.npz", "--format", "mxfp4_e2m1", "--require-exact", cwd=tmp_path,
          message="--require-exact is for converting checkpoint folders")  # fmt: skip


def test_the_summary_names_the_plain_source_when_it_refuses(tmp_path):
    make_llama(tmp_path / "llama")
    line = fails("quantize", "llama", "out", "--format", "nvfp4", "--require-exact", cwd=tmp_path,
                 message="bfloat16 to nvfp4 changes its values")  # fmt: skip
    assert "SQNR" in line and json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
