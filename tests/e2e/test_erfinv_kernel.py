"""kiln_runner's CPU aten::erfinv.out (runtime/cpu_kernels, float math with one Newton step) agrees
with torch.erfinv to 1e-6 relative over the whole domain (erfinv_domain.py): every float in
[1 - 2^-9, 1) and its negatives, a dense grid of (-1, 1), tiny and subnormal inputs, and the special
values +-1, +-0, out-of-domain and NaN. The program is portable (no partitioner), so the CPU kernel
runs erfinv whatever Kiln supports; tests/gpu_e2e/check_erfinv.py holds Kiln's GPU erfinv to the
same inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run
from erfinv_domain import F32, domain_inputs


@pytest.fixture(scope="module")
def erfinv_run(runner, tmp_path_factory):
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from kiln_executorch.aot.export import NON_CORE_CPU_OPS

    class Erfinv(torch.nn.Module):
        def forward(self, x):
            return torch.erfinv(x)

    d = tmp_path_factory.mktemp("erfinv")
    x = domain_inputs()
    ep = torch.export.export(Erfinv(), (torch.zeros(x.size),))
    edge = to_edge_transform_and_lower(ep, compile_config=EdgeCompileConfig(_core_aten_ops_exception_list=NON_CORE_CPU_OPS))
    (d / "erfinv.pte").write_bytes(edge.to_executorch().buffer)
    x.tofile(d / "x.bin")
    r = run([runner, d / "erfinv.pte", "--input", f"0={d / 'x.bin'}", "--output-dir", d])
    assert r.returncode == 0, r.stderr
    y = np.fromfile(d / "output_0.bin", dtype=F32)
    assert y.shape == x.shape
    return torch.from_numpy(x), torch.from_numpy(y)


def test_relative_accuracy_over_the_domain(erfinv_run):
    x, y = erfinv_run
    truth = torch.erfinv(x.double())
    ours = y.double()
    normal = torch.isfinite(truth) & (truth.abs() >= np.finfo(F32).tiny)
    rel = (ours - truth).abs()[normal] / truth.abs()[normal]
    worst = int(rel.argmax())
    assert rel.max() <= 1e-6, f"relative error {rel.max():.3g} at x={x[normal][worst].item()!r}"
    rel_torch = (ours - torch.erfinv(x).double()).abs()[normal] / truth.abs()[normal]
    assert rel_torch.max() <= 1e-6, f"vs torch.erfinv(float32): {rel_torch.max():.3g}"
    # Results in the subnormal range: within one subnormal step.
    sub = torch.isfinite(truth) & ~normal & (truth != 0)
    assert sub.any() and ((ours - truth).abs()[sub] <= 2 * 2.0 ** -149).all()


def test_near_one_is_finite_and_increasing(erfinv_run):
    x, y = erfinv_run
    below_one = (x > 1 - 2.0 ** -9) & (x < 1)
    xs, order = torch.sort(x[below_one])
    ys = y[below_one][order]
    assert torch.isfinite(ys).all()
    assert (ys[1:] >= ys[:-1]).all(), "erfinv must not decrease towards 1"
    last = torch.tensor(np.nextafter(F32(1), F32(0)))
    assert ys[-1].item() == pytest.approx(torch.erfinv(last.double()).item(), rel=1e-6)


def test_special_values(erfinv_run):
    x, y = erfinv_run
    def at(v):
        i = int(np.flatnonzero(x.numpy() == F32(v))[0]) if not np.isnan(v) else int(np.flatnonzero(np.isnan(x.numpy()))[0])
        return y[i].item()
    assert at(1) == float("inf") and at(-1) == float("-inf")
    zeros = y[x == 0]
    assert (zeros == 0).all()
    assert np.signbit(y[(x == 0) & torch.signbit(x)].numpy()).all(), "erfinv(-0) is -0"
    for v in [1.5, -2, np.inf, -np.inf, np.nan]:
        assert np.isnan(at(v)), v
