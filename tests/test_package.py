"""Package-level behaviour: lazy compilation, the on-disk cache, fork safety, the command line."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from neuron_kernels import BLOCK_FORMATS
from neuron_kernels.tools.bench import benched_formats

from .cli_runner import run
from .helpers import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    # A fresh interpreter: what an import loads or compiles, NUMBA_CACHE_DIR and forks are the point.
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=full_env,
    )


def test_import_compiles_nothing_and_skips_numba():
    r = run_python("""
        import sys
        import neuron_kernels as nk
        nk.promote_type("bfloat16", "float16"); nk.format_info("float8_e4m3fn")
        print("numba" in sys.modules, "torch" in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False False"  # torch is optional: the package never imports it itself


def test_public_api_is_listed():
    import neuron_kernels as nk

    for name in nk.__all__:
        assert hasattr(nk, name), name


def codec_functions_compiled(tmp_path, *steps: str) -> list[str]:
    """Run ``steps`` (lines of code, with ``np``, ``ml_dtypes`` and ``nk`` imported) one after the
    other in a fresh process with an empty cache; after each, which of the codec's shared functions
    have been compiled, as a sorted comma-separated list of names ("-" for none)."""
    lines = "\n".join(f"{step}\nprint(','.join(used()) or '-')" for step in steps)
    r = run_python(
        "import ml_dtypes, numpy as np, neuron_kernels as nk\n"
        "from neuron_kernels.kernels import codec as C, narrowing as N, loaders as S\n"
        "used = lambda: sorted(f.py_func.__name__ for f in (C.decode, C.encode, C.encode_e8m0, S.load,\n"
        "    N.f64_rest, N.f64_to_f32_odd, N.f64_to_f32_truncated, S.f16_to_f32) if f.signatures)\n" + lines,
        env={"NUMBA_CACHE_DIR": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_a_cast_compiles_only_its_own_path(tmp_path):
    # A process's first cast compiles the source's loader and the target's storer, not every
    # source kind and encoder: float32 -> bfloat16 needs neither the decoder, the float64 paths
    # nor the e8m0 encoder; a float64 stochastic cast to e8m0 then needs its own.
    first, second = codec_functions_compiled(
        tmp_path,
        'nk.cast(np.ones(8, np.float32), "bfloat16")',
        'nk.cast(np.ones(8), "float8_e8m0fnu", rounding="stochastic", seed=1)',
    )
    assert first == "encode"
    assert second == "encode,encode_e8m0,f64_rest,f64_to_f32_truncated"


def test_a_block_kernel_compiles_only_its_own_path(tmp_path):
    # The helpers take the format's decisions as constants of the kernel: float32 -> MXFP8 to
    # nearest even needs no codec function at all (no loader, encoder or decoder); stochastic
    # rounding of bfloat16 then needs the encoder only (bfloat16 codes are read in place).
    first, second = codec_functions_compiled(
        tmp_path,
        'x = np.ones((4, 64), np.float32); nk.fake_quantize(x, "mxfp8_e4m3"); nk.quantize(x, "mxfp8_e4m3")',
        'nk.quantize(x.astype(ml_dtypes.bfloat16), "mxfp8_e4m3", rounding="stochastic", seed=1)',
    )
    assert first == "-"
    assert second == "encode"


def test_cached_specialisations_stay_apart(tmp_path):
    # Two kernels built by one factory must not share a cache entry: run both in a fresh process
    # (compiling and caching), then again (loading from the cache), checking results each time.
    code = """
        import numpy as np, ml_dtypes, neuron_kernels as nk
        from tests.reference import round_float32_to_mbits
        x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
        a = nk.cast(x, "tfloat32").view(np.uint32)
        b = nk.cast(x, "bfloat16").view(np.uint16)
        assert (a == round_float32_to_mbits(x, 10).view(np.uint32)).all()
        assert (b == x.astype(ml_dtypes.bfloat16).view(np.uint16)).all()
        print("ok")
    """
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    for _ in range(2):
        r = run_python(code, env)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert any(p.suffix == ".nbc" for p in tmp_path.rglob("*"))


def test_compiled_closures_are_named_by_their_values():
    """A compiled closure that another kernel calls is linked by a symbol made of its name: closures of
    one factory get a name of their own per closure value (the same in every process), so that a
    kernel loaded from the cache cannot be linked to another closure's code (two test workers
    sharing a cache did, before: wrong codes, once an abort)."""
    from neuron_kernels._jit import jit

    def factory(c):
        @jit
        def callee(x):  # pragma: no cover - compiled
            return x + c

        @jit(inline="always")
        def inlined(x):  # pragma: no cover - compiled
            return x + c

        return callee, inlined

    (one, one_inlined), (again, _), (two, _) = factory(1), factory(1), factory(2)
    names = one.py_func.__qualname__, again.py_func.__qualname__, two.py_func.__qualname__
    assert names[0] == names[1] != names[2] and names[0].startswith("test_compiled_closures")
    assert one_inlined.py_func.__qualname__.endswith("factory.<locals>.inlined")  # inlined: no symbol
    assert (one(1), two(1)) == (2, 3)


_CAST_AND_QUANTIZE = """
    import numpy as np, ml_dtypes, neuron_kernels as nk
    x = np.linspace(-3, 3, 256, dtype=np.float32)
    assert (nk.cast(x, "bfloat16").view(np.uint16) == x.astype(ml_dtypes.bfloat16).view(np.uint16)).all()
    mx = nk.quantize_mx(x, "mxfp8_e4m3")
    assert (mx.dequantize() == nk.fake_quantize_mx(x, "mxfp8_e4m3")).all()
    print("ok")
"""


def test_corrupted_cache_files_are_recompiled(tmp_path):
    """Garbage or truncated cache files: a warning and a recompilation, then a clean cache again."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    r = run_python(_CAST_AND_QUANTIZE, env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    files = [p for p in tmp_path.rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert files
    for i, p in enumerate(files):
        p.write_bytes(os.urandom(40) if i % 2 else p.read_bytes()[:50])
    r = run_python(_CAST_AND_QUANTIZE, env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "unreadable compilation cache entry" in r.stderr and "Traceback" not in r.stderr
    r = run_python(_CAST_AND_QUANTIZE, {**env, "PYTHONWARNINGS": "error"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_works_without_a_writable_cache(tmp_path):
    """A read-only install (no __pycache__ can be made) and an unusable NUMBA_CACHE_DIR: the
    kernels compile in memory and the results are right."""
    pkg = tmp_path / "site"
    shutil.copytree(
        os.path.join(ROOT, "neuron_kernels"), pkg / "neuron_kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    for init in (pkg / "neuron_kernels").rglob("__init__.py"):  # every package folder, however deep
        (init.parent / "__pycache__").write_text("a file where the cache folder would go")
    (tmp_path / "blocked").write_text("not a folder")
    env = {
        "NUMBA_CACHE_DIR": str(tmp_path / "blocked" / "cache"),
        "PYTHONPATH": str(pkg),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    code = textwrap.dedent(_CAST_AND_QUANTIZE) + f"assert nk.__file__.startswith({str(pkg)!r}), nk.__file__\n"
    # A process of its own: it imports the copy of the package, with the environment read at import.
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "Traceback" not in r.stderr
    assert not list(pkg.rglob("*.nbi"))


_DOUBLING_LOAD = """

from .._jit import u32_add

_load_as_it_was = load


@jit
def load(x, source, c):  # pragma: no cover - compiled
    return u32_add(_load_as_it_was(x, source, c), 0x00800000)  # every (normal) source item doubled
"""


def test_cache_follows_edits_of_inlined_helpers(tmp_path):
    """A block kernel (defined in kernels/block_kernels/rows.py) of float16 input inlines the loaders'
    ``load``: after an edit of loaders.py that leaves rows.py as it was, the cached kernel must not run the
    old ``load``; after edits of docstrings and comments only, it still comes from the cache."""
    pkg = tmp_path / "site"
    shutil.copytree(
        os.path.join(ROOT, "neuron_kernels"), pkg / "neuron_kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
        "NUMBA_DEBUG_CACHE": "1",  # prints what is loaded from the cache
        "PYTHONPATH": str(pkg),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    code = textwrap.dedent(f"""
        import numpy as np, neuron_kernels as nk
        assert nk.__file__.startswith({str(pkg)!r}), nk.__file__
        print(nk.fake_quantize_mx(np.arange(1, 65, dtype=np.float16), "mxfp8_e4m3").tolist())
    """)

    def fake_quantize() -> tuple[list[float], str]:
        # A process of its own: a new process reads the edited sources and the on-disk cache.
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.splitlines()[-1]), r.stdout

    before, _ = fake_quantize()  # compiles, and fills the cache
    assert min(before) > 0
    again, log = fake_quantize()  # nothing edited: the kernel comes from the cache
    assert again == before
    assert re.search(r"data loaded from .*rows\.row_fake_quantize", log), log
    kernel_file = pkg / "neuron_kernels" / "kernels" / "block_kernels" / "rows.py"
    kernel_stat = kernel_file.stat()
    codec = pkg / "neuron_kernels" / "kernels" / "codec.py"
    # docstrings, comments and blank lines are not code: the cached kernels stay valid
    formats = pkg / "neuron_kernels" / "formats.py"
    text = formats.read_text()
    formats.write_text(text.replace('"""The format table:', '"""\n\nThe format table (edited):', 1) + "\n# a comment\n")
    codec.write_text("# a comment\n" + codec.read_text().replace("Code of the float32", "The code of the float32", 1))
    unchanged, log = fake_quantize()
    assert unchanged == before
    assert re.search(r"data loaded from .*rows\.row_fake_quantize", log), log
    loaders = pkg / "neuron_kernels" / "kernels" / "loaders.py"
    loaders.write_text(loaders.read_text() + _DOUBLING_LOAD)
    assert kernel_file.stat().st_mtime_ns == kernel_stat.st_mtime_ns
    after, log = fake_quantize()
    assert after == [2 * v for v in before], log  # powers of two scale MX blocks exactly


def test_threads_after_fork_do_not_hang():
    r = run_python(
        """
        import multiprocessing as mp, numpy as np, neuron_kernels as nk
        from neuron_kernels import _parallel
        x = np.ones(_parallel.PARALLEL_MIN_ELEMENTS * 2, np.float32)
        nk.set_num_threads(2)
        nk.cast(x, "bfloat16")          # the parent starts its thread pool
        def child(q):
            q.put(float(nk.cast(x, "bfloat16").astype(np.float32).sum()))
        ctx = mp.get_context("fork")
        q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start()
        print(q.get(timeout=120)); p.join(60)
    """,
        timeout=200,
    )
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip()) == 2 * float(2**21)


def test_cli_bench_json_and_plot(tmp_path):
    """One small bench run (each costs its kernels' loading) writes both the JSON rows and the chart."""
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    r = run("bench", "--size", "64Ki", "--repeat", "1", "--json", str(out), "--plot", str(png), cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    assert "float32 -> bfloat16" in r.stdout and "vs copy" in r.stdout and "mxfp4_e2m1" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(out.read_text())
    pairs = {(row["source"], row["target"]) for row in report["casts"]}
    assert ("float32", "bfloat16") in pairs and ("bfloat16", "float32") in pairs
    for row in report["casts"]:
        assert row["elements"] == 65536
        assert row["ours_gbs"] > 0 and row["copy_gbs"] > 0 and row["peer_gbs"] > 0
    formats = {row["fmt"] for row in report["mx"]}
    assert formats == benched_formats() and {n for n, f in BLOCK_FORMATS.items() if not f.integer} <= formats
    for row in report["mx"]:
        assert row["elements"] == 65536 and np.isfinite(row["sqnr_db"])
        assert min(row["quantize_gbs"], row["dequantize_gbs"], row["fake_gbs"], row["peer_gbs"]) > 0


def test_cli_promote_and_formats():
    r = run("promote", "uint8", "int8", cwd=ROOT, check=False)
    assert (r.returncode, r.stdout.strip()) == (0, "int16")
    r = run("promote", "uint64", "int8", "--explain", cwd=ROOT, check=False)
    assert r.returncode == 0 and "float32" in r.stdout and "int-mixed-float32" in r.stdout
    r = run("promote", "float4_e2m1fn", "float4_e2m1fn", cwd=ROOT, check=False)
    assert r.returncode == 2 and "No available implicit dtype promotion path" in r.stderr and r.stdout == ""
    r = run("promote", "--table", cwd=ROOT, check=False)
    assert r.returncode == 0 and "e8m0" in r.stdout
    r = run("formats", cwd=ROOT, check=False)
    assert r.returncode == 0 and "float8_e4m3fn" in r.stdout and "448" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("promote", "float9", "int8"), "unknown dtype 'float9'"),
        (("promote", "int8"), "needs two dtypes"),
        (("bench", "--size", "lots"), "invalid size"),
        (("bench", "--repeat", "0"), "--repeat"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_cli_bad_input(args, message):
    r = run(*args, cwd=ROOT, check=False)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


#: The console script (``[project.scripts]`` of pyproject.toml): ``module:function``.
with open(os.path.join(ROOT, "pyproject.toml")) as _fh:
    CONSOLE_SCRIPT = re.search(r'^neuron-kernels = "([\w.]+):(\w+)"$', _fh.read(), re.M).groups()


@pytest.mark.parametrize("launcher", ["console script", "python -m"])
@pytest.mark.parametrize(
    "args, status, out, err",
    [(("promote", "uint8", "int8"), 0, "int16\n", ""), (("promote", "int8"), 2, "", "needs two dtypes")],
    ids=["ok", "error"],
)
def test_exit_status_of_the_command_process(launcher, args, status, out, err):
    """The installed command and ``python -m neuron_kernels`` exit with what ``main`` returns."""
    module, function = CONSOLE_SCRIPT
    start = (
        ["-c", f"import sys; from {module} import {function}; sys.exit({function}())"]
        if launcher == "console script"
        else ["-m", "neuron_kernels"]
    )
    # A process of its own: the exit status of the command's process is the point.
    r = subprocess.run(
        [sys.executable, *start, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=child_env()
    )
    assert r.returncode == status, r.stderr
    assert r.stdout == out and err in r.stderr and "Traceback" not in r.stderr
