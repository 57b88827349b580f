"""Compiling kernels ahead of their first call, on every core.

Numba compiles a kernel on its first call, under the GIL, and caches it on disk: the first call of
each (source, format, ...) specialisation costs seconds, later ones and later processes nothing.
:func:`warmup` pays that cost on purpose (in a container build, a CI step, before a benchmark),
in separate processes so that every core compiles, by making the calls a real use makes on tiny
arrays: the kernels compiled are exactly the ones later calls load.

A task is ``(kind, source, format)``:

- ``("cast", source, target)``: :func:`neuron_kernels.cast` (default rounding, no saturation);
- ``("quantize" | "fake_quantize", source, block format)``: the block functions with the
  format's defaults (``dequantize`` with it: the codes back to float32);
- ``("error", source, block format)``: the error table's one-pass statistics kernel (every scale
  mode and policy of the format).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np

from ..dtypes import get_format
from ..errors import InvalidValueError
from ..formats import BLOCK_FORMATS, INPUT_DTYPES

__all__ = [
    "WARMUP_SOURCES",
    "COMPILED_SOURCES",
    "Task",
    "warmup",
    "warmup_tasks",
    "run_task",
    "describe",
    "build_compiled_tier",
    "task_origins",
]

Task = tuple[str, str, str]

#: The sources warmed by default: what arrays and checkpoints hold most.
WARMUP_SOURCES = ("float32", "bfloat16")

_KINDS = ("cast", "quantize", "fake_quantize", "error")


def _cast_targets(source: str) -> list[str]:
    from ..registry import supported_casts

    return [k.target for k in supported_casts() if k.source == source and k.target != source]


def warmup_tasks(
    formats: Sequence[str] | None = None, sources: Sequence[str] = WARMUP_SOURCES, kinds: Iterable[str] = _KINDS
) -> list[Task]:
    """The tasks that compile what ``sources`` need for ``formats`` (cast targets and block
    formats; None: all of them): casts from each source and back to float32, and the block
    functions. Block tasks first (they compile longest), so that the pool ends together."""
    kinds = tuple(kinds)
    for kind in kinds:
        if kind not in _KINDS:
            raise InvalidValueError(f"unknown warmup kind {kind!r}; accepted: {', '.join(_KINDS)}")
    checked = [get_format(s).name for s in sources]
    for s in checked:
        if s not in INPUT_DTYPES:
            raise InvalidValueError(f"warmup sources are float arrays ({', '.join(INPUT_DTYPES)}), got {s!r}")
    blocks = [f for f in BLOCK_FORMATS if formats is None or f in formats]
    targets = sorted({t for s in checked for t in _cast_targets(s)})
    if formats is not None:
        unknown = [f for f in formats if f not in BLOCK_FORMATS and f not in targets]
        if unknown:
            raise InvalidValueError(
                f"cannot warm up {', '.join(map(repr, unknown))}: neither a block format "
                f"({', '.join(BLOCK_FORMATS)}) nor a cast target of {', '.join(checked)}"
            )
        targets = [t for t in targets if t in formats]
    tasks: list[Task] = []
    for kind in ("quantize", "fake_quantize", "error"):
        if kind in kinds:
            tasks += [(kind, s, f) for f in blocks for s in checked]
    if "cast" in kinds:
        tasks += [("cast", s, t) for s in checked for t in targets if t in _cast_targets(s)]
        tasks += [("cast", t, "float32") for t in targets if t != "float32" and "float32" in _cast_targets(t)]
    return list(dict.fromkeys(tasks))


def _sample(source: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = get_format(source).result_dtype
    return np.zeros(shape, dtype)


def run_task(task: Task) -> None:
    """Make the calls of ``task`` on tiny arrays (compiling what they need, or loading it)."""
    import neuron_kernels as nk

    kind, source, fmt = task
    if kind == "cast":
        nk.cast(_sample(source, (64,)), fmt)
    elif kind == "quantize":
        nk.dequantize(nk.quantize(_sample(source, (2, 64)), fmt))
    elif kind == "fake_quantize":
        nk.fake_quantize(_sample(source, (2, 64)), fmt)
    elif kind == "error":
        from ..blocks.inputs import input_array
        from ..blocks.scheme import block_job

        arr, src = input_array(_sample(source, (2, 64)))
        arr.setflags(write=False)  # as the error table reads files: memory-mapped, read-only
        block_job(fmt, 2, pack=False).resolved(arr, src).error_sums(arr, src)
    else:
        raise InvalidValueError(f"unknown warmup kind {kind!r}; accepted: {', '.join(_KINDS)}")


def _run_tasks(tasks: list[Task]) -> int:
    """Run ``tasks`` in this process; how many kernels they compiled."""
    from .._jit import compiles

    before = compiles()
    for task in tasks:
        run_task(task)
    return compiles() - before


def warmup(
    tasks: Sequence[Task],
    processes: int | None = None,
    progress: Callable[[int, int, Task], None] | None = None,
    *,
    host_tuned: bool = True,
) -> tuple[int, float]:
    """Compile what ``tasks`` need, in ``processes`` worker processes (default: one per core;
    1: in this process). The first task runs here: if it compiled nothing, the cache is taken
    as warm and the rest is only loaded, here (a pool would cost more than it saves). Returns
    (kernels compiled, seconds). ``progress(done, total, task)`` after each task.

    ``host_tuned`` (``neuron-kernels warmup``): compile for this host into the local cache even
    what the compiled tier holds (code for a CPU level; the host's own may be faster, and the
    local cache takes precedence). Without it (a command readying its kernels before it starts),
    what the tier holds is loaded from it."""
    from .._jit import local_cache_only

    if not host_tuned:
        return _warmup(list(tasks), processes, progress)
    with local_cache_only():
        return _warmup(list(tasks), processes, progress)


def _warmup(
    tasks: list[Task], processes: int | None, progress: Callable[[int, int, Task], None] | None
) -> tuple[int, float]:
    start = time.perf_counter()
    if not tasks:
        return 0, 0.0
    processes = len(os.sched_getaffinity(0)) if processes is None else processes
    if processes < 1:
        raise InvalidValueError(f"processes must be a positive int, got {processes}")
    compiled = _run_tasks(tasks[:1])
    if progress:
        progress(1, len(tasks), tasks[0])
    rest = tasks[1:]
    if processes == 1 or compiled == 0 or not rest:
        for k, task in enumerate(rest, 2):
            compiled += _run_tasks([task])
            if progress:
                progress(k, len(tasks), task)
        return compiled, time.perf_counter() - start
    # spawn, not fork: a forked child would inherit this process's threads and numba state
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(processes, len(rest)), mp_context=context) as pool:
        futures = {pool.submit(_run_tasks, [task]): task for task in rest}
        for k, future in enumerate(as_completed(futures), 2):
            compiled += future.result()
            if progress:
                progress(k, len(tasks), futures[future])
    return compiled, time.perf_counter() - start


def describe(task: Task) -> str:
    """A task in words (the command line's progress)."""
    kind, source, fmt = task
    return f"{source} -> {fmt}" if kind == "cast" else f"{kind} {fmt} from {source}"


#: The sources a compiled tier holds kernels for.
COMPILED_SOURCES = ("float32", "bfloat16", "float16")


def build_compiled_tier(
    dest: str, level: str, tasks: Sequence[Task] | None = None, processes: int | None = None
) -> dict[str, object]:
    """Compile the kernels of ``tasks`` (default: :func:`warmup_tasks` of :data:`COMPILED_SOURCES`,
    every format) for the CPU ``level`` (one of
    :data:`~neuron_kernels._jit.CPU_LEVELS`) into the compiled tier under ``dest`` (the package's
    ``_compiled`` folder when a wheel is built): ``dest/<numba, Python, platform>/<level>/``, one
    folder per source folder of the package, and its manifest. Compiles in fresh processes whose
    numba targets ``level`` with no other CPU features, with an empty cache of their own, then
    copies that cache. Returns the manifest."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile

    from .._jit import CPU_LEVELS, MANIFEST, PACKAGE_ROOT, compiled_tag
    from .._jit.numba_internals import cache_subpath

    if level not in CPU_LEVELS:
        raise InvalidValueError(f"unknown CPU level {level!r}; accepted: {', '.join(CPU_LEVELS)}")
    tasks = warmup_tasks(None, COMPILED_SOURCES) if tasks is None else list(tasks)
    folder = os.path.join(dest, compiled_tag(), level)
    with tempfile.TemporaryDirectory(prefix="nk-tier-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "NUMBA_CPU_NAME": level, "NUMBA_CPU_FEATURES": ""}
        env["NEURON_KERNELS_COMPILED"] = "0"
        # the processes compile this copy of the package, whatever else is installed
        paths = [os.path.dirname(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
        script = (
            "import json, sys\n"
            "from neuron_kernels._jit.numba_internals import host_magic\n"
            "from neuron_kernels.tools.warmup import warmup\n"
            "tasks = [tuple(t) for t in json.loads(sys.argv[1])]\n"
            "compiled, _ = warmup(tasks, None if sys.argv[2] == 'None' else int(sys.argv[2]))\n"
            "magic = list(host_magic())\n"
            "print(json.dumps({'compiled': compiled, 'magic': magic}))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps(tasks), str(processes)],
            env=env,
            cwd=os.path.dirname(PACKAGE_ROOT),  # `python -c` puts its folder first on the path
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"building the compiled tier for {level} failed:\n{done.stderr[-4000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        shutil.rmtree(folder, ignore_errors=True)
        kernels = 0
        for here, subfolders, files in os.walk(PACKAGE_ROOT):
            subfolders[:] = [d for d in subfolders if not d.startswith(("__pycache__", "_compiled"))]
            py = [f for f in files if f.endswith(".py")]
            if not py:
                continue
            built = os.path.join(cache, cache_subpath(os.path.join(here, py[0])))
            if not os.path.isdir(built):
                continue
            target = os.path.join(folder, os.path.relpath(here, PACKAGE_ROOT))
            os.makedirs(target, exist_ok=True)
            for name in os.listdir(built):
                if name.endswith((".nbi", ".nbc")):
                    shutil.copyfile(os.path.join(built, name), os.path.join(target, name))
                    kernels += name.endswith(".nbc")
    if not kernels:
        raise RuntimeError(f"building the compiled tier for {level} saved no kernel (cache folder {cache!r})")
    manifest = {"tag": compiled_tag(), "level": level, "magic": result["magic"], "kernels": kernels}
    manifest["tasks"] = len(tasks)
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def task_origins(tasks: Sequence[Task]) -> list[tuple[Task, dict[str, str]]]:
    """Each task with where the kernels its calls use come from in this process (kernel name:
    ``"local"``, ``"compiled x86-64-vN"`` or ``"jit"``), the calls made in task order: a kernel
    neither cache has is compiled on the way, as a first call would."""
    from .._jit import ORIGINS

    result = []
    for task in tasks:
        before = dict(ORIGINS)
        run_task(task)
        result.append((task, {k: v for k, v in ORIGINS.items() if before.get(k) != v}))
    return result
