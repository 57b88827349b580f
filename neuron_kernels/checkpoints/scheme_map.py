"""Which scheme each weight of a checkpoint is quantised with: :class:`SchemeMap`.

The command builds one from ``--format`` (every weight the module decisions quantise) and
``--scheme PATTERN=FORMAT[,option=value...]`` (the weights matching ``PATTERN``, a shell pattern
as ``--only``'s, the first that matches in the order given; :func:`parse_scheme_option`), or from
``--recipe-file``: a YAML or JSON file of ``config_groups`` in the shape of llm-compressor's
(a quantisation config, a ``QuantizationModifier``'s arguments or a whole recipe that holds one;
:func:`read_recipe_file`), whose targets and ``ignore`` entries match as compressed-tensors
matches them (:func:`~.targets.ct_group`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..blocks.scheme import OPTIONS, Scheme
from ..errors import InvalidValueError, NeuronKernelsError
from ..formats import BLOCK_FORMATS
from ..io.arrays import FileFormatError
from .architecture import module_of
from .selection import pattern_match
from .targets import ct_group

__all__ = ["Group", "SchemeMap", "OWN", "parse_scheme_option", "read_recipe_file", "RECIPE_PRESETS"]


class _Own:
    def __repr__(self) -> str:
        return "<the format's own>"


#: A group's activations where it gives none of its own: those the layout writes for its format.
OWN: Any = _Own()


@dataclass(frozen=True)
class Group:
    """Weights quantised with one scheme: ``targets`` (shell patterns for ``--scheme``,
    compressed-tensors entries for a recipe), the :class:`Scheme`, and the ``input_activations``
    a recipe gives the group (None: none; :data:`OWN`: the layout's for the format); ``options``:
    those given with it (``--scheme``'s), which :meth:`SchemeMap.under` lays over the command's."""

    targets: tuple[str, ...]
    scheme: Scheme
    activations: Any = OWN
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SchemeMap:
    """The schemes of a checkpoint's weights: ``groups`` in order, ``default`` the scheme of a weight
    no group takes (None: kept), ``order`` how a group is found (``first``: the first group with a
    shell pattern that matches the tensor or its module; ``compressed-tensors``: compressed-tensors'
    precedence over the groups' targets, :func:`~.targets.ct_group`), ``ignore`` the modules a
    recipe keeps (compressed-tensors entries), ``source`` what it came from, for messages."""

    groups: tuple[Group, ...] = ()
    default: Scheme | None = None
    order: str = "first"
    ignore: tuple[str, ...] = ()
    source: str = "--format"

    @classmethod
    def one(cls, scheme: Scheme) -> SchemeMap:
        return cls((), scheme)

    def group_of(self, name: str, model_name: str | None = None) -> int | None:
        """The index of the group of the tensor ``name`` (``MODULE.weight``; ``model_name``: the
        model's name of its module), or None (no group: the default's)."""
        module = module_of(name)
        names = tuple(dict.fromkeys((module, model_name or module)))
        if self.order == "targets":
            return ct_group(names, [g.targets for g in self.groups], self.ignore)
        for index, g in enumerate(self.groups):
            if any(pattern_match(n, g.targets) is not None for n in (name, *names)):
                return index
        return None

    def scheme_for(self, name: str, model_name: str | None = None) -> Scheme | None:
        index = self.group_of(name, model_name)
        return self.default if index is None else self.groups[index].scheme

    def kept_why(self) -> str:
        """Why a weight with no scheme is kept."""
        if self.order == "targets":
            return f"no group of {self.source} targets it, or its ignore does"
        return "matches no --scheme (and no --format was given)"

    def schemes(self) -> Iterator[Scheme]:
        """Every scheme, the groups' in order and then the default's, each once."""
        yield from dict.fromkeys([g.scheme for g in self.groups] + ([self.default] if self.default else []))

    def under(self, base: dict[str, Any]) -> SchemeMap:
        """The map with every group's scheme taking the options ``base`` (the command line's), its
        own options over them; each checked."""
        groups = []
        for g in self.groups:
            scheme = Scheme.of(g.scheme.format, {**base, **g.options})
            _check(scheme, f"{' '.join(g.targets)}={g.scheme.format}")
            groups.append(replace(g, scheme=scheme))
        return replace(self, groups=tuple(groups))

    def activations(self, scheme: Scheme) -> Any:
        """The activations of the first group of ``scheme`` (:data:`OWN` for the default's)."""
        return next((g.activations for g in self.groups if g.scheme == scheme), OWN)


# ---- --scheme PATTERN=FORMAT[,option=value...] -------------------------------------------------------


def parse_scheme_option(text: str) -> Group:
    """One ``--scheme``: ``PATTERN=FORMAT`` then ``,option=value`` pairs (the options of
    :func:`neuron_kernels.quantize`, ``-`` or ``_`` in their names; values as numbers, ``true`` /
    ``false``, ``none`` or words), each checked as the scheme's job is built."""
    pattern, eq, rest = text.partition("=")
    fmt, *pairs = rest.split(",")
    if not eq or not pattern or not fmt:
        raise InvalidValueError(f"--scheme {text!r}: give PATTERN=FORMAT[,option=value...], e.g. '*.mlp.*=nvfp4'")
    if fmt not in BLOCK_FORMATS:
        raise InvalidValueError(f"--scheme {text!r}: {fmt!r} is not a block format ({', '.join(BLOCK_FORMATS)})")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in OPTIONS or key in ("axis",):
            accepted = ", ".join(o for o in OPTIONS if o != "axis")
            raise InvalidValueError(f"--scheme {text!r}: {pair!r} is not option=value of one of {accepted}")
        options[key] = _value(value.strip())
    scheme = Scheme.of(fmt, options)
    _check(scheme, f"--scheme {text!r}")
    return Group((pattern,), scheme, options=options)


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _check(scheme: Scheme, where: str) -> None:
    try:
        scheme.job(2)
    except NeuronKernelsError as e:
        raise InvalidValueError(f"{where}: {e}") from None


# ---- --recipe-file ---------------------------------------------------------------------------------

#: llm-compressor's preset schemes (``scheme: NAME``) this package writes, as the block format and
#: the activations each gives (the dynamic ones, which need no calibration), and those it refuses,
#: with why (``compressed_tensors/quantization/quant_scheme.py``).
_DYNAMIC_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}


def _dynamic_mx(bits: int) -> dict[str, Any]:
    """MX activations quantised on the fly (compressed-tensors' MXFP8 / MXFP4 presets)."""
    return {"num_bits": bits, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group",
            "dynamic": True, "scale_dtype": "torch.uint8"}  # fmt: skip


RECIPE_PRESETS: dict[str, tuple[str, Any] | str] = {
    "FP8_DYNAMIC": ("fp8_channel", OWN),
    "FP8_BLOCK": ("fp8_block", OWN),
    "NVFP4A16": ("nvfp4", None),
    "MXFP4A16": ("mxfp4_e2m1", None),
    "MXFP8A16": ("mxfp8_e4m3", None),
    # MX weights with MX activations quantised on the fly (no calibration): the Neuron docs' Trn3 recipe
    "MXFP8": ("mxfp8_e4m3", _dynamic_mx(8)),
    "MXFP4": ("mxfp4_e2m1", _dynamic_mx(4)),
    # integers: W{b}A16 in groups of 128, W4A16_ASYM with zero points (compressed-tensors' presets)
    **{f"W{b}A16": (f"int{b}_group", None) for b in range(2, 9)},
    "W4A16_ASYM": ("int4_group_asym", None),
    "W8A8": "int8 activations, which this package writes in no layout yet (it reads W8A8's int-quantized)",
    "FP8": "static per-tensor activation scales, which need calibration data (FP8_DYNAMIC needs none)",
    "NVFP4": "an activation global scale, which needs calibration data (NVFP4A16 quantises the weights only)",
}


#: The largest recipe file read (a recipe is a few KB).
_LARGEST_RECIPE = 16 << 20


def read_recipe_file(path: str, group_format: Callable[[dict[str, Any]], str | None]) -> SchemeMap:
    """The :class:`SchemeMap` of a recipe file (YAML or JSON; see the module docstring): its groups'
    weights read as the package's block formats, its ``ignore`` kept. Refused, in one line: a
    file that is not a mapping, or holds no quantisation groups, or asks for what needs
    calibration data (static activations, a KV-cache scheme) or for weights this package does
    not write."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            raw = f.read(_LARGEST_RECIPE + 1)
    except OSError as e:
        raise FileFormatError(f"{where}: cannot read the recipe file ({e.strerror})") from None
    if len(raw) > _LARGEST_RECIPE:
        raise FileFormatError(f"{where}: a recipe file larger than {_LARGEST_RECIPE >> 20} MiB; recipes are a few KB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{where}: not UTF-8 text (byte {e.start}); a recipe is a YAML or JSON file") from None
    try:
        document = _parse(where, text)
    except RecursionError:
        raise FileFormatError(f"{where}: nested too deeply to be a recipe") from None
    args = _modifier(document)
    if args is None:
        raise FileFormatError(
            f"{where}: no config_groups or scheme found (give a quantisation config, a QuantizationModifier's "
            f"arguments, or a recipe that holds one)"
        )
    if args.get("kv_cache_scheme"):
        raise FileFormatError(
            f"{where}: kv_cache_scheme needs calibration data to compute the KV-cache scales; this package carries "
            f"the scales a checkpoint holds, but computes none"
        )
    groups = _groups(where, args, group_format)
    ignore = args.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(e, str) for e in ignore):
        raise FileFormatError(f"{where}: ignore must be a list of module names or re: expressions")
    return SchemeMap(tuple(groups), None, "targets", tuple(ignore), f"the recipe {os.path.basename(where)}")


def _parse(where: str, text: str) -> Any:
    if where.lower().endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as e:
            raise FileFormatError(f"{where}: not JSON ({e})") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FileFormatError(f"{where}: not YAML ({str(e).splitlines()[0]})") from None


def _modifier(document: Any, depth: int = 0) -> dict[str, Any] | None:
    """The mapping that holds ``config_groups`` or ``scheme``: the document itself, or the first
    found below it (a recipe's stages and modifiers), breadth first within a few levels."""
    if not isinstance(document, dict) or depth > 6:
        return None
    if "config_groups" in document or "scheme" in document:
        return document
    for value in document.values():
        found = _modifier(value, depth + 1)
        if found is not None:
            return found
    return None


def _groups(where: str, args: dict[str, Any], group_format: Callable[[dict[str, Any]], str | None]) -> list[Group]:
    found: list[Group] = []
    groups = args.get("config_groups")
    if groups is not None:
        if not isinstance(groups, dict) or not groups:
            raise FileFormatError(f"{where}: config_groups must be a non-empty mapping of groups")
        for name, g in groups.items():
            if not isinstance(g, dict):
                raise FileFormatError(f"{where}: config_groups.{name} is not a mapping")
            found.append(_group(where, str(name), g, group_format))
    scheme = args.get("scheme")
    if scheme is not None:
        presets = {scheme: args.get("targets") or ["Linear"]} if isinstance(scheme, str) else scheme
        if not isinstance(presets, dict):
            raise FileFormatError(f"{where}: scheme must be a preset's name or a mapping of presets to targets")
        for preset, targets in presets.items():
            found.append(_preset(where, str(preset), targets))
    return found


def _targets(where: str, name: str, targets: Any) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise FileFormatError(f"{where}: the targets of {name} must be a non-empty list of strings")
    return tuple(targets)


def _preset(where: str, preset: str, targets: Any) -> Group:
    known = RECIPE_PRESETS.get(preset.upper())
    if isinstance(known, str):
        raise FileFormatError(f"{where}: the preset {preset} quantises with {known}")
    if known is None:
        writes = ", ".join(k for k, v in RECIPE_PRESETS.items() if not isinstance(v, str))
        raise FileFormatError(f"{where}: the preset {preset} is not one this package writes ({writes})")
    return Group(_targets(where, preset, targets), Scheme(known[0]), known[1])


def _group(where: str, name: str, g: dict[str, Any], group_format: Callable[[dict[str, Any]], str | None]) -> Group:
    """One config group: its weights as the layout's block format (``group_format``: by bits, type,
    strategy, group size, block structure and scale dtype), its dynamic activations as given."""
    w = g.get("weights")
    if not isinstance(w, dict):
        raise FileFormatError(f"{where}: config_groups.{name} has no weights mapping")
    fmt = group_format({**g, "weights": w})
    if fmt is None:
        raise FileFormatError(
            f"{where}: config_groups.{name}: weights of {w.get('num_bits')} bits, type {w.get('type')}, strategy "
            f"{w.get('strategy')}, group_size {w.get('group_size')}, block_structure {w.get('block_structure')} are "
            f"not a scheme this package writes (NVFP4: 4-bit float tensor_group of 16; MXFP4: 4-bit float group of "
            f"32; MXFP8: 8-bit float group of 32 with uint8 scales; FP8: 8-bit float channel, tensor or block "
            f"[128, 128]; integers: 2 to 8-bit int, group or channel, without act-order)"
        )
    acts = g.get("input_activations")
    if acts is not None:
        if not isinstance(acts, dict) or acts.get("dynamic") in (False, None):
            raise FileFormatError(
                f"{where}: config_groups.{name} quantises its input activations with static scales, which need "
                f"calibration data; give dynamic ones (dynamic: true) or none"
            )
    if g.get("output_activations"):
        raise FileFormatError(f"{where}: config_groups.{name} quantises output activations, which needs calibration")
    options: dict[str, Any] = {}
    if BLOCK_FORMATS[fmt].integer:
        if acts is not None:
            raise FileFormatError(
                f"{where}: config_groups.{name} quantises the activations of integer weights, which this package "
                f"writes in no layout yet; give weights only (W{BLOCK_FORMATS[fmt].element_bits}A16)"
            )
        size = w.get("group_size")
        if w.get("strategy") == "group":
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise FileFormatError(f"{where}: config_groups.{name}: group_size {size!r} is not a positive integer")
            options["block_size"] = size  # the group's own, over the command line's
    targets = _targets(where, f"config_groups.{name}", g.get("targets"))
    return Group(targets, Scheme(fmt, **options), acts, options)
