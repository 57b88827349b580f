"""The source loaders (``neuron_kernels/kernels/loaders.py``): the run-time switch ``load`` that the
block kernels' shared helpers call gives, for every source kind, what the kind's own loader of the
table gives (the loader a cast kernel compiles in), bit for bit. The loaders' results themselves
are checked against ml_dtypes by every cast test."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

from neuron_kernels.formats import FORMATS
from neuron_kernels.kernels import loaders as S
from neuron_kernels.kernels.codec import NO_CODEC, codec_of

_rng = np.random.default_rng(7)
_F64 = np.concatenate(
    [
        _rng.standard_normal(500) * 10.0 ** _rng.integers(-50, 50, 500),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, 2.0**-160, 3.4e38, 3.5e38, 1e300, 1 + 2.0**-30],
    ]
)
_INT = np.concatenate([_rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64), [0, 1, -1, 2**53 + 1, -(2**63)]])

_PATTERNS = np.concatenate([_rng.integers(0, 2**32, 500, dtype=np.uint32), [0, 0x7F800000, 0x7FC00001]])
_PATTERNS = _PATTERNS.astype(np.uint32)

#: Each source kind with items of it and the codec its codes need.
CASES = {
    "SOURCE_F32": (_PATTERNS, NO_CODEC),
    "SOURCE_F64_NEAREST": (_F64, NO_CODEC),
    "SOURCE_F64_ODD": (_F64, NO_CODEC),
    "SOURCE_F64_SPLIT": (_F64, NO_CODEC),
    "SOURCE_CODES": (np.arange(256, dtype=np.uint8), codec_of(FORMATS["float8_e4m3fn"])),
    "SOURCE_INT": (_INT, NO_CODEC),
    "SOURCE_INT_ODD": (_INT, NO_CODEC),
    "SOURCE_BF16": (np.arange(2**16, dtype=np.uint32).astype(np.uint16), NO_CODEC),
    "SOURCE_F16": (np.arange(2**16, dtype=np.uint32).astype(np.uint16), NO_CODEC),
}


def test_every_source_kind_has_a_loader_and_a_case():
    kinds = {name: getattr(S, name) for name in dir(S) if name.startswith("SOURCE_")}
    assert set(S.LOADERS) == set(kinds.values())
    assert set(CASES) == set(kinds)


@numba.njit
def _by_switch(xs, kind, c, out):  # pragma: no cover - compiled
    for i in range(xs.size):
        out[i] = S.load(xs[i], kind, c)


def _by_table(load_item):
    @numba.njit
    def run(xs, c, out):  # pragma: no cover - compiled
        for i in range(xs.size):
            out[i] = load_item(xs[i], c)

    return run


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_switch_gives_what_the_table_gives(name):
    xs, c = CASES[name]
    kind = getattr(S, name)
    switched, tabled = np.empty(xs.size, np.uint32), np.empty(xs.size, np.uint32)
    _by_switch(xs, kind, c, switched)
    _by_table(S.loader(kind))(xs, c, tabled)
    np.testing.assert_array_equal(switched, tabled)


def test_bfloat16_and_float16_loaders_against_ml_dtypes():
    codes = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    for name, dtype in (("SOURCE_BF16", ml_dtypes.bfloat16), ("SOURCE_F16", np.float16)):
        out = np.empty(codes.size, np.uint32)
        _by_table(S.loader(getattr(S, name)))(codes, NO_CODEC, out)
        want = codes.view(dtype).astype(np.float32).view(np.uint32)
        finite = ~np.isnan(codes.view(dtype).astype(np.float32))
        np.testing.assert_array_equal(out[finite], want[finite])
        assert np.isnan(out[~finite].view(np.float32)).all()
