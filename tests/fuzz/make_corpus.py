#!/usr/bin/env python3
"""Regenerates the blob reader fuzzer's seed corpus, tests/fuzz/corpus/.

Candidates:
- real engine blobs: every KilnBackend delegate of the fixture modules (tests/python/models.py)
  exported with KilnPartitioner in fp32 and bf16. Modules whose weights are large are shrunk to a
  few thousand parameters with the same structure (same ops, same partitioning): the reader never
  looks at weight bytes, and every mutation that lands in a weight is a wasted execution.
  Coalesced (tanh -> erfinv -> cos) is one fused delegate, in bf16 with float32 steps inside;
- an op-mix module that reaches the opcodes and kinds the fixtures do not (where, comparisons,
  reductions, average pooling with ceil mode, cat/slice/permute copies, integer math, clamp, ...);
- a variant set (a bounded dynamic batch: several plans, one shared weights section) and a
  truncated one;
- handmade blobs written by the C++ builder's writer (no passes; the malformed ones unchecked): one small valid graph per opcode and a few
  edge cases (empty graph, zero-element tensors, views of an argument, a bias-less matmul) plus
  malformed ones (magic only, another format version, a truncated header, a blob_size that lies,
  amax over an empty axis).
  libFuzzer always tries the empty input itself, and the replay test checks it and a null pointer.

The candidates are then minimised with the fuzzer's own -merge=1 (only inputs that add coverage are
kept; `bash scripts/fuzz.sh 0` builds the fuzzer) and the survivors replace tests/fuzz/corpus/
under readable names. --no-merge keeps every candidate.

Run: PYTHONPATH=python KILN_SKIP_DELEGATE_REGISTRATION=1 .venv/bin/python tests/fuzz/make_corpus.py
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fuzz" / "corpus"
FUZZER = REPO / "build-fuzz" / "blob_reader_fuzzer"
MAX_CORPUS_BYTES = 2 * 1024 * 1024

os.environ.setdefault("KILN_SKIP_DELEGATE_REGISTRATION", "1")
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import models  # noqa: E402
from kiln_executorch.aot import export, read_delegates  # noqa: E402
from kiln_executorch.aot.backend import unwrap_state_keys  # noqa: E402
from kiln_executorch.aot import blob_format as bf  # noqa: E402
from kiln_executorch.aot import builder  # noqa: E402
from kiln_executorch.aot.ir import Graph  # noqa: E402


# --- Real blobs from exported modules ---------------------------------------------------------

class OpMix(nn.Module):
    """Ops the fixture modules do not reach: where, comparisons, logical ops, reductions, average
    pooling (ceil mode, count_include_pad off), strided copies (cat, slice, permute), integer math,
    clamp, leaky_relu, hardswish, division and pow."""

    def forward(self, x, ids):
        y = x.permute(0, 1, 3, 2)[:, :, 1:, :]                      # strided copy
        y = torch.cat([y, y * 0.5], dim=2)
        m = y > 0.1
        y = torch.where(m & (y < 2.0), F.hardswish(y), F.leaky_relu(y, 0.2))
        y = torch.clamp(y, -1.0, 1.5) / (y.abs() + 2.0) + y.pow(2.0)
        p = F.avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        r = p.amax(dim=-1) + p.mean(dim=(2, 3), keepdim=False)[..., None] - p.sum(-1)
        k = (ids * 3 + 1) % 7 - ids // 2                              # integer math
        return torch.log_softmax(r, dim=-1), k, m.any(dim=-1)


def shrunk_mlp():
    torch.manual_seed(0)
    m = models.Mlp()
    m.fc1, m.fc2 = nn.Linear(16, 32), nn.Linear(32, 10)
    return m.eval(), (torch.randn(8, 16),)


def shrunk_cnn():
    torch.manual_seed(0)
    m = models.CnnSmall()
    m.conv1, m.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
    m.conv2, m.fc = nn.Conv2d(4, 8, 3, padding=1), nn.Linear(8, 10)
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.2, 0.2)
        m.bn.running_var.uniform_(0.6, 1.4)
    return m.eval(), (torch.randn(1, 3, 8, 8),)


def shrunk_transformer():
    torch.manual_seed(0)
    return models.TransformerBlock(d_model=16, heads=4).eval(), (torch.randn(1, 8, 16),)


def shrunk_embedding_lm():
    torch.manual_seed(0)
    m = models.EmbeddingLm()
    m.emb, m.proj = nn.Embedding(20, 8), nn.Linear(8, 20)
    return m.eval(), (torch.randint(0, 20, (1, 12)),)


def shrunk_kv_cache():
    torch.manual_seed(0)
    m = models.KvCacheDecode(d=8, max_seq=8)
    return m.eval(), (torch.randn(1, 1, 8), torch.tensor([0]))


MODULES = {
    "add_one": lambda: (models.AddOne().eval(), (torch.randn(64, 64),)),
    "coalesced": lambda: (models.Coalesced().eval(), (torch.randn(64, 64),)),
    "mlp": shrunk_mlp,
    "cnn_small": shrunk_cnn,
    "transformer_block": shrunk_transformer,
    "embedding_lm": shrunk_embedding_lm,
    "kv_cache_decode": shrunk_kv_cache,
    "op_mix": lambda: (OpMix().eval(), (torch.randn(1, 2, 6, 5), torch.randint(0, 9, (4, 3)))),
}
PRECISIONS = ("fp32", "bf16")


def exported_blobs(tmp: Path) -> dict[str, bytes]:
    found = {}
    for name, make in MODULES.items():
        for precision in PRECISIONS:
            module, inputs = make()
            pte = export(module, inputs, tmp / f"{name}-{precision}.pte", precision=precision)
            delegates = [d for d in read_delegates(pte) if d.backend_id == "KilnBackend"]
            if not delegates:
                raise SystemExit(f"make_corpus: {name} ({precision}) exported no Kiln delegate")
            for d in delegates:
                # A stateful delegate's payload wraps the engine blob with its state names:
                # the fuzzer reads engine blobs.
                found[f"{name}-{precision}-{d.index}"] = unwrap_state_keys(d.data)[1]
    return found


def dynamic_blobs(tmp: Path) -> dict[str, bytes]:
    """A variant set (the shrunk MLP with batch 1..3: three plans sharing one weights section) and
    the same set cut short."""
    module, inputs = shrunk_mlp()
    batch = torch.export.Dim("batch", min=1, max=3)
    pte = export(module, (inputs[0][:2],), tmp / "dynamic_mlp.pte", dynamic_shapes=({0: batch},))
    (d,) = read_delegates(pte)
    return {"dynamic_mlp-fp32-0": d.data,
            "handmade-malformed_variant_set_truncated": d.data[:len(d.data) // 2]}


# --- Handmade blobs ---------------------------------------------------------------------------

def _io(g: Graph, dtype, shape, storage, index):
    tid = g.add_tensor(dtype, shape, storage=storage, offset=index)
    (g.inputs if storage == bf.Storage.INPUT else g.outputs).append(tid)
    return tid


def _plan(g: Graph, checked=True):
    """Places every arena tensor (non-view) one after the other, 256-byte aligned, and writes the
    graph as it is (checked by the runtime's reader unless it is malformed on purpose)."""
    offset = 0
    for t in g.tensors:
        if t.storage == bf.Storage.ARENA and t.alias_of is None:
            t.offset = offset
            offset += (t.nbytes + bf.ARENA_ALIGNMENT - 1) // bf.ARENA_ALIGNMENT * bf.ARENA_ALIGNMENT
    g.arena_size = offset
    return builder.build_blob(g, builder.WRITE_ONLY if checked else builder.UNCHECKED)


def contiguous(shape):
    strides, s = [], 1
    for d in reversed(shape):
        strides.insert(0, s)
        s *= d
    return strides


def handmade_valid() -> dict[str, bytes]:
    f32, f16, i64, i32, b = torch.float32, torch.float16, torch.int64, torch.int32, torch.bool
    IN, OUT = bf.Storage.INPUT, bf.Storage.OUTPUT
    blobs = {"empty_graph": _plan(Graph())}

    g = Graph()
    x = _io(g, f32, (2, 3, 4), IN, 0)
    out = _io(g, f16, (4, 3, 2), OUT, 0)
    g.add_op(bf.Opcode.COPY, x=x, out=out, rank=3, sizes=[4, 3, 2], in_offset=23,
             in_strides=[-1, -4, -12], out_offset=0, out_strides=contiguous([4, 3, 2]))
    blobs["copy_negative_strides_cast"] = _plan(g)

    g = Graph(precision=bf.Precision.FP16)
    a = _io(g, f32, (3, 1), IN, 0)
    c = _io(g, b, (3, 4), OUT, 0)
    s = g.add_tensor(f32, (3, 4))
    g.add_op(bf.Opcode.BINARY, kind=bf.BinaryKind.SUB, a=a, b=-1, out=s, alpha=2.0, scalar=0.5,
             rank=2, sizes=[3, 4], a_strides=[1, 0], b_strides=[0, 0])
    g.add_op(bf.Opcode.BINARY, kind=bf.BinaryKind.GE, a=s, b=a, out=c, alpha=1.0, scalar=0.0,
             rank=2, sizes=[3, 4], a_strides=[4, 1], b_strides=[1, 0])
    blobs["binary_scalar_and_broadcast_compare"] = _plan(g)

    g = Graph()
    cond = _io(g, b, (4,), IN, 0)
    a = _io(g, i32, (4,), IN, 1)
    out = _io(g, i32, (2, 4), OUT, 0)
    w = g.add_weight(torch.tensor([7], dtype=i32))
    g.add_op(bf.Opcode.WHERE, cond=cond, a=a, b=w, out=out, rank=2, sizes=[2, 4],
             cond_strides=[0, 1], a_strides=[0, 1], b_strides=[0, 0])
    blobs["where_broadcast_weight"] = _plan(g)

    # A fused program: bf16 and Bool inputs read through broadcast strides, every form.
    g = Graph()
    x = _io(g, torch.bfloat16, (2, 3, 4), IN, 0)
    bias = _io(g, f32, (3,), IN, 1)
    cond = _io(g, b, (2, 1, 4), IN, 2)
    out = _io(g, f32, (2, 3, 4), OUT, 0)
    d = bf.double_to_bits
    program = [bf.FusedForm.BINARY, bf.BinaryKind.ADD, 0, 1, -1, d(0.5), d(0.0), bf.DType.BFLOAT16,
               bf.FusedForm.UNARY, bf.UnaryKind.HARDSWISH, 3, -1, -1, d(0.0), d(0.0),
               bf.DType.FLOAT32,
               bf.FusedForm.WHERE, 0, 2, 4, 0, d(0.0), d(0.0), bf.DType.FLOAT32]
    g.add_op(bf.Opcode.FUSED_ELEMENTWISE, out=out, rank=3, sizes=[2, 3, 4], num_inputs=3,
             inputs=[x, bias, cond], strides=[12, 4, 1, 0, 1, 0, 4, 0, 1], num_instrs=3,
             program=[int(v) for v in program])
    blobs["fused_elementwise_broadcast_where"] = _plan(g)

    g = Graph(precision=bf.Precision.TF32)
    a = _io(g, f32, (2, 3, 4), IN, 0)
    wt = g.add_weight(torch.arange(20, dtype=f32).reshape(5, 4))
    bias = g.add_weight(torch.ones(5, dtype=f32))
    residual = _io(g, f32, (2, 3, 5), IN, 1)
    out = _io(g, f32, (2, 3, 5), OUT, 0)
    g.add_op(bf.Opcode.MATMUL, a=a, b=wt, bias=bias, out=out, batch=2, M=3, N=5, K=4, trans_a=0,
             trans_b=1, a_batch_stride=12, b_batch_stride=0, bias_row_stride=0,
             bias_col_stride=1, alpha=1.0, beta=1.0, epilogue=bf.Epilogue.GELU_TANH,
             residual=residual)
    blobs["matmul_trans_b_bias_residual_epilogue"] = _plan(g)

    g = Graph()
    x = _io(g, f32, (2, 3, 4), IN, 0)
    sm = g.add_tensor(f32, (2, 3, 4))
    ln = g.add_tensor(f32, (2, 3, 4))
    out = _io(g, b, (2, 4), OUT, 0)
    g.add_op(bf.Opcode.SOFTMAX, x=x, out=sm, outer=2, dim=3, inner=4, is_log=1)
    g.add_op(bf.Opcode.LAYER_NORM, x=sm, weight=-1, bias=-1, out=ln, rows=6, cols=4, eps=1e-5, rms=0)
    g.add_op(bf.Opcode.REDUCE, kind=bf.ReduceKind.ANY, x=ln, out=out, outer=2, reduce=3, inner=4)
    blobs["softmax_layer_norm_reduce_any"] = _plan(g)

    g = Graph()
    ids = _io(g, i32, (5,), IN, 0)
    table = g.add_weight(torch.arange(12, dtype=f32).reshape(4, 3))
    out = _io(g, f32, (5, 3), OUT, 0)
    filled = _io(g, i64, (0, 3), OUT, 1)
    g.add_op(bf.Opcode.EMBEDDING, weight=table, indices=ids, out=out, num_indices=5, dim=3, vocab=4)
    g.add_op(bf.Opcode.FILL, out=filled, value=float("nan"))
    blobs["embedding_int32_and_empty_fill"] = _plan(g)

    g = Graph()
    x = _io(g, f32, (1, 4, 5, 5), IN, 0)
    wt = g.add_weight(torch.ones(4, 2, 3, 3, dtype=f32))
    y = g.add_tensor(f32, (1, 4, 3, 3))
    out = _io(g, f32, (1, 4, 2, 2), OUT, 0)
    g.add_op(bf.Opcode.CONV2D, x=x, weight=wt, bias=-1, out=y, N=1, C_in=4, H=5, W=5, C_out=4,
             kH=3, kW=3, stride_h=2, stride_w=2, pad_h=2, pad_w=2, dil_h=2, dil_w=2, groups=2,
             H_out=3, W_out=3, epilogue=bf.Epilogue.RELU6, residual=-1, channels_last=1)
    g.add_op(bf.Opcode.POOL2D, kind=bf.PoolKind.MAX, x=y, out=out, N=1, C=4, H=3, W=3, kH=2,
             kW=2, stride_h=2, stride_w=2, pad_h=0, pad_w=0, dil_h=1, dil_w=1, H_out=2, W_out=2,
             count_include_pad=0, channels_last=1)
    blobs["grouped_dilated_conv_then_ceil_max_pool"] = _plan(g)

    g = Graph()
    x = _io(g, f32, (2, 6), IN, 0)
    view = g.add_tensor(f32, (3, 4), storage=IN, offset=0)          # a view of input 0
    out = _io(g, f32, (12,), OUT, 0)
    g.add_op(bf.Opcode.UNARY, kind=bf.UnaryKind.CLAMP, x=view, out=out, p0=float("-inf"), p1=6.0)
    blobs["unary_on_an_input_view"] = _plan(g)
    del x
    return blobs


def handmade_malformed(valid: bytes) -> dict[str, bytes]:
    header = bf.HEADER.pack(bf.MAGIC, bf.FORMAT_VERSION, bf.HEADER_SIZE, bf.HEADER_SIZE,
                            *([0] * 4), *([bf.HEADER_SIZE] * 3), 0, bf.HEADER_SIZE,
                            bf.HEADER_SIZE, 0, 0, 0, 0, bytes(16))
    newer = bytearray(valid)
    struct.pack_into("<I", newer, 8, bf.FORMAT_VERSION + 1)
    # Well-formed records, but amax over an empty axis has no identity: the reader must refuse.
    g = Graph()
    x = _io(g, torch.float32, (2, 0, 3), bf.Storage.INPUT, 0)
    out = _io(g, torch.float32, (2, 3), bf.Storage.OUTPUT, 0)
    g.add_op(bf.Opcode.REDUCE, kind=bf.ReduceKind.AMAX, x=x, out=out, outer=2, reduce=0, inner=3)
    return {
        "malformed_amax_over_an_empty_axis": _plan(g, checked=False),
        "malformed_magic_only": bf.MAGIC,
        "malformed_header_truncated": header[:60],
        "malformed_newer_format_version": bytes(newer),
        "malformed_blob_size_lies": header[:16] + struct.pack("<Q", 1 << 40) + header[24:],
    }


# --- Minimising and writing -------------------------------------------------------------------

def merge(fuzzer: Path, candidates: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    """Keeps the candidates that libFuzzer's -merge=1 keeps (it names its copies by SHA-1)."""
    raw, kept = tmp / "raw", tmp / "kept"
    raw.mkdir()
    kept.mkdir()
    for name, data in candidates.items():
        (raw / name).write_bytes(data)
    subprocess.run([str(fuzzer), "-merge=1", str(kept), str(raw)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    survivors = {p.name for p in kept.iterdir()}
    return {n: d for n, d in candidates.items() if hashlib.sha1(d).hexdigest() in survivors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fuzzer", type=Path, default=FUZZER,
                        help="the libFuzzer binary used for -merge=1 (bash scripts/fuzz.sh 0 builds it)")
    parser.add_argument("--no-merge", action="store_true", help="keep every candidate")
    parser.add_argument("--out", type=Path, default=CORPUS)
    args = parser.parse_args()
    if not args.no_merge and not args.fuzzer.is_file():
        print(f"make_corpus: no fuzzer at {args.fuzzer}; run `bash scripts/fuzz.sh 0` first or "
              "pass --no-merge", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        valid = handmade_valid()
        candidates = {**exported_blobs(tmp), **dynamic_blobs(tmp),
                      **{f"handmade-{k}": v for k, v in valid.items()}}
        malformed = handmade_malformed(valid["matmul_trans_b_bias_residual_epilogue"])
        candidates.update({f"handmade-{k}": v for k, v in malformed.items()})
        # Identical blobs (an fp32 and a bf16 export with no floating weights) are kept once.
        unique = {}
        for name, data in sorted(candidates.items()):
            unique.setdefault(hashlib.sha1(data).hexdigest(), (name, data))
        candidates = dict(unique.values())
        kept = candidates if args.no_merge else merge(args.fuzzer, candidates, tmp)

    total = sum(len(d) for d in kept.values())
    if total > MAX_CORPUS_BYTES:
        print(f"make_corpus: the corpus would be {total} bytes, over {MAX_CORPUS_BYTES}; shrink a "
              "module", file=sys.stderr)
        return 1
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    for name, data in sorted(kept.items()):
        (args.out / f"{name}.blob").write_bytes(data)
    print(f"make_corpus: {len(kept)} of {len(candidates)} candidates kept, {total} bytes, in "
          f"{args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
