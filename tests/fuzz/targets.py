"""The fuzz targets: one per reader and one per command, each a check of one input that raises
:class:`Finding` (or lets an unexpected exception through) where the package breaks its contract
with a file from anyone.

An input is one byte that picks a *slot* (a file of a seed: a shard, ``config.json``, the index,
``hf_quant_config.json``, a GGUF file, an ``.npy``, a member-holding ``.npz``) and the bytes that
replace that file. The seed is copied into a fresh folder with the file replaced, and the target
runs on the copy.

What every target holds to:

- readers (``safetensors``, ``checkpoint``, ``gguf``, ``npy``, ``npz``, ``blocks``): they return or
  raise the package's own error (:class:`~neuron_kernels.errors.NeuronKernelsError`), nothing
  else; what they accept reads whole; and what the format's own reader refuses, they refuse too
  (safetensors' ``deserialize``, gguf-py's ``GGUFReader``, numpy's ``np.load``);
- commands (``quantize``, ``dequantize``, ``cast``, ``check``): exit 0 (``check``: 1 too) with an
  output the package reads back, or exit 2 with one line on stderr and nothing left under the
  output's name or a temporary one; no traceback, no warning, no write the input did not pay for
  (the fuzzer runs them under a file size limit).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Finding", "Slot", "Target", "TARGETS", "execute", "seed_inputs"]


class Finding(AssertionError):
    """What a target must never do, seen on one input."""


@dataclass(frozen=True)
class Slot:
    """The file an input replaces: ``file`` of the seed ``seed`` (a file or a folder under the seeds
    folder; ``file`` is "" where the seed is the file), and the command's arguments for it."""

    seed: str
    file: str = ""
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    name: str
    slots: tuple[Slot, ...]
    run: Callable[[str, Slot, str], None]  # (the input's path, its slot, the work folder)


def _slot(data: bytes, target: Target) -> Slot:
    return target.slots[data[0] % len(target.slots)] if data else target.slots[0]


def seed_inputs(target: Target, seeds: str) -> list[bytes]:
    """The inputs that reproduce each slot's seed as it is."""
    out = []
    for i, slot in enumerate(target.slots):
        with open(
            os.path.join(seeds, slot.seed, slot.file) if slot.file else os.path.join(seeds, slot.seed), "rb"
        ) as fh:
            out.append(bytes([i]) + fh.read())
    return out


def execute(target: Target, data: bytes, seeds: str) -> None:
    """Run ``target`` on one input (see the module docstring)."""
    slot = _slot(data, target)
    with tempfile.TemporaryDirectory(prefix="nk-fuzz-") as work:
        source = os.path.join(seeds, slot.seed)
        path = os.path.join(work, os.path.basename(slot.seed))
        if slot.file:
            shutil.copytree(source, path)
            with open(os.path.join(path, slot.file), "wb") as fh:
                fh.write(data[1:])
        else:
            with open(path, "wb") as fh:
                fh.write(data[1:])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # as the test suite runs: a warning is a finding
            target.run(path, slot, work)


# ---- readers -----------------------------------------------------------------------------------------


def _ours(fn: Callable[[], object]) -> bool:
    """Whether the package's reader accepts (True) or refuses in its own error (False)."""
    from neuron_kernels.errors import NeuronKernelsError

    try:
        fn()
    except NeuronKernelsError:
        return False
    return True


def _read_all(entries: list) -> None:
    for e in entries:
        e.read_flat(0, e.size)
        if e.shape:
            e.read(0, e.shape[0])


def _safetensors(path: str, slot: Slot, work: str) -> None:
    from neuron_kernels.io.arrays import open_arrays

    if _ours(lambda: _read_all(open_arrays(path))):
        import safetensors

        with open(path, "rb") as fh:
            raw = fh.read()
        try:
            safetensors.deserialize(raw)
        except Exception as exc:  # noqa: BLE001 - any refusal of the format's own reader
            raise Finding(f"accepted a file safetensors' own reader refuses ({exc})") from None


