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
