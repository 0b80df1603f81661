"""The public fixture models (../shared/fixtures), exported with KilnPartitioner.

For each: the re-created module reproduces the fixture's recorded outputs; the saved .pte carries
the expected KilnBackend delegates and leaves the expected operators to ExecuTorch; and the whole
program, run with the blobs read back from that .pte through the reference interpreter (CPU
operators with torch), gives eager PyTorch's answer: the fixture's recorded eager CPU output.

Recorded outputs, not this process's eager fp32 run, are the yardstick: coalesced amplifies the
last bits of tanh about 600x (fixtures README), and in one of about ten runs of this suite the
process's eager fp32 tanh came out different enough to move coalesced's output by 4e-3. The
re-creation check evaluates the module in float64 for the same reason."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

from kiln_executorch.aot import export, lower, read_delegates, read_operators  # noqa: E402
from kiln_executorch.aot.blob_format import Precision  # noqa: E402
from kiln_executorch.aot.blob_writer import read_blob  # noqa: E402
from kiln_executorch.aot.reference import run_program  # noqa: E402

FIXTURES = models.all_fixtures()

# name: (Kiln partitions, operators left to ExecuTorch's kernels)
EXPECTED = {
    "mlp": (1, []),
    "cnn_small": (1, []),
    "add_one": (1, []),
    "coalesced": (2, ["aten::erfinv.out"]),
    "transformer_block": (1, []),
    "embedding_lm": (1, []),
    "multi_method.forward": (1, []),
    "multi_method.encode": (1, []),
    "kv_cache_decode": (1, []),   # the caches are state inside the delegate
}


def max_error(actual, expected):
    return (actual.double() - expected.double()).abs().max().item()


@pytest.mark.parametrize("name", FIXTURES)
def test_recreated_module_reproduces_fixture_outputs(name):
    f = FIXTURES[name]
    inputs = [x.double() if x.is_floating_point() else x for x in f.inputs]
    with torch.no_grad():
        out = copy.deepcopy(f.module).double()(*inputs)
    tol = f.tolerance
    torch.testing.assert_close(out.float(), f.expected[0], atol=tol["atol"], rtol=tol["rtol"])


def export_and_check(name, precision, tmp_path):
    """Exports fixture `name`, checks what the .pte carries, returns (reference output, eager)."""
    f = FIXTURES[name]
    fixture, method = (name.split(".") + ["forward"])[:2]
    if fixture == "multi_method":
        parts = {m.method: m for m in models.multi_method()}
        edge = lower({k: p.module for k, p in parts.items()},
                     {k: p.inputs for k, p in parts.items()}, precision)
    else:
        edge = lower(f.module, f.inputs, precision)
    program = copy.deepcopy(edge.exported_program(method))     # to_executorch edits its input
    pte = tmp_path / "model.pte"
    pte.write_bytes(edge.to_executorch().buffer)

    partitions, outside = EXPECTED[name]
    delegates = [d for d in read_delegates(pte) if d.method == method]
    assert [d.backend_id for d in delegates] == ["KilnBackend"] * partitions
    assert all(d.compile_specs == {"precision": precision.encode()} for d in delegates)
    assert read_operators(pte)[method] == outside
    lowered = [m.processed_bytes for _, m in program.graph_module.named_children()
               if hasattr(m, "processed_bytes")]
    assert lowered == [d.data for d in delegates]
    for d in delegates:
        assert read_blob(d.data).precision == Precision[precision.upper()]

    (actual,) = run_program(program, f.inputs, blobs=[d.data for d in delegates])
    eager = f.expected[0]
    assert actual.dtype == eager.dtype and actual.shape == eager.shape
    return actual, eager


@pytest.mark.parametrize("name", FIXTURES)
def test_fp32_export_matches_eager(name, tmp_path):
    actual, eager = export_and_check(name, "fp32", tmp_path)
    assert max_error(actual, eager) <= 1e-5


@pytest.mark.parametrize("name, precision", [
    ("mlp", "bf16"), ("cnn_small", "bf16"), ("transformer_block", "bf16"),
    ("embedding_lm", "bf16"), ("multi_method.encode", "fp16"), ("add_one", "tf32"),
])
def test_reduced_precision_export_is_close(name, precision, tmp_path):
    actual, eager = export_and_check(name, precision, tmp_path)
    assert max_error(actual, eager) <= 2e-2 * eager.abs().max().item()


def test_coalesced_partitions_surround_erfinv(tmp_path):
    f = FIXTURES["coalesced"]
    program = lower(f.module, f.inputs).exported_program()
    order = [str(n.target).split(".")[-2] if "erfinv" in str(n.target) else n.target.__name__
             for n in program.graph.nodes if n.op == "call_function"]
    assert order == ["executorch_call_delegate", "getitem", "erfinv",
                     "executorch_call_delegate", "getitem"]


def test_export_writes_the_file(tmp_path):
    f = FIXTURES["embedding_lm"]
    path = tmp_path / "embedding_lm.pte"
    assert export(f.module, f.inputs, path, precision="bf16") == path
    (delegate,) = read_delegates(path)
    assert delegate.backend_id == "KilnBackend" and delegate.method == "forward"
    assert delegate.compile_specs == {"precision": b"bf16"}


def test_dynamic_mlp_stays_on_cpu(tmp_path):
    f = FIXTURES["mlp"]
    batch = torch.export.Dim("batch", min=1, max=16)
    path = export(f.module, f.inputs, tmp_path / "dynamic_mlp.pte",
                  dynamic_shapes={"x": {0: batch}})
    assert read_delegates(path) == []
    assert read_operators(path)["forward"] == ["aten::permute_copy.out", "aten::addmm.out",
                                                "aten::relu.out"]
