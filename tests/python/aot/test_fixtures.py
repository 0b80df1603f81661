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
from kiln_testing.blob_reader import read_blob, read_variant_set  # noqa: E402
from kiln_testing.reference import run_program  # noqa: E402

FIXTURES = models.all_fixtures()

# name: (Kiln partitions, operators left to ExecuTorch's kernels besides the et_copy operators
# every delegate boundary gets)
EXPECTED = {
    "mlp": (1, []),
    "cnn_small": (1, []),
    "add_one": (1, []),
    "coalesced": (1, []),         # erfinv too: exclude_ops puts it back on the CPU (below)
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
    assert all(d.compile_specs == {"precision": precision.encode(), "target_device": b"cuda:0"}
               for d in delegates)
    operators = read_operators(pte)[method]
    assert [op for op in operators if not op.startswith("et_copy::")] == outside
    assert {"et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"} <= set(operators)
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
    ("coalesced", "bf16"), ("coalesced", "fp16"),
])
def test_reduced_precision_export_is_close(name, precision, tmp_path):
    actual, eager = export_and_check(name, precision, tmp_path)
    assert max_error(actual, eager) <= 2e-2 * eager.abs().max().item()


def call_order(program):
    return [str(n.target).split(".")[-2] if "erfinv" in str(n.target) else n.target.__name__
            for n in program.graph.nodes if n.op == "call_function"]


def test_coalesced_is_one_partition():
    f = FIXTURES["coalesced"]
    program = lower(f.module, f.inputs).exported_program()
    assert call_order(program) == ["executorch_call_delegate", "getitem"]


def test_coalesced_partitions_surround_an_excluded_erfinv(tmp_path):
    f = FIXTURES["coalesced"]
    edge = lower(f.module, f.inputs, exclude_ops=[torch.ops.aten.erfinv.default])
    program = copy.deepcopy(edge.exported_program())
    assert call_order(program) == ["executorch_call_delegate", "getitem", "erfinv",
                                   "executorch_call_delegate", "getitem"]
    pte = tmp_path / "coalesced.pte"
    pte.write_bytes(edge.to_executorch().buffer)
    delegates = read_delegates(pte)
    assert [d.backend_id for d in delegates] == ["KilnBackend"] * 2
    assert read_operators(pte, device_copies=False)["forward"] == ["aten::erfinv.out"]
    (actual,) = run_program(program, f.inputs, blobs=[d.data for d in delegates])
    assert max_error(actual, f.expected[0]) <= 1e-5


def test_export_writes_the_file(tmp_path):
    f = FIXTURES["embedding_lm"]
    path = tmp_path / "embedding_lm.pte"
    assert export(f.module, f.inputs, path, precision="bf16") == path
    (delegate,) = read_delegates(path)
    assert delegate.backend_id == "KilnBackend" and delegate.method == "forward"
    assert delegate.compile_specs == {"precision": b"bf16", "target_device": b"cuda:0"}


def test_dynamic_mlp_is_delegated_as_a_variant_set(tmp_path):
    f = FIXTURES["mlp"]
    batch = torch.export.Dim("batch", min=1, max=16)
    edge = lower(f.module, f.inputs, dynamic_shapes={"x": {0: batch}})
    program = copy.deepcopy(edge.exported_program())
    path = tmp_path / "dynamic_mlp.pte"
    path.write_bytes(edge.to_executorch().buffer)
    (delegate,) = read_delegates(path)
    assert delegate.backend_id == "KilnBackend"
    assert read_operators(path, device_copies=False)["forward"] == []
    variants, weights = read_variant_set(delegate.data)
    assert [shapes for _, shapes in variants] == [[(b, 256)] for b in range(1, 17)]
    assert weights is not None and len(delegate.data) < 2 * len(weights)   # stored once
    reference = copy.deepcopy(f.module).double()
    for b in (1, 3, 9, 16):
        x = torch.randn(b, 256, generator=torch.Generator().manual_seed(b))
        (actual,) = run_program(program, [x], blobs=[delegate.data])
        with torch.no_grad():
            eager = reference(x.double())
        assert actual.shape == (b, 10)
        assert max_error(actual, eager) <= 1e-5
