"""KilnPartitioner: claims the nodes of an edge program that Kiln can run.

Each node is judged by supported_ops.check_node; CapabilityBasedPartitioner groups the supported
ones into convex partitions, and every partition is tagged for KilnBackend with the precision in
its compile specs. A partition that would only compute constants or only re-view tensors is left
to ExecuTorch: delegating it would add a call without taking work off the CPU.
"""

import operator
from typing import NamedTuple

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .lowering import PRECISION_SPEC, PRECISIONS, KilnBackend
from .supported_ops import CONSTANT_ONLY, STATE_UPDATES, VIEWS, aten_op, check_node


class NodeDecision(NamedTuple):
    node: torch.fx.Node
    supported: bool
    reason: str


class _Context:
    """What the checks may ask about the whole program: which values are known ahead of time."""

    def __init__(self, ep):
        sig = ep.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        # Mutated-buffer placeholder -> the node whose value the buffer takes after the graph.
        nodes = {n.name: n for n in ep.graph.nodes}
        source = {s.target: nodes.get(s.arg.name) for s in sig.output_specs
                  if s.kind == OutputKind.BUFFER_MUTATION}
        self.updates = {nodes[s.arg.name]: source.get(s.target) for s in sig.input_specs
                        if s.kind == InputKind.BUFFER and s.target in mutated}
        constant_inputs = {s.arg.name for s in sig.input_specs
                           if s.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                                         InputKind.CONSTANT_TENSOR) and s.target not in mutated}
        self.constants = set()
        for node in ep.graph.nodes:
            if node.op == "placeholder" and node.name in constant_inputs:
                self.constants.add(node)
            elif node.op == "call_function" and self._foldable(node):
                self.constants.add(node)

    def _foldable(self, node):
        """Whether Kiln's builder would evaluate this node ahead of time (it evaluates only
        operators it supports: their semantics are known and none of them is random)."""
        if not check_node(node, self)[0]:
            return False
        return aten_op(node) in CONSTANT_ONLY or all(n in self.constants
                                                     for n in node.all_input_nodes)

    def is_constant(self, node):
        return node in self.constants

    def buffer_update(self, node):
        """For a mutated buffer's placeholder, the node computing its new value; else None."""
        return self.updates.get(node)


class _Support(OperatorSupportBase):
    def __init__(self, ctx):
        self.ctx = ctx

    def is_node_supported(self, submodules, node):
        return node.op == "call_function" and check_node(node, self.ctx)[0]


def _edge_program(program):
    return program.exported_program() if hasattr(program, "exported_program") else program


class KilnPartitioner(Partitioner):
    """Partitioner for `to_edge_transform_and_lower(ep, partitioner=[KilnPartitioner(...)])`.

    precision: "fp32" (IEEE fp32 math), "tf32" (fp32 storage, TF32 tensor-core matmuls and
    convolutions), "fp16" or "bf16" (weights and activations stored in that dtype; the delegate's
    inputs and outputs keep the graph's dtypes).
    device_resident: keep delegate inputs and outputs in device memory across calls (not yet
    available).
    """

    def __init__(self, precision="fp32", device_resident=False):
        if precision not in PRECISIONS:
            raise ValueError(f"KilnPartitioner precision={precision!r}; choose one of "
                             f"{', '.join(PRECISIONS)}")
        if device_resident:
            raise NotImplementedError(
                "KilnPartitioner(device_resident=True) is not implemented yet: delegate inputs "
                "and outputs are host memory, copied to and from the GPU on every call")
        super().__init__()
        self.precision = precision
        self.delegation_spec = DelegationSpec(
            KilnBackend.__name__, [CompileSpec(PRECISION_SPEC, precision.encode())])

    def partition(self, exported_program):
        ctx = _Context(exported_program)
        proposed = CapabilityBasedPartitioner(
            exported_program.graph_module, _Support(ctx),
            allows_single_node_partition=True).propose_partitions()
        partition_tags = {}
        for partition in proposed:
            if not any(_does_work(n, ctx) for n in partition.nodes):
                continue
            tag = f"kiln_{len(partition_tags)}"
            partition_tags[tag] = self.delegation_spec
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
        # A buffer updated by a claimed index_put becomes state the delegate owns: its
        # placeholder joins the partition, and ExecuTorch then hands the delegate the buffer and
        # its mutation (the lowered program's BUFFER / BUFFER_MUTATION specs). This is what
        # executorch's tag_mutated_buffer does, narrowed to buffers whose only reader and whose
        # new value are that index_put (supported_ops._index_put checks both), so a buffer is
        # never owned by a delegate that does not also compute its update.
        for placeholder, update in ctx.updates.items():
            tag = update.meta.get("delegation_tag") if update is not None else None
            if tag is not None and aten_op(update) in STATE_UPDATES:
                placeholder.meta["delegation_tag"] = tag
        # Parameters and constants a partition reads move into its blob (ExecuTorch duplicates
        # one that several partitions read); other mutated buffers are left out: they stay
        # program state and reach the delegate as inputs.
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program,
                               partition_tags=partition_tags)

    @staticmethod
    def explain(program):
        """Kiln's decision for every operator node of an edge program (an ExportedProgram or an
        EdgeProgramManager's method): [(node, supported, reason)], in graph order. getitem nodes
        are left out: they go wherever the node they read goes."""
        ep = _edge_program(program)
        ctx = _Context(ep)
        return [NodeDecision(n, *check_node(n, ctx)) for n in ep.graph.nodes
                if n.op == "call_function" and n.target is not operator.getitem]


def _does_work(node, ctx):
    return (node.op == "call_function" and node.target is not operator.getitem
            and not ctx.is_constant(node) and aten_op(node) not in VIEWS)
