"""The fuzzer of the package's readers and commands (docs/checkpoints.md, "Files from anyone").

``pip install -e ".[fuzz]"`` (atheris), then ``python -m tests.fuzz`` (every target for a minute)
or ``python -m tests.fuzz gguf npz --seconds 3600 --keep-going``. One module per job:
:mod:`.seeds` (the package's own outputs the corpora start from), :mod:`.targets` (what each
target runs and what it must never do), :mod:`.mutate` (mutations that know the files'
structure), :mod:`.run` (one target under atheris), ``__main__`` (the driver: the targets in
processes of their own, findings kept in ``regressions/``).

It lives with the tests rather than in ``scripts/``: its targets are the tests' contract (one line,
exit 2, nothing written) checked on generated inputs, they reuse the tests' model makers, and its
findings are replayed by a test (``tests/test_fuzz_regressions.py``) in every test run, without
atheris.
"""
