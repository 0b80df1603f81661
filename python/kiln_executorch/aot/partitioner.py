"""KilnPartitioner: claims the nodes of an edge program that Kiln can run.

Each node is judged by supported_ops.check_node; CapabilityBasedPartitioner groups the supported
ones into convex partitions, and every partition is tagged for KilnBackend with the precision in
its compile specs. A partition that would only compute constants or only re-view tensors is left
to ExecuTorch: delegating it would add a call without taking work off the CPU.

Bounded dynamic sizes are claimed (Kiln builds one plan per size, see dynamic.py) when the
partition's symbols need at most MAX_VARIANTS plans and no size (a SymInt) would cross the
partition's boundary: a delegate takes and returns tensors only.

Operators named in `exclude_ops` are refused whatever Kiln could do with them (like
Torch-TensorRT's `torch_executed_ops`), so ExecuTorch's CPU kernels or a later partitioner run them.
"""

import functools
import operator
from typing import NamedTuple

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .backend import (LAYOUT_SPEC, LAYOUTS, PRECISION_SPEC, PRECISIONS, TARGET_DEVICE_SPEC,
                      WEIGHTS, WEIGHTS_SPEC, KilnBackend)
from .dynamic import is_sym_node, node_symbols, variant_count
from .ops.attention import check as attention_check
from .supported_ops import CONSTANT_ONLY, STATE_UPDATES, VIEWS, aten_op, check_node


class NodeDecision(NamedTuple):
    node: torch.fx.Node
    supported: bool
    reason: str


class _Context:
    """What the checks may ask about the whole program: which values are known ahead of time."""

    def __init__(self, ep, excluded_ops=frozenset()):
        self.excluded_ops = excluded_ops
        self.range_constraints = getattr(ep, "range_constraints", None) or {}
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


class _class_or_instance_method:
    """A method whose first parameter is the instance, or None when called on the class: explain()
    predates exclude_ops and is called on the class, but an instance must report its own
    exclusions."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __get__(self, instance, owner):
        return functools.partial(self.fn, instance)


def operator_overloads(ops):
    """exclude_ops (see KilnPartitioner) -> the frozenset of ATen OpOverloads it names."""
    if ops is None:
        return frozenset()
    if isinstance(ops, str) or _operator(ops) is not None:
        ops = [ops]     # one operator given on its own
    found = set()
    for op in ops:
        named = _lookup(op) if isinstance(op, str) else _operator(op)
        if isinstance(named, torch._ops.OpOverloadPacket):
            found.update(getattr(named, o) for o in named.overloads())
        elif named is not None:
            found.add(named)
        else:
            raise TypeError(f"KilnPartitioner exclude_ops: {op!r} is not an operator (pass e.g. "
                            "torch.ops.aten.erfinv.default or 'aten.erfinv.default')")
    return frozenset(found)


def _operator(value):
    """An ATen OpOverload or OpOverloadPacket as it is, an edge-dialect op's ATen overload, else
    None."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return value
    op = getattr(value, "_op", None)     # EdgeOpOverload wraps the ATen overload
    return op if isinstance(op, torch._ops.OpOverload) else None


def _lookup(name):
    """"aten.erfinv.default", "aten::erfinv.default", "aten::erfinv", "torch.ops.aten.erfinv" ->
    the OpOverload, or the OpOverloadPacket when no overload is named."""
    parts = name.strip().removeprefix("torch.ops.").replace("::", ".", 1).split(".")
    op = None
    if len(parts) in (2, 3) and all(parts):
        try:
            op = getattr(getattr(torch.ops, parts[0]), parts[1])
            op = getattr(op, parts[2]) if len(parts) == 3 else op
        except (AttributeError, RuntimeError):   # torch's answers for an unknown op or overload
            op = None
    if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise ValueError(f"KilnPartitioner exclude_ops: {name!r} names no operator (expected "
                         "e.g. 'aten.erfinv.default' or 'aten::erfinv')")
    return op


