"""The `kiln` flow of ExecuTorch's backend test suite (executorch/backends/test/suite, shipped in
the pinned wheel), as a pytest plugin, so the suite runs unedited:

    pytest <executorch>/backends/test/suite/operators -p kiln_testing.backend_suite \\
        [--kiln-out DIR]

(tests/suite/run_suite.py is the driver that does this.) Loaded with -p, the plugin is imported
before the suite's conftest.py, which reads `flow.all_flows()` and `runner.run_test` when it is
imported: the plugin makes all_flows() return the kiln flow alone (so every suite test runs once,
as `test_x[kiln-...]`) and wraps run_test to record every subtest's result.

The flow's Tester (KilnTester) lowers with KilnPartitioner (fp32, Kiln's default settings),
serializes, and runs the lowered program where the suite's run step would need the GPU: through
kiln_testing.reference (each Kiln delegate's blob through the reference interpreter, every
operator left outside with torch), compared with eager PyTorch at the suite's own tolerances. So
on the CPU a case passes when it lowers, serializes and the lowered program computes eager's
answer; a lowering error is a test failure (the suite's conftest raises on backend failures).
With --kiln-out DIR, each case that has a Kiln delegate leaves its .pte, its inputs and eager's
outputs in DIR (manifest.json lists them, in tests/gpu_e2e/export_operators.py's format) for
tests/gpu_e2e/check_suite.py to run on the H200 through kiln_runner, and DIR/results.jsonl holds
one line per subtest: the suite's result, the delegated and undelegated operator counts, the
lowering time and the error (bench/suite_summary.py writes the markdown summary from it).
"""
from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import torch
from executorch.backends.test.harness import Tester
from executorch.backends.test.harness.stages import StageType
from executorch.backends.test.harness.stages import ToEdgeTransformAndLower as _Lower
from executorch.backends.test.harness.stages import ToExecutorch as _ToExecutorch
from executorch.backends.test.suite.flow import TestFlow
from executorch.exir import EdgeCompileConfig

from kiln_executorch.aot import KilnPartitioner

from .reference import run_program

# numpy dtype names of the raw files (tests/gpu_e2e/check_operators.py reads them); bfloat16 is
# stored as its 16 bits.
NUMPY = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
         torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
         torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}


def _name_return_types():
    """torch's pytree knows torch.return_types (median's (values, indices), ...) as structseqs
    without a serialized name, so ExecuTorch's emitter cannot write the output spec of a program
    that returns one, whatever runs it: the suite's median tests return median(x, dim) itself.
    The harness names them (their own import path) so those programs serialize; no Kiln code
    depends on it."""
    import warnings

    import torch.utils._pytree as pytree

    for name in ("median", "max", "min", "sort", "topk", "kthvalue", "mode"):
        cls = getattr(torch.return_types, name, None)
        node = pytree.SUPPORTED_NODES.get(cls)
        named = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if node is None or (named is not None and
                            named.serialized_type_name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND):
            continue   # not a pytree node here, or torch names it already
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "already registered": the same functions again
            pytree._private_register_pytree_node(
                cls, node.flatten_fn, node.unflatten_fn,
                serialized_type_name=f"torch.return_types.{name}",
                flatten_with_keys_fn=node.flatten_with_keys_fn)


_name_return_types()


class _KilnLower(_Lower):
    """to_edge_transform_and_lower with KilnPartitioner. The edge compile config is the suite's
    (every flow's): no IR validity check, so a case with an operator outside the core ATen set
    (adaptive_max_pool2d, ...) is judged by the partitioner rather than refused by ExecuTorch's
    verifier before partitioning (kiln_executorch.aot.lower's default config does refuse it)."""

    def __init__(self, partitioners=None, edge_compile_config=None):
        # (The base class keeps `partitioners` only when default_partitioner_cls is given.)
        super().__init__(default_partitioner_cls=KilnPartitioner, partitioners=partitioners,
                         edge_compile_config=edge_compile_config or EdgeCompileConfig(
                             _check_ir_validity=False))


class _KilnToExecutorch(_ToExecutorch):
    def __init__(self, config=None):
        super().__init__(config or KilnPartitioner.executorch_config())


class _State:
    """What the plugin knows across one pytest session."""
    out: Path | None = None      # --kiln-out
    case: str = ""               # the subtest being run (run_test's wrapper sets it)
    staged: str | None = None    # the case name the run step staged, if any
    manifest: list = []


def _save(t: torch.Tensor, path: Path, output: bool = False) -> dict:
    """The tensor's bytes in its physical layout (a channels-last input as the .pte's dim order
    declares it, as the suite's own golden artifacts are written). An eager output that is a view
    with other strides (x.permute(...)) is saved in its logical order: the program writes its
    outputs contiguous, channels-last ones excepted."""
    t = t.detach()
    physical = t.dim() and (not output or (t.dim() == 4 and not t.is_contiguous() and
                                           t.is_contiguous(memory_format=torch.channels_last)))
    t = t.permute(t.dim_order()).contiguous() if physical else t.contiguous()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    path.write_bytes(raw.numpy().tobytes())
    return {"file": path.name, "dtype": NUMPY[t.dtype], "shape": list(t.shape)}


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in _tensors(v)]


