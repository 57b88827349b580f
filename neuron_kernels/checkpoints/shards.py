"""The output's shards: its tensors grouped into ``.safetensors`` files of at most a given size, each
file written from its items, and the index that maps every tensor to its file.

An :class:`Item` is a unit of output (a quantised weight's tensors, a copied tensor) and how to fill
it; :func:`shards_of` groups items into :class:`Shard` files in the input's order;
:func:`write_shard` writes one (the same bytes whichever process writes it, so that shards may be
written one after the other here, or each by a worker of a cluster: :mod:`.cluster`);
:func:`write_index` writes ``model.safetensors.index.json`` when there is more than one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..io.safetensors import SafetensorsWriter, TensorSpec
from .folder import INDEX_NAME, PTS_KEY, write_json

__all__ = ["Item", "Shard", "Tally", "shards_of", "write_index", "write_shard", "write_shards"]


@dataclass
class Item:
    """A unit of output that goes into one shard: its tensors and how to fill them.

    ``prepare()`` runs before its shard's header is written (the per-tensor scale's pass) and
    returns metadata; ``fill(sinks)`` writes every tensor through ``sinks`` (name -> sink).
    ``report``: what ``fill`` records about the tensor (its error statistics), if anything."""

    specs: list[TensorSpec]
    fill: Callable[[dict[str, Any]], None]
    prepare: Callable[[], dict[str, float]] = lambda: {}
    kept: str | None = None  # the input tensor copied as it is, if that is what the item is
    report: Any = None

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)


class Tally:
    """A progress callback that counts the bytes it is told of (for a shard written elsewhere:
    the count travels back with its result)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, nbytes: int) -> None:
        self.count += nbytes


@dataclass
class Shard:
    """One output file: its name and items, and the progress callback its items report to."""

    name: str
    items: list[Item]
    progress: Any = field(default=None, repr=False)

    @property
    def specs(self) -> list[TensorSpec]:
        return [s for item in self.items for s in item.specs]


def shards_of(items: list[Item], max_bytes: int, progress: Any = None) -> list[Shard]:
    """Consecutive items grouped into shards of at most ``max_bytes`` (an item larger than that
    gets a shard of its own): ``model.safetensors`` when there is one, else
    ``model-0000k-of-0000n.safetensors``."""
    groups: list[list[Item]] = [[]]
    size = 0
    for item in items:
        if groups[-1] and size + item.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += item.nbytes
    n = len(groups)
    names = ["model.safetensors"] if n == 1 else [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    return [Shard(name, group, progress) for name, group in zip(names, groups)]


def write_shard(path: str, shard: Shard, check: Callable[[], None] = lambda: None) -> None:
    """The shard's file at ``path``: each item prepared (its per-tensor scale, into the header's
    metadata), then filled tensor by tensor; ``check()`` before each item (it may raise to stop)."""
    pts: dict[str, float] = {}
    for item in shard.items:
        pts.update(item.prepare())
    metadata = {"format": "pt"} | ({PTS_KEY: json.dumps(pts)} if pts else {})
    with SafetensorsWriter(path, shard.specs, metadata) as writer:
        for item in shard.items:
            check()
            with contextlib.ExitStack() as stack:
                sinks = {s.name: stack.enter_context(writer.tensor(s.name)) for s in item.specs}
                item.fill(sinks)


def write_index(folder: str, shards: list[Shard]) -> None:
    """``model.safetensors.index.json`` (every tensor's shard and the total size), when there
    is more than one shard."""
    if len(shards) < 2:
        return
    weight_map = {s.name: shard.name for shard in shards for s in shard.specs}
    total = sum(s.nbytes for shard in shards for s in shard.specs)
    write_json(os.path.join(folder, INDEX_NAME), {"metadata": {"total_size": total}, "weight_map": weight_map})


def write_shards(folder: str, items: list[Item], max_bytes: int) -> None:
    """The items as shards in ``folder``, one after the other, and the index."""
    shards = shards_of(items, max_bytes)
    for shard in shards:
        write_shard(os.path.join(folder, shard.name), shard)
    write_index(folder, shards)