class KilnPartitioner(Partitioner):
    """Partitioner for `to_edge_transform_and_lower(ep, partitioner=[KilnPartitioner(...)])`.

    precision: "fp32" (IEEE fp32 math), "tf32" (fp32 storage, TF32 tensor-core matmuls and
    convolutions), "fp16" or "bf16" (weights and activations stored in that dtype; the delegate's
    inputs and outputs keep the graph's dtypes).
    device_resident: the method's inputs and outputs stay in CUDA memory: the caller passes
    device pointers and gets device pointers back, with no et_copy operator in the program. A
    partitioner cannot choose how ExecuTorch plans memory, so this pairs with
    `edge.to_executorch(KilnPartitioner.executorch_config(device_resident=True))`
    (kiln_executorch.aot.export(..., device_resident=True) does both). With it, partition() also
    checks that every method input is read only by Kiln and every method output is made by Kiln,
    and raises ValueError naming the tensor that would otherwise stay in host memory.

    exclude_ops: operators Kiln leaves to ExecuTorch (its CPU kernels or a later partitioner)
    even when it supports them, e.g. [torch.ops.aten.erfinv.default]. Each entry is an ATen
    OpOverload, an OpOverloadPacket (every overload), an edge-dialect op, or a string naming one:
    "aten.erfinv.default", "aten::erfinv.default", "aten::erfinv", "torch.ops.aten.erfinv". A name
    that is no operator is a ValueError naming it. explain() on the instance gives the nodes
    they cover the reason supported_ops.EXCLUDED.

    layout: "channels_last" (default: a conv net's activations stay NHWC between convolutions,
    tensor-core friendly; converted only where another op reads them) or "nchw" (the layout the
    graph has), carried to the builder as the "layout" compile spec.

    weights: None (default: weights keep their dtype), "int8" or an int4 scheme: every linear,
    mm and addmm whose weight is a constant (merged q/k/v projections and an LM head included) is
    a kQuantMatmul, a GEMV/GEMM that dequantizes in registers. "int8": one byte a weight, one
    fp32 scale per output channel (symmetric, scale = max|W[n, :]| / 127), so a batch-1 decode
    reads half the weight bytes of bf16. "int4" (groups of 128 along K), "int4_g64", "int4_g32":
    int4 in [-7, 7] with one fp32 scale per group (max|W| / 7), a quarter of bf16's bytes; a
    weight whose K the group does not divide stays unquantized. Carried to the lowering as the
    "weights" compile spec.

    Every Kiln delegate declares its device (the "target_device" compile spec, "cuda:0"), so
    ExecuTorch puts et_copy::_h2d_copy / _d2h_copy at the delegate's boundaries unless the program
    is exported device-resident.
    """

    def __init__(self, precision="fp32", device_resident=False, exclude_ops=None,
                 layout="channels_last", weights=None):
        if precision not in PRECISIONS:
            raise ValueError(f"KilnPartitioner precision={precision!r}; choose one of "
                             f"{', '.join(PRECISIONS)}")
        if weights is not None and weights not in WEIGHTS:
            raise ValueError(f"KilnPartitioner weights={weights!r}; choose one of None, "
                             f"{', '.join(WEIGHTS)}")
        if layout not in LAYOUTS:
            raise ValueError(f"KilnPartitioner layout={layout!r}; choose one of "
                             f"{', '.join(LAYOUTS)}")
        super().__init__()
        self.precision = precision
        self.device_resident = bool(device_resident)
        self.exclude_ops = operator_overloads(exclude_ops)
        self.layout = layout
        self.weights = weights
        specs = [CompileSpec(PRECISION_SPEC, precision.encode()),
                 CompileSpec(TARGET_DEVICE_SPEC, b"cuda:0")]
        if layout != LAYOUTS[0]:   # the default travels as no spec: programs stay as they were
            specs.append(CompileSpec(LAYOUT_SPEC, layout.encode()))
        if weights is not None:
            specs.append(CompileSpec(WEIGHTS_SPEC, weights.encode()))
        self.delegation_spec = DelegationSpec(KilnBackend.__name__, specs)

    @staticmethod
    def executorch_config(device_resident=False, **kwargs):
        """The ExecutorchBackendConfig for to_executorch(). device_resident=True: no copy for
        method inputs and outputs, and no runtime buffer for them (the caller's device memory is
        used in place). Other keyword arguments go to ExecutorchBackendConfig."""
        from executorch.exir import ExecutorchBackendConfig
        from executorch.exir.passes import MemoryPlanningPass
        from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig
        if not device_resident:
            return ExecutorchBackendConfig(**kwargs)
        return ExecutorchBackendConfig(
            propagate_device_config=PropagateDeviceConfig(skip_h2d_for_method_inputs=True,
                                                          skip_d2h_for_method_outputs=True),
            enable_non_cpu_memory_planning=True,
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False,
                                                    alloc_graph_output=False),
            **kwargs)

    def ops_to_not_decompose(self, ep):
        """ExecuTorch's hook (to_edge_transform_and_lower): the ATen operators kept whole for
        Kiln. scaled_dot_product_attention becomes one kAttention op instead of bmm, softmax and
        bmm when Kiln takes every SDPA node of the program (ops/attention.py's check); otherwise
        all of them decompose as before. All or nothing, with no per-node filter: ExecuTorch's
        filter path re-traces the kept nodes through a stand-in op whose output strides differ
        from SDPA's, which breaks the views models take of its output (transpose + view)."""
        sdpa = torch.ops.aten.scaled_dot_product_attention.default
        nodes = [n for n in ep.graph.nodes if n.op == "call_function" and aten_op(n) == sdpa]
        if sdpa in self.exclude_ops or not all(attention_check(n) is None for n in nodes):
            return [], None
        return [sdpa], None

    def partition(self, exported_program):
        ctx = _Context(exported_program, self.exclude_ops)
        proposed = CapabilityBasedPartitioner(
            exported_program.graph_module, _Support(ctx),
            allows_single_node_partition=True).propose_partitions()
        partition_tags = {}
        for partition in proposed:
            if not any(_does_work(n, ctx) for n in partition.nodes):
                continue
            # Each node's symbols fit under the cap; their union over a partition may not.
            symbols = set().union(*(node_symbols(n) for n in partition.nodes))
            if variant_count(symbols, ctx.range_constraints)[0] is None or \
                    _size_crosses_boundary(partition.nodes):
                continue
            tag = f"kiln_{len(partition_tags)}"
            partition_tags[tag] = self.delegation_spec
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
        # A buffer updated by a claimed index_put becomes state the delegate owns: its
        # placeholder joins the partition, and ExecuTorch then hands the delegate the buffer and
        # its mutation (the lowered program's BUFFER / BUFFER_MUTATION specs). This is what
        # executorch's tag_mutated_buffer does, narrowed to buffers whose only reader and whose
        # new value are that index_put (ops/state.py checks both), so a buffer is
        # never owned by a delegate that does not also compute its update.
        for placeholder, update in ctx.updates.items():
            tag = update.meta.get("delegation_tag") if update is not None else None
            if tag is not None and aten_op(update) in STATE_UPDATES:
                placeholder.meta["delegation_tag"] = tag
        # Parameters and constants a partition reads move into its blob (ExecuTorch duplicates
        # one that several partitions read); other mutated buffers are left out: they stay
        # program state and reach the delegate as inputs.
        tag_constant_data(exported_program)
        if self.device_resident:
            _check_device_resident(exported_program)
        return PartitionResult(tagged_exported_program=exported_program,
                               partition_tags=partition_tags)

    @_class_or_instance_method
    def explain(partitioner, program):
        """Kiln's decision for every operator node of an edge program (an ExportedProgram or an
        EdgeProgramManager's method): [(node, supported, reason)], in graph order. getitem nodes
        are left out: they go wherever the node they read goes. KilnPartitioner.explain(program)
        judges with no exclusions; partitioner.explain(program) with that instance's
        exclude_ops."""
        ep = _edge_program(program)
        ctx = _Context(ep, partitioner.exclude_ops if partitioner is not None else frozenset())
        return [NodeDecision(n, *check_node(n, ctx)) for n in ep.graph.nodes
                if n.op == "call_function" and n.target is not operator.getitem]


