"""The random Hadamard rotation of one 16-element group (:func:`rotate_group`): what the rotation
kernels (:mod:`.rotated`) and the row kernels of the rotated input (:mod:`.rows`) compute."""

from __future__ import annotations

import numpy as np

from ..._jit import f32_bits, f32_from_bits, jit
from .elements import load_value


@jit(inline="always")
def rotate_group(src_row, start, dst, off, signs, t, kind, codec, inverse):  # pragma: no cover - compiled
    """Rotate the 16 values ``src_row[start:start + 16]`` into the float32 patterns
    ``dst[off:off + 16]``: forward ``(x * signs) @ H16 / 4``, inverse ``(y @ H16 / 4) * signs``.

    In float64 (``t`` is scratch of 16): the signs multiply first (forward) and exactly; the fast
    Walsh-Hadamard butterfly runs in stages h = 1, 2, 4, 8, each pair (j, j + h) with
    ``j & h == 0`` in increasing j becoming (a + b, a - b); then each value is multiplied by 0.25
    (and by its sign, inverse) and rounded once to float32."""
    for k in range(16):
        v = np.float64(f32_from_bits(load_value(src_row[start + k], kind, codec)))
        t[k] = v if inverse else v * signs[k]
    for stage in range(4):  # constant trip counts and no branches: straight-line code
        h = 1 << stage
        for pair in range(8):  # the pairs (j, j + h) with j & h == 0, in increasing j
            j = (pair >> stage << (stage + 1)) | (pair & (h - 1))
            a = t[j]
            b = t[j + h]
            t[j] = a + b
            t[j + h] = a - b
    for k in range(16):
        v = t[k] * 0.25
        dst[off + k] = f32_bits(np.float32(v * signs[k] if inverse else v))
