"""A HF transformers Llama decoder as one program with `prefill` and `decode` methods sharing the
KV cache (kiln_executorch.llm): the export (each method one Kiln delegate, no operator left to
ExecuTorch, both naming the same states in a state-key container, the program carrying its
named-data entry) and, on the CPU through the reference interpreter, a chunked prefill followed by
decode steps that give eager HF's greedy tokens and logits (HF run on the whole sequence without a
cache: an independent reference for the cache, the masks and the positions); Qwen3, Qwen2,
Mistral, Gemma and Phi-3 decoders the same way."""

import struct

import pytest
import torch

from executorch.exir._serialize._program import deserialize_pte_binary
from kiln_executorch import llm
from kiln_executorch.aot import blob_format as bf
from kiln_executorch.aot import read_delegates
from kiln_executorch.aot.backend import (PROGRAM_STATE_KEY, unwrap_state_keys,
                                         wrap_state_keys)
from kiln_testing.blob_reader import read_blob
from kiln_testing.reference import ReferenceProgram

MAX_CONTEXT, PREFILL = 48, 8
PROMPT = [1, 72, 105, 33, 9, 200, 17, 5, 44, 3, 90]     # 11 tokens: two prefill chunks
NEW_TOKENS = 24


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                         max_position_embeddings=128, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def edge(model):
    return llm.lower_llm(model, MAX_CONTEXT, PREFILL, precision="fp32")


@pytest.fixture(scope="module")
def pte(model, tmp_path_factory):
    """export_llm's own program (a lowering of its own: to_executorch changes the edge manager
    it runs on, and the reference runs `edge` as lowered)."""
    path = tmp_path_factory.mktemp("llm") / "tiny_llama.pte"
    info = llm.export_llm(model, path, MAX_CONTEXT, PREFILL, precision="fp32")
    return path, info


KEYS = [f"decoder.{kind}_cache_{layer}" for layer in range(2) for kind in ("k", "v")]


def test_each_method_is_one_delegate_naming_the_same_states(pte):
    pte, info = pte
    assert info["methods"] == {"prefill": {"kiln_delegates": 1, "cpu_operators": []},
                               "decode": {"kiln_delegates": 1, "cpu_operators": []}}
    assert (info["max_context"], info["prefill_length"], info["vocab_size"]) == \
        (MAX_CONTEXT, PREFILL, 256)
    delegates = read_delegates(pte)
    assert sorted(d.method for d in delegates) == ["decode", "prefill"]
    for d in delegates:
        keys, payload = unwrap_state_keys(d.data)
        assert keys == KEYS, d.method
        g = read_blob(payload)
        states = {t.offset: t for t in g.tensors if t.storage == bf.Storage.STATE}
        assert [tuple(states[o].shape) for o in sorted(states)] == [(1, 2, MAX_CONTEXT, 16)] * 4
        writes = [op for op in g.ops if op.opcode == bf.Opcode.INDEX_PUT]
        assert len(writes) == 4
        assert any(op.opcode == bf.Opcode.ATTENTION for op in g.ops)
    program = deserialize_pte_binary(pte.read_bytes())
    names = {plan.name for plan in program.program.execution_plan}
    assert {"prefill", "decode", "max_context", "prefill_length", "vocab_size"} <= names
    assert PROGRAM_STATE_KEY in program.named_data.pte_data


def test_prefill_then_decode_gives_eager_greedy_tokens(model, edge):
    ref = ReferenceProgram(edge, torch.float32)
    tokens, logits = llm.run_generation(ref.run, PROMPT, NEW_TOKENS, PREFILL, MAX_CONTEXT)
    want, want_logits = llm.greedy_reference(model, PROMPT, NEW_TOKENS)
    assert tokens == want
    err = max(float((a - b).abs().max()) for a, b in zip(logits, want_logits))
    assert err < 1e-4, err
    # Both methods wrote the one shared cache: rows of the prompt and of every decoded token.
    k0 = ref.state("decoder.k_cache_0")
    assert k0.shape == (1, 2, MAX_CONTEXT, 16)
    written = len(PROMPT) + NEW_TOKENS - 1
    assert bool((k0[0, :, :written].abs().sum(-1) > 0).all())


def test_methods_do_not_share_without_keys_and_states_stay_per_program(model, edge):
    """Two loads (two ReferencePrograms) keep separate caches: decoding on a fresh load without
    its prefill gives other logits than after the prefill."""
    first = ReferenceProgram(edge, torch.float32)
    llm.run_generation(first.run, PROMPT, 1, PREFILL, MAX_CONTEXT)
    after_prefill, _ = first.run("decode", [torch.tensor([[7]]), torch.tensor([len(PROMPT)])])
    second = ReferenceProgram(edge, torch.float32)
    without, _ = second.run("decode", [torch.tensor([[7]]), torch.tensor([len(PROMPT)])])
    assert float((after_prefill - without).abs().max()) > 1e-3


def test_mismatched_state_declarations_are_refused(edge):
    ref = ReferenceProgram(edge, torch.float32)
    ref.run("decode", [torch.tensor([[1]]), torch.tensor([0])])
    dtype, shape, buf = ref.shared[KEYS[0]]
    ref.shared[KEYS[0]] = (dtype, (1, 2, MAX_CONTEXT * 2, 16), buf)   # as if declared otherwise
    with pytest.raises(ValueError, match="decoder.k_cache_0"):
        ref.run("prefill", [torch.zeros(1, PREFILL, dtype=torch.int64), torch.arange(PREFILL),
                            torch.tensor([0])])


