"""CPU side of the shared-weights GPU check: export_shared_weights.py writes a program with a Kiln
delegate in each of its two methods, the inputs and eager outputs, and weight numbers that say the
two blobs share exactly the Linear. Also records how ExecuTorch stores the shared weight: once per
delegate blob (twice in the file), which is why the sharing has to happen on the device."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from kiln_executorch.aot import read_delegates, read_operators

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "export_shared_weights.py"


def load_script():
    spec = importlib.util.spec_from_file_location("export_shared_weights", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_shared_weights(tmp_path):
    env = dict(os.environ, KILN_SKIP_DELEGATE_REGISTRATION="1")
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, env=env)
    for name in ("shared_weights.pte", "x.bin", "forward.expected.bin", "encode.expected.bin",
                 "meta.json", "weights.txt"):
        assert (tmp_path / name).is_file(), name
    pte = tmp_path / "shared_weights.pte"
    assert pte.stat().st_size < 8 << 20  # travels to the GPU machine

    delegates = read_delegates(pte)
    assert sorted((d.method, d.backend_id) for d in delegates) == [
        ("encode", "KilnBackend"), ("forward", "KilnBackend")]
    # Everything runs in Kiln: only ExecuTorch's copies to and from the GPU stay outside.
    assert {m: sorted(ops) for m, ops in read_operators(pte).items()} == {
        m: ["et_copy::_d2h_copy.out", "et_copy::_h2d_copy.out"] for m in ("forward", "encode")}

    meta = json.loads((tmp_path / "meta.json").read_text())
    w = meta["weight_bytes"]
    assert w["shared_linear"] == (512 * 1024 + 1024) * 4 and w["proj"] == (1024 * 128 + 128) * 4
    # Kiln's blobs carry exactly the parameters: one copy of each is the Linear plus proj.
    assert w["expected"] == w["shared_linear"] + w["proj"]
    assert w["forward_only"] == w["shared_linear"]
    assert w["unshared"] == 2 * w["shared_linear"] + w["proj"]
    assert dict(line.split() for line in (tmp_path / "weights.txt").read_text().splitlines()) == {
        k: str(v) for k, v in w.items()}

    # ExecuTorch stores the shared weight once per delegate blob: twice in the file.
    script = load_script()
    methods, x, shared, proj = script.build()
    weight = shared.weight.detach().contiguous().numpy().tobytes()
    assert pte.read_bytes().count(weight) == 2
    assert sum(d.data.count(weight) for d in delegates) == 2

    np.testing.assert_array_equal(np.fromfile(tmp_path / "x.bin", dtype=np.float32),
                                  x.numpy().ravel())
    for name, m in methods.items():
        want = m(x).detach().numpy().ravel()
        got = np.fromfile(tmp_path / f"{name}.expected.bin", dtype=np.float32)
        np.testing.assert_array_equal(got, want)
        assert meta["methods"][name]["shape"] == list(m(x).shape)


def test_device_memory_counters_read_zero_with_nothing_loaded():
    code = ("import kiln_executorch as k; m = k.device_memory(); "
            "assert set(m) == {'weight_bytes', 'weight_allocated_bytes', 'weight_requested_bytes', "
            "'activation_bytes'}, m; assert all(v == 0 for v in m.values()), m; print(m)")
    env = {k: v for k, v in os.environ.items() if k != "KILN_SKIP_DELEGATE_REGISTRATION"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    skipped = subprocess.run([sys.executable, "-c", "import kiln_executorch as k; "
                              "assert k.device_memory() is None"],
                             env=dict(env, KILN_SKIP_DELEGATE_REGISTRATION="1"),
                             capture_output=True, text=True)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
