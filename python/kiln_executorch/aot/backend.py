"""KilnBackend: one partition (an edge-dialect ExportedProgram) -> Kiln engine blob bytes.

    edge graph --lowering.py (+ ops/)--> Kiln IR --C++ builder (builder.py)--> blob bytes

The C++ builder (builder/, bound in builder.py) runs, in order: dead-op elimination; residual-add
and activation epilogue fusion into kMatmul and kConv2d (the bias is lowered into them);
precision conversion (fp16/bf16: floating weights and activations in the low dtype, kCopy casts
at the delegate's floating inputs and outputs so its I/O dtypes stay the graph's, erfinv's operand
and result kept float32 as torch.autocast runs it; tf32 only sets the header); channels-last
layout (conv nets' activations NHWC between convolutions, unless the "layout" compile spec is
"nchw"); elementwise-chain fusion (kUnary/kBinary/kWhere chains into one kFusedElementwise kernel,
after precision conversion so each step keeps its op's rounding); binding of outputs to the
runtime's output memory; liveness-based best-fit planning of the arena (256-byte aligned).

A partition with bounded dynamic sizes is lowered once per assignment of its symbols (dynamic.py)
and the C++ builder turns the lowerings into one variant set; a static one is a plain blob.
"""

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

from . import builder
from .blob_format import Precision
from .dynamic import assignments, program_symbols, specialise
from .lowering import lower_graph

PRECISIONS = {"fp32": Precision.FP32, "tf32": Precision.TF32, "fp16": Precision.FP16,
              "bf16": Precision.BF16}
PRECISION_SPEC = "precision"
# Memory layout of conv nets' activations inside a partition: "channels_last" (NHWC between
# convolutions, the builder's channels-last pass) or "nchw" (the pass off).
LAYOUTS = ("channels_last", "nchw")
LAYOUT_SPEC = "layout"
# ExecuTorch's key for the device a delegate's data lives on (exir PropagateDevicePass).
TARGET_DEVICE_SPEC = "target_device"


class KilnBackend(BackendDetails):
    """The preprocess ExecuTorch calls for every partition tagged for "KilnBackend"; the runtime
    finds the delegate by this class's name."""

    @staticmethod
    def preprocess(edge_program, compile_specs):
        specs = {s.key: s.value for s in compile_specs}
        name = specs.get(PRECISION_SPEC, b"fp32").decode()
        if name not in PRECISIONS:
            raise ValueError(f"compile spec precision={name!r}; expected one of {list(PRECISIONS)}")
        layout = specs.get(LAYOUT_SPEC, b"channels_last").decode()
        if layout not in LAYOUTS:
            raise ValueError(f"compile spec layout={layout!r}; expected one of {list(LAYOUTS)}")
        if program_symbols(edge_program):
            return PreprocessResult(processed_bytes=build_variant_set(
                edge_program, PRECISIONS[name], layout))
        return PreprocessResult(processed_bytes=build_blob(edge_program, PRECISIONS[name],
                                                           layout=layout))


def _passes(fuse, layout="channels_last"):
    passes = builder.PASSES_ALL if fuse else builder.PASSES_ALL & ~builder.PASS_FUSE_ELEMENTWISE
    return passes if layout == "channels_last" else passes & ~builder.PASS_CHANNELS_LAST


def build_blob(edge_program, precision=Precision.FP32, fuse=True,
               layout="channels_last") -> bytes:
    """Edge program of one partition -> engine blob: lowered here, built by the C++ builder
    (fuse=False keeps every elementwise op its own kernel, the form fusion is checked against;
    layout="nchw" keeps conv nets NCHW)."""
    return builder.build_blob(lower_graph(edge_program, precision), _passes(fuse, layout))


def build_variant_set(edge_program, precision=Precision.FP32, layout="channels_last") -> bytes:
    """A partition with bounded dynamic sizes -> a variant set: the partition lowered once per
    assignment of its symbols and built (with every pass) by the C++ builder, each blob serving
    the delegate input shapes of its own lowering."""
    symbols = program_symbols(edge_program)
    ranges = getattr(edge_program, "range_constraints", None)
    return builder.build_variant_set([lower_graph(specialise(edge_program, a), precision)
                                      for a in assignments(symbols, ranges)],
                                     _passes(True, layout))