def _gguf(path: str, slot: Slot, work: str) -> None:
    from neuron_kernels.checkpoints.gguf_convert import load_gguf
    from neuron_kernels.io.gguf_file import open_gguf

    def read() -> None:
        header = open_gguf(path)
        for field in header.fields.values():
            field.contents()
        load_gguf(path)

    if _ours(read):
        import gguf

        try:
            gguf.GGUFReader(path)
        except Exception as exc:  # noqa: BLE001 - any refusal of the format's own reader
            raise Finding(f"accepted a file gguf-py's reader refuses ({type(exc).__name__}: {exc})") from None


def _numpy(path: str, slot: Slot, work: str) -> None:
    from neuron_kernels.io.arrays import open_arrays

    entries: list = []

    def read() -> None:
        entries.extend(open_arrays(path))
        _read_all(entries)

    if _ours(read):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = np.load(path, allow_pickle=False)
                if isinstance(loaded, np.lib.npyio.NpzFile):
                    with loaded:
                        for e in entries:
                            loaded[e.name]
        except Exception as exc:  # noqa: BLE001 - any refusal of the format's own reader
            raise Finding(f"accepted a file numpy's np.load refuses ({type(exc).__name__}: {exc})") from None


def _blocks(path: str, slot: Slot, work: str) -> None:
    import neuron_kernels as nk
    from neuron_kernels.io.blockfile import read_block_file

    def read() -> None:
        for name in read_block_file(path):
            nk.load_blocks(path, name).dequantize()

    _ours(read)


def _checkpoint(path: str, slot: Slot, work: str) -> None:
    from neuron_kernels.checkpoints import load_checkpoint

    _ours(lambda: load_checkpoint(path))


# ---- commands ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    status: int
    stdout: str
    stderr: str


def _cli(args: list[str], cwd: str) -> _Run:
    """``neuron-kernels ARGS`` in this process (as tests/cli_runner.py runs it)."""
    import signal

    from neuron_kernels.cli import main

    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(args)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
    return _Run(status, out.getvalue(), err.getvalue())


