"""OCP FP8 weights (float8_e4m3fn, values to 448) brought into a runtime's smaller FP8 range
(Trn1/Trn2's 240) without quantising them again: every code halved, every scale doubled.

A value ``code * scale`` becomes ``(code / 2) * (2 * scale)``: the doubled scale is exact in
float32, and so is the halved code for every float8_e4m3fn value but the odd multiples of 2^-9
(subnormals, and the normals of the smallest binade with an odd last mantissa bit), which round
to nearest even: 8 of the 126 positive magnitudes. The largest halved value, 224, lies within 240.
NxD's own recipe (divide by 448 / 240 in bfloat16 and round again) keeps 14 of them exactly.
A weight whose values all lie within the range already is copied, byte for byte.
"""

from __future__ import annotations

import numpy as np

from ..formats import FORMATS

__all__ = ["OCP_E4M3", "HALVED", "HALVED_EXACT", "MAGNITUDE", "beyond", "halve"]

#: The FP8 format whose codes are halved: OCP's E4M3.
OCP_E4M3 = FORMATS["float8_e4m3fn"]
_E4M3FN = OCP_E4M3.result_dtype
_CODES = np.arange(256, dtype=np.uint8)
_VALUES = _CODES.view(_E4M3FN).astype(np.float32)

#: The float8_e4m3fn code of each code's value halved (rounded to nearest even; NaN stays NaN).
HALVED: np.ndarray = (_VALUES / np.float32(2)).astype(_E4M3FN).view(np.uint8)

#: Whether halving each code is exact (NaN counts as exact: it stays NaN).
HALVED_EXACT: np.ndarray = np.isnan(_VALUES) | (HALVED.view(_E4M3FN).astype(np.float32) * 2 == _VALUES)

#: Each code's magnitude, NaN as 0 (what a range check reads).
MAGNITUDE: np.ndarray = np.nan_to_num(np.abs(_VALUES), nan=0.0).astype(np.float32)


def beyond(codes: np.ndarray, largest: float) -> int:
    """How many of the float8_e4m3fn ``codes`` (uint8) have a magnitude above ``largest``."""
    above = np.nonzero(MAGNITUDE > largest)[0].astype(np.uint8)
    return int(np.isin(codes, above).sum()) if above.size else 0


def halve(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the halved codes, where each was not exact) of float8_e4m3fn ``codes`` (uint8)."""
    return HALVED[codes], ~HALVED_EXACT[codes]
