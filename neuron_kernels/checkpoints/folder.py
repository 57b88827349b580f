"""The checkpoint folder: a directory of ``.safetensors`` shards, or one ``.safetensors`` file.

A checkpoint is a directory of ``.safetensors`` shards, with or without a
``model.safetensors.index.json`` (whose ``weight_map`` names each tensor's shard), a
``config.json`` and other files (tokenizer, generation config), or a single ``.safetensors``
file. :func:`open_checkpoint` reads its headers only; tensors are read piece by piece through
memory maps, so that a checkpoint of any size is processed in bounded memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..io.files import ArrayEntry, FileFormatError, read_safetensors_header

__all__ = ["Checkpoint", "open_checkpoint", "json_file", "write_json", "INDEX_NAME", "CONFIG_NAME", "PTS_KEY"]

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
    return path


def json_file(path: str) -> Any:
    """The JSON document at ``path``; any problem reading it raises :class:`FileFormatError`."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FileFormatError(f"{path}: cannot read it as JSON ({exc})") from None


def write_json(path: str, content: Any) -> None:
    """``content`` as the JSON document at ``path`` (indented, as the producers write config.json)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(content, fh, indent=2)
        fh.write("\n")


def _shard_entries(path: str, shown: str) -> tuple[dict[str, ArrayEntry], dict[str, str]]:
    from ..io.files import ARRAY_FILES

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
    :class:`FileFormatError` naming it."""
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
    config = json_file(os.path.join(path, CONFIG_NAME)) if os.path.isfile(os.path.join(path, CONFIG_NAME)) else None
    if config is not None and not isinstance(config, dict):
        raise FileFormatError(f"{os.path.join(path, CONFIG_NAME)}: not a JSON object")
    index_path = os.path.join(path, INDEX_NAME)
    shards: list[str]
    wanted: dict[str, str] = {}
    if os.path.isfile(index_path):
        index = json_file(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
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
