"""Export programs where Kiln and another backend share one graph, and check from the saved .pte
that each really has the partitioning it is meant to have.

Programs written to --out (each NAME.pte with NAME.expected beside it):

  coalesced     cos(erfinv(tanh(x))), x [64,64]. Partitioners: Kiln with
                exclude_ops=[aten.erfinv.default] first, then XNNPACK from the executorch wheel.
                Kiln could run all three ops as one partition; told to leave erfinv out, it takes
                tanh and cos, XNNPACK does not take erfinv either, so it stays on ExecuTorch's CPU
                kernels between two Kiln partitions: Kiln -> CPU erfinv -> Kiln.
  mixed         cos(linear(tanh(x))) + x, x [64,64]. Partitioners: XNNPACK restricted to linear
                first, then Kiln. XNNPACK owns the linear in the middle, Kiln the pieces on either
                side, so tensors cross Kiln -> XNNPACK and XNNPACK -> Kiln: Kiln -> XNNPACK -> Kiln.
  xnnpack_only  the mixed module with XNNPACK alone (no Kiln): runs on any CPU.

Each program's expectation (the order its method calls delegates and CPU kernels) is stated in
PROGRAMS below and checked against what the saved file carries (read_delegates, read_operators
and the method's instruction list); a partitioning change that turns a program into something
else fails this script instead of passing quietly.

Also written per program: NAME.input_0.bin (a random input, raw float32), NAME.output_0.bin
(eager PyTorch's output for it) and manifest.json describing all of it. NAME.expected is the
format of shared/fixtures/README.md (`ones.expected`): output shape, then the first 8 values of
eager PyTorch's output for an all-ones input, printf %.6g; check a run with
`kiln_runner NAME.pte | tools/kiln-verify --expected NAME.expected --atol 1e-3`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAPE = (64, 64)
CPU = "cpu"           # a KernelCall on ExecuTorch's kernels, in a program's expected sequence


class Coalesced(torch.nn.Module):
    def forward(self, x):
        return torch.cos(torch.erfinv(torch.tanh(x)))


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(SHAPE[1], SHAPE[1])

    def forward(self, x):
        return torch.cos(self.fc(torch.tanh(x))) + x


def kiln(precision, exclude_ops=None):
    from kiln_executorch.aot import KilnPartitioner
    return KilnPartitioner(precision=precision, exclude_ops=exclude_ops)


def xnnpack(only=None):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    return XnnpackPartitioner(configs=only) if only else XnnpackPartitioner()


def xnnpack_linear_only():
    from executorch.backends.xnnpack.partition.config.gemm_configs import AddmmConfig, LinearConfig
    return xnnpack([LinearConfig, AddmmConfig])


# A Kiln delegate call as the saved method runs it: ExecuTorch copies its inputs to the GPU and its
# outputs back with the et_copy kernels around the call (Kiln delegates declare device cuda:0).
KILN = [f"{CPU}:et_copy::_h2d_copy.out", "KilnBackend", f"{CPU}:et_copy::_d2h_copy.out"]

# name -> module, partitioners (in order), and the sequence the saved method must execute:
# backend ids for delegate calls, "cpu:<operator>" for kernel calls.
PROGRAMS = {
    "coalesced": dict(
        module=Coalesced,
        partitioners=lambda p: [kiln(p, exclude_ops=[torch.ops.aten.erfinv.default]), xnnpack()],
        sequence=[*KILN, f"{CPU}:aten::erfinv.out", *KILN],
        why="erfinv: KilnPartitioner(exclude_ops=[aten.erfinv.default]) leaves it out of Kiln and "
            "XNNPACK does not support it, so ExecuTorch's CPU kernel runs it between two Kiln "
            "partitions (tanh, cos)"),
    "mixed": dict(
        module=Mixed, partitioners=lambda p: [xnnpack_linear_only(), kiln(p)],
        sequence=[*KILN, "XnnpackBackend", KILN[0], *KILN],  # the second Kiln call reads 2 inputs
        why="XNNPACK owns the linear between Kiln's tanh and Kiln's cos + add: tensors cross "
            "Kiln -> XNNPACK and XNNPACK -> Kiln"),
    "xnnpack_only": dict(
        module=Mixed, partitioners=lambda p: [xnnpack()],
        sequence=["XnnpackBackend"],
        why="the mixed module on XNNPACK alone: a program any CPU runs"),
}


def execution_sequence(pte: Path, method: str = "forward") -> list[str]:
    """The method's delegate and kernel calls in execution order, read from the saved file."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall
    from kiln_executorch.aot import read_delegates, read_operators

    plan = next(p for p in deserialize_pte_binary(pte.read_bytes()).program.execution_plan
                if p.name == method)
    backends = {d.index: d.backend_id for d in read_delegates(pte) if d.method == method}
    operators = read_operators(pte)[method]
    seq = []
    for chain in plan.chains:
        for ins in chain.instructions:
            a = ins.instr_args
            if isinstance(a, DelegateCall):
                seq.append(backends[a.delegate_index])
            elif isinstance(a, KernelCall):
                seq.append(f"{CPU}:{operators[a.op_index]}")
    return seq


