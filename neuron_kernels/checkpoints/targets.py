"""Which config group a module of a compressed-tensors checkpoint belongs to, as each runtime
decides it: compressed-tensors' own order (transformers and llm-compressor apply it) and vLLM's,
which differ where targets overlap.

A config is its groups' ``targets`` in config order and its ``ignore`` entries. An entry is a
module's name, ``re:`` and a regular expression matched from the start of the name, or a class
name (``Linear``: any Linear module).

- compressed-tensors (0.20.1, ``utils/match.py`` and ``lifecycle/apply.py``): an ignored module
  has no group; a target string in two groups is the later group's; of the targets that match,
  exact names first, then ``re:`` expressions in the order of their strings, then class names.
- vLLM (``find_matched_target`` and ``should_ignore_layer`` in
  vllm/model_executor/layers/quantization/compressed_tensors/utils.py; ``get_moe_method`` in
  compressed_tensors_moe.py): the first target in config order that equals or matches the layer's
  name, else the first that is a part of its class name (case-insensitive: ``Linear``), else, for
  a fused layer (``qkv_proj``), the target of its first shard where every shard matches one by
  name. A fused layer is ignored where all its shards are and refused where some are; a fused MoE
  is looked up by three names, ``<prefix>.0.gate_proj``, ``.up_proj`` and ``.down_proj``, which
  must agree.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["entry_matches", "ct_matches", "ct_group", "vllm_group", "Refused"]


class Refused(ValueError):
    """vLLM refuses the layer: its shards (or its MoE's names) would take different schemes."""


def entry_matches(name: str, entry: str) -> bool | None:
    """Whether one target or ignore entry names the module ``name``: None where it is a class name
    other than ``Linear`` (a capitalised word without a dot: not decidable from names)."""
    if entry.startswith("re:"):
        with contextlib.suppress(re.error):
            return re.match(entry[3:], name) is not None
        return False
    if entry == "Linear" or entry == name:
        return True
    return None if "." not in entry and entry[:1].isupper() else False


def ct_matches(module: str, entries: Any) -> bool | None:
    """Whether any of ``entries`` (a config's ``targets`` or ``ignore``; entries that are not
    strings are passed over) names ``module``; None where none does but a class name other than
    ``Linear`` might."""
    undecided = False
    for entry in entries or ():
        if not isinstance(entry, str):
            continue
        hit = entry_matches(module, entry)
        if hit:
            return True
        undecided = undecided or hit is None
    return None if undecided else False


def _by_target(groups: Sequence[Sequence[str]]) -> dict[str, int]:
    """Each target -> its group's index: the later group's for a target in two, at the place of its
    first appearance (a dict updated in config order, as both runtimes build theirs)."""
    out: dict[str, int] = {}
    for index, targets in enumerate(groups):
        for t in targets:
            out[t] = index
    return out


def ct_group(names: Sequence[str], groups: Sequence[Sequence[str]], ignore: Any) -> int | None:
    """The index of the group compressed-tensors gives the Linear module called ``names`` (its
    checkpoint name, and the model's where transformers renames it), or None (ignored, or no
    target matches)."""
    if any(ct_matches(n, ignore) for n in names):
        return None
    by_target = _by_target(groups)
    exact = [t for t in by_target if not t.startswith("re:") and t in names]
    regex = sorted(t for t in by_target if t.startswith("re:") and any(entry_matches(n, t) for n in names))
    classes = [t for t in by_target if t == "Linear"]
    for t in exact + regex + classes:
        return by_target[t]
    return None


def _first_by_name(name: str, order: dict[str, int]) -> int | None:
    for t, index in order.items():
        if not _is_class(t) and entry_matches(name, t):
            return index
    return None


def _is_class(target: str) -> bool:
    return not target.startswith("re:") and "." not in target and target[:1].isupper()


def _ignored(name: str, ignore: Any) -> bool:
    return any(isinstance(e, str) and not _is_class(e) and entry_matches(name, e) for e in ignore or ())


def vllm_group(
    module: str,
    groups: Sequence[Sequence[str]],
    ignore: Any,
    shards: Sequence[str] = (),
    fused_name: str | None = None,
    moe_probes: Sequence[str] = (),
) -> int | None:
    """The index of the group vLLM gives the checkpoint module ``module``, or None (ignored;
    unquantised). ``shards``: the modules of its fused layer (``module`` among them) and
    ``fused_name``, that layer's name (None where not known: its own name is then not tried);
    ``moe_probes``: for one expert's Linear, the names vLLM looks its fused MoE up by. Raises
    :class:`Refused` where vLLM refuses the layer."""
    order = _by_target(groups)
    classes = [i for t, i in order.items() if _is_class(t) and "linear" in t.lower()]
    if moe_probes:
        moe = [t for t in order if t == "Linear"]
        found = {_one_layer(p, order, ignore, [order[t] for t in moe]) for p in moe_probes}
        if len(found) > 1:
            raise Refused(f"{', '.join(moe_probes)} take different schemes; vLLM refuses the fused MoE")
        return found.pop()
    if len(shards) > 1:
        if fused_name is not None and any(isinstance(e, str) and e == fused_name for e in ignore or ()):
            return None
        ignored = {_ignored(s, ignore) for s in shards}
        if len(ignored) > 1:
            raise Refused(f"{', '.join(shards)} are one fused layer in vLLM, ignored in part; vLLM refuses it")
        if ignored.pop():
            return None
        hit = _first_by_name(fused_name, order) if fused_name is not None else None
        if hit is None and classes:
            hit = classes[0]
        if hit is None:
            each = [_first_by_name(s, order) for s in shards]
            hit = each[0] if all(i is not None for i in each) else None
        return hit
    return _one_layer(module, order, ignore, classes)


def _one_layer(name: str, order: dict[str, int], ignore: Any, classes: list[int]) -> int | None:
    if _ignored(name, ignore):
        return None
    hit = _first_by_name(name, order)
    return hit if hit is not None else classes[0] if classes else None
