"""The public functions' boundary (neuron_kernels/api.py): the family functions' defaults are the
format rows', and each option they share with ``quantize`` defaults as it does there."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.errors import InvalidTypeError, InvalidValueError

MX = [n for n, f in nk.BLOCK_FORMATS.items() if f.is_mx]
FAMILIES = [
    (nk.quantize_mx, MX),
    (nk.fake_quantize_mx, MX),
    (nk.quantize_nvfp4, ["nvfp4"]),
]
#: What a format row says each option defaults to.
ROW_DEFAULTS = {
    "block_size": lambda f: f.block_size,
    "scale_mode": lambda f: f.scale_modes[0],
    "per_tensor_scale": lambda f: "amax" if f.per_tensor_scale else None,
}


@pytest.mark.parametrize("function, formats", FAMILIES, ids=lambda v: getattr(v, "__name__", ""))
def test_family_defaults_are_the_format_rows(function, formats):
    params = inspect.signature(function).parameters
    checked = [name for name in ROW_DEFAULTS if name in params]
    assert checked, function.__name__
    for name in checked:
        assert {ROW_DEFAULTS[name](nk.BLOCK_FORMATS[f]) for f in formats} == {params[name].default}, name


@pytest.mark.parametrize("function, formats", FAMILIES, ids=lambda v: getattr(v, "__name__", ""))
def test_family_options_default_as_in_quantize(function, formats):
    general = inspect.signature(nk.quantize).parameters
    for p in inspect.signature(function).parameters.values():
        if p.name in general and p.name not in ROW_DEFAULTS and p.name not in ("x", "fmt"):
            assert p.default == general[p.name].default, (function.__name__, p.name)


def test_family_functions_are_quantize_with_their_defaults(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    for fmt in [*MX, "nvfp4"]:
        general = nk.quantize(x, fmt)
        family = nk.quantize_nvfp4(x) if fmt == "nvfp4" else nk.quantize_mx(x, fmt)
        for part in ("codes", "scales"):
            np.testing.assert_array_equal(getattr(family, part), getattr(general, part))
        assert family.per_tensor_scale == general.per_tensor_scale
        fake = nk.fake_quantize_nvfp4(x) if fmt == "nvfp4" else nk.fake_quantize_mx(x, fmt)
        np.testing.assert_array_equal(fake.view(np.uint32), nk.dequantize(general).view(np.uint32))


def test_the_earlier_block_array_forms_warn_and_give_the_same_array():
    q = nk.quantize(np.linspace(-3, 3, 128, dtype=np.float32).reshape(2, 64), "nvfp4")
    with pytest.warns(DeprecationWarning, match="pass a layout"):
        old = nk.BlockArray(q.codes, q.scales, "nvfp4", 16, 1, (2, 64), True, per_tensor_scale=q.per_tensor_scale)
    with pytest.warns(DeprecationWarning, match="pass a layout"):
        parts = nk.BlockArray.from_parts(q.codes, q.scales, "nvfp4", 16, 1, (2, 64), True, "here", block_rows=1,
                                         per_tensor_scale=q.per_tensor_scale)  # fmt: skip
    for a in (old, parts):
        assert a.layout == q.layout and a.per_tensor_scale == q.per_tensor_scale
        np.testing.assert_array_equal(a.dequantize().view(np.uint32), q.dequantize().view(np.uint32))
    with pytest.raises(TypeError, match="layout"):
        nk.BlockArray(q.codes, q.scales, q.layout, 16)


def test_renamed_functions_warn_and_are_the_new_ones():
    from neuron_kernels.tools import bench

    with pytest.warns(DeprecationWarning, match="MXArray is now BlockArray"):
        assert nk.MXArray is nk.BlockArray
    with pytest.warns(DeprecationWarning, match="QuantizationError is now QuantizationStats"):
        assert nk.QuantizationError is nk.QuantizationStats

    with pytest.warns(DeprecationWarning, match="bench_blocks"):
        assert bench.bench_mx is bench.bench_blocks
    with pytest.warns(DeprecationWarning, match="format_block_table"):
        assert bench.format_mx_table is bench.format_block_table
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        bench.nothing  # noqa: B018


@pytest.mark.parametrize(
    "old, new",
    [
        ("neuron_kernels.promotion", "neuron_kernels.neuron.promotion"),
        ("neuron_kernels.bench", "neuron_kernels.tools.bench"),
        ("neuron_kernels.plots", "neuron_kernels.tools.plots"),
        ("neuron_kernels.warmup", "neuron_kernels.tools.warmup"),
    ],
)
def test_moved_modules_import_under_their_old_names_with_a_warning(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_the_neuron_operands_keep_their_old_module_with_a_warning():
    from neuron_kernels import neuron
    from neuron_kernels.neuron import operands

    with pytest.warns(DeprecationWarning, match="neuron_kernels.neuron.to_nc_matmul_mx is now"):
        assert neuron.to_nc_matmul_mx is operands.to_nc_matmul_mx
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        neuron.nothing  # noqa: B018


def test_the_options_are_declared_once():
    """A quantisation's options are the Scheme record's fields (OPTIONS); the overloads' keyword
    classes declare the same names, and each public function's own keyword arguments are its
    class's: a new option is a field, a line in one class, and the signatures that take it."""
    from typing import get_type_hints

    from neuron_kernels.blocks import scheme as S

    def keywords(function):
        return {p.name for p in inspect.signature(function).parameters.values() if p.kind == p.KEYWORD_ONLY} - {"out"}

    assert set(get_type_hints(S.SchemeOptions)) == set(S.OPTIONS)
    assert keywords(nk.quantize) == set(S.OPTIONS)
    for function, declared in ((nk.quantize_mx, S.MXOptions), (nk.quantize_nvfp4, S.NVFP4Options),
                               (nk.fake_quantize_mx, S.FakeMXOptions)):  # fmt: skip
        assert keywords(function) == set(get_type_hints(declared)), function.__name__
    assert S.Scheme.of("nvfp4", {"scale_search": "mse", "x": 1}) == S.Scheme("nvfp4", scale_search="mse")
    with pytest.raises(TypeError, match="unknown option"):
        S.block_job("nvfp4", 2, blocksize=16)


