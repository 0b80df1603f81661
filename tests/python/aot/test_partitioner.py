"""KilnPartitioner's arguments, its compile specs and its per-node explanation."""

import operator

import pytest
import torch
from executorch.exir import to_edge

from kiln_executorch.aot import KilnBackend, KilnPartitioner


def test_backend_id_is_the_preprocess_class_name():
    assert KilnBackend.__name__ == "KilnBackend"
    assert KilnPartitioner().delegation_spec.backend_id == "KilnBackend"


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_precision_travels_in_the_compile_specs(precision):
    specs = KilnPartitioner(precision).delegation_spec.compile_specs
    assert [(s.key, s.value) for s in specs] == [("precision", precision.encode()),
                                                 ("target_device", b"cuda:0")]


def test_bad_precision_names_the_choices():
    with pytest.raises(ValueError, match="precision='int8'; choose one of fp32, tf32, fp16, bf16"):
        KilnPartitioner("int8")


def test_device_resident_is_a_partitioner_option():
    assert KilnPartitioner(device_resident=True).device_resident
    assert not KilnPartitioner().device_resident


def test_exclude_ops_accepts_overloads_packets_edge_ops_and_names():
    from executorch.exir.dialects._ops import ops as exir_ops
    cos = torch.ops.aten.cos
    every = {getattr(cos, name) for name in cos.overloads()}     # default, out, int, float, ...
    assert {cos.default, cos.out} < every
    for given, want in [
            (None, set()), ([], set()), (cos.default, {cos.default}), ([cos.default], {cos.default}),
            (["aten.cos.default"], {cos.default}), (["aten::cos.default"], {cos.default}),
            (["torch.ops.aten.cos.default"], {cos.default}), ("aten::cos", every), ([cos], every),
            ([exir_ops.edge.aten.cos.default], {cos.default}),
            (("aten.cos.out", torch.ops.aten.tanh.default), {cos.out, torch.ops.aten.tanh.default})]:
        assert KilnPartitioner(exclude_ops=given).exclude_ops == want, given


@pytest.mark.parametrize("name", ["cos", "aten.no_such_op", "aten::cos.no_such_overload",
                                  "aten.cos.default.extra", "aten.__class__", ""])
def test_exclude_ops_names_a_name_that_is_no_operator(name):
    with pytest.raises(ValueError, match=f"exclude_ops: {name!r} names no operator"):
        KilnPartitioner(exclude_ops=[name])


def test_exclude_ops_refuses_what_is_not_an_operator():
    with pytest.raises(TypeError, match="exclude_ops: 3 is not an operator"):
        KilnPartitioner(exclude_ops=[3])


def test_explain_on_an_instance_reports_its_exclusions():
    edge = to_edge(torch.export.export(Mixed(), (torch.randn(4, 5),)))
    reasons = [d.reason for d in KilnPartitioner(exclude_ops=["aten::relu"]).explain(edge)]
    assert reasons[1] == ("aten.relu.default is excluded by KilnPartitioner(exclude_ops=...); "
                          "ExecuTorch runs it")
    assert [d.reason for d in KilnPartitioner.explain(edge)][1] == "supported"


class Mixed(torch.nn.Module):
    def forward(self, x):
        values, _ = torch.sort(x)
        return torch.relu(values) + 1


def test_explain_lists_every_operator_node_in_order():
    edge = to_edge(torch.export.export(Mixed(), (torch.randn(4, 5),)))
    found = KilnPartitioner.explain(edge)
    program = edge.exported_program()
    assert [d.node for d in found] == [n for n in program.graph.nodes if n.op == "call_function"
                                       and n.target is not operator.getitem]
    assert [(d.supported, d.reason) for d in found] == [
        (False, "aten.sort.default is not in Kiln's operator table"),
        (True, "supported"), (True, "supported"), (True, "supported")]
    assert KilnPartitioner.explain(program) == found
