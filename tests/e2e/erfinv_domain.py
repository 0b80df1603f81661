"""The inputs erfinv is checked over, shared by the CPU kernel's test (test_erfinv_kernel.py) and the
GPU check (tests/gpu_e2e/export_erfinv.py): every float in [1 - 2^-9, 1) and its negatives (where
the slope grows without bound), a dense grid of (-1, 1), tiny and subnormal inputs, and the special
values +-1, +-0, out-of-domain and NaN."""
from __future__ import annotations

import numpy as np

F32 = np.float32
# Below this |x| erfinv's relative condition number stays small; [NEAR_ONE, 1) is every float there.
NEAR_ONE = 1 - 2.0 ** -9


def domain_inputs() -> np.ndarray:
    one = F32(1)
    below_one = one - np.arange(1, 1 << 15, dtype=F32) * F32(2.0 ** -24)      # every float in [1-2^-9, 1)
    grid = np.linspace(-1, 1, 40001, dtype=F32)
    tiny = np.logspace(-45, 0, 3000).astype(F32)
    special = np.array([1, -1, 0, -0.0, np.nextafter(one, F32(0)), -np.nextafter(one, F32(0)),
                        0.5, -0.5, np.nextafter(F32(0.5), F32(0)), 1e-45, -1e-45, np.finfo(F32).tiny,
                        1.5, -2, np.inf, -np.inf, np.nan], dtype=F32)
    return np.concatenate([special, below_one, -below_one, grid, tiny, -tiny]).astype(F32)
