"""``python -m tests.fuzz [TARGET ...] [--seconds S] [--jobs J]``: fuzz every target (or those
named) for ``S`` seconds each, ``J`` at a time, with atheris (``pip install -e ".[fuzz]"``).

Each target runs in a process of its own (:mod:`tests.fuzz.run`), on a corpus kept under
``--work`` (default ``.fuzz/``, so that a later run starts from the coverage an earlier one
reached) and started from the package's own outputs (:mod:`tests.fuzz.seeds`). An input that
makes a target fail (:mod:`tests.fuzz.targets`: a traceback, a second line on stderr, an output
left behind, a write or an allocation the input did not pay for, a file the format's own reader
refuses and the package accepts; or a hang of 120 s, where an input takes about a second, with
room for a kernel compiled on its first use) is copied into ``tests/fuzz/regressions/TARGET/``,
which ``tests/test_fuzz_regressions.py`` replays in every test run; ``--keep-going`` then starts
the target again for the time left. The exit status is 1 if anything was found.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _seed_corpus(target: str, corpus: str, seeds: str) -> None:
    from .targets import TARGETS, seed_inputs

    os.makedirs(corpus, exist_ok=True)
    for data in seed_inputs(TARGETS[target], seeds):
        name = os.path.join(corpus, "seed-" + hashlib.sha1(data).hexdigest()[:16])
        if not os.path.exists(name):
            with open(name, "wb") as fh:
                fh.write(data)


from .targets import TARGETS  # noqa: E402 - after the paths it does not need


def _fuzz(target: str, seconds: float, work: str, regressions: str, keep_going: bool, seed: int | None) -> dict:
    """Run one target for ``seconds``; returns its tally (runs, coverage, findings)."""
    corpus = os.path.join(work, "corpus", target)
    found_dir = os.path.join(work, "findings")
    os.makedirs(found_dir, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    tally = {"target": target, "seconds": 0.0, "runs": 0, "cov": 0, "findings": []}
    end = time.monotonic() + seconds
    log_path = os.path.join(work, "logs", f"{target}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    open(log_path, "w").close()
    while True:
        left = int(end - time.monotonic())
        if left < 5:
            break
        prefix = os.path.join(found_dir, f"{target}-")
        before = set(os.listdir(found_dir))
        started = time.monotonic()
        cmd = [
            sys.executable, "-m", "tests.fuzz.run", target, f"-max_total_time={left}", "-timeout=120",
            "-max_len=300000", "-rss_limit_mb=2048", "-print_final_stats=1", f"-artifact_prefix={prefix}", corpus,
        ] + ([f"-seed={seed}"] if seed is not None else [])  # fmt: skip
        with open(log_path, "a") as log:
            subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=left + 600)
        tally["seconds"] += time.monotonic() - started
        with open(log_path, errors="replace") as log:
            text = log.read()
        runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)
        covs = re.findall(r"cov: (\d+)", text)
        tally["runs"] = sum(map(int, runs))
        tally["cov"] = max(map(int, covs), default=0)
        new = sorted(n for n in set(os.listdir(found_dir)) - before if n.startswith(f"{target}-"))
        for name in new:
            with open(os.path.join(found_dir, name), "rb") as fh:
                data = fh.read()
            if data:  # the slot by its index, so that slots added later (at the end) leave it the same
                data = bytes([data[0] % len(TARGETS[target].slots)]) + data[1:]
            keep = os.path.join(regressions, target, hashlib.sha1(data).hexdigest()[:16] + ".bin")
            os.makedirs(os.path.dirname(keep), exist_ok=True)
            with open(keep, "wb") as fh:
                fh.write(data)
            tally["findings"].append(keep)
        if not new or not keep_going:
            break
    return tally


def main(argv: list[str] | None = None) -> int:
    from .seeds import VERSION, build_seeds

    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", help=f"default: all ({', '.join(TARGETS)})")
    p.add_argument("--seconds", type=float, default=60, help="fuzzing time of each target (default 60)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="targets run at once (default: one per core)")
    p.add_argument("--work", default=os.path.join(ROOT, ".fuzz"), help="corpora, findings and logs (default .fuzz/)")
    p.add_argument("--regressions", default=os.path.join(HERE, "regressions"), help="where findings are kept")
    p.add_argument("--keep-going", action="store_true", help="after a finding, fuzz the target on for the time left")
    p.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a new one each run); CI gives one")
    args = p.parse_args(argv)
    try:
        import atheris  # noqa: F401
    except ImportError:
        print('the fuzzer needs atheris: pip install -e ".[fuzz]"', file=sys.stderr)
        return 2
    names = args.targets or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        p.error(f"unknown target {unknown[0]!r}; targets: {', '.join(TARGETS)}")
    seeds = build_seeds(os.environ.get("NEURON_KERNELS_FUZZ_SEEDS") or os.path.join(args.work, f"seeds-{VERSION}"))
    os.environ["NEURON_KERNELS_FUZZ_SEEDS"] = seeds
    for name in names:
        _seed_corpus(name, os.path.join(args.work, "corpus", name), seeds)
    started = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        tallies = list(
            pool.map(lambda n: _fuzz(n, args.seconds, args.work, args.regressions, args.keep_going, args.seed), names)
        )
    print(f"{'target':<12} {'seconds':>8} {'runs':>10} {'coverage':>9}  findings")
    for t in tallies:
        print(f"{t['target']:<12} {t['seconds']:>8.0f} {t['runs']:>10} {t['cov']:>9}  {len(t['findings'])}")
        for f in t["findings"]:
            print(f"    {os.path.relpath(f, ROOT)} (see {os.path.relpath(args.work, ROOT)}/logs/{t['target']}.log)")
    found = sum(len(t["findings"]) for t in tallies)
    print(f"{len(tallies)} target(s) in {time.monotonic() - started:.0f} s: {found} finding(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
