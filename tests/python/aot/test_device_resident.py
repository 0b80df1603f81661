"""Device-resident export: the saved .pte, read back, has no et_copy operator and CUDA method
inputs and outputs; the default export of the same module is the negative control (host method
I/O, both copies in the program)."""

import pytest
import torch

from kiln_executorch.aot import (KilnPartitioner, export, read_delegates, read_method_io,
                                 read_operators)


class TwoInTwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x, y):
        h = self.fc(x) + y
        return torch.relu(h), torch.tanh(h)


# Kiln runs erfinv; excluding it puts a CPU operator where these tests need one.
CPU_ERFINV = [torch.ops.aten.erfinv.default]


class SharedWithCpu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x), torch.erfinv(x)


class CpuOutput(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return y, torch.erfinv(y - 0.5)


INPUTS = (torch.randn(4, 16), torch.randn(4, 8))


def test_device_resident_program_has_no_copies_and_cuda_io(tmp_path):
    path = export(TwoInTwoOut().eval(), INPUTS, tmp_path / "resident.pte", device_resident=True)
    io = read_method_io(path)["forward"]
    assert io.copies == []
    assert io.inputs == ["cuda:0", "cuda:0"] and io.outputs == ["cuda:0", "cuda:0"]
    assert not any(op.startswith("et_copy::") for op in read_operators(path)["forward"])
    assert [d.backend_id for d in read_delegates(path)] == ["KilnBackend"]


def test_default_program_is_the_negative_control(tmp_path):
    path = export(TwoInTwoOut().eval(), INPUTS, tmp_path / "default.pte")
    io = read_method_io(path)["forward"]
    assert sorted(io.copies) == ["et_copy::_d2h_copy", "et_copy::_h2d_copy"]
    assert io.inputs == ["cpu", "cpu"] and io.outputs == ["cpu", "cpu"]
    assert set(read_operators(path)["forward"]) == {"et_copy::_h2d_copy.out",
                                                    "et_copy::_d2h_copy.out"}


def test_input_read_on_the_cpu_is_refused(tmp_path):
    with pytest.raises(ValueError, match="method input 'x' is read by .*CPU"):
        export(SharedWithCpu().eval(), (torch.rand(4, 8) - 0.5,), tmp_path / "m.pte",
               device_resident=True, exclude_ops=CPU_ERFINV)


def test_output_not_made_by_kiln_is_refused(tmp_path):
    with pytest.raises(ValueError, match="method output .* is not computed by Kiln"):
        export(CpuOutput().eval(), (torch.rand(4, 8),), tmp_path / "m.pte",
               device_resident=True, exclude_ops=CPU_ERFINV)


@pytest.mark.parametrize("module", [SharedWithCpu, CpuOutput])
def test_the_same_modules_are_device_resident_when_kiln_runs_erfinv(module, tmp_path):
    path = export(module().eval(), (torch.rand(4, 8),), tmp_path / "m.pte", device_resident=True)
    io = read_method_io(path)["forward"]
    assert io.copies == [] and io.outputs == ["cuda:0", "cuda:0"]
    assert read_operators(path)["forward"] == []


def test_executorch_config_pairs_with_the_partitioner():
    config = KilnPartitioner.executorch_config(device_resident=True)
    assert config.propagate_device_config.skip_h2d_for_method_inputs
    assert config.propagate_device_config.skip_d2h_for_method_outputs
    assert config.enable_non_cpu_memory_planning
    assert not config.memory_planning_pass.alloc_graph_input
    assert not config.memory_planning_pass.alloc_graph_output
    default = KilnPartitioner.executorch_config()
    assert not default.propagate_device_config.skip_h2d_for_method_inputs


def test_gpu_e2e_export_writes_what_the_check_reads(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, repo / "tests" / "gpu_e2e" / "export_device_resident.py",
                        "--out", tmp_path], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(repo / "python")})
    assert r.returncode == 0, r.stdout + r.stderr
    resident, default = tmp_path / "device_resident.pte", tmp_path / "default.pte"
    io = read_method_io(resident)["forward"]
    assert io.copies == [] and set(io.inputs + io.outputs) == {"cuda:0"}
    assert sorted(read_method_io(default)["forward"].copies) == ["et_copy::_d2h_copy",
                                                                 "et_copy::_h2d_copy"]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["inputs"] == [[64, 256], [64, 256]] and meta["outputs"] == [[64, 256], [64, 512]]
    for i, shape in enumerate(meta["inputs"]):
        assert (tmp_path / f"input_{i}.bin").stat().st_size == 4 * shape[0] * shape[1]
    for i, shape in enumerate(meta["outputs"]):
        assert (tmp_path / f"expected_output_{i}.bin").stat().st_size == 4 * shape[0] * shape[1]
    assert resident.stat().st_size < 4 << 20 and default.stat().st_size < 4 << 20
