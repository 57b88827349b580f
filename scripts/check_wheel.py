"""Check an installed wheel's compiled tier (CI runs this in a fresh virtual environment with an
empty NUMBA_CACHE_DIR, docs/performance.md "Compiled kernels"):

1. the package imported is the installed one, and it has a compiled tier for this machine;
2. every call of the tier's tasks (casts from float32, bfloat16 and float16 to every format and
   back; quantise, dequantise, fake-quantise and the error table's kernels of every block format
   from those sources) compiles nothing;
3. a sample of those calls gives the bits that numba's JIT gives for this host (computed in a
   subprocess that does not read the tier).

Exit 0 when all hold; otherwise 1 with what failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

SAMPLE = """
import hashlib, json
import numpy as np
import ml_dtypes
import neuron_kernels as nk
rng = np.random.default_rng(7)
x = (rng.standard_normal((64, 256)) * np.exp2(rng.integers(-30, 30, (64, 1)))).astype(np.float32)
x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
out = {}
xb = x.astype(ml_dtypes.bfloat16)
out["float32->bfloat16"] = nk.cast(x, "bfloat16").tobytes()
out["float32->float8_e4m3fn"] = nk.cast(x, "float8_e4m3fn").tobytes()
out["bfloat16->float4_e2m1fn"] = nk.cast(xb, "float4_e2m1fn").tobytes()
for fmt, xs in (("mxfp8_e4m3", x), ("mxfp4_e2m1", xb), ("nvfp4", x)):
    q = nk.quantize(xs, fmt)
    out[f"{fmt} {xs.dtype}"] = q.codes.tobytes() + q.scales.tobytes() + q.dequantize().tobytes()
out["fake nvfp4 float32"] = nk.fake_quantize(x, "nvfp4").tobytes()
print(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in out.items()}))
"""


def main() -> int:
    start = time.perf_counter()
    import neuron_kernels

    imported = time.perf_counter() - start
    from neuron_kernels import _jit
    from neuron_kernels.tools.warmup import COMPILED_SOURCES, run_task, warmup_tasks

    problems = []
    here = os.path.dirname(os.path.abspath(neuron_kernels.__file__))
    if "site-packages" not in here:
        problems.append(f"the package imported is {here}, not an installed wheel")
    tiers = _jit.compiled_tiers()
    print(f"package: {here}; compiled tiers: {[level for level, _, _ in tiers] or 'none'}")
    if not tiers:
        problems.append("no compiled tier for this machine")
    import numpy as np

    x = np.linspace(-4, 4, 4096, dtype=np.float32).reshape(16, 256)
    firsts = []
    for fmt in ("mxfp8_e4m3", "nvfp4"):
        start = time.perf_counter()
        neuron_kernels.quantize(x, fmt)
        firsts.append(f"quantize {fmt} {time.perf_counter() - start:.2f} s")
    calls = ", ".join(firsts)
    print(f"import neuron_kernels {imported:.2f} s; first calls: {calls} (timings are reported, not checked)")
    start = time.perf_counter()
    tasks = warmup_tasks(None, COMPILED_SOURCES)
    for task in tasks:
        run_task(task)
    compiled = _jit.compiles()
    print(f"{len(tasks)} tasks in {time.perf_counter() - start:.1f} s: {compiled} kernel(s) compiled")
    if compiled:
        jitted = sorted(name for name, origin in _jit.ORIGINS.items() if origin == "jit")
        problems.append(f"{compiled} kernel(s) compiled despite the tier: {jitted[:10]}")
    answers = {}
    for label, extra in (("tier", {}), ("jit", {"NEURON_KERNELS_COMPILED": "0"})):
        done = subprocess.run(
            [sys.executable, "-c", SAMPLE], env={**os.environ, **extra}, capture_output=True, text=True, check=False
        )
        if done.returncode:
            problems.append(f"the sample calls failed ({label}):\n{done.stderr[-2000:]}")
            break
        answers[label] = json.loads(done.stdout.strip().splitlines()[-1])
    if len(answers) == 2:
        differ = [k for k in answers["jit"] if answers["tier"].get(k) != answers["jit"][k]]
        print(f"{len(answers['jit'])} sample calls compared with the JIT: {len(differ)} differ")
        if differ:
            problems.append(f"the tier's results differ from the JIT's: {differ}")
    digest = hashlib.sha256(json.dumps(answers.get("tier", {}), sort_keys=True).encode()).hexdigest()[:16]
    print(f"sample digest {digest}")
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
