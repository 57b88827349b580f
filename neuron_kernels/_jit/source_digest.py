"""What the cache keys hold of the package's own code: a digest of the kernel sources, and the
file lock under which cache entries are saved."""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
from typing import Any

import numba

#: The package's folder.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The package's files that compiled code, or a constant compiled into it, comes from (folders:
#: every ``.py`` file in them). A kernel inlines helpers of other files than its own, and numba's
#: cache sees only the kernel's own file, so the cache keys carry a digest of the code of all of
#: these (the dtype API, which no kernel compiles, lives in ``dtypes.py``, outside this list).
KERNEL_SOURCES = ("_jit", "kernels", "formats.py", "modes.py")


class _DropDocstrings(ast.NodeTransformer):
    """Removes every statement that is a bare string (docstrings, attribute docstrings)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            node.body = kept or [ast.Pass()]  # type: ignore[attr-defined]
        return node


def code_of(data: bytes) -> bytes:
    """What of a source file can change compiled code: its syntax tree without docstrings, comments,
    line numbers or layout (so that editing any of those keeps every cached kernel); the bytes
    themselves where the file does not parse."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return data
    return ast.dump(_DropDocstrings().visit(tree), include_attributes=False).encode()


def kernel_files(root: str) -> list[str]:
    """The files of :data:`KERNEL_SOURCES`, relative to the package folder ``root``, sorted."""
    names: list[str] = []
    for entry in KERNEL_SOURCES:
        path = os.path.join(root, entry)
        if not os.path.isdir(path):
            names.append(entry)
            continue
        for folder, subfolders, files in os.walk(path):
            subfolders[:] = [d for d in subfolders if d != "__pycache__"]
            rel = os.path.relpath(folder, root)
            names.extend(os.path.join(rel, f).replace(os.sep, "/") for f in files if f.endswith(".py"))
    return sorted(names)


@functools.cache
def sources_digest() -> str | None:
    """SHA-256 of the names and the code (:func:`code_of`) of the files of :data:`KERNEL_SOURCES`,
    read once per process (so it describes the code this process imported, even if the files
    change later); ``None`` where one of them cannot be read (then nothing is cached on disk).

    Parsing the files costs a fraction of a second, so the result is remembered in a small file
    named by the digest of the files' bytes (cheap to compute) beside numba's cache; where that
    folder cannot be written, it is computed every time."""
    root = PACKAGE_ROOT
    try:
        sources = []
        for name in kernel_files(root):
            with open(os.path.join(root, name), "rb") as f:
                sources.append((name, f.read()))
    except OSError:
        return None
    raw = hashlib.sha256(b"".join(f"{n}\0{len(d)}\0".encode() + d for n, d in sources)).hexdigest()
    memo = os.path.join(numba.config.CACHE_DIR or os.path.join(root, "__pycache__"), f"nk-code-{raw[:32]}.txt")
    with contextlib.suppress(OSError, ValueError):
        with open(memo, encoding="ascii") as f:
            known = f.read().strip()
        if len(known) == 64:
            return known
    digest = hashlib.sha256()
    for name, data in sources:
        code = code_of(data)
        digest.update(f"{name}\0{len(code)}\0".encode())
        digest.update(code)
    result = digest.hexdigest()
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        tmp = f"{memo}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(result)
        os.replace(tmp, memo)
    return result


@contextlib.contextmanager
def cache_lock(folder: str) -> Any:
    """An exclusive lock on the cache folder while an entry is saved. numba saves an entry by
    reading the function's index, adding the entry and writing the index back: processes that
    compile overloads of one function at once (``neuron-kernels warmup``, test workers) would
    otherwise each write an index without the others' entries. Where file locks are not
    available, nothing is locked (a lost entry is only compiled again)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