def _reads_back(output: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every array of a command's output, read with the package's readers."""
    from neuron_kernels.checkpoints.layouts import open_any
    from neuron_kernels.io.arrays import open_arrays
    from neuron_kernels.io.blockfile import read_block_file
    from neuron_kernels.io.gguf_file import open_gguf

    if output.endswith(".gguf"):
        return [(t.name, t.shape) for t in open_gguf(output).tensors.values()]
    if os.path.isdir(output):
        ckpt, _ = open_any(output)
        return [(n, e.shape) for n, e in ckpt.tensors.items()]
    entries = [(e.name or "", e.shape) for e in open_arrays(output)]
    if output.endswith(".npz") and any(n.endswith("meta") for n, _ in entries):
        read_block_file(output)
    return entries


def _command(args: list[str], work: str, output: str | None, statuses: tuple[int, ...] = (0, 2)) -> _Run:
    """Run a command and check what it leaves (see the module docstring)."""
    r = _cli(args, work)
    said = f"neuron-kernels {' '.join(args)}: exit {r.status}: {r.stderr[-2000:]}"
    if r.status not in statuses:
        raise Finding(f"exit status {r.status}, not one of {statuses}: {said}")
    if "File too large" in r.stderr:
        raise Finding(f"a write past the fuzzer's file size limit (more than the input paid for): {said}")
    left = [n for n in os.listdir(work) if n.startswith((".partial-", ".replaced-"))]
    if left:
        raise Finding(f"left {left} behind: {said}")
    if r.status == 2:
        lines = r.stderr.strip().splitlines()
        if len(lines) != 1 or "Traceback" in r.stderr:
            raise Finding(f"not one line on stderr: {said}")
        if output is not None and os.path.exists(os.path.join(work, output)):
            raise Finding(f"an output was left after a refusal: {said}")
    elif output is not None:
        try:
            _reads_back(os.path.join(work, output))
        except Exception as exc:  # noqa: BLE001 - the package must read what it wrote
            raise Finding(f"wrote {output}, which the package cannot read back ({exc}): {said}") from None
    return r


def _quantize(path: str, slot: Slot, work: str) -> None:
    name = os.path.basename(path)
    out = "out.gguf" if name.endswith(".gguf") else "out.npz" if os.path.isfile(path) else "out"
    _command(["quantize", name, out, *slot.args], work, out)


def _dequantize(path: str, slot: Slot, work: str) -> None:
    name = os.path.basename(path)
    out = "out.gguf" if name.endswith(".gguf") else "out.npz" if os.path.isfile(path) else "out"
    _command(["dequantize", name, out, *slot.args], work, out)


def _cast(path: str, slot: Slot, work: str) -> None:
    from neuron_kernels.errors import NeuronKernelsError
    from neuron_kernels.io.arrays import open_arrays

    name = os.path.basename(path)
    out = "out" + os.path.splitext(name)[1]
    r = _command(["cast", name, out, *slot.args], work, out)
    if r.status == 0:
        try:
            given = sorted((e.name or "", e.shape) for e in open_arrays(path))
        except NeuronKernelsError as exc:
            raise Finding(f"cast wrote {out} from an input its reader refuses ({exc})") from None
        got = sorted((e.name or "", e.shape) for e in open_arrays(os.path.join(work, out)))
        if [s for _, s in got] != [s for _, s in given]:
            raise Finding(f"cast wrote arrays of shapes {got} from arrays of shapes {given}")


def _check(path: str, slot: Slot, work: str) -> None:
    name = os.path.basename(path)
    if slot.args[:1] == ("--repair",):
        _command(["check", name, "--repair", "fixed"], work, "fixed", (0, 1, 2))
    else:
        _command(["check", name, *slot.args], work, None, (0, 1, 2))


# ---- the table ---------------------------------------------------------------------------------------

_FOLDERS = {
    "plain": ("config.json", "model.safetensors", "generation_config.json"),
    "sharded": ("model.safetensors.index.json", "model-00001-of-00002.safetensors", "config.json"),
    "ct-nvfp4": ("config.json", "model.safetensors"),
    "ct-mxfp4": ("config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"),
    "ct-fp8": ("config.json", "model.safetensors"),
    "fp8-block": ("config.json", "model.safetensors"),
    "modelopt-fp8": ("hf_quant_config.json", "config.json", "model.safetensors"),
    "modelopt-nvfp4": ("hf_quant_config.json", "config.json", "model.safetensors"),
    "llmcompressor-nvfp4": ("config.json", "model.safetensors.index.json", "model.safetensors"),
}
_QUANTISED = [f for f in _FOLDERS if f not in ("plain", "sharded")]


#: Seeds added since the first findings were kept: their slots come after the others.
_ADDED = {
    "ct-fp8-block": ("config.json", "model.safetensors"),
    "ct-mixed": ("config.json", "model.safetensors"),
    "modelopt-mixed": ("hf_quant_config.json", "config.json", "model.safetensors"),
    "llmcompressor-mixed": ("config.json", "model.safetensors"),
    "deepseek-v4": ("config.json", "model.safetensors"),
    "llmcompressor-w4a16-asym": ("config.json", "model.safetensors"),
    "llmcompressor-w3a16": ("config.json", "model.safetensors"),
    "llmcompressor-w8a8": ("config.json", "model.safetensors"),
    "gptq-int4": ("config.json", "model.safetensors", "quantize_config.json"),
    "awq-int4": ("config.json", "model.safetensors"),
    "ct-int-mixed": ("config.json", "model.safetensors"),
    "neuron": ("neuron_quantization.json", "config.json", "model.safetensors"),
}
#: Added after the integer block files: the neuron layout's stacked experts (Llama 4's).
_ADDED_LATER = {"neuron-experts": ("neuron_quantization.json", "model.safetensors")}


def _folder_slots(folders: list[str], args: tuple[str, ...] = ()) -> tuple[Slot, ...]:
    return tuple(Slot(f, file, args) for f in folders for file in {**_FOLDERS, **_ADDED, **_ADDED_LATER}[f])


_SHARDS = tuple(Slot(f, file) for f, files in _FOLDERS.items() for file in files if file.endswith(".safetensors")) + (
    Slot("x.safetensors"),
)
_NPZ = ("numpy.npz", "deflated.npz", "floats.npz", "x.npz", "mx.npz", "many.npz", "nv.npz", "fp8.npz", "layout.npz")
_BLOCK_FILES = ("mx.npz", "many.npz", "nv.npz", "fp8.npz", "layout.npz")
#: Block files of the integer formats (zero points; act-order's group index), added later.
_INTEGER_BLOCK_FILES = ("int-asym.npz", "act-order.npz")
_GGUF = ("model.gguf", "moe.gguf", "nvfp4.gguf", "moe-nvfp4.gguf", "mxfp4.gguf")

#: Every target, by name. A target's slots are only ever added at the end of its list: a kept
#: finding (tests/fuzz/regressions/) names its slot by its index.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("safetensors", _SHARDS + (Slot("ct-fp8-block", "model.safetensors"),), _safetensors),
        Target(
            "checkpoint",
            _folder_slots(list(_FOLDERS)) + _folder_slots(list(_ADDED)) + _folder_slots(list(_ADDED_LATER)),
            _checkpoint,
        ),
        Target("gguf", tuple(Slot(g) for g in _GGUF), _gguf),
        Target("npy", (Slot("numpy.npy"), Slot("fortran.npy"), Slot("x.npy")), _numpy),
        Target("npz", tuple(Slot(n) for n in _NPZ + _INTEGER_BLOCK_FILES), _numpy),
        Target("blocks", tuple(Slot(n) for n in _BLOCK_FILES + _INTEGER_BLOCK_FILES), _blocks),
        Target(
            "quantize",
            _folder_slots(["plain", "sharded"], ("--format", "nvfp4"))
            + _folder_slots(["ct-nvfp4", "modelopt-nvfp4"], ("--format", "mxfp4_e2m1"))
            + (
                Slot("model.gguf", "", ("--format", "nvfp4")),
                Slot("moe.gguf", "", ("--format", "mxfp4_e2m1")),
                Slot("numpy.npy", "", ("--format", "mxfp4_e2m1")),
                Slot("fortran.npy", "", ("--format", "nvfp4")),
                Slot("floats.npz", "", ("--format", "mxfp8_e4m3")),
                Slot("deflated.npz", "", ("--format", "fp8_block", "--block-shape", "8x8")),
                Slot("x.safetensors", "", ("--format", "nvfp4")),
                Slot("recipe", "recipe.yaml", ("--recipe-file", "recipe/recipe.yaml")),
                Slot("ct-mixed", "config.json", ("--format", "mxfp8_e4m3", "--scheme", "*.mlp.*=mxfp4_e2m1")),
                Slot("modelopt-mixed", "hf_quant_config.json", ("--format", "nvfp4")),
                Slot("deepseek-v4", "model.safetensors", ("--format", "nvfp4", "--only", "*.experts.*")),
                Slot("gptq-int4", "model.safetensors", ("--format", "int4_group", "--block-size", "32")),
                Slot("llmcompressor-w4a16-asym", "config.json", ("--format", "fp8_channel")),
            ),
            _quantize,
        ),
        Target(
            "dequantize",
            _folder_slots(_QUANTISED)
            + tuple(Slot(n, "", ("--dtype", "float32")) for n in _BLOCK_FILES)
            + tuple(Slot(g) for g in ("nvfp4.gguf", "moe-nvfp4.gguf", "mxfp4.gguf"))
            + _folder_slots(list(_ADDED))
            + tuple(Slot(n, "", ("--dtype", "float32")) for n in _INTEGER_BLOCK_FILES)
            + _folder_slots(list(_ADDED_LATER)),
            _dequantize,
        ),
        Target(
            "cast",
            tuple(
                Slot(n, "", ("--to", to))
                for n in ("numpy.npy", "fortran.npy", "x.npy", "numpy.npz", "deflated.npz", "x.safetensors", "x.npz")
                for to in ("bfloat16", "float8_e4m3fn")
            ),
            _cast,
        ),
        Target(
            "check",
            _folder_slots(_QUANTISED)
            + _folder_slots(["ct-nvfp4", "modelopt-nvfp4"], ("--repair",))
            + _folder_slots(list(_ADDED))
            + _folder_slots(list(_ADDED_LATER)),
            _check,
        ),
    )
}
