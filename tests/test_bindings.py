"""Which binding of the block kernels a call runs (``neuron_kernels.kernels.block_kernels.binding``, the
label ``neuron-kernels bench`` prints per row): the specialised loops where the source, format,
block length and rounding are compiled in, the generic shared loops elsewhere. The expectations
are the rules of docs/performance.md, case by case."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuron_kernels.blocks.job import input_array
from neuron_kernels.blocks.scheme import block_job

CASES = [
    # (format, dtype, shape, options, expected)
    ("mxfp8_e4m3", np.float32, (4, 64), {}, "specialised"),
    ("mxfp4_e2m1", ml_dtypes.bfloat16, (4, 64), {}, "specialised"),
    ("mxfp8_e4m3", np.float16, (4, 64), {}, "specialised"),
    ("nvfp4", np.float32, (4, 64), {}, "specialised"),
    ("nvfp4", ml_dtypes.bfloat16, (4, 64), {}, "specialised"),
    # policies in registers, then the element loops over runs of whole blocks
    ("nvfp4", np.float32, (4, 64), {"four_over_six": "mse"}, "specialised"),
    ("nvfp4", np.float32, (4, 64), {"scale_search": "mse"}, "specialised"),
    ("mxfp4_e2m1", np.float32, (4, 64), {"scale_search": "mse"}, "specialised"),
    ("nvfp4", np.float32, (4, 64), {"rht": True}, "specialised"),
    # blocks along another axis and 2-D tiles: the tile kernels, loader compiled in
    ("mxfp8_e4m3", np.float32, (64, 4), {"axis": 0}, "specialised"),
    ("nvfp4", np.float32, (64, 4), {"axis": 0}, "specialised"),
    # the generic loops
    ("mxfp8_e4m3", np.float64, (4, 64), {}, "generic: scalar amax"),
    ("mxfp8_e4m3", np.float32, (4, 64), {"block_size": 16}, "generic: scalar amax"),
    (
        "nvfp4",
        np.float32,
        (4, 64),
        {"four_over_six": "mse", "rounding": "stochastic", "seed": 1},
        "generic: policies on the shared loop",
    ),
    ("nvfp4", np.float64, (4, 64), {"scale_search": "mse"}, "generic: policies on the shared loop"),
    ("nvfp4", np.float32, (64, 4), {"axis": 0, "four_over_six": "mse"}, "generic: policies on the shared loop"),
]


@pytest.mark.parametrize("fmt, dtype, shape, options, expected", CASES, ids=lambda v: str(v))
def test_binding_of_a_call(fmt, dtype, shape, options, expected):
    arr, src = input_array(np.ones(shape, dtype))
    job = block_job(fmt, arr.ndim, **options).resolved(arr, src)
    assert job.binding(arr.shape, src) == expected


def test_fake_quantisation_binding():
    arr, src = input_array(np.ones((4, 64), np.float32))
    job = block_job("nvfp4", 2).resolved(arr, src)
    assert job.binding(arr.shape, src, quantize=False) == "specialised"
