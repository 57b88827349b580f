"""The array files' writers keep their promises (docs/cli.md, neuron_kernels/io/files.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from neuron_kernels.io.safetensors import SafetensorsWriter, TensorSpec, read_safetensors_header

#: Item sizes 1, 2, 4 and 8 in an order, and with lengths, that would leave every wider tensor
#: misaligned if they were laid out as given.
ARRAYS = {
    "codes": np.arange(7, dtype=np.uint8),
    "half": np.arange(3, dtype=np.float16),
    "scale": np.array([1.5], dtype=np.float32),
    "bf": np.arange(5).astype(ml_dtypes.bfloat16),
    "big": np.arange(3, dtype=np.float64),
    "more_codes": np.arange(5, dtype=np.uint8),
    "ints": np.arange(3, dtype=np.int32),
}


@pytest.mark.parametrize("order", [list(ARRAYS), list(reversed(ARRAYS))])
def test_safetensors_tensors_are_aligned_to_their_item_size(tmp_path, order):
    path = str(tmp_path / "t.safetensors")
    specs = [TensorSpec(n, ARRAYS[n].dtype, ARRAYS[n].shape) for n in order]
    with SafetensorsWriter(path, specs, {"format": "pt"}) as w:
        for n in reversed(order):  # written in any order
            with w.tensor(n) as t:
                t.write(ARRAYS[n])
    data_start, _, entries = read_safetensors_header(path)
    assert data_start % 8 == 0
    for name, (dtype, shape, offset) in entries.items():
        assert offset % dtype.itemsize == 0, (name, dtype, offset)
        assert shape == ARRAYS[name].shape
    got = load_file(path)
    assert set(got) == set(ARRAYS)
    for name, value in ARRAYS.items():
        assert got[name].dtype == value.dtype
        np.testing.assert_array_equal(got[name].view(np.uint8), value.view(np.uint8))


def test_file_kinds_register_themselves(tmp_path, monkeypatch):
    from neuron_kernels.io import arrays
    from neuron_kernels.io.arrays import ARRAY_FILES, ArrayEntry, ArrayFileKind, array_file_kind, open_arrays

    assert list(ARRAY_FILES) == [".npy", ".npz", ".safetensors"]
    monkeypatch.setattr(arrays, "ARRAY_FILES", dict(ARRAY_FILES))
    values = np.arange(6, dtype=np.float32)

    def open_raw(path):
        data = np.fromfile(path, np.float32)
        return [ArrayEntry(path, None, data.shape, data.dtype, lambda a, b: data[a:b])]

    kind = arrays.register_file_kind(ArrayFileKind("raw", ".f32", open_raw, lambda path, items: None, one_array=True))
    path = tmp_path / "x.f32"
    values.tofile(path)
    assert array_file_kind(str(path)) is kind
    (entry,) = open_arrays(path)
    np.testing.assert_array_equal(entry.read(), values)
    with pytest.raises(ValueError, match="already registered"):
        arrays.register_file_kind(kind)