def expected_text(y: torch.Tensor) -> str:
    return ("[" + ",".join(map(str, y.shape)) + "]\n"
            + " ".join(f"{v:.6g}" for v in y.flatten()[:8].tolist()) + "\n")


def export_one(name: str, out: Path, precision: str) -> dict:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from kiln_executorch.aot import read_delegates, read_operators
    from kiln_executorch.aot.export import NON_CORE_CPU_OPS

    spec = PROGRAMS[name]
    torch.manual_seed(0)
    model = spec["module"]().eval()
    ones = torch.ones(SHAPE)
    # Inside tanh's steep part but away from erfinv's poles at +-1, so the check stays well posed.
    x = torch.rand(SHAPE, generator=torch.Generator().manual_seed(1)) * 4 - 2
    with torch.no_grad():
        ep = torch.export.export(model, (ones,))
        edge = to_edge_transform_and_lower(
            ep, partitioner=spec["partitioners"](precision),
            compile_config=EdgeCompileConfig(_core_aten_ops_exception_list=NON_CORE_CPU_OPS))
        pte = out / f"{name}.pte"
        pte.write_bytes(edge.to_executorch().buffer)
        y_ones, y_x = model(ones), model(x)

    seq = execution_sequence(pte)
    if seq != spec["sequence"]:
        raise SystemExit(f"export_coalesced: {pte} executes {seq}, expected {spec['sequence']} "
                         f"({spec['why']}). The partitioning changed: update PROGRAMS if that is "
                         f"intended.")
    (out / f"{name}.expected").write_text(expected_text(y_ones))
    x.numpy().tofile(out / f"{name}.input_0.bin")
    y_x.numpy().tofile(out / f"{name}.output_0.bin")
    return {
        "pte": pte.name, "expected": f"{name}.expected", "why": spec["why"],
        "sequence": seq,
        "delegates": [d.backend_id for d in read_delegates(pte)],
        "operators": read_operators(pte)["forward"],
        "input_shape": list(SHAPE), "input_file": f"{name}.input_0.bin",
        "output_shape": list(y_x.shape), "output_file": f"{name}.output_0.bin",
        "needs_gpu": "KilnBackend" in seq,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "examples" / "coalesced")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"],
                    help="Kiln's compute precision (XNNPACK and the CPU kernels run fp32)")
    ap.add_argument("--programs", default=",".join(PROGRAMS),
                    help=f"comma-separated subset of {','.join(PROGRAMS)}")
    args = ap.parse_args(argv)
    names = [n for n in args.programs.split(",") if n]
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        ap.error(f"unknown program(s) {unknown}; choose from {list(PROGRAMS)}")
    args.out.mkdir(parents=True, exist_ok=True)

    # Kiln's elementwise pieces in fp32 agree with eager to ~1e-6; fp16/bf16 keep activations in
    # that type between Kiln's ops.
    atol = 1e-3 if args.precision in ("fp32", "tf32") else 5e-2
    manifest = {"precision": args.precision, "atol": atol, "programs": {}}
    for name in names:
        entry = export_one(name, args.out, args.precision)
        manifest["programs"][name] = entry
        print(f"{name}: {args.out / entry['pte']} executes {' -> '.join(entry['sequence'])} "
              f"({entry['why']})")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
