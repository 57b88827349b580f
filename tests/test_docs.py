"""The documents tell the truth: every Python example of the README and docs/ runs as written, and
every module, function and file of the package that a document or a docstring names exists.

Examples run in order, one namespace per document, in a fresh working directory holding the
folders they name (``Llama-3-8B/``: the tiny Llama saved by transformers that the checkpoint tests
use, under the README's name; ``Llama-3-8B-NVFP4/``: the README's own command run on it). A
document whose examples need torch needs the ``runtimes`` extra (skipped with the reason without
it, a failure in CI)."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import warnings
from pathlib import Path

import pytest

from .cli_runner import run
from .helpers import import_runtime

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TINY_LLAMA = Path(__file__).parent / "fixtures" / "modelopt" / "bf16"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def python_examples(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file: (first line number, code)."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) == "python"]


def _folders(where: Path) -> None:
    """The checkpoint folders the README's examples name."""
    shutil.copytree(TINY_LLAMA, where / "Llama-3-8B")
    run("quantize", "Llama-3-8B/", "Llama-3-8B-NVFP4/", "--format", "nvfp4", cwd=where)


@pytest.mark.parametrize("path", [d for d in DOCUMENTS if python_examples(d)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_runs_as_written(path, tmp_path, monkeypatch, fresh_registry):
    """(The README registers cast kernels of its own: ``fresh_registry`` puts the package's back.)"""
    examples = python_examples(path)
    if any("import torch" in code for _, code in examples):
        import_runtime("torch")
    _folders(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for line, code in examples:
        exec(compile(code, f"{path.name}:{line}", "exec"), namespace)


def test_documents_have_examples():
    """The collector finds the README's examples (a fence it misses would pass unseen)."""
    assert len(python_examples(ROOT / "README.md")) >= 6


# ---- names --------------------------------------------------------------------------------------

_DOTTED = re.compile(r"\bneuron_kernels(?:\.\w+)+")
_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc):`~?(\.+[\w.]*)`")
_PATH = re.compile(r"\b((?:neuron_kernels|tests|scripts|benchmarks|docs)/[\w/.-]+\.(?:py|md|json))")


def _resolves(dotted: str) -> bool:
    """Whether ``neuron_kernels.a.b.c`` names a module, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # a deprecated alias is no name to document
                    obj = getattr(obj, attr)
            except (AttributeError, DeprecationWarning):
                return False
        return True
    return False


def _absolute(relative: str, module: Path) -> str:
    """A relative name of a docstring role (``.runs.CHUNK``, ``..nibbles``) made absolute from the
    module the docstring is in (a leading dot is that module's package, each further dot a parent)."""
    package = list(module.relative_to(ROOT).with_suffix("").parts)[:-1]
    dots = len(relative) - len(relative.lstrip("."))
    base = package[: len(package) - (dots - 1)]
    rest = relative.lstrip(".")
    return ".".join(base + ([rest] if rest else []))


def _texts() -> list[tuple[str, str, Path | None]]:
    """(where, text, module) of every document (the README's Changes section aside: it names the
    old names on purpose) and of every docstring of the package."""
    out: list[tuple[str, str, Path | None]] = []
    for d in DOCUMENTS:
        text = d.read_text(encoding="utf-8")
        out.append((str(d.relative_to(ROOT)), re.sub(r"\n## Changes\n.*?(?=\n## )", "\n", text, flags=re.S), None))
    for module in sorted((ROOT / "neuron_kernels").rglob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.append((f"{module.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", doc, module))
    return out


def test_every_named_module_function_and_file_exists():
    """A document or docstring that names ``neuron_kernels.x.y`` or a file of the repository
    names something that is there."""
    missing = []
    for where, text, module in _texts():
        names = set(_DOTTED.findall(text))
        if module is not None:
            names |= {_absolute(r.rstrip("."), module) for r in _ROLE.findall(text)}
        for dotted in names:
            if not _resolves(dotted.rstrip(".")):
                missing.append(f"{where}: {dotted}")
        for path in set(_PATH.findall(text)):
            if not (ROOT / path).exists():
                missing.append(f"{where}: {path}")
    assert not missing, "\n".join(sorted(missing))
