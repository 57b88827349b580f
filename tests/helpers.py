"""Helpers shared by the test modules (fixtures are in ``conftest.py``; a test module imports
helpers from here or from another helper module, never from another test module).

``special_float32`` and ``child_env`` (every subprocess started by a test imports this checkout,
whatever its working directory); the helpers of the bad-input tests (``test_*_bad_input.py`` and the
bad-input sections of ``test_promotion.py`` and ``test_registry.py``): bit-exact comparisons, the
inputs and out= arrays several of them use, block files with any member replaced, and ``isolated`` /
``outcome_of`` (with the ``isolated_runs`` fixture), which run a call that may crash or hang the
interpreter in a subprocess of its own. The command line runs in the test process: ``cli_runner.run``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels import BlockArray

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def special_float32() -> np.ndarray:
    """Named edge cases of float32 -> bfloat16 / tfloat32 rounding."""
    bits = [
        0x00000000,
        0x80000000,  # signed zeros
        0x00000001,
        0x80000001,  # smallest subnormals
        0x007FFFFF,
        0x00800000,  # largest subnormal, smallest normal
        0x3F800000,
        0x3F808000,
        0x3F818000,
        0x3F808001,
        0x3F807FFF,  # 1.0 and bf16 ties / near-ties
        0x3F801000,
        0x3F803000,  # tf32 ties (to even down, to even up)
        0x7F7F7FFF,
        0x7F7F8000,
        0x7F7FFFFF,  # bf16 overflow boundary
        0xFF7F8000,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,  # infinities
        0x7F800001,
        0xFF800001,
        0x7FC00000,
        0xFFC00000,
        0x7FFFFFFF,
        0xFFFFFFFF,
        0x7FA00000,  # NaNs
    ]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a Python subprocess: this checkout first on its path (whatever its working
    directory, and even when another checkout of the package is installed), plus ``extra``. The
    compiled tier is off (``NEURON_KERNELS_COMPILED=0``) unless ``extra`` turns it on: the
    subprocesses test what compiles and what the local cache holds."""
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "NEURON_KERNELS_COMPILED": "0", **extra}


def import_runtime(module: str):
    """``import module`` (its import-time warnings silenced), or :func:`runtime_missing` with why."""
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        runtime_missing(f"{module} is not installed ({exc})")


def runtime_missing(why: str) -> None:
    """Skip a test whose runtime (torch, transformers, compressed-tensors, torchao) is not
    installed, with the reason; fail it instead where ``NEURON_KERNELS_REQUIRE_RUNTIMES`` is set
    (CI, which installs them: a runtime test that skips there tests nothing)."""
    if os.environ.get("NEURON_KERNELS_REQUIRE_RUNTIMES"):
        pytest.fail(f"NEURON_KERNELS_REQUIRE_RUNTIMES is set, but {why}")
    pytest.skip(why)


PRELUDE = """
import json
import ml_dtypes
import numpy as np
import neuron_kernels as nk
from neuron_kernels import BlockArray, BlockLayout

BF16 = np.dtype(ml_dtypes.bfloat16)
EXACT = np.tile(np.arange(-7, 9, dtype=np.float32), 4).reshape(2, 32)
MX8 = nk.quantize_mx(EXACT, "mxfp8_e4m3", block_size=8)
MX4 = nk.quantize_mx(EXACT, "mxfp4_e2m1", block_size=8)


def report(fn):
    try:
        value = fn()
    except Exception as exc:
        outcome = {"raised": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    else:
        outcome = {"value": value}
    print("OUTCOME " + json.dumps(outcome), flush=True)
"""


def isolated(cases: dict[str, tuple[str, float]], name: str, body: str, timeout: float = 180) -> str:
    """Add a case to a test module's ``ISOLATED`` dict (name -> (body, timeout in seconds)): ``body`` runs
    after ``PRELUDE`` in a fresh interpreter and reports one call's outcome with ``report(fn)``."""
    cases[name] = (textwrap.dedent(body), timeout)
    return name


