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

A partition that owns program state (a KV cache) wraps its blob or variant set in a state-key
container (format/state_keys.h) naming each state by its buffer's fully qualified name, and stores
one small named-data entry (PROGRAM_STATE_KEY) in the program: the runtime shares a named state
among the delegates of one loaded program (the prefill and decode methods of one module), and
ExecuTorch hands every method of one program the same named-data map, which is how the runtime
tells one loaded program from another.
"""

import struct

from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

from ..quantize import SCHEMES
from . import blob_format as bf
from . import builder
from .blob_format import Precision, Storage
from .dynamic import assignments, program_symbols, specialise
from .lowering import lower_graph

PRECISIONS = {"fp32": Precision.FP32, "tf32": Precision.TF32, "fp16": Precision.FP16,
              "bf16": Precision.BF16}
PRECISION_SPEC = "precision"
# Memory layout of conv nets' activations inside a partition: "channels_last" (NHWC between
# convolutions, the builder's channels-last pass) or "nchw" (the pass off).
LAYOUTS = ("channels_last", "nchw")
LAYOUT_SPEC = "layout"
# Weight-only quantization of the matmuls whose weight is a constant (ops/matmul.py): "int8"
# (per output channel) or an int4 scheme (per group of K), kiln_executorch.quantize.SCHEMES;
# without the spec, weights keep their dtype.
WEIGHTS = tuple(SCHEMES)
WEIGHTS_SPEC = "weights"
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
        weights = specs[WEIGHTS_SPEC].decode() if WEIGHTS_SPEC in specs else None
        if weights is not None and weights not in WEIGHTS:
            raise ValueError(f"compile spec weights={weights!r}; expected one of {list(WEIGHTS)}")
        if program_symbols(edge_program):
            payload = build_variant_set(edge_program, PRECISIONS[name], layout, weights)
        else:
            payload = build_blob(edge_program, PRECISIONS[name], layout=layout, weights=weights)
        keys = state_names(edge_program)
        if not keys:
            return PreprocessResult(processed_bytes=payload)
        store = NamedDataStore()
        store.add_named_data(PROGRAM_STATE_KEY, PROGRAM_STATE_DATA)
        return PreprocessResult(processed_bytes=wrap_state_keys(keys, payload),
                                data_store_output=store.get_named_data_store_output())


# The named-data entry every stateful Kiln program carries (same key and bytes from every
# delegate, so ExecuTorch stores it once): it gives the loaded program a named-data map.
PROGRAM_STATE_KEY = "kiln.program_state"
PROGRAM_STATE_DATA = b"kiln program state v1"


def state_names(edge_program):
    """The fully qualified names of the buffers the partition owns as state (mutated buffers it
    takes as inputs), in placeholder order: the order lowering.py adds them to the IR and the
    builder lays out their initial values, so name i is the blob's i-th distinct state."""
    sig = edge_program.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    specs = {s.arg.name: s for s in sig.input_specs}
    names = []
    for node in edge_program.graph.nodes:
        spec = specs.get(node.name) if node.op == "placeholder" else None
        if spec is not None and spec.target in mutated and spec.target not in names and \
                spec.kind.name == "BUFFER":
            names.append(spec.target)
    return names


def _blob_states(blob):
    """Number of distinct states (kState offsets) an engine blob declares."""
    h = dict(zip(bf.HEADER_FIELDS, bf.HEADER.unpack_from(blob)))
    offsets = set()
    for i in range(h["num_tensors"]):
        values = bf.TENSOR_RECORD.unpack_from(blob, h["tensors_offset"] + i * bf.TENSOR_RECORD.size)
        storage, offset = values[2 + bf.MAX_RANK], values[4 + bf.MAX_RANK]
        if storage == int(Storage.STATE):
            offsets.add(offset)
    return len(offsets)


def payload_states(payload):
    """Distinct states of a blob, or of every variant of a variant set (which must agree)."""
    if bytes(payload[:len(bf.VSET_MAGIC)]) != bf.VSET_MAGIC:
        return _blob_states(payload)
    h = dict(zip(bf.VSET_HEADER_FIELDS, bf.VSET_HEADER.unpack_from(payload)))
    counts = set()
    for v in range(h["num_variants"]):
        offset, size = bf.VARIANT_RECORD.unpack_from(payload, h["variants_offset"] +
                                                     v * bf.VARIANT_RECORD.size)
        counts.add(_blob_states(payload[offset:offset + size]))
    if len(counts) != 1:
        raise ValueError(f"the variants of one partition declare different numbers of states: "
                         f"{sorted(counts)}")
    return counts.pop()


