"""Every float32 value an MX element can meet, through the elements' round-to-nearest-even path
(marked slow).

The MX kernels encode x / X under ``nearest_even`` with float arithmetic of their own (not the cast
codec), so it gets its own sweep. Each block holds the anchor 2^emax_elem and 31 swept values below
2^(emax_elem + 1); the floor scale of every block is then X = 1 and the codes must be the element
format's saturating round-to-nearest-even encoding of the values themselves. The oracle is
ml_dtypes (after clipping to +-max, which is what saturation means), and exact float64 arithmetic
for mxint8. The sweep covers every pattern of both signs from three binades below the smallest
subnormal up to the largest element binade, and every 4099th pattern below that.
"""

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk

FORMATS = list(nk.MX_FORMATS)


def _expected(v: np.ndarray, fmt: str) -> np.ndarray:
    mxf = nk.MX_FORMATS[fmt]
    if fmt == "mxint8":  # c = round(x * 64) clamped to [-127, 127] (docs/blocks.md), independent of the table
        return np.clip(np.rint(v.astype(np.float64) * 64), -127, 127).astype(np.int8).view(np.uint8)
    lim = np.float32(mxf.max_element)
    return np.clip(v, -lim, lim).astype(getattr(ml_dtypes, mxf.element)).view(np.uint8)


def _codes_at_unit_scale(v: np.ndarray, fmt: str) -> np.ndarray:
    """The element codes of ``v`` quantised in blocks whose scale is 1 (asserted)."""
    mxf = nk.MX_FORMATS[fmt]
    nblocks = -(-v.size // 31)
    padded = np.zeros(nblocks * 31, np.float32)
    padded[: v.size] = v
    x = np.empty((nblocks, 32), np.float32)
    x[:, 0] = np.float32(2.0**mxf.emax_elem)
    x[:, 1:] = padded.reshape(nblocks, 31)
    mx = nk.quantize_mx(x, fmt, pack=False)
    assert (mx.scales.view(np.uint8) == 127).all()
    return mx.codes[:, 1:].reshape(-1)[: v.size]


def _lowest_binade(fmt: str) -> int:
    mxf = nk.MX_FORMATS[fmt]
    if fmt == "mxint8":
        return -6 - 3
    f = mxf.element_format
    return 1 - f.bias - f.mbits - 3  # three binades below the smallest subnormal


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_element_value_nearest_even(fmt):
    mxf = nk.MX_FORMATS[fmt]
    mantissas = np.arange(1 << 23, dtype=np.uint32)
    for binade in range(_lowest_binade(fmt), mxf.emax_elem + 1):
        u = np.uint32(binade + 127) << np.uint32(23) | mantissas
        v = np.concatenate([u, u | np.uint32(0x80000000)]).view(np.float32)
        got = _codes_at_unit_scale(v, fmt)
        want = _expected(v, fmt)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{fmt} binade 2^{binade}: x={v[bad[:5]]} got {got[bad[:5]]} want {want[bad[:5]]}"
    # Below the sweep (float32 subnormals included), a sample: all of it rounds to signed zero.
    top = np.uint32(_lowest_binade(fmt) + 127) << np.uint32(23)
    u = np.arange(0, int(top), 4099, dtype=np.uint32)
    v = np.concatenate([u, u | np.uint32(0x80000000)]).view(np.float32)
    np.testing.assert_array_equal(_codes_at_unit_scale(v, fmt), _expected(v, fmt))
