"""Property tests: any shape, stride, order and byte order gives ml_dtypes' answer."""

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neuron_kernels as nk

BF16 = np.dtype(ml_dtypes.bfloat16)

float32_arrays = hnp.arrays(
    dtype=st.sampled_from([np.dtype("<f4"), np.dtype(">f4")]),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7),
    elements=st.integers(0, 2**32 - 1).map(lambda u: np.uint32(u).view(np.float32)),
)


@st.composite
def strided_views(draw):
    a = draw(float32_arrays)
    index = []
    for side in a.shape:
        step = draw(st.sampled_from([1, 2, -1, -3]))
        index.append(slice(None, None, step) if side else slice(None))
    view = a[tuple(index)]
    if view.ndim >= 2 and draw(st.booleans()):
        view = view.swapaxes(0, -1)
    return view


@settings(max_examples=200, deadline=None)
@given(strided_views())
def test_encode_any_layout(x):
    with np.errstate(invalid="ignore", over="ignore"):
        expected = x.astype(np.float32).astype(BF16)
    got = nk.cast(x, "bfloat16")
    assert got.shape == x.shape and got.dtype == BF16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.uint16, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)), st.booleans())
def test_decode_any_layout(codes, reverse):
    x = codes.view(BF16)
    if reverse and x.ndim:
        x = x[..., ::-1]
    with np.errstate(invalid="ignore"):
        expected = x.astype(np.float32)
    got = nk.cast(x, np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