def wrap_state_keys(keys, payload) -> bytes:
    """The state-key container (format/state_keys.h) around `payload`. Checks that the payload
    declares exactly len(keys) states."""
    found = payload_states(payload)
    if found != len(keys):
        raise ValueError(f"the partition owns {len(keys)} state buffers ({keys}) but its blob "
                         f"declares {found} states")
    encoded = [k.encode() for k in keys]
    if len(set(encoded)) != len(encoded) or not 0 < len(encoded) <= bf.MAX_STATE_KEYS or \
            any(not 0 < len(k) <= bf.MAX_STATE_KEY_LENGTH for k in encoded):
        raise ValueError(f"state keys {keys}: expected 1..{bf.MAX_STATE_KEYS} unique names of "
                         f"1..{bf.MAX_STATE_KEY_LENGTH} bytes")
    body = struct.pack(f"<{len(encoded)}I", *map(len, encoded)) + b"".join(encoded)
    align = bf.SKEYS_PAYLOAD_ALIGNMENT
    payload_offset = -(-(bf.SKEYS_HEADER_SIZE + len(body)) // align) * align
    pad = payload_offset - bf.SKEYS_HEADER_SIZE - len(body)
    size = payload_offset + len(payload)
    header = bf.SKEYS_HEADER.pack(bf.SKEYS_MAGIC, bf.SKEYS_FORMAT_VERSION, bf.SKEYS_HEADER_SIZE,
                                  len(encoded), 0, size, payload_offset, len(payload))
    return header + body + b"\0" * pad + bytes(payload)


def unwrap_state_keys(data):
    """(keys, payload) of a state-key container; ([], data) for a bare blob or variant set."""
    if bytes(data[:len(bf.SKEYS_MAGIC)]) != bf.SKEYS_MAGIC:
        return [], data
    h = dict(zip(bf.SKEYS_HEADER_FIELDS, bf.SKEYS_HEADER.unpack_from(data)))
    if h["format_version"] != bf.SKEYS_FORMAT_VERSION or h["container_size"] != len(data):
        raise ValueError(f"invalid Kiln state-key container: version {h['format_version']}, "
                         f"size {h['container_size']} of {len(data)} bytes")
    n = h["num_states"]
    lengths = struct.unpack_from(f"<{n}I", data, bf.SKEYS_HEADER_SIZE)
    at, keys = bf.SKEYS_HEADER_SIZE + 4 * n, []
    for length in lengths:
        keys.append(bytes(data[at:at + length]).decode())
        at += length
    return keys, data[h["payload_offset"]:h["payload_offset"] + h["payload_size"]]


def _passes(fuse, layout="channels_last"):
    passes = builder.PASSES_ALL if fuse else builder.PASSES_ALL & ~builder.PASS_FUSE_ELEMENTWISE
    return passes if layout == "channels_last" else passes & ~builder.PASS_CHANNELS_LAST


def build_blob(edge_program, precision=Precision.FP32, fuse=True,
               layout="channels_last", weights=None) -> bytes:
    """Edge program of one partition -> engine blob: lowered here, built by the C++ builder
    (fuse=False keeps every elementwise op its own kernel, the form fusion is checked against;
    layout="nchw" keeps conv nets NCHW; weights="int8" quantizes constant matmul weights)."""
    return builder.build_blob(lower_graph(edge_program, precision, weights), _passes(fuse, layout))


def build_variant_set(edge_program, precision=Precision.FP32, layout="channels_last",
                      weights=None) -> bytes:
    """A partition with bounded dynamic sizes -> a variant set: the partition lowered once per
    assignment of its symbols and built (with every pass) by the C++ builder, each blob serving
    the delegate input shapes of its own lowering."""
    symbols = program_symbols(edge_program)
    ranges = getattr(edge_program, "range_constraints", None)
    return builder.build_variant_set([lower_graph(specialise(edge_program, a), precision, weights,
                                                  merge_one_row=False)
                                      for a in assignments(symbols, ranges)],
                                     _passes(True, layout))
