"""One fuzz target under atheris (libFuzzer, coverage-guided over the package's Python code):
``python -m tests.fuzz.run TARGET [libFuzzer options] CORPUS_DIR``. The driver
(``python -m tests.fuzz``) starts one of these per target; run alone, it takes the seeds from
``$NEURON_KERNELS_FUZZ_SEEDS`` (made if missing) and libFuzzer's options as given.

The package's modules are instrumented for coverage, except its compiled kernels (``kernels``,
``_jit``), whose Python source numba compiles and which take no header field. The process runs
under a file size limit (``--fsize-mb``, default 64; SIGXFSZ ignored, so that a write past it
fails with EFBIG, which the targets report) and a data size limit (``--data-mb``, default 3072),
so that a write or an allocation in proportion to a number read from a header, not to the bytes
present, fails in the run.
"""

from __future__ import annotations

import os
import pkgutil
import random
import resource
import signal
import sys

__all__ = ["main"]


def _compiled_modules() -> list[str]:
    """The modules of the package not instrumented: the compiled kernels and the JIT's own."""
    import importlib.util

    spec = importlib.util.find_spec("neuron_kernels")
    assert spec is not None and spec.submodule_search_locations
    root = list(spec.submodule_search_locations)[0]
    out = []
    for sub in ("kernels", "_jit"):  # listed from their folders: walk_packages would import the package
        out.append(f"neuron_kernels.{sub}")
        for folder, dirs, files in os.walk(os.path.join(root, sub)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            package = "neuron_kernels." + os.path.relpath(folder, root).replace(os.sep, ".")
            out += [f"{package}.{f[:-3]}" for f in files if f.endswith(".py") and f != "__init__.py"]
            out.append(package)
    return out


def _import_all() -> None:
    """Import every module of the package (inside the instrumenting block: a module imported
    later, as the package imports many lazily, would not be instrumented)."""
    import importlib

    import neuron_kernels

    for info in pkgutil.walk_packages(neuron_kernels.__path__, "neuron_kernels."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra (dask, zarr, torch) not installed
            pass


def _limits(fsize_mb: int, data_mb: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_mb << 20, fsize_mb << 20))
    resource.setrlimit(resource.RLIMIT_DATA, (data_mb << 20, data_mb << 20))


def _option(args: list[str], name: str, default: int) -> tuple[int, list[str]]:
    for i, a in enumerate(args):
        if a.startswith(f"{name}="):
            return int(a.split("=", 1)[1]), args[:i] + args[i + 1 :]
    return default, args


def main(argv: list[str] | None = None) -> None:
    import atheris

    args = list(sys.argv if argv is None else argv)
    name, rest = args[1], args[2:]
    fsize, rest = _option(rest, "--fsize-mb", 64)
    data, rest = _option(rest, "--data-mb", 3072)
    from .seeds import build_seeds

    seeds = build_seeds()
    with atheris.instrument_imports(include=["neuron_kernels"], exclude=_compiled_modules()):
        _import_all()
    from .mutate import mutate
    from .targets import TARGETS, execute

    target = TARGETS[name]
    _limits(fsize, data)

    def one(data: bytes) -> None:
        execute(target, data, seeds)

    def structured(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if len(data) > 1 and rng.random() < 0.5:
            new = mutate(data[1:], rng)
            if new is not None:
                selector = data[:1] if rng.random() > 0.05 else bytes([rng.randrange(256)])
                return (selector + new)[:max_size]
        return atheris.Mutate(data, max_size)

    atheris.Setup([args[0], *rest], one, custom_mutator=structured)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
