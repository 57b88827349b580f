"""The package's structure, read from its source: layers import only downwards, and no module but the
format table decides anything by comparing a format's name.

Layers, from the bottom: the vocabularies and the format table; the kernels; the registry and the
promotion lattice; the in-memory numerics (casts, then block formats, then Neuron's operand layout);
files; lazy arrays; the public functions; what is built on them (checkpoints, benchmarks, plots,
warm-up); the command line and the package's top level. A module may import its own layer and the
ones below, at module level or inside a function alike.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import neuron_kernels as nk

PACKAGE = pathlib.Path(nk.__file__).parent

#: Each module's layer (the longest matching prefix of its dotted name below the package).
LAYERS: dict[str, int] = {
    "errors": 0,
    "modes": 0,
    "recipes": 0,
    "_random": 0,
    "_compat": 0,
    "_parallel": 0,
    "formats": 1,
    "dtypes": 1,
    "_jit": 2,
    "kernels": 2,
    "interop": 2,
    "registry": 3,
    "neuron.promotion": 3,
    "casting": 4,
    "neuron.auto_cast": 4,
    "blocks": 5,
    "neuron": 6,
    "io": 7,
    "lazy": 8,
    "api": 9,
    "checkpoints": 10,
    "tools": 10,
    "autograd": 10,
    "cli": 11,
    "__main__": 11,
    "__init__": 11,
}


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: pathlib.Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return parts if parts != ["__init__"] else ["__init__"]


def _layer(parts: list[str]) -> int:
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"neuron_kernels.{'.'.join(parts)} has no layer in LAYERS: add it")


def _imports(path: pathlib.Path) -> list[tuple[int, list[str]]]:
    """(line, the imported package module as parts) of every import of the package, at any depth."""
    return _imports_of(path, path.read_text())


def _imports_of(path: pathlib.Path, source: str) -> list[tuple[int, list[str]]]:
    here = _dotted(path)
    package = here[:-1] if path.name != "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [a.name] for a in node.names] if not node.module else [target]
            elif node.module and node.module.split(".")[0] == "neuron_kernels":
                names = [node.module.split(".")[1:]]
            else:
                continue
            found += [(node.lineno, n) for n in names if n]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[1:]) for a in node.names if a.name.startswith("neuron_kernels.")]
    return found


def _resolvable(parts: list[str]) -> list[str]:
    """The longest prefix of ``parts`` that is a module or package of the package (a name imported
    from the package itself: its ``__init__``)."""
    for n in range(len(parts), 0, -1):
        p = PACKAGE.joinpath(*parts[:n])
        if p.with_suffix(".py").exists() or (p / "__init__.py").exists():
            return parts[:n]
    return ["__init__"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    mine = _layer(_dotted(path))
    upward = [
        f"line {line}: neuron_kernels.{'.'.join(_resolvable(t))} (layer {_layer(_resolvable(t))})"
        for line, t in _imports(path)
        if _layer(_resolvable(t)) > mine
    ]
    assert not upward, f"{path.relative_to(PACKAGE)} (layer {mine}) imports from above: {upward}"


def test_every_module_has_a_layer():
    for path in _modules():
        _layer(_dotted(path))


# ---- format names ----------------------------------------------------------------------------------------

#: Where a comparison with a format's name is the point: the format table and the vocabularies.
NAME_OWNERS = {"formats.py", "dtypes.py", "modes.py"}
#: The machine's own number types: the kernels' working arithmetic and its sources, named where a
#: kernel or a reader picks how to load or store a value, not a choice among the table's formats.
HOST_TYPES = {"float64", "float32", "float16", "bfloat16"}
_NAMES = (set(nk.FORMATS) | set(nk.BLOCK_FORMATS)) - HOST_TYPES
#: Pieces of names that a substring test would use to pick a family ("fp4" in fmt).
_PIECES = {"fp4", "fp6", "fp8", "nvfp", "mxfp", "e8m0", "e4m3", "e5m2", "e2m1"}


def _name_comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every comparison with a format's name (``fmt == "nvfp4"``, ``name in
    ("float8_e8m0fnu", ...)``) or substring test of a piece of one (``"fp4" in fmt``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            if isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                values = [e.value for e in side.elts if isinstance(e, ast.Constant)]
            else:
                values = [side.value] if isinstance(side, ast.Constant) else []
            found += [(node.lineno, v) for v in values if isinstance(v, str) and v in _NAMES]
        substring = isinstance(node.left, ast.Constant) and isinstance(node.ops[0], (ast.In, ast.NotIn))
        if substring and isinstance(node.left.value, str) and node.left.value in _PIECES:
            found.append((node.lineno, node.left.value))
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_format_name_is_compared_outside_the_table(path):
    if path.name in NAME_OWNERS and path.parent == PACKAGE:
        return
    found = _name_comparisons(ast.parse(path.read_text()))
    assert not found, f"{path.relative_to(PACKAGE)} compares format names: {found}; derive it from the table"


def test_the_checks_find_what_they_look_for():
    code = 'n = 4 if "fp4" in fmt else 8\nnv = fmt == "nvfp4"\nok = dtype.name in ("float32", "float64")\n'
    assert sorted(_name_comparisons(ast.parse(code))) == [(1, "fp4"), (2, "nvfp4")]
    # an import of the public layer from the numerics, inside a function, is found and is upward
    fake = PACKAGE / "blocks" / "array.py"
    imports = _imports_of(
        fake, "def f():\n    from ..api import quantize\n    from ..errors import InvalidValueError\n"
    )
    assert [(line, _resolvable(t)) for line, t in imports] == [(2, ["api"]), (3, ["errors"])]
    assert _layer(["api"]) > _layer(_dotted(fake)) > _layer(["errors"])


# ---- names, layouts, private names ---------------------------------------------------------------

#: Modules that may share a name: the command line's, each named after the commands it runs.
SAME_NAMES_ALLOWED = (PACKAGE / "cli" / "commands",)


def test_no_module_name_twice():
    """Each module's name says its job, once: no two modules (or packages) of the package share one."""
    seen: dict[str, list[str]] = {}
    for path in _modules():
        if path.parent in SAME_NAMES_ALLOWED or path.name == "__main__.py":
            continue
        name = path.parent.name if path.name == "__init__.py" else path.stem
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue
        seen.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    twice = {n: p for n, p in seen.items() if len(p) > 1}
    assert not twice, f"module names used twice: {twice}"


