"""Every input that ever made a fuzz target fail (``tests/fuzz/regressions/TARGET/*.bin``, kept by
``python -m tests.fuzz``), replayed through its target's checks (:mod:`tests.fuzz.targets`), and
every target on its seeds; atheris is not needed for these.

A failure here shows the target's finding: a traceback, a second line on stderr, an output left
behind, a file the format's own reader refuses that the package accepts (see the targets' module
docstring). To add a case by hand: ``bytes([slot]) + file_bytes`` into the target's folder.
"""

import glob
import os

import pytest

from .fuzz.seeds import build_seeds
from .fuzz.targets import TARGETS, execute, seed_inputs

REGRESSIONS = os.path.join(os.path.dirname(__file__), "fuzz", "regressions")
CASES = sorted(glob.glob(os.path.join(REGRESSIONS, "*", "*.bin")))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    # a process of the test run makes them once; the fuzzer's own are made the same way
    return build_seeds(str(tmp_path_factory.getbasetemp() / "fuzz-seeds"))


@pytest.mark.parametrize("case", CASES, ids=[os.path.relpath(c, REGRESSIONS) for c in CASES])
def test_a_fuzz_finding_stays_fixed(case, seeds):
    target = os.path.basename(os.path.dirname(case))
    with open(case, "rb") as fh:
        execute(TARGETS[target], fh.read(), seeds)


@pytest.mark.parametrize("name", list(TARGETS))
def test_each_target_passes_on_its_seeds(name, seeds):
    """The package's own outputs read, convert and check cleanly: the targets' checks are not
    findings on every input (and the seeds are valid, so the fuzzer starts from real files)."""
    for data in seed_inputs(TARGETS[name], seeds):
        execute(TARGETS[name], data, seeds)
