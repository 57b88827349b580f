import numpy as np
import pytest

import neuron_kernels as nk


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture
def threads():
    """Restore the thread bound after a test changes it."""
    yield nk.set_num_threads
    nk.set_num_threads(None)


def special_float32() -> np.ndarray:
    """Named edge cases of float32 -> bfloat16 / tfloat32 rounding."""
    bits = [
        0x00000000,
        0x80000000,  # signed zeros
        0x00000001,
        0x80000001,  # smallest subnormals
        0x007FFFFF,
        0x00800000,  # largest subnormal, smallest normal
        0x3F800000,
        0x3F808000,
        0x3F818000,
        0x3F808001,
        0x3F807FFF,  # 1.0 and bf16 ties / near-ties
        0x3F801000,
        0x3F803000,  # tf32 ties (to even down, to even up)
        0x7F7F7FFF,
        0x7F7F8000,
        0x7F7FFFFF,  # bf16 overflow boundary
        0xFF7F8000,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,  # infinities
        0x7F800001,
        0xFF800001,
        0x7FC00000,
        0xFFC00000,
        0x7FFFFFFF,
        0xFFFFFFFF,
        0x7FA00000,  # NaNs
    ]
    return np.array(bits, dtype=np.uint32).view(np.float32)
