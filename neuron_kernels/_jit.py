"""Numba in one place: the jit helper and the 32-bit integer intrinsics the kernels use.

Importing this module imports numba; the rest of the package imports it only when a kernel is
first needed, so ``import neuron_kernels`` stays cheap and compiles nothing.

Plain numba integer code widens ``uint32`` arithmetic to 64 bits, which halves the SIMD width
of the cast loops. The intrinsics below emit the 32-bit LLVM instruction directly; their
arguments are converted to ``uint32`` first, so literals can be passed as they are.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils, event
from numba.core.caching import FunctionCache, IndexDataCacheFile, dumps
from numba.core.dispatcher import Dispatcher
from numba.extending import intrinsic

__all__ = [
    "jit",
    "vectorize",
    "u32_add",
    "u32_sub",
    "u32_mul",
    "u32_shr",
    "u32_shl",
    "u32_and",
    "u32_or",
    "u32_xor",
    "f32_bits",
    "f32_from_bits",
    "f16_to_f32_bits",
    "i32_positive",
    "u32_amax_abs",
    "compiles",
    "on_compile",
]

#: The options of every kernel: cached on disk, GIL released, no fastmath (it breaks NaN and
#: signed-zero handling).
JIT_OPTIONS: dict[str, Any] = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}


#: The package's files that compiled code, or a constant compiled into it, comes from (folders:
#: every ``.py`` file in them). A kernel inlines helpers of other files than its own, and numba's
#: cache sees only the kernel's own file, so the cache keys carry a digest of the code of all of
#: these (the dtype API, which no kernel compiles, lives in ``dtypes.py``, outside this list).
KERNEL_SOURCES = ("_jit.py", "kernels", "formats.py", "modes.py")


class _DropDocstrings(ast.NodeTransformer):
    """Removes every statement that is a bare string (docstrings, attribute docstrings)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            node.body = kept or [ast.Pass()]  # type: ignore[attr-defined]
        return node


def _code_of(data: bytes) -> bytes:
    """What of a source file can change compiled code: its syntax tree without docstrings, comments,
    line numbers or layout (so that editing any of those keeps every cached kernel); the bytes
    themselves where the file does not parse."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return data
    return ast.dump(_DropDocstrings().visit(tree), include_attributes=False).encode()


def _kernel_files(root: str) -> list[str]:
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
def _sources_digest() -> str | None:
    """SHA-256 of the names and the code (:func:`_code_of`) of the files of :data:`KERNEL_SOURCES`,
    read once per process (so it describes the code this process imported, even if the files
    change later); ``None`` where one of them cannot be read (then nothing is cached on disk).

    Parsing the files costs a fraction of a second, so the result is remembered in a small file
    named by the digest of the files' bytes (cheap to compute) beside numba's cache; where that
    folder cannot be written, it is computed every time."""
    root = os.path.dirname(os.path.abspath(__file__))
    try:
        sources = []
        for name in _kernel_files(root):
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
        code = _code_of(data)
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
def _cache_lock(folder: str) -> Any:
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


def _closure_key(fn: Callable[..., Any]) -> list[Any]:
    """The values of ``fn``'s closure as a cache key: compiled functions as (module, qualified
    name, their own closure's key), everything else as it is."""
    key: list[Any] = []
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, Dispatcher):
            py = value.py_func
            value = ("compiled", py.__module__, py.__qualname__, tuple(_closure_key(py)))
        key.append(value)
    return key


#: The folder of the package's compiled tier (see :func:`compiled_tiers`).
COMPILED_FOLDER = "_compiled"

#: The x86-64 micro-architecture levels a compiled tier may be built for (LLVM's CPU names),
#: best first, with the host features (LLVM's names) each adds to the levels after it.
CPU_LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    "x86-64-v3": ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"),
    "x86-64-v2": ("cx16", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3"),
}

#: The manifest of a tier folder: what its kernels were compiled for.
MANIFEST = "manifest.json"

