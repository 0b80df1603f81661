"""CI side of the LLM GPU check: export_llm.py writes what check_llm.py needs (the small model in
fp32, bf16 (device-resident, and over host tensors) and bf16 with int8 / int4 weights, each
method one Kiln delegate with no operator left, returning the logits and their argmax,
the weights' digest the GPU side rebuilds, a prompt and eager HF's CPU tokens), the model rebuilt
from config and seed gives the same digest and, through the eager static-cache decoder
check_llm.py times, the same tokens; check_llm.py's divergence rule accepts only near-ties; and the
quantized programs quantize every matmul, with check_llm.py's dequantized reference and floor."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kiln_executorch.aot import read_delegates, read_method_io, read_operators
from kiln_executorch.aot.backend import unwrap_state_keys

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "bench"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("llm")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), KILN_SKIP_DELEGATE_REGISTRATION="1")
    env.pop("KILN_LLM_BENCH", None)
    env.pop("KILN_LLM_VARIANTS", None)
    r = subprocess.run([sys.executable, HERE / "export_llm.py", "--out", out], env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads((out / "meta.json").read_text())


def test_an_unknown_variant_is_refused_before_any_export(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), KILN_SKIP_DELEGATE_REGISTRATION="1")
    r = subprocess.run([sys.executable, HERE / "export_llm.py", "--out", tmp_path,
                        "--variants", "bf16,bf17"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0
    assert "unknown variants ['bf17']" in r.stderr
    assert not list(tmp_path.glob("*.pte"))


def test_programs_are_one_delegate_per_method_sharing_named_states(exported):
    out, meta = exported
    assert sorted(meta["programs"]) == ["small_bf16", "small_bf16_host", "small_bf16_int4",
                                        "small_bf16_int8", "small_fp32"]
    for key, p in meta["programs"].items():
        pte = out / p["file"]
        assert read_operators(pte, device_copies=False) == {
            "prefill": [], "decode": [], "max_context": [], "prefill_length": [],
            "vocab_size": []}, key
        # Device-resident by default: CUDA inputs and outputs, no et_copy; _host: host tensors.
        io = read_method_io(pte)
        where = "cpu" if key.endswith("_host") else "cuda:0"
        for method in ("prefill", "decode"):
            assert io[method].inputs == [where] * len(io[method].inputs), (key, method)
            assert io[method].outputs == [where, where], (key, method)
            assert bool(io[method].copies) == (where == "cpu"), (key, method)
        keys = {d.method: unwrap_state_keys(d.data)[0] for d in read_delegates(pte)}
        assert keys["prefill"] == keys["decode"] and len(keys["decode"]) == 4, key
        assert len(p["prompt"]) + p["new_tokens"] <= p["max_context"]
        assert len(p["cpu_fp32_expected_tokens"]) == p["new_tokens"]


def test_rebuilt_model_matches_digest_and_tokens(exported):
    import check_llm
    import export_llm
    import real_models
    from kiln_executorch.llm import StaticCacheDecoder, run_generation

    _, meta = exported
    p = meta["programs"]["small_fp32"]
    model = export_llm.build(p["config_name"], p["seed"])
    assert real_models.weights_digest(model) == p["digest"]
    decoder = StaticCacheDecoder(model, p["max_context"]).eval()

    def run(method, inputs):
        with torch.no_grad():
            return list(decoder(*inputs))

    tokens, logits = run_generation(run, p["prompt"], p["new_tokens"], p["prefill_length"],
                                    p["max_context"])
    assert tokens == p["cpu_fp32_expected_tokens"]
    assert check_llm.first_divergence(tokens, tokens, logits) == (len(tokens), False)
    near = [t.clone() for t in logits]
    other = list(tokens)
    second = int(torch.topk(near[3], 2).indices[1])
    near[3][second] = near[3][tokens[3]] - 1e-4 * float(near[3].abs().max())
    other[3] = second
    assert check_llm.first_divergence(other, tokens, near) == (3, True)
    far = [t.clone() for t in logits]
    far[3] = torch.zeros_like(far[3])
    far[3][tokens[3]] = 1.0
    assert check_llm.first_divergence(other, tokens, far) == (3, False)


def test_int8_program_quantizes_every_matmul_and_check_llm_rebuilds_its_reference(exported):
    import check_llm
    import export_llm
    from kiln_executorch.aot import blob_format as bf
    from kiln_executorch.quantize import fake_quantize
    from kiln_testing.blob_reader import read_blob

    out, meta = exported
    p = meta["programs"]["small_bf16_int8"]
    assert (p["precision"], p["weights"], p["quantized_from"]) == ("bf16", "int8", "fp32")
    for d in read_delegates(out / p["file"]):
        ops = [op.opcode for op in read_blob(unwrap_state_keys(d.data)[1]).ops]
        assert bf.Opcode.QUANT_MATMUL in ops and bf.Opcode.MATMUL not in ops, d.method
    model = export_llm.build(p["config_name"], p["seed"])
    head = fake_quantize(model.lm_head.weight).to(torch.bfloat16)
    embedding = model.model.embed_tokens.weight.to(torch.bfloat16)
    ref = check_llm.reference_model(model, p)
    assert ref.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(ref.lm_head.weight, head)
    assert torch.equal(ref.model.embed_tokens.weight, embedding)
    # The decode floor counts the linears at a byte a weight.
    plain = check_llm.weight_bytes(ref, None)
    assert check_llm.weight_bytes(ref, "int8") < 0.6 * plain
    assert check_llm.weight_bytes(ref, "int4") < 0.75 * check_llm.weight_bytes(ref, "int8")
    p4 = meta["programs"]["small_bf16_int4"]
    assert p4["weights"] == "int4"
    for d in read_delegates(out / p4["file"]):
        ops = read_blob(unwrap_state_keys(d.data)[1]).ops
        assert {(op.operands["bits"], op.operands["group_size"]) for op in ops
                if op.opcode == bf.Opcode.QUANT_MATMUL} == {(4, 128)}, d.method
