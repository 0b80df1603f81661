"""One-call export of a PyTorch module to a Kiln-delegated .pte; readers for what a .pte holds."""

from dataclasses import dataclass
from pathlib import Path

import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.schema import DataLocation, DeviceType, Tensor

from .partitioner import KilnPartitioner

# Operators outside the core ATen set (and without a decomposition into it) that ExecuTorch's
# default compile config refuses in an edge program. Its verifier checks the edge graph before
# partitioning, so the exception is needed whether Kiln takes the operator or exclude_ops leaves
# it to ExecuTorch's CPU kernels.
NON_CORE_CPU_OPS = [torch.ops.aten.erfinv.default, torch.ops.aten.adaptive_max_pool2d.default,
                    torch.ops.aten.median.default, torch.ops.aten.median.dim,
                    torch.ops.aten.adaptive_max_pool3d.default, torch.ops.aten.round.decimals]


def lower(module, example_inputs, precision="fp32", dynamic_shapes=None, compile_config=None,
          device_resident=False, exclude_ops=None, layout="channels_last", weights=None):
    """torch.export -> to_edge_transform_and_lower(partitioner=[KilnPartitioner(precision,
    device_resident, exclude_ops, layout, weights)]). Returns ExecuTorch's EdgeProgramManager (the
    step before to_executorch; a device-resident one needs
    KilnPartitioner.executorch_config(device_resident=True) there).

    The module is exported as it is: call .eval() first for inference (batch norm in training mode
    stays on the CPU). For a program with several methods pass dicts keyed by method name for
    `module`, `example_inputs` and (optionally) `dynamic_shapes`. `compile_config` is handed to
    ExecuTorch; the default is ExecuTorch's own, except that it admits NON_CORE_CPU_OPS.
    """
    if compile_config is None:
        compile_config = EdgeCompileConfig(_core_aten_ops_exception_list=NON_CORE_CPU_OPS)
    # Kiln is for inference: export without autograd (with it, a program that mutates a buffer
    # fails later in to_executorch on an in-place update of a leaf that requires grad).
    with torch.no_grad():
        if isinstance(module, dict):
            shapes = dynamic_shapes or {}
            programs = {name: torch.export.export(m, tuple(example_inputs[name]),
                                                  dynamic_shapes=shapes.get(name))
                        for name, m in module.items()}
        else:
            programs = torch.export.export(module, tuple(example_inputs),
                                           dynamic_shapes=dynamic_shapes)
        return to_edge_transform_and_lower(
            programs, partitioner=[KilnPartitioner(precision, device_resident, exclude_ops,
                                                   layout, weights)],
            compile_config=compile_config)


def export(module, example_inputs, path, precision="fp32", dynamic_shapes=None,
           compile_config=None, device_resident=False, exclude_ops=None, layout="channels_last",
           weights=None):
    """lower(...) -> to_executorch() -> the .pte at `path`. Returns `path`.

    device_resident=True: every method input and output is a CUDA tensor the caller owns (pass
    device pointers, get device pointers back) and no et_copy operator remains; the default puts
    et_copy::_h2d_copy / _d2h_copy around each Kiln delegate and takes host tensors."""
    edge = lower(module, example_inputs, precision, dynamic_shapes, compile_config,
                 device_resident, exclude_ops, layout, weights)
    with torch.no_grad():
        config = KilnPartitioner.executorch_config(device_resident=device_resident)
        Path(path).write_bytes(edge.to_executorch(config).buffer)
    return path


@dataclass
class Delegate:
    method: str
    index: int               # position in the method's delegate table
    backend_id: str          # "KilnBackend" for Kiln's
    compile_specs: dict      # key -> bytes
    data: bytes              # the processed blob


def _program(pte_path):
    return deserialize_pte_binary(Path(pte_path).read_bytes()).program


def read_delegates(pte_path):
    """Every delegate of every method in a saved .pte, with its payload, as ExecuTorch's own
    deserializer reads the file."""
    program = _program(pte_path)
    found = []
    for plan in program.execution_plan:
        for i, d in enumerate(plan.delegates):
            assert d.processed.location == DataLocation.INLINE    # the deserializer inlines all
            found.append(Delegate(plan.name, i, d.id, {s.key: s.value for s in d.compile_specs},
                                  program.backend_delegate_data[d.processed.index].data))
    return found


def read_operators(pte_path, device_copies=True):
    """{method: ["aten::cos.out", ...]}: the operators a .pte still runs on ExecuTorch's kernels.
    device_copies=False leaves out ExecuTorch's et_copy operators (the copies to and from the GPU
    around each Kiln call), which is the compute a program leaves outside its delegates."""
    return {plan.name: [f"{o.name}.{o.overload}" if o.overload else o.name
                        for o in plan.operators
                        if device_copies or o.name not in COPY_OPERATORS]
            for plan in _program(pte_path).execution_plan}


COPY_OPERATORS = ("et_copy::_h2d_copy", "et_copy::_d2h_copy")


@dataclass
class MethodIO:
    copies: list     # the et_copy operators the method still runs, e.g. ["et_copy::_h2d_copy"]
    inputs: list     # per method input: "cpu", "cuda:0", ... (None for a non-tensor value)
    outputs: list    # per method output, likewise


def _device(value):
    if not isinstance(value, Tensor):
        return None
    info = value.extra_tensor_info
    if info is None or info.device_type == DeviceType.CPU:
        return "cpu"
    return f"{info.device_type.name.lower()}:{info.device_index}"


def read_method_io(pte_path):
    """{method: MethodIO}: where each method's inputs and outputs live, from the tensor metadata
    the saved .pte carries, and which et_copy operators remain."""
    found = {}
    for plan in _program(pte_path).execution_plan:
        copies = [o.name for o in plan.operators if o.name in COPY_OPERATORS]
        found[plan.name] = MethodIO(copies=copies,
                                    inputs=[_device(plan.values[i].val) for i in plan.inputs],
                                    outputs=[_device(plan.values[i].val) for i in plan.outputs])
    return found
