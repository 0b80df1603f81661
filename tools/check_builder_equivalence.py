#!/usr/bin/env python3
"""Checks that the C++ builder (libkiln_builder.so) writes byte-identical blobs to the Python
pipeline it replaces, for every program the Python AOT tests export plus the bench zoo's small
models (fp32/tf32/fp16/bf16, fused and unfused).

It wraps lowering.build_graph, lowering.build_variant_set and blob_writer.write_blob: each call
runs the Python original, then the C++ builder on a fresh lowering of the same edge program (or on
the same hand-made graph, written as it is), and compares the bytes. Then it runs pytest on
tests/python/aot in this process and the zoo loop. Exit status 1 when any program differs.

Run: PYTHONPATH=python KILN_BUILD_DIR=build .venv/bin/python tools/check_builder_equivalence.py
"""
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from kiln_executorch.aot import blob_writer, builder, lowering  # noqa: E402
from kiln_executorch.aot.blob_format import Precision  # noqa: E402
from kiln_executorch.aot.dynamic import assignments, program_symbols, specialise  # noqa: E402

compared = {"graph": 0, "variant_set": 0, "handmade": 0}
differ = []
orig_build_graph = lowering.build_graph
orig_build_variant_set = lowering.build_variant_set
orig_write_blob = blob_writer.write_blob
inside = [0]


def _passes(fuse):
    return builder.PASSES_ALL if fuse else builder.PASSES_ALL & ~builder.PASS_FUSE_ELEMENTWISE


def checked_build_graph(edge_program, precision=Precision.FP32, fuse=True):
    inside[0] += 1
    try:
        g = orig_build_graph(edge_program, precision, fuse)
        old = orig_write_blob(g)
    finally:
        inside[0] -= 1
    fresh = lowering._Lowering(edge_program).run()
    fresh.precision = precision
    new = builder.build_blob(fresh, _passes(fuse))
    compared["graph"] += 1
    if new != old:
        differ.append(("graph", Precision(precision).name, fuse, len(old), len(new)))
    return g


def checked_build_variant_set(edge_program, precision=Precision.FP32):
    inside[0] += 1
    try:
        old = orig_build_variant_set(edge_program, precision)
    finally:
        inside[0] -= 1
    graphs = []
    for a in assignments(program_symbols(edge_program),
                         getattr(edge_program, "range_constraints", None)):
        g = lowering._Lowering(specialise(edge_program, a)).run()
        g.precision = precision
        graphs.append(g)
    new = builder.build_variant_set(graphs)
    compared["variant_set"] += 1
    if new != old:
        differ.append(("variant_set", Precision(precision).name, True, len(old), len(new)))
    return old


def checked_write_blob(graph):
    old = orig_write_blob(graph)
    if inside[0] == 0:
        # A graph a test made by hand (already planned): the C++ writer alone.
        try:
            new = builder.build_blob(copy.deepcopy(graph), builder.WRITE_ONLY | builder.UNCHECKED)
        except builder.KilnBuilderError as e:
            new = f"error: {e}".encode()
        compared["handmade"] += 1
        if new != old:
            differ.append(("handmade", Precision(graph.precision).name, None, len(old), len(new)))
    return old


def patch():
    lowering.build_graph = checked_build_graph
    lowering.build_variant_set = checked_build_variant_set
    lowering.write_blob = checked_write_blob
    blob_writer.write_blob = checked_write_blob


def zoo():
    import model_zoo
    from kiln_executorch.aot import lower
    for key in model_zoo.ZOO:
        if key == "resnet18":
            continue
        module, inputs = model_zoo.build(key)
        for precision in ("fp32", "tf32", "fp16", "bf16"):
            program = lower(module, tuple(inputs), precision).exported_program()
            for _, m in program.graph_module.named_children():
                if hasattr(m, "processed_bytes"):
                    # preprocess already compared the fused build; add the unfused one.
                    checked_build_graph(m.original_module, Precision[precision.upper()], False)


def corpus():
    """The fuzz seed generator's programs: real exports, a variant set, hand-made blobs."""
    import tempfile
    sys.path.insert(0, str(REPO / "tests" / "fuzz"))
    import make_corpus
    with tempfile.TemporaryDirectory() as tmp:
        make_corpus.exported_blobs(Path(tmp))
        make_corpus.dynamic_blobs(Path(tmp))
    valid = make_corpus.handmade_valid()
    make_corpus.handmade_malformed(valid["matmul_trans_b_bias_epilogue"])


def main():
    patch()
    args = sys.argv[1:]
    if "--no-pytest" in args:
        args.remove("--no-pytest")
    else:
        import pytest
        rc = pytest.main(args or [str(REPO / "tests" / "python" / "aot"), "-q", "-p",
                                  "no:cacheprovider"])
        print(f"pytest exit status {rc}")
    zoo()
    corpus()
    total = sum(compared.values())
    print(f"compared {total} programs byte for byte: {compared}")
    for d in differ:
        print("DIFFERENT:", d)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
