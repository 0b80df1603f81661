"""KV caches as state inside a Kiln delegate (../shared/fixtures/kv_cache_decode).

The exported .pte keeps the caches inside the Kiln delegate (no index_put/copy_ left to
ExecuTorch), the blob declares them as kState tensors written by kIndexPut, the reference
executor reproduces the fixture's three decode steps and the caches after step 3 from one loaded
blob, bad positions are rejected, and tests/gpu_e2e/export_kv_cache.py writes what the GPU check
reads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

from kiln_executorch.aot import export, read_delegates, read_operators  # noqa: E402
from kiln_executorch.aot.blob_format import Opcode, Storage  # noqa: E402
from kiln_testing.blob_reader import read_blob  # noqa: E402
from kiln_testing.reference import BlobExecutionError, ReferenceEngine, run_blob  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "examples" / "tiny_lm"))
import export_tiny_lm  # noqa: E402
FOLDER = models.FIXTURES / "kv_cache_decode"


def fixture_steps():
    meta = json.loads((FOLDER / "meta.json").read_text())
    (plan,) = meta["methods"]
    steps = []
    for case in plan["cases"]:
        inputs = [models._read_tensor(FOLDER / s["file"], s) for s in case["inputs"]]
        expected = models._read_tensor(FOLDER / case["outputs"][0]["file"], case["outputs"][0])
        steps.append((inputs, expected))
    state = [models._read_tensor(FOLDER / s["file"], s) for s in plan["cases"][-1]["state_after"]]
    return steps, state


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def exported(request, tmp_path_factory):
    f = models.kv_cache_decode()
    path = tmp_path_factory.mktemp("kv") / f"kv_cache_{request.param}.pte"
    export(f.module, f.inputs, path, precision=request.param)
    return request.param, path


def test_caches_live_inside_one_kiln_delegate(exported):
    precision, path = exported
    assert read_operators(path, device_copies=False) == {"forward": []}     # no aten::index_put / aten::copy_ left
    (delegate,) = read_delegates(path)
    assert delegate.backend_id == "KilnBackend"
    g = read_blob(delegate.data)
    state_offsets = {t.offset for t in g.tensors if t.storage == Storage.STATE}
    assert len(state_offsets) == 2                      # k_cache and v_cache
    writes = [op for op in g.ops if op.opcode == Opcode.INDEX_PUT]
    assert len(writes) == 2
    assert {g.tensors[op.out].storage for op in writes} == {Storage.STATE}
    # The delegate's I/O is x, input_pos -> y: the caches are neither inputs nor outputs.
    assert [g.tensors[t].shape for t in g.inputs] == [(1, 1, 32), (1,)]
    assert [g.tensors[t].shape for t in g.outputs] == [(1, 1, 32)]
    low = torch.bfloat16 if precision == "bf16" else torch.float32
    assert {g.tensors[op.out].dtype for op in writes} == {low}


def test_reference_reproduces_the_fixture_decode_and_state(exported):
    precision, path = exported
    (delegate,) = read_delegates(path)
    steps, state_after = fixture_steps()
    tol = 1e-5 if precision == "fp32" else 3e-2
    for compute in (torch.float64, torch.float32):
        engine = ReferenceEngine(delegate.data, compute)
        for k, (inputs, expected) in enumerate(steps):
            (y,) = engine.run(inputs)
            err = (y.double() - expected.double()).abs().max().item()
            assert err <= tol, f"step {k + 1}: {err}"
        for got, want in zip(engine.states(), state_after):
            assert (got.double() - want.double()).abs().max().item() <= tol


def test_a_step_reads_what_the_previous_step_wrote(exported):
    _, path = exported
    (delegate,) = read_delegates(path)
    steps, _ = fixture_steps()
    (fresh,) = run_blob(delegate.data, steps[1][0])     # step 2 without step 1
    assert (fresh - steps[1][1]).abs().max().item() > 1e-2


@pytest.mark.parametrize("position", [32, -1, 1 << 40])
def test_bad_positions_are_rejected_and_state_is_kept(exported, position):
    _, path = exported
    (delegate,) = read_delegates(path)
    steps, _ = fixture_steps()
    engine = ReferenceEngine(delegate.data)
    engine.run(steps[0][0])
    before = engine.states()
    x = steps[1][0][0]
    with pytest.raises(BlobExecutionError, match=f"index_put position {position} outside"):
        engine.run([x, torch.tensor([position])])
    for a, b in zip(before, engine.states()):
        assert torch.equal(a, b)
    (y,) = engine.run(steps[1][0])                       # still usable, state intact
    tol = 1e-5 if exported[0] == "fp32" else 3e-2
    assert (y.double() - steps[1][1].double()).abs().max().item() <= tol


def test_only_index_put_writes_state():
    f = models.kv_cache_decode()
    from kiln_executorch.aot import lower
    from kiln_executorch.aot import builder
    edge = lower(f.module, f.inputs)
    (lowered,) = [m for _, m in edge.exported_program().graph_module.named_children()
                  if hasattr(m, "processed_bytes")]
    g = read_blob(lowered.processed_bytes)
    fill = next(op for op in g.ops if op.opcode == Opcode.MATMUL)
    state = next(t.id for t in g.tensors if t.storage == Storage.STATE)
    fill.operands["out"] = state
    for t in g.tensors:                                  # read_blob leaves no alias links
        t.alias_of = None
    with pytest.raises(BlobExecutionError, match="only INDEX_PUT writes state"):
        # Written as it is and unchecked: the runtime's reader would refuse it before the
        # reference interpreter could.
        run_blob(builder.build_blob(g, builder.UNCHECKED), f.inputs)


def test_gpu_e2e_export_writes_programs_and_steps(tmp_path):
    script = REPO / "tests" / "gpu_e2e" / "export_kv_cache.py"
    r = subprocess.run([sys.executable, script, "--out", tmp_path], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert set(meta["programs"]) == {"fp32", "bf16"}
    for precision, program in meta["programs"].items():
        path = tmp_path / program["file"]
        assert read_operators(path, device_copies=False) == {"forward": []}
        assert [d.backend_id for d in read_delegates(path)] == ["KilnBackend"]
        assert program["delegates"] == 1 and program["cpu_operators"] == []
        assert path.stat().st_size < 1 << 20
    assert len(meta["steps"]) >= 3
    steps, _ = fixture_steps()
    for k, s in enumerate(meta["steps"]):
        for name in ("x", "pos", "expected"):
            assert (tmp_path / s[name]).is_file()
        assert s["position"] == k
        if k < len(steps):    # the fixture's own steps and eager outputs
            expected = torch.frombuffer(bytearray((tmp_path / s["expected"]).read_bytes()),
                                        dtype=torch.float32)
            assert torch.allclose(expected, steps[k][1].reshape(-1), atol=1e-5)
    # 32 float32 values each way, the position in, and the engine's 32-byte error flag out
    # (runtime/engine/step.h's DeviceErrorFlag, which export_kv_cache reads).
    assert meta["error_flag_bytes"] == 32
    assert meta["copy_per_step"] == {"host_to_device": 136, "device_to_host": 160}
    lm = meta["tiny_lm"]
    assert (tmp_path / "tiny_lm" / lm["model"]).is_file()
    assert len(lm["expected_tokens"]) == len(lm["prompt"]) + lm["new_tokens"]
    assert (tmp_path / meta["bad_position_file"]).read_bytes() == \
        torch.tensor([32]).numpy().tobytes()


def test_tiny_lm_example_is_one_delegate_and_the_reference_generates_its_tokens(tmp_path):
    """examples/tiny_lm: embedding, 2 attention layers with KV caches (4 heads: the caches are
    written at dim 2 of [1, 4, 64, 16]) and MLPs, all in one Kiln delegate; decoding the blob with
    the reference executor, one call per token with state carried over, picks eager's tokens."""
    meta = export_tiny_lm.write(tmp_path, new_tokens=12)
    pte = tmp_path / meta["model"]
    assert read_operators(pte, device_copies=False) == {"forward": []}
    (delegate,) = read_delegates(pte)
    g = read_blob(delegate.data)
    assert len({t.offset for t in g.tensors if t.storage == Storage.STATE}) == 4
    assert sum(op.opcode == Opcode.INDEX_PUT for op in g.ops) == 4
    engine = ReferenceEngine(delegate.data, torch.float32)
    tokens = list(meta["prompt"])
    expected = meta["expected_tokens"]
    for pos in range(len(expected) - 1):
        (logits,) = engine.run([torch.tensor([[tokens[pos]]]), torch.tensor([pos])])
        if pos >= len(meta["prompt"]) - 1:
            tokens.append(int(logits.reshape(-1).argmax()))
    assert tokens == expected
    assert (tmp_path / "expected_tokens.txt").read_text().split() == [str(t) for t in expected]