def run_isolated(body: str, timeout: float):
    try:  # a process of its own: the call may crash or hang the interpreter
        return subprocess.run(
            [sys.executable, "-c", PRELUDE + body],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


def outcome_of(runs, name: str) -> dict:
    future, timeout = runs[name]
    proc = future.result()
    if proc is None:
        pytest.fail(f"{name}: no answer within {timeout} s (the call hangs)")
    assert proc.returncode == 0, f"{name}: the interpreter died with status {proc.returncode}: {proc.stderr[-800:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, f"{name}: no outcome; stderr: {proc.stderr[-800:]}"
    return json.loads(lines[-1][len("OUTCOME ") :])


def assert_raised(outcome: dict, errors: tuple[type, ...], pattern: str) -> None:
    assert "raised" in outcome, f"no exception; the call returned {str(outcome.get('value'))[:300]}"
    assert {e.__name__ for e in errors} & set(outcome["raised"]), f"{outcome['raised'][0]}: {outcome['message']}"
    assert re.search(pattern, outcome["message"]), outcome["message"]


BF16 = np.dtype(ml_dtypes.bfloat16)

F32 = np.float32


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(bits(got), bits(want))


def native(x: np.ndarray) -> np.ndarray:
    """The same values, C-contiguous and in native byte order (0-d stays 0-d)."""
    return np.array(x, dtype=x.dtype.newbyteorder("="), order="C", copy=True)


def ml_cast(x, name: str) -> np.ndarray:
    """numpy/ml_dtypes' own conversion (the oracle of the default rounding)."""
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(getattr(ml_dtypes, name, name))


def assert_same_mx(got: BlockArray, want: BlockArray) -> None:
    assert (got.fmt, got.block_size, got.axis, got.shape, got.packed) == (
        want.fmt,
        want.block_size,
        want.axis,
        want.shape,
        want.packed,
    )
    assert_same_bits(got.codes, want.codes)
    assert_same_bits(got.scales.view(np.uint8), want.scales.view(np.uint8))


def kw_id(kwargs: dict) -> str:
    return ",".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "rounding" or len(kwargs) == 1)


#: Exact in mxfp8_e4m3 (block amax 8, scale 2^-5: every x * 32 is an e4m3 value), bfloat16 and float16.
EXACT = np.tile(np.arange(-7, 9, dtype=F32), 4).reshape(2, 32)

X_MX = (np.random.default_rng(1).standard_normal((6, 40)) * 4).astype(F32)

BASE = (np.random.default_rng(7).standard_normal((8, 48)) * np.exp2(np.arange(48) % 9 - 4)).astype(F32)

#: Strided, negative-stride and big-endian views of a float32 array.
LAYOUTS = {
    "reversed": lambda a: a[::-1],
    "negative_step_2": lambda a: a[:, ::-2],
    "transposed": lambda a: a.T,
    "fortran": np.asfortranarray,
    "sliced": lambda a: a[1::2, ::3],
    "big_endian": lambda a: a.astype(">f4"),
    "big_endian_reversed": lambda a: a.astype(">f4")[:, ::-1],
    "big_endian_float16_reversed": lambda a: a.astype(">f2")[::-1],
    "big_endian_float64_transposed": lambda a: a.astype(">f8").T,
}

NONFINITE = {
    "all_nan": np.full(64, np.nan, F32),
    "all_neg_nan": -np.full(64, np.nan, F32),
    "all_inf": np.full(64, np.inf, F32),
    "all_neg_inf": np.full(64, -np.inf, F32),
    "mixed": np.array([1.0, np.nan, -2.5, np.inf, -np.inf, 0.0, -0.0, 3.0] * 8, F32),
    "some_blocks": np.concatenate([np.ones(32, F32), np.linspace(-4, 4, 78, dtype=F32)]),
}

NONFINITE["some_blocks"][[3, 40, 100]] = [np.nan, np.inf, -np.inf]  # blocks 0, 1 and the partial block 3

#: Non-numeric dtypes, which no entry point takes.
WRONG_DTYPES = [
    np.complex64,
    np.complex128,
    object,
    "U3",
    "S3",
    bool,
    [("a", "f4"), ("b", "i4")],
    "V4",
    "datetime64[s]",
    "timedelta64[s]",
    np.longdouble,
]

WRONG_IDS = [
    "complex64",
    "complex128",
    "object",
    "unicode",
    "bytes",
    "bool",
    "structured",
    "void",
    "datetime64",
    "timedelta64",
    "longdouble",
]


def _read_only(shape, dtype):
    a = np.zeros(shape, dtype)
    a.flags.writeable = False
    return a


