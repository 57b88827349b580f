"""Quantities given on the command line: element counts (``bench --size 64Mi``) and byte sizes
(``--max-shard-size 5GB``), read by one parser with one table of units."""

from __future__ import annotations

import argparse
import math
import re
from fractions import Fraction

__all__ = ["UNITS", "parse_bytes", "parse_size"]

#: A number (whole or with decimals), a unit of :data:`UNITS` (the ``i`` lower case) and a ``B``
#: (bytes), any of the last two left out, blanks around.
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?([bB]?)\s*$")

#: The units, by their lower-case spelling: k, M, G, T are powers of 10, Ki, Mi, Gi, Ti powers of 2.
UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
         "ti": 1 << 40}  # fmt: skip


def _quantity(text: str) -> tuple[Fraction, bool] | None:
    """The value of ``text`` (exact: ``1.001k`` is 1001) and whether it ends in ``B``; None if
    ``text`` is no quantity."""
    m = _QUANTITY.match(text)
    if not m:
        return None
    return Fraction(m.group(1)) * UNITS[(m.group(2) or "").lower()], bool(m.group(3))


def parse_size(text: str) -> int:
    """``"64Mi"`` -> 67108864: an element count; plain integers, k/M/G/T (powers of 10) and
    Ki/Mi/Gi/Ti (powers of 2), with decimals where the count is whole (``1.5k``)."""
    found = _quantity(text)
    if found is None or found[1] or found[0].denominator != 1 or found[0] < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: give a positive element count such as 1048576, 1Mi or 64Mi"
        )
    return int(found[0])


def parse_bytes(text: str) -> int:
    """``"5GB"`` -> 5000000000, ``"500MB"``, ``"2GiB"``, ``"1.5Gi"``, plain byte counts (a
    fraction of a byte is dropped)."""
    found = _quantity(text)
    value = math.floor(found[0]) if found else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a size such as 5GB, 500MB or 2GiB")
    return value