def test_checked_jobs_are_reused_without_changing_what_a_call_means():
    """A scheme's job is checked once and reused (docs/performance.md "Per call"): the same result
    for the same options; options of another type still checked as themselves (``True`` is no
    block size, whatever ``1`` gave); stochastic rounding without a seed still draws a fresh one
    per call; a refused option is refused every time."""
    from neuron_kernels.blocks import scheme as S

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    first = nk.quantize(x, "mxfp8_e4m3", block_size=32)
    assert any(isinstance(k[0], S.Scheme) and k[0].block_size == 32 for k in S._JOBS)
    assert np.array_equal(nk.quantize(x, "mxfp8_e4m3", block_size=32).codes, first.codes)
    assert nk.quantize(x, "mxfp8_e4m3", block_size=1).block_size == 1
    with pytest.raises(InvalidTypeError, match="block_size must be a positive int, got True"):
        nk.quantize(x, "mxfp8_e4m3", block_size=True)
    nk.quantize(x, "nvfp4", block_shape=(1, 16))
    with pytest.raises(InvalidTypeError, match="block_shape must be a positive int"):
        nk.quantize(x, "nvfp4", block_shape=(1.0, 16))
    draws = {nk.quantize(x, "mxfp4_e2m1", rounding="stochastic").codes.tobytes() for _ in range(4)}
    assert len(draws) > 1
    for _ in range(2):
        with pytest.raises(InvalidValueError):
            nk.quantize(x, "mxfp8_e4m3", scale_mode="nonsense")