class KilnTester(Tester):
    """The suite's Tester for Kiln: KilnPartitioner lowering; the run step runs the lowered edge
    program on the CPU through the reference interpreter (the Kiln delegate needs a GPU)."""

    def __init__(self, module, example_inputs, dynamic_shapes=None):
        stages = Tester.default_stage_classes() | {
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: _KilnLower,
            StageType.TO_EXECUTORCH: _KilnToExecutorch}
        super().__init__(module, example_inputs, stage_classes=stages,
                         dynamic_shapes=dynamic_shapes)

    def to_executorch(self, to_executorch_stage=None):
        # The lowered edge program as partitioning left it: ExecuTorch's to_executorch rewrites
        # parts of that graph in place (out variants, memory planning), which torch cannot run.
        lowered = self.stages[StageType.TO_EDGE_TRANSFORM_AND_LOWER].artifact.exported_program()
        self.lowered_program = copy.deepcopy(lowered)
        return super().to_executorch(to_executorch_stage)

    def run_method_and_compare_outputs(self, stage=None, inputs=None, num_runs=1, atol=1e-03,
                                       rtol=1e-03, qtol=0, statistics_callback=None,
                                       artifact_dir=None, artifact_name=None):
        inputs = inputs if inputs else next(self.generate_random_inputs())
        reference, scale = self._calculate_reference_output(
            self.stages[StageType.EXPORT].artifact, inputs)
        with torch.no_grad():
            actual = run_program(self.lowered_program, inputs)
        self._compare_outputs(reference, tuple(actual), scale, atol, rtol, qtol,
                              statistics_callback)
        if _State.out is not None and self.stages[StageType.SERIALIZE] is not None:
            self._stage(inputs, reference)
        return self

    def _stage(self, inputs, reference):
        """The saved program, its inputs and eager's outputs, for the GPU check."""
        # The method takes the inputs' leaves in order (a tuple of index tensors is flattened).
        leaves = torch.utils._pytree.tree_leaves(tuple(inputs))
        tensors = _tensors(inputs)
        if any(t.dtype not in NUMPY for t in tensors + _tensors(reference)) or \
                len(tensors) != len(leaves):
            return  # not stageable as raw files (the results line says so: no "staged")
        inputs = leaves
        name = _State.case
        (_State.out / f"{name}.pte").write_bytes(self.stages[StageType.SERIALIZE].artifact)
        _State.manifest.append({
            "case": name, "program": f"{name}.pte",
            "inputs": [_save(x, _State.out / f"{name}_input_{i}.bin")
                       for i, x in enumerate(inputs)],
            "expected": [_save(y, _State.out / f"{name}_expected_{j}.bin", output=True)
                         for j, y in enumerate(_tensors(reference))]})
        _State.staged = name
        _write_manifest()  # after each case, so a run cut short keeps what it staged


def _write_manifest():
    (_State.out / "manifest.json").write_text(json.dumps(_State.manifest, indent=1) + "\n")


KILN_TEST_FLOW = TestFlow("kiln", backend="kiln", tester_factory=KilnTester)


def case_name(test_name: str, subtest: int) -> str:
    """A file-name-safe case name: test_add[kiln-float32] subtest 2 -> add_kiln-float32_2."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name.removeprefix("test_")).strip("_")
    return f"{base}_{subtest}"


def _record(summary, seconds):
    delegated = dict(summary.delegated_op_counts or {})
    undelegated = dict(summary.undelegated_op_counts or {})
    error = "" if summary.error is None else f"{type(summary.error).__name__}: {summary.error}"
    return {"test": summary.name, "base": summary.base_name, "subtest": summary.subtest_index,
            "case": _State.case, "result": summary.result.name, "error": error[:600],
            "delegated_ops": delegated, "undelegated_ops": undelegated,
            "lower_s": summary.lower_time.total_seconds() if summary.lower_time else None,
            "total_s": seconds, "staged": _State.staged}


def _install():
    """all_flows() -> the kiln flow only; run_test wrapped to name and record each subtest."""
    import executorch.backends.test.suite.flow as flow
    import executorch.backends.test.suite.runner as runner

    if getattr(runner.run_test, "_kiln", False):
        return
    flow.all_flows = lambda: {KILN_TEST_FLOW.name: KILN_TEST_FLOW}
    original = runner.run_test

    def run_test(model, inputs, flow_, test_name, test_base_name, subtest_index, params,
                 *args, **kwargs):
        _State.case, _State.staged = case_name(test_name, subtest_index), None
        start = time.perf_counter()
        summary = original(model, inputs, flow_, test_name, test_base_name, subtest_index,
                           params, *args, **kwargs)
        if _State.out is not None:
            with (_State.out / "results.jsonl").open("a") as f:
                f.write(json.dumps(_record(summary, time.perf_counter() - start)) + "\n")
        return summary

    run_test._kiln = True
    runner.run_test = run_test


_install()


def pytest_addoption(parser):
    parser.addoption("--kiln-out", type=Path, default=None,
                     help="folder for results.jsonl and the staged programs of the kiln flow")


def pytest_configure(config):
    out = config.getoption("--kiln-out")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.jsonl").write_text("")
        _State.out, _State.manifest = out, []


def pytest_sessionfinish(session, exitstatus):
    if _State.out is not None:
        _write_manifest()
