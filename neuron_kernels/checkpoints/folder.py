"""The checkpoint folder: a directory of ``.safetensors`` shards, or one ``.safetensors`` file.

A checkpoint is a directory of ``.safetensors`` shards, with or without a
``model.safetensors.index.json`` (whose ``weight_map`` names each tensor's shard), a
``config.json`` and other files (tokenizer, generation config), or a single ``.safetensors``
file. :func:`open_checkpoint` reads its headers only; tensors are read piece by piece through
memory maps, so that a checkpoint of any size is processed in bounded memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..io.arrays import ArrayEntry, FileFormatError
from ..io.safetensors import read_safetensors_header
from ..io.untrusted import parse_json
from .configs import FILE_FIELDS, check_fields

__all__ = [
    "Checkpoint",
    "LinkRefusedError",
    "follow_links",
    "open_checkpoint",
    "json_file",
    "write_json",
    "INDEX_NAME",
    "CONFIG_NAME",
    "PTS_KEY",
]

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
#: Weights of other formats in a checkpoint directory: not copied into a converted checkpoint.
_OTHER_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".index.json")
#: The shard metadata key under which the exact NVFP4 per-tensor scales are kept (JSON: name -> float),
#: so that the package reads back the scale it quantised with (1 / weight_global_scale otherwise).
PTS_KEY = "per_tensor_scales"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's tensors (data not read), its ``config.json`` and the other files beside it.

    ``tensors``: name -> :class:`ArrayEntry`, in the order of the index (else of the shards);
    ``metadata``: the shards' ``__metadata__`` merged; ``extra_files``: the other top-level files of
    the directory, copied into a converted checkpoint; ``skipped``: (name, why) of what is not.
    """

    path: str
    folder: str | None
    tensors: dict[str, ArrayEntry]
    config: dict[str, Any] | None
    metadata: dict[str, str] = field(default_factory=dict)
    extra_files: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        qc = (self.config or {}).get("quantization_config")
        return qc if isinstance(qc, dict) else None

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.tensors.values())

    @property
    def exact_scales(self) -> dict[str, Any]:
        """The exact NVFP4 per-tensor scales the shards' metadata keeps (:data:`PTS_KEY`): name ->
        float; an entry that is not JSON, or not an object, is refused."""
        try:
            exact = parse_json(self.metadata.get(PTS_KEY, "{}"))
        except ValueError as exc:
            raise FileFormatError(f"{self.path}: the shards' {PTS_KEY} metadata {exc}") from None
        if not isinstance(exact, dict):
            raise FileFormatError(f"{self.path}: the shards' {PTS_KEY} metadata is not a JSON object")
        return exact


def _inside(folder: str, name: str, what: str) -> str:
    """``folder/name`` for a ``name`` that stays inside ``folder``: relative, no ``..``, and no
    folder on the way that is a symlink leading out (the file itself may be a link, as in the
    Hugging Face cache, where every file links into a blob store)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise FileFormatError(f"{folder}: {what} {name!r} is not a file name")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts:
        raise FileFormatError(f"{folder}: {what} {name!r} points outside the checkpoint folder; refused")
    path = os.path.join(folder, *parts)
    root = os.path.realpath(folder)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != root and not parent.startswith(root + os.sep):
        raise FileFormatError(f"{folder}: {what} {name!r} leads outside the checkpoint folder (a symlink); refused")
    _check_link(folder, path)
    return path


class LinkRefusedError(FileFormatError):
    """A file of a checkpoint folder that is a symbolic link leading outside the folder (and
    outside the Hugging Face cache repository it belongs to), not followed unless allowed."""


_FOLLOW_LINKS: contextvars.ContextVar[bool] = contextvars.ContextVar("follow_links", default=False)


@contextlib.contextmanager
def follow_links(allowed: bool = True) -> Iterator[None]:
    """Within the block, the files of a checkpoint folder that are symbolic links are followed
    wherever they lead (``allowed=False``: only inside the folder or its Hugging Face cache
    repository, the default); ``neuron-kernels ... --follow-links`` runs its command in one."""
    token = _FOLLOW_LINKS.set(allowed)
    try:
        yield
    finally:
        _FOLLOW_LINKS.reset(token)


#: The folders of the Hugging Face cache that hold a repository (``models--ORG--NAME``, ...),
#: whose ``snapshots/REVISION/`` files are links into the repository's ``blobs/``.
_HUB_REPOS = ("models--", "datasets--", "spaces--")


def _hub_blobs(root: str) -> str | None:
    """The ``blobs/`` folder of the Hugging Face cache repository whose snapshot holds the folder
    ``root`` (a real path: ``.../models--ORG--NAME/snapshots/REVISION[/...]``), if it is a real
    folder (not a link: a folder from anyone could name any folder of the machine ``blobs``)."""
    parts = root.split(os.sep)
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(_HUB_REPOS):
            blobs = os.sep.join([*parts[:i], "blobs"])
            return blobs if os.path.isdir(blobs) and not os.path.islink(blobs) else None
    return None


def _check_link(folder: str, path: str) -> None:
    """Refuse ``path``, a file of the checkpoint ``folder`` read or copied, if it is a symbolic link
    that leads outside the folder and outside the ``blobs/`` of the Hugging Face cache repository
    the folder is a snapshot of (unless :func:`follow_links` allows it): a folder from anyone
    could otherwise copy any file of the machine into the checkpoint written from it."""
    if not os.path.islink(path) or _FOLLOW_LINKS.get():
        return
    target, root = os.path.realpath(path), os.path.realpath(folder)
    blobs = _hub_blobs(root)
    if target.startswith(root + os.sep) or (blobs is not None and target.startswith(blobs + os.sep)):
        return
    where = "the checkpoint folder" + (" and its Hugging Face cache repository's blobs/" if blobs else "")
    raise LinkRefusedError(
        f"{path}: a symbolic link to {target}, outside {where}; not followed (a folder from elsewhere could "
        f"copy any file of this machine into the output): pass --follow-links (follow_links() in Python) to follow it"
    )


def json_file(path: str) -> dict[str, Any]:
    """The JSON object at ``path`` (nested at most 128 deep); any problem reading it, or a
    document that is not an object, raises :class:`FileFormatError`."""
    try:
        with open(path, "rb") as fh:
            value = parse_json(fh.read())
    except OSError as exc:
        raise FileFormatError(f"{path}: cannot read it as JSON ({exc})") from None
    except ValueError as exc:
        raise FileFormatError(f"{path}: cannot read it as JSON (the document {exc})") from None
    if not isinstance(value, dict):
        kind = {str: "string", list: "array", bool: "boolean", type(None): "null"}.get(type(value), "number")
        raise FileFormatError(f"{path}: not a JSON object (a JSON {kind}); a JSON object is read")
    return value


def write_json(path: str, content: Any) -> None:
    """``content`` as the JSON document at ``path`` (indented, as the producers write config.json)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(content, fh, indent=2)
        fh.write("\n")