def _layout_names() -> set[str]:
    from neuron_kernels.checkpoints import LAYOUTS

    return set(LAYOUTS)


def _string_comparisons(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every comparison (``==``, ``!=``, ``in``) with one of ``names`` as a literal."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            found += [(node.lineno, e.value) for e in elts if isinstance(e, ast.Constant) and e.value in names]
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_layout_name_is_compared_outside_the_layouts(path):
    """What a checkpoint layout stores, means and refuses is a field of its record
    (``checkpoints/layouts/``): no other module asks which layout it has by its name."""
    if PACKAGE / "checkpoints" / "layouts" in path.parents:
        return
    found = _string_comparisons(ast.parse(path.read_text()), _layout_names())
    assert not found, f"{path.relative_to(PACKAGE)} compares layout names: {found}; ask the layout's record"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_is_imported_across_modules(path):
    """A name another module needs is public (no leading underscore) in the module that defines it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("neuron_kernels")):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("_") and a.name[:2] != "__"]
    assert not found, f"{path.relative_to(PACKAGE)} imports private names: {found}"


def test_the_name_checks_find_what_they_look_for():
    code = 'a = layout.name == "compressed-tensors"\nb = x in ("npz", "y")\nc = "fp8" != y\n'
    assert sorted(_string_comparisons(ast.parse(code), {"compressed-tensors", "npz", "fp8"})) == [
        (1, "compressed-tensors"), (2, "npz"), (3, "fp8")]  # fmt: skip


# ---- limits and dtype lists ----------------------------------------------------------------------

#: Every format's largest value from 6 up (smaller ones are ordinary numbers): a float literal equal
#: to one is a limit written by hand, which the code should read from the format's row.
_LIMITS = {float(f.max) for f in nk.FORMATS.values() if f.kind == "float" and f.max >= 6.0}
_INPUT_SET = set(nk.formats.INPUT_DTYPES)


def _hand_written_facts(tree: ast.AST) -> list[tuple[int, object]]:
    """(line, value) of every float literal equal to a format's limit, and of every literal list of
    the input dtypes (``("float32", "float16", "bfloat16", "float64")`` in any order)."""
    found: list[tuple[int, object]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is float and node.value in _LIMITS:
            found.append((node.lineno, node.value))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            if values == _INPUT_SET and len(node.elts) == len(_INPUT_SET):
                found.append((node.lineno, "the input dtypes"))
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_limit_or_dtype_list_is_written_outside_the_table(path):
    if path.name == "formats.py" and path.parent == PACKAGE:
        return
    found = _hand_written_facts(ast.parse(path.read_text()))
    assert not found, f"{path.relative_to(PACKAGE)} writes facts of the table by hand: {found}; read them from it"


def test_the_fact_check_finds_what_it_looks_for():
    code = 'b = 448.0\nn = 448\nd = ("float64", "float32", "bfloat16", "float16")\ne = ("float32", "bfloat16")\n'
    assert _hand_written_facts(ast.parse(code)) == [(1, 448.0), (3, "the input dtypes")]


# ---- the tests' own modules ----------------------------------------------------------------------

TESTS = pathlib.Path(__file__).parent


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda p: p.name)
def test_no_test_module_or_conftest_is_imported(path):
    # Shared helpers live in helper modules (helpers.py, checkpoint_helpers.py, ...); fixtures in
    # conftest.py, which pytest provides by name.
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + ([a.name for a in node.names] if not node.module else [])
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        last = [n.split(".")[-1] for n in names]
        found += [(node.lineno, n) for n in last if n.startswith("test_") or n == "conftest"]
    assert not found, (
        f"tests/{path.name} imports test modules or conftest: {found}; move what it needs to a helper module"
    )
