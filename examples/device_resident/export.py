"""Exports a program whose inputs and outputs stay on the GPU, and checks the saved file rather
than the flags: from the .pte's own tables, no et_copy operator remains and every method input and
output is a CUDA tensor. The default export of the same module is the negative control: host
method I/O, with et_copy::_h2d_copy and et_copy::_d2h_copy around the Kiln delegate.

    python examples/device_resident/export.py --out DIR

writes DIR/device_resident.pte, DIR/default.pte, DIR/input_<i>.bin (float32, row-major) and
DIR/expected_output_<i>.bin (eager PyTorch on the CPU). Run the device-resident program with the
C++ app next to this file (see main.cpp)."""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("KILN_SKIP_DELEGATE_REGISTRATION", "1")  # export only: no GPU needed here

import torch  # noqa: E402

from kiln_executorch.aot import export, read_delegates, read_method_io  # noqa: E402


class Block(torch.nn.Module):
    """Two inputs, two outputs, all of it Kiln's: a gated MLP with a residual."""

    def __init__(self, dim=256, hidden=512):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x, residual):
        h = torch.relu(self.up(x))
        return self.down(h) + residual, torch.tanh(h)


def example():
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(64, 256), torch.randn(64, 256))


def check_device_resident(path):
    io = read_method_io(path)["forward"]
    assert io.copies == [], f"{path}: et_copy operators remain: {io.copies}"
    assert all(d == "cuda:0" for d in io.inputs + io.outputs), \
        f"{path}: method inputs {io.inputs}, outputs {io.outputs}; expected cuda:0 everywhere"
    return io


def check_default(path):
    io = read_method_io(path)["forward"]
    assert sorted(io.copies) == ["et_copy::_d2h_copy", "et_copy::_h2d_copy"], \
        f"{path}: the default export should keep both copies, has {io.copies}"
    assert all(d == "cpu" for d in io.inputs + io.outputs), (io.inputs, io.outputs)
    return io


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    module, inputs = example()
    resident = export(module, inputs, out / "device_resident.pte", device_resident=True)
    default = export(module, inputs, out / "default.pte")
    for path in (resident, default):
        assert [d.backend_id for d in read_delegates(path)] == ["KilnBackend"], path
    io_resident, io_default = check_device_resident(resident), check_default(default)
    with torch.no_grad():
        expected = module(*inputs)
    for i, t in enumerate(inputs):
        t.contiguous().numpy().tofile(out / f"input_{i}.bin")
    for i, t in enumerate(expected):
        t.contiguous().numpy().tofile(out / f"expected_output_{i}.bin")
    meta = {"inputs": [list(t.shape) for t in inputs], "outputs": [list(t.shape) for t in expected],
            "device_resident": vars(io_resident), "default": vars(io_default)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"device_resident.pte: no et_copy, inputs {io_resident.inputs}, outputs "
          f"{io_resident.outputs}")
    print(f"default.pte (negative control): {io_default.copies}, inputs {io_default.inputs}, "
          f"outputs {io_default.outputs}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    main(ap.parse_args().out)