def _shard_entries(path: str, shown: str) -> tuple[dict[str, ArrayEntry], dict[str, str]]:
    from ..io.arrays import ARRAY_FILES

    if not os.path.isfile(path):
        raise FileFormatError(f"{shown}: missing (named by the checkpoint, not found)")
    _, metadata, _ = read_safetensors_header(path)
    entries = ARRAY_FILES[".safetensors"].open(path) if os.path.getsize(path) > 8 else []
    return {e.name or "": e for e in entries}, metadata


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint at ``path``: a folder of ``.safetensors`` shards (with or without
    ``model.safetensors.index.json``) or one ``.safetensors`` file; headers only are read.

    Every problem (a missing shard, an index naming a tensor its shard does not hold, a truncated
    or corrupt shard, a name leading outside the folder, a tensor in two shards) raises
    :class:`FileFormatError` naming it; a file that is a symbolic link leading outside the folder
    and outside the Hugging Face cache repository it is a snapshot of raises
    :class:`LinkRefusedError`, unless within :func:`follow_links`."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileFormatError(f"{path}: no such file or folder")
    if not os.path.isdir(path):
        if not path.lower().endswith(".safetensors"):
            raise FileFormatError(f"{path}: a checkpoint is a folder of .safetensors shards or one .safetensors file")
        tensors, metadata = _shard_entries(path, path)
        if not tensors:
            raise FileFormatError(f"{path}: holds no tensors")
        return Checkpoint(path, None, tensors, None, metadata)
    for name in os.listdir(path):  # every top-level file is read or copied: none may lead out
        if os.path.isfile(os.path.join(path, name)):
            _check_link(path, os.path.join(path, name))
    config = json_file(os.path.join(path, CONFIG_NAME)) if os.path.isfile(os.path.join(path, CONFIG_NAME)) else None
    for name, fields in FILE_FIELDS.items():  # the fields the layouts read, of the types they read
        if os.path.isfile(os.path.join(path, name)):
            full = os.path.join(path, name)
            check_fields(config if name == CONFIG_NAME else json_file(full), fields, full)
    index_path = os.path.join(path, INDEX_NAME)
    shards: list[str]
    wanted: dict[str, str] = {}
    if os.path.isfile(index_path):
        index = json_file(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise FileFormatError(f"{index_path}: no weight_map of tensor names to shard files")
        wanted = dict(weight_map)
        shards = list(dict.fromkeys(weight_map.values()))
    else:
        shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        if not shards:
            raise FileFormatError(f"{path}: holds no .safetensors files (and no {INDEX_NAME})")
    tensors: dict[str, ArrayEntry] = {}
    metadata: dict[str, str] = {}
    found: dict[str, str] = {}
    for shard in shards:
        shard_path = _inside(path, shard, "shard")
        entries, meta = _shard_entries(shard_path, shard_path)
        metadata.update(meta)
        for name, entry in entries.items():
            if name in found:
                raise FileFormatError(f"{path}: tensor {name!r} is in two shards, {found[name]} and {shard}")
            found[name] = shard
            tensors[name] = entry
    for name, shard in wanted.items():
        if found.get(name) != shard:
            raise FileFormatError(
                f"{index_path}: names tensor {name!r} in {shard}, which does not hold it"
                + (f" (it is in {found[name]})" if name in found else "")
            )
    ordered = {n: tensors[n] for n in wanted} | tensors  # the index's order, then any unlisted
    used = set(shards) | {INDEX_NAME, CONFIG_NAME}
    extra, skipped = [], []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name in used:
            continue
        if os.path.isdir(full):
            skipped.append((name + "/", "a folder (only the top-level files of a checkpoint are copied)"))
        elif name.lower().endswith(_OTHER_WEIGHTS):
            skipped.append((name, "weights or an index of another set of files"))
        elif os.path.isfile(full):
            extra.append(name)
    return Checkpoint(path, path, ordered, config, metadata, tuple(extra), tuple(skipped))
