"""A sharded bfloat16 checkpoint of a few GB quantised and dequantised in bounded memory (slow).

The child's peak memory is its own ``VmHWM`` (see tests/memory.py for why not ``ru_maxrss``); the
results must equal the in-memory functions tensor by tensor.
"""

import json
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.io.safetensors import SafetensorsWriter, TensorSpec

from .helpers import child_env
from .memory import REPORT_PEAK

BF16 = np.dtype(ml_dtypes.bfloat16)
#: 3 shards of 2 tensors of 8192 x 8192 (128 MiB each) and one of 16384 x 8192: 1 GiB, twice the
#: memory the conversion may take (2.75 GiB once: the same peak, three times the CI time).
SHARDS = 3
SHAPES = [(8192, 8192)] * 2
#: Linear modules of a Llama (config.json says llama): the command quantises those only.
NAMES = ["self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj"]
PEAK_LIMIT_MIB = 480  # the largest tensor alone is 256 MiB, the checkpoint 1024 MiB; seen: 234 MiB


def tensor(seed: int, shape) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.exp2(rng.integers(-10, 10, (shape[0], 1)).astype(np.float32))
    return x.astype(BF16)


def peak_of(child) -> float:
    return int(re.search(r"VmHWM:\s*(\d+) kB", child.stderr).group(1)) / 1024


@pytest.mark.slow
def test_a_sharded_checkpoint_in_bounded_memory(tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    weight_map, seeds = {}, {}
    for s in range(SHARDS):
        shapes = SHAPES + ([(16384, 8192)] if s == 0 else [])
        specs = [TensorSpec(f"model.layers.{s}.{NAMES[i]}.weight", BF16, shape) for i, shape in enumerate(shapes)]
        fname = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        with SafetensorsWriter(str(src / fname), specs, {"format": "pt"}) as w:
            for spec in specs:
                seeds[spec.name] = (len(seeds), spec.shape)
                with w.tensor(spec.name) as t:
                    t.write(tensor(*seeds[spec.name]))
                weight_map[spec.name] = fname
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def child(*args):
        # A process of its own: its peak memory (VmHWM) is what is measured.
        r = subprocess.run(
            [sys.executable, "-c", REPORT_PEAK, *args, "--chunk-mb", "64", "--max-shard-size", "1GB", "--quiet"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=3600,
            env=child_env(),
        )
        assert r.returncode == 0, r.stderr
        return r

    q = child("quantize", "big", "q", "--format", "nvfp4")
    d = child("dequantize", "q", "back")
    peaks = peak_of(q), peak_of(d)
    print(f"peak RSS: quantize {peaks[0]:.0f} MiB, dequantize {peaks[1]:.0f} MiB")
    assert max(peaks) < PEAK_LIMIT_MIB, peaks

    got = nk.load_checkpoint(tmp_path / "q")
    back = nk.open_checkpoint(tmp_path / "back").tensors
    assert set(got) == set(seeds) == set(back)
    for name, (seed, shape) in seeds.items():
        x = tensor(seed, shape)
        want = nk.quantize(x, "nvfp4")
        assert got[name].per_tensor_scale == want.per_tensor_scale
        np.testing.assert_array_equal(got[name].codes, want.codes)
        np.testing.assert_array_equal(got[name].scales.view(np.uint8), want.scales.view(np.uint8))
        np.testing.assert_array_equal(back[name].read().view(np.uint16), want.dequantize("bfloat16").view(np.uint16))
        assert f"{nk.quantization_error(x, want).sqnr_db:.2f}" in q.stdout