#: out= arrays that are wrong for a (2, 32) result of dtype ``dt``: (id, make(dt), error, pattern).
BAD_OUTS = [
    ("shape", lambda dt: np.zeros((2, 31), dt), ValueError, r"out has shape \(2, 31\); the result has shape \(2, 32\)"),
    ("transposed_shape", lambda dt: np.zeros((32, 2), dt), ValueError, r"shape \(32, 2\)"),
    ("broadcastable", lambda dt: np.zeros((1, 32), dt), ValueError, r"shape \(1, 32\)"),
    ("0-d", lambda dt: np.zeros((), dt), ValueError, r"out has shape \(\)"),
    ("dtype", lambda dt: np.zeros((2, 32), np.int32), ValueError, "out has dtype int32"),
    ("byte_order", lambda dt: np.zeros((2, 32), np.dtype(dt).newbyteorder(">")), ValueError, "out has dtype"),
    ("read_only", lambda dt: _read_only((2, 32), dt), ValueError, "out is read-only"),
    ("list", lambda dt: [[0.0] * 32] * 2, TypeError, "out must be a numpy array, got list"),
    ("tuple", lambda dt: (0.0,) * 64, TypeError, "out must be a numpy array, got tuple"),
    ("memoryview", lambda dt: memoryview(np.zeros(64, np.uint8)), TypeError, "out must be a numpy array"),
]

#: out= arrays of every layout for a (2, 32) result of dtype ``dt``.
GOOD_OUTS = {
    "reversed": lambda dt: np.zeros((2, 32), dt)[::-1, ::-1],
    "every_other_column": lambda dt: np.zeros((2, 64), dt)[:, ::-2],
    "fortran": lambda dt: np.zeros((2, 32), dt, order="F"),
}


@functools.cache
def mx8_exact() -> BlockArray:
    """EXACT in mxfp8_e4m3 with blocks of 8 (made on first use; do not modify)."""
    return nk.quantize_mx(EXACT, "mxfp8_e4m3", block_size=8)


def meta_bytes(**fields) -> np.ndarray:
    return np.frombuffer(json.dumps(fields).encode(), np.uint8)


META = {"version": 1, "fmt": "mxfp8_e4m3", "block_size": 8, "axis": 1, "shape": [2, 32], "packed": False}

MISSING = object()


def write_mx(path, codes=None, scales=None, meta=None, raw_meta=None, **extra):
    """A block file of ``mx8_exact()`` as np.savez writes it, with any member replaced."""
    np.savez(
        path,
        codes=mx8_exact().codes if codes is None else codes,
        scales=mx8_exact().scales.view(np.uint8) if scales is None else scales,
        meta=meta_bytes(**(META if meta is None else meta)) if raw_meta is None else np.frombuffer(raw_meta, np.uint8),
        **extra,
    )
    return path


def meta_with(**change):
    """META with fields changed (MISSING removes one)."""
    return {k: v for k, v in {**META, **change}.items() if v is not MISSING}


RUNTIME_MODULES = ("torch", "transformers", "compressed_tensors")


def runtime_python() -> tuple[str | None, str]:
    candidates = [os.environ.get("NEURON_KERNELS_RUNTIME_PYTHON"), sys.executable]
    for python in filter(None, candidates):
        # The runtimes are probed and run in processes of their own, in the interpreter that has them.
        probe = subprocess.run(
            [python, "-c", "import " + ", ".join(RUNTIME_MODULES)], capture_output=True, text=True, timeout=300
        )
        if probe.returncode == 0:
            return python, ""
    return None, (
        f"needs {', '.join(RUNTIME_MODULES)} in this interpreter or in NEURON_KERNELS_RUNTIME_PYTHON "
        "(pip install torch transformers compressed-tensors)"
    )


def act_order_array(bits: int = 4) -> tuple[nk.BlockArray, np.ndarray]:
    from .reference_integers import ct_dequantize_ref

    """An asymmetric array with a permuted group index, and its values by the reference."""
    rng = np.random.default_rng(bits)
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
    q = rng.integers(lo, hi, (6, 64)).astype(np.int8)
    scales = rng.uniform(0.01, 0.1, (6, 4)).astype(ml_dtypes.bfloat16)
    zp = rng.integers(lo, hi, (6, 4)).astype(np.int8)
    g_idx = rng.permutation(np.arange(64) // 16).astype(np.int32)
    arr = nk.BlockArray(
        (q.view(np.uint8) & np.uint8((1 << bits) - 1)), scales, nk.BlockLayout(f"int{bits}_group_asym", (6, 64), 1, 16),
        zero_points=zp, group_index=g_idx,
    )  # fmt: skip
    return arr, ct_dequantize_ref(q, scales, zp, 16, g_idx)