def test_state_key_container_round_trips_and_checks_the_count(pte):
    (d, *_) = read_delegates(pte[0])
    keys, payload = unwrap_state_keys(d.data)
    assert wrap_state_keys(keys, payload) == bytes(d.data)
    magic, version, header_size, n, _, size, offset, payload_size = \
        bf.SKEYS_HEADER.unpack_from(d.data)
    assert (magic, version, header_size, size, n) == (b"KILNSKEY", 1, 48, len(d.data), 4)
    assert offset % 8 == 0 and offset + payload_size == size
    assert struct.unpack_from("<4I", d.data, 48) == tuple(len(k) for k in KEYS)
    with pytest.raises(ValueError, match="owns 3 state buffers"):
        wrap_state_keys(keys[:3], payload)


def test_prompts_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="past the cache"):
        llm.chunks(42, PREFILL, 44)      # the last chunk, rows 40..47, ends past row 44
    with pytest.raises(ValueError, match="do not fit"):
        llm.run_generation(None, list(range(40)), 10, PREFILL, MAX_CONTEXT)
    assert llm.chunks(11, 8, 48) == [(0, 8), (8, 3)]


def test_bf16_rotary_angles_stay_float32_past_position_256():
    """HF computes rotary angles (position * inv_freq) and their cos / sin in float32 on purpose;
    in bf16 a position past 256 rounds (1001 -> 1000) and the angle moves by radians. A model with
    sharp attention (scaled q / k projections) prefilled at positions 1000.. must still give
    eager bf16's logits, and the position cast and angles in the blob stay Float32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                         max_position_embeddings=2048)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(30 if ("q_proj" in name or "k_proj" in name) else
                   10 if ("v_proj" in name or "o_proj" in name) else 1)
    model = model.to(torch.bfloat16)
    edge = llm.lower_llm(model, 1040, 8, precision="bf16")
    eager = llm.StaticCacheDecoder(model, 1040).eval()
    tokens, positions = torch.tensor([[1, 72, 105, 33, 9, 200, 17, 5]]), torch.arange(1001, 1009)
    with torch.no_grad():
        want = eager(tokens, positions, torch.tensor([7]))[0].float().reshape(-1)
    got, _ = ReferenceProgram(edge, torch.float32).run("prefill", [tokens, positions,
                                                                    torch.tensor([7])])
    err = float((got.float().reshape(-1) - want).abs().max() / want.abs().max())
    assert err < 3e-2, err     # 0.63 when the angles were bf16
    (lowered,) = [m for m in edge.exported_program("prefill").graph_module.modules()
                  if hasattr(m, "processed_bytes")]
    g = read_blob(lowered.processed_bytes)
    casts = [op for op in g.ops if op.opcode == bf.Opcode.COPY
             and g.tensors[op.operands["x"]].dtype == torch.int64]
    assert casts and all(g.tensors[op.operands["out"]].dtype == torch.float32 for op in casts)


def tiny_decoder(arch, attention="sdpa"):
    """A 2-layer decoder of another HF architecture (Qwen3: RMSNorm on each head's q and k;
    Qwen2: biased q / k / v projections; Mistral; Gemma: (1 + w) norms, scaled embeddings, tanh
    GELU gate; Phi3: one fused qkv and one fused gate-up projection; Gemma2: soft-capped scores,
    which HF runs only in its eager attention), tied embeddings, with norm weights and biases away
    from their initial values so that they count."""
    import transformers

    config = getattr(transformers, f"{arch}Config")(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, vocab_size=256, max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=0, attn_implementation=attention)
    torch.manual_seed(0)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("arch", ["Qwen3", "Qwen2", "Mistral", "Gemma", "Phi3"])
def test_other_decoders_are_one_delegate_a_method_and_give_eager_greedy_tokens(arch):
    model = tiny_decoder(arch)
    edge = llm.lower_llm(model, MAX_CONTEXT, PREFILL, precision="fp32")
    for method in llm.METHODS:
        graph = edge.exported_program(method).graph
        calls = {str(n.target) for n in graph.nodes if n.op == "call_function"}
        assert calls == {"<built-in function getitem>", "executorch_call_delegate"}, (method, calls)
    tokens, logits = llm.run_generation(ReferenceProgram(edge, torch.float32).run, PROMPT,
                                        NEW_TOKENS, PREFILL, MAX_CONTEXT)
    want, want_logits = llm.greedy_reference(model, PROMPT, NEW_TOKENS)
    assert tokens == want
    # Relative to the logits' largest magnitude.
    err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(logits, want_logits))
    assert err < 1e-4, err


def test_a_model_on_eager_attention_is_refused_with_the_fix():
    """HF's eager attention adds the mask to the scores: the boolean cache mask would let every
    query attend to unwritten rows (Gemma 2 exported that way gave logits 0.5 away from eager)."""
    model = tiny_decoder("Gemma2", attention="eager")
    with pytest.raises(ValueError, match="attn_implementation='eager'.*load the model with "
                                         "attn_implementation='sdpa'"):
        llm.lower_llm(model, MAX_CONTEXT, PREFILL, precision="fp32")