def _size_crosses_boundary(nodes):
    """Whether a size (a SymInt-valued node) would enter or leave the delegate: a delegate passes
    tensors only, so such a partition stays with ExecuTorch."""
    members = set(nodes)
    for node in members:
        if is_sym_node(node) and any(u not in members for u in node.users):
            return True
        if any(isinstance(a.meta.get("val"), torch.SymInt) and a not in members
               for a in node.all_input_nodes):
            return True
    return False


def _does_work(node, ctx):
    return (node.op == "call_function" and node.target is not operator.getitem
            and not ctx.is_constant(node) and aten_op(node) not in VIEWS
            and not is_sym_node(node))


def _check_device_resident(ep):
    """A device-resident method hands every input to exactly one Kiln partition and takes every
    output from one: any other use would keep that tensor in host memory (ExecuTorch then leaves
    the copy in, or refuses an input with several readers)."""
    sig = ep.graph_signature
    user_inputs, user_outputs = set(sig.user_inputs), set(sig.user_outputs)
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            tags = {u.meta.get("delegation_tag") for u in node.users}
            if len(tags) != 1 or None in tags:
                readers = ", ".join(
                    "the method's outputs" if u.op == "output" else
                    f"{u.name} ({'Kiln' if u.meta.get('delegation_tag') else 'CPU'})"
                    for u in node.users)
                raise ValueError(
                    f"device_resident=True: method input {node.name!r} is read by {readers}; a "
                    "device-resident input must be read by one Kiln partition only (leave "
                    "device_resident off, or move the CPU work out of the model)")
        elif node.op == "output":
            for out in node.args[0]:
                if not isinstance(out, torch.fx.Node) or out.name not in user_outputs:
                    continue
                src = out.args[0] if out.target is operator.getitem else out
                if not (isinstance(src, torch.fx.Node) and src.meta.get("delegation_tag")):
                    raise ValueError(
                        f"device_resident=True: method output {out.name!r} is not computed by "
                        "Kiln (it is an input, a constant or a CPU operator's result), so it "
                        "would be host memory; leave device_resident off for this model")