_PACKAGE_ROOT = os.path.dirname(os.path.abspath(__file__))


def compiled_tag() -> str:
    """The folder of the compiled tier for this numba, Python and platform: kernels compiled for
    another of them are never looked at."""
    return f"numba-{numba.__version__}-{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def compiled_root() -> str:
    """Where the compiled tiers live: ``NEURON_KERNELS_COMPILED_DIR`` if set, else the package's
    ``_compiled`` folder."""
    return os.environ.get("NEURON_KERNELS_COMPILED_DIR") or os.path.join(_PACKAGE_ROOT, COMPILED_FOLDER)


def host_levels() -> list[str]:
    """The levels of :data:`CPU_LEVELS` this machine runs, best first."""
    from llvmlite import binding

    try:
        features = {k for k, v in binding.get_host_cpu_features().items() if v}
    except RuntimeError:  # pragma: no cover - LLVM cannot tell on this platform
        return []
    levels = list(CPU_LEVELS)
    return [lv for i, lv in enumerate(levels) if all(f in features for later in levels[i:] for f in CPU_LEVELS[later])]


@functools.cache
def compiled_tiers() -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    """(level, folder, numba's CPU key of the code there) of each compiled tier this process can
    use, best first: a folder under :func:`compiled_root` / :func:`compiled_tag` for a level the
    host runs, whose manifest is readable. Read-only: nothing is ever written there at run time.
    None where ``NUMBA_CPU_NAME`` is set (a build of a tier) or ``NEURON_KERNELS_COMPILED=0``
    (``neuron-kernels warmup``, which compiles host-tuned kernels into the local cache)."""
    if numba.config.CPU_NAME or os.environ.get("NEURON_KERNELS_COMPILED", "").strip() == "0":
        return ()
    base = os.path.join(compiled_root(), compiled_tag())
    tiers = []
    for level in host_levels():
        folder = os.path.join(base, level)
        try:
            with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
                magic = tuple(json.load(f)["magic"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        tiers.append((level, folder, magic))
    return tuple(tiers)


_compiled_off = threading.local()


@contextlib.contextmanager
def local_cache_only() -> Any:
    """Within the block, this thread and the processes it starts neither load from the compiled
    tier nor see it (``NEURON_KERNELS_COMPILED=0``): what they lack is compiled for this host and
    saved to the local cache (``neuron-kernels warmup``)."""
    before = os.environ.get("NEURON_KERNELS_COMPILED")
    os.environ["NEURON_KERNELS_COMPILED"] = "0"
    _compiled_off.active = True
    try:
        yield
    finally:
        _compiled_off.active = False
        if before is None:
            os.environ.pop("NEURON_KERNELS_COMPILED", None)
        else:
            os.environ["NEURON_KERNELS_COMPILED"] = before


#: Where each kernel this process loaded or compiled came from, by qualified name: ``"local"``
#: (the host's cache), ``"compiled x86-64-vN"`` (the compiled tier) or ``"jit"`` (compiled now).
ORIGINS: dict[str, str] = {}


class _TolerantCache(FunctionCache):
    """numba's on-disk cache, keyed on the package's kernel sources as well (see
    :data:`KERNEL_SOURCES`), and tolerant: an unreadable entry (a corrupted or truncated file) is
    a miss with a warning, not an exception in the user's call: the kernel is recompiled and the
    bad index removed so that the new compilation can be saved."""

    def __init__(self, py_func: Callable[..., Any]) -> None:
        super().__init__(py_func)
        digest = _sources_digest()
        if digest is None:
            self.disable()
        # numba ignores an index whose stamp is not the current one and overwrites it at the next
        # save: with the digest in the stamp, an edit of any kernel source empties the indexes
        # instead of leaving entries behind that no key will match again.
        self._cache_file._source_stamp = (self._cache_file._source_stamp, digest)

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        # Both load_overload and save_overload look entries up by this key: numba's own (the
        # signature, the CPU, digests of the bytecode and of the closure's values), except that
        # a compiled function in the closure is described by its name and its own closure, not
        # pickled (its pickle holds an id that is new in every process, so the key would never
        # match again), and the digest of the kernel sources, which holds the functions' code.
        return self._key(sig, codegen.magic_tuple())

    def _key(self, sig: Any, magic: tuple[Any, ...]) -> Any:
        cells = tuple(_closure_key(self._py_func))
        digests = (hashlib.sha256(self._py_func.__code__.co_code).hexdigest(), hashlib.sha256(dumps(cells)).hexdigest())
        return (sig, magic, digests, _sources_digest())

    def _load_compiled(self, sig: Any, target_context: Any) -> Any:
        """The kernel from a compiled tier (:func:`compiled_tiers`), best level first, or None:
        looked up with the tier's CPU key in place of the host's, in the folder of the kernel's
        source file relative to the package. A missing or unreadable entry is a miss."""
        py_file = getattr(self._impl.locator, "_py_file", None)
        if not self._enabled or py_file is None or getattr(_compiled_off, "active", False):
            return None
        relative = os.path.relpath(os.path.dirname(os.path.abspath(py_file)), _PACKAGE_ROOT)
        for level, folder, magic in compiled_tiers():
            entries = IndexDataCacheFile(
                os.path.join(folder, relative), self._impl.filename_base, self._cache_file._source_stamp
            )
            try:
                data = entries.load(self._key(sig, magic))
                if data is not None:
                    ORIGINS[self._qualname()] = f"compiled {level}"
                    return self._impl.rebuild(target_context, data)
            except Exception:  # noqa: BLE001 - a tier that cannot be read is a miss, never an error
                continue
        return None

    def _qualname(self) -> str:
        return getattr(self._py_func, "__qualname__", "a kernel")

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The host's cache first (host-tuned code, once compiled here or by ``neuron-kernels
        warmup``), then the compiled tier; None (compile) where neither has the kernel."""
        data = self._load_local(sig, target_context)
        if data is not None:
            ORIGINS[self._qualname()] = "local"
            return data
        data = self._load_compiled(sig, target_context)
        if data is None:
            ORIGINS[self._qualname()] = "jit"
        return data

    def _load_local(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:  # noqa: BLE001 - any unreadable cache entry is a miss
            warnings.warn(
                f"neuron_kernels: ignoring an unreadable compilation cache entry of "
                f"{self._qualname()} ({type(exc).__name__}: {exc}); compiling it again",
                RuntimeWarning,
                stacklevel=2,
            )
            with contextlib.suppress(OSError, AttributeError):
                os.remove(self._cache_file._index_path)
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            with _cache_lock(self.cache_path):
                super().save_overload(sig, data)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written only costs time
            warnings.warn(
                f"neuron_kernels: cannot save {self._qualname()} to the compilation cache "
                f"({type(exc).__name__}: {exc})",
                RuntimeWarning,
                stacklevel=2,
            )


#: Seconds a first call may compile before the library says so (once per process).
NOTICE_AFTER = 1.0

_log = logging.getLogger("neuron_kernels")


class _CompileWatch(event.Listener):  # type: ignore[misc]
    """Numba's compile events (cache misses only; loads from the disk cache send none), outermost
    only: counts the package's compiled kernels, tells the subscribers of :func:`on_compile`, and
    logs one notice per process when a compile runs past :data:`NOTICE_AFTER` seconds."""

    def __init__(self) -> None:
        self.depth = 0
        self.count = 0
        self.noticed = False
        self.subscribers: list[Callable[[str, str, float], None]] = []
        self._timer: threading.Timer | None = None
        self._start = 0.0

    @staticmethod
    def _name(ev: Any) -> str | None:
        fn = getattr(ev.data.get("dispatcher"), "py_func", None) if isinstance(ev.data, dict) else None
        module = getattr(fn, "__module__", "") or ""
        return getattr(fn, "__qualname__", "?") if module.startswith("neuron_kernels") else None

    def on_start(self, ev: Any) -> None:
        self.depth += 1
        name = self._name(ev)
        if self.depth != 1 or name is None:
            return
        self._start = time.perf_counter()
        if not self.noticed and _log.isEnabledFor(logging.WARNING) and not self.subscribers:
            self._timer = threading.Timer(NOTICE_AFTER, self._notice)
            self._timer.daemon = True
            self._timer.start()
        for callback in list(self.subscribers):
            callback("start", name, 0.0)

    def on_end(self, ev: Any) -> None:
        self.depth -= 1
        name = self._name(ev)
        if self.depth != 0 or name is None:
            return
        self.count += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for callback in list(self.subscribers):
            callback("end", name, time.perf_counter() - self._start)

    def _notice(self) -> None:
        if not self.noticed:
            self.noticed = True
            _log.warning(
                "neuron_kernels: compiling kernels for their first use (a few seconds each, once: "
                "they are cached on disk; `neuron-kernels warmup` compiles them ahead of time)"
            )


_WATCH = _CompileWatch()
event.register("numba:compile", _WATCH)


def compiles() -> int:
    """How many of the package's kernels this process has compiled (not loaded from the cache)."""
    return _WATCH.count


@contextlib.contextmanager
def on_compile(callback: Callable[[str, str, float], None]) -> Any:
    """Call ``callback("start" | "end", kernel name, seconds)`` around every compile of a package
    kernel while the block runs (the command line's progress line; the one-time notice is then
    left to it)."""
    _WATCH.subscribers.append(callback)
    try:
        yield
    finally:
        _WATCH.subscribers.remove(callback)


def _name_by_closure(f: Callable[..., Any]) -> None:
    """Give a compiled closure a qualified name of its own per closure value (a digest of them).

    A compiled function calls another, not inlined, by its symbol, which numba makes of the callee's
    qualified name, its argument types and a number counted per process. Two closures of one factory
    (one name) with the same argument types compiled in two processes can get the same symbol: a
    kernel that one process saved to the disk cache and the other loads would then be linked to the
    other closure's code. Closures named by their values cannot be confused."""
    try:
        digest = hashlib.sha256(dumps(tuple(_closure_key(f)))).hexdigest()[:16]
    except Exception:  # noqa: BLE001 - a value that cannot be pickled: the cache key cannot hold it either
        return
    f.__qualname__ = f"{f.__qualname__}_{digest}"


def jit(fn: Callable[..., Any] | None = None, **overrides: Any) -> Any:
    """``numba.njit`` with the package's options; compiles lazily on the first call."""
    options = {**JIT_OPTIONS, **overrides}

    def make(f: Callable[..., Any]) -> Any:
        if f.__closure__ and options.get("inline") != "always":
            _name_by_closure(f)
        dispatcher = numba.njit(**options)(f)
        if options.get("cache") and isinstance(getattr(dispatcher, "_cache", None), FunctionCache):
            dispatcher._cache = _TolerantCache(dispatcher.py_func)
        return dispatcher

    return make if fn is None else make(fn)


def vectorize(fn: Callable[..., Any], signature: str) -> Any:
    """A NumPy ufunc of the scalar function ``fn`` for one signature (``"uint16(float32)"``), made by
    numba's ``@vectorize`` machinery with the package's cache (see :class:`_TolerantCache`).

    Unlike :func:`jit`, this compiles (or loads from the cache) at once: a ufunc holds a pointer to
    its compiled loop. Call it lazily, on first use.
    """
    from numba.np.ufunc.ufuncbuilder import UFuncBuilder

    builder = UFuncBuilder(fn, cache=False, targetoptions={"nopython": True})
    if JIT_OPTIONS.get("cache"):
        builder.nb_func.cache = _TolerantCache(fn)
    builder.add(signature)
    return builder.build_ufunc()


def _u32_binop(op: str) -> Any:
    def typer(typingctx: Any, a: Any, b: Any) -> Any:
        sig = types.uint32(types.uint32, types.uint32)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return getattr(builder, op)(args[0], args[1])

        return sig, codegen

    typer.__name__ = f"u32_{op.strip('_')}"
    return intrinsic(typer)


u32_add = _u32_binop("add")
u32_sub = _u32_binop("sub")
u32_mul = _u32_binop("mul")
u32_shr = _u32_binop("lshr")
u32_shl = _u32_binop("shl")
u32_and = _u32_binop("and_")
u32_or = _u32_binop("or_")
u32_xor = _u32_binop("xor")


@intrinsic
def f32_bits(typingctx: Any, x: Any) -> Any:
    """The bit pattern of a float32 as a uint32 (a bitcast, no conversion)."""
    sig = types.uint32(types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx: Any, u: Any) -> Any:
    """The float32 whose bit pattern is the uint32 ``u`` (a bitcast, no conversion)."""
    sig = types.float32(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def i32_positive(typingctx: Any, u: Any) -> Any:
    """Whether the uint32 ``u``, read as a signed 32-bit integer, is greater than zero."""
    sig = types.boolean(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.icmp_signed(">", args[0], ir.Constant(ir.IntType(32), 0))

    return sig, codegen


@intrinsic
def f16_to_f32_bits(typingctx: Any, u: Any) -> Any:
    """The float32 pattern of the float16 pattern in the low 16 bits of the uint32 ``u``, by the
    hardware conversion (F16C's vcvtph2ps where the CPU has it). Exact for every number; a NaN
    comes out quiet (callers that keep signalling NaN payloads fix those up)."""
    sig = types.uint32(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        half = builder.bitcast(builder.trunc(args[0], ir.IntType(16)), ir.HalfType())
        return builder.bitcast(builder.fpext(half, ir.FloatType()), ir.IntType(32))

    return sig, codegen


@intrinsic
def u32_amax_abs(typingctx: Any, row: Any, start: Any, count: Any) -> Any:
    """``max(row[start + i] & sign mask for i < count)`` for a C-contiguous uint32 or uint16 ``row``
    (float32 patterns, or float16/bfloat16 codes) and a compile-time constant ``count``: one vector
    load and one reduction, no bounds check; the result as a uint32 (the 16-bit code's magnitude).

    A plain loop over a 32-element block runs at a quarter of the vector width (the vectoriser
    wants 64 iterations); this is the block amax of the block kernels. ``count == 0`` gives 0 for
    any ``row`` (the kernels pass 0 where they have no fixed block length), and so does a ``row``
    of another type (a float64 row in code shared by every source, where the call is never made).
    """
    if not isinstance(count, types.IntegerLiteral) or count.literal_value < 0:
        return None
    n = count.literal_value
    if n and not (
        isinstance(row, types.Array)
        and row.dtype in (types.uint32, types.uint16)
        and row.ndim == 1
        and row.layout == "C"
    ):
        n = 0
    bits = 32 if n == 0 or row.dtype == types.uint32 else 16
    sig = types.uint32(row, types.uint64, count)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if n == 0:
            return ir.Constant(ir.IntType(32), 0)
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        lane = ir.IntType(bits)
        vty = ir.VectorType(lane, n)
        ptr = builder.bitcast(builder.gep(data, [args[1]]), vty.as_pointer())
        mask = (1 << (bits - 1)) - 1
        vec = builder.and_(builder.load(ptr, align=bits // 8), ir.Constant(vty, [mask] * n))
        fnty = ir.FunctionType(lane, [vty])
        reduce = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.vector.reduce.umax.v{n}i{bits}")
        result = builder.call(reduce, [vec])
        return result if bits == 32 else builder.zext(result, ir.IntType(32))

    return sig, codegen
