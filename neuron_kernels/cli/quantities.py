"""Quantities given on the command line: element counts (``bench --size 64Mi``) and byte sizes
(``--max-shard-size 5GB``)."""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_bytes", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]i?)?\s*$")
_UNITS = {"": 1, "k": 1000, "ki": 1 << 10, "m": 10**6, "mi": 1 << 20, "g": 10**9, "gi": 1 << 30}


def parse_size(text: str) -> int:
    """``"64Mi"`` -> 67108864; plain integers, k/M/G (powers of 10) and Ki/Mi/Gi (powers of 2)."""
    m = _SIZE.match(text)
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: give a positive element count such as 1048576, 1Mi or 64Mi"
        )
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?\s*$")
_BYTE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
               "ti": 1 << 40}  # fmt: skip


def parse_bytes(text: str) -> int:
    """``"5GB"`` -> 5000000000, ``"500MB"``, ``"2GiB"``, plain byte counts."""
    m = _BYTES.match(text)
    value = int(float(m.group(1)) * _BYTE_UNITS[(m.group(2) or "").lower()]) if m else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a size such as 5GB, 500MB or 2GiB")
    return value
