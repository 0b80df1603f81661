"""Language-model generation programs: a HF transformers decoder (Llama; Qwen3, Qwen2, Mistral,
Gemma and Phi-3 lower the same way) with a static KV cache, exported into one .pte with a
`prefill` and a `decode` method that share the cache on the GPU (each method one Kiln delegate,
no operator left to ExecuTorch).

    from transformers import LlamaConfig, LlamaForCausalLM
    from kiln_executorch.llm import export_llm
    export_llm(LlamaForCausalLM(config).eval(), "llama.pte", max_context=2048, prefill_length=128)

The methods take and return CUDA tensors (device_resident=True, the default): runner/kiln_llm
feeds each greedy token to the next decode step on the GPU. device_resident=False gives methods
over host tensors.

The methods (int64 inputs; float32 logits and the greedy next token out):
- ``prefill(tokens [1, P], positions [P], last [1]) -> (logits [1, 1, vocab], token [1, 1])``:
  writes the keys and values of P tokens at cache rows `positions` and returns the logits at
  index `last` of the chunk and their argmax (the greedy next token, computed on the GPU: a
  runner that generates greedily never needs the logits on the host). A prompt shorter than P
  is padded at its end (any token id) with positions continuing past it: causal masking keeps
  the pad rows out of every real token's attention, and decode overwrites each pad row before
  it reads it. A longer prompt is prefilled in chunks of P.
- ``decode(token [1, 1], position [1]) -> (logits [1, 1, vocab], token [1, 1])``: one token at
  cache row `position`, attending to rows 0..position; the token output has the token input's
  shape, so a device-resident program's runner feeds one step's output to the next on the GPU.
- constant methods ``max_context``, ``prefill_length`` and ``vocab_size`` (ints), read by
  runners (runner/kiln_llm) the way ExecuTorch's LLM runners read ``get_max_seq_len``.

The caches are buffers ``decoder.k_cache_<layer>`` / ``decoder.v_cache_<layer>`` ([1, kv_heads,
max_context, head_dim], the model's dtype) updated with index_copy_, so each becomes a kState
tensor of its method's Kiln delegate; the delegates name them (format/state_keys.h) and the
runtime gives both methods of one loaded program one copy on the device. Prefill has a fixed
chunk length P, not a dynamic one: a bounded dynamic length is lowered as one plan per length
(at most 64 plans a delegate), and P plans of a 16-layer model cost P times the export time for
little gain over padding a chunk.

The module needs no executorch until `export_llm` is called (the GPU check builds the same
decoder from it to time torch eager and torch.compile with the same static cache).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

METHODS = ("prefill", "decode")


class KvCache:
    """Stands in for HF's Cache object inside the decoder's forward: each attention layer's
    update writes its new keys and values at `positions` of that layer's cache buffers (in place,
    index_copy_) and attends to the whole static cache; the caller's mask hides rows not yet
    written. Holds no tensors of its own (the buffers belong to the decoder module)."""

    is_compileable = True

    def __init__(self, owner: "StaticCacheDecoder"):
        self._owner = [owner]    # a list: not a registered submodule
        self.positions = None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        owner = self._owner[0]
        k = getattr(owner, f"k_cache_{layer_idx}")
        v = getattr(owner, f"v_cache_{layer_idx}")
        k.index_copy_(2, self.positions, key_states)
        v.index_copy_(2, self.positions, value_states)
        return k, v

    def get_seq_length(self, layer_idx=0):
        return 0


class StaticCacheDecoder(nn.Module):
    """A HF causal LM (``.model`` the decoder stack, ``.lm_head`` the vocabulary projection) with
    a static KV cache of `max_context` rows per layer. forward(tokens [1, S], positions [S], last
    [1] or None) -> (logits [1, 1 (or S), vocab] float32, their argmax [1, 1 (or S)] int64)."""

    def __init__(self, model, max_context: int):
        super().__init__()
        c = model.config
        # The boolean cache mask below is what HF's SDPA attention takes; its eager attention
        # would add it to the scores as 0 / 1 and attend to rows not yet written.
        attention = getattr(c, "_attn_implementation", None)
        if attention not in (None, "sdpa"):
            raise ValueError(
                f"{type(model).__name__} uses attn_implementation={attention!r}; the static-cache "
                "export needs HF's SDPA attention: load the model with attn_implementation="
                "'sdpa' (architectures without an SDPA path in transformers, such as Gemma 2's "
                "soft-capped attention, are not supported)")
        self.model = model
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        dtype = next(model.parameters()).dtype
        self.max_context = int(max_context)
        for i in range(c.num_hidden_layers):
            for kind in ("k", "v"):
                self.register_buffer(
                    f"{kind}_cache_{i}",
                    torch.zeros(1, c.num_key_value_heads, max_context, head_dim, dtype=dtype),
                    persistent=False)
        self.register_buffer("slots", torch.arange(max_context), persistent=False)
        self.cache = KvCache(self)

    def reset(self):
        """Zeroes every cache (eager use: a new sequence)."""
        with torch.no_grad():
            for name, b in self.named_buffers():
                if "_cache_" in name:
                    b.zero_()

    def forward(self, tokens, positions, last=None):
        self.cache.positions = positions
        # Boolean mask [1, 1, S, max_context]: query i sees cache rows 0..positions[i].
        mask = self.slots[None, :] <= positions[:, None]
        hidden = self.model.model(input_ids=tokens, attention_mask=mask[None, None],
                                  position_ids=positions[None], cache=self.cache,
                                  use_cache=True).last_hidden_state
        if last is not None:
            hidden = hidden.index_select(1, last)
        logits = self.model.lm_head(hidden).float()
        return logits, logits.argmax(-1)


class _Method(nn.Module):
    """One exported method over a shared decoder; the attribute name `decoder` is the same in
    every method, so the cache buffers have the same fully qualified names (the share keys)."""

    def __init__(self, decoder: StaticCacheDecoder, kind: str):
        super().__init__()
        self.decoder = decoder
        self.kind = kind

    def forward(self, tokens, positions, last=None):
        return self.decoder(tokens, positions, last)


def example_inputs(prefill_length: int):
    """{method: example inputs} (token ids 0; positions from 0)."""
    return {"prefill": (torch.zeros(1, prefill_length, dtype=torch.int64),
                        torch.arange(prefill_length), torch.tensor([prefill_length - 1])),
            "decode": (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([prefill_length]))}


def lower_llm(model, max_context: int = 2048, prefill_length: int = 128,
              precision: str = "bf16", device_resident: bool = False, weights=None):
    """torch.export of both methods and to_edge_transform_and_lower with KilnPartitioner: the
    EdgeProgramManager before to_executorch (the reference interpreter runs it on the CPU).
    weights: KilnPartitioner's weights= (None, or "int8": every projection and the LM head
    quantized)."""
    from executorch.exir import to_edge_transform_and_lower

    from .aot import KilnPartitioner

    if not 0 < prefill_length <= max_context:
        raise ValueError(f"prefill_length {prefill_length} must be in 1..max_context "
                         f"({max_context})")
    decoder = StaticCacheDecoder(model, max_context).eval()
    inputs = example_inputs(prefill_length)
    with torch.no_grad():
        programs = {name: torch.export.export(_Method(decoder, name), inputs[name])
                    for name in METHODS}
        return to_edge_transform_and_lower(
            programs, partitioner=[KilnPartitioner(precision, device_resident,
                                                   weights=weights)],
            constant_methods={"max_context": int(max_context),
                              "prefill_length": int(prefill_length),
                              "vocab_size": int(model.config.vocab_size)})


def export_llm(model, path, max_context: int = 2048, prefill_length: int = 128,
               precision: str = "bf16", device_resident: bool = True, weights=None):
    """Exports `model` (a HF causal LM in eval mode) to `path`: methods prefill and decode sharing
    the KV caches, constant methods max_context, prefill_length and vocab_size (weights: as
    lower_llm's). device_resident (default True): the methods take and return CUDA tensors, so
    kiln_llm keeps a greedy token on the GPU from one step to the next and copies no logits;
    False gives host tensors (ExecuTorch copies inputs and outputs on every step), for runtimes
    that hand the methods CPU tensors. Raises ValueError
    when a method is not one Kiln delegate with no operator left to ExecuTorch. Returns a dict
    describing the program (sizes, the delegate count and CPU operators per method)."""
    from .aot import KilnPartitioner
    from .aot.export import COPY_OPERATORS

    edge = lower_llm(model, max_context, prefill_length, precision, device_resident, weights)
    with torch.no_grad():
        program = edge.to_executorch(KilnPartitioner.executorch_config(
            device_resident=device_resident))
    del edge
    Path(path).write_bytes(program.buffer)
    # The delegates and operators from the program just serialized, not from reading the file
    # back: a billion-parameter program is gigabytes, and a second copy of it (three, as the
    # deserializer inlines the payloads) does not fit beside the first on a 24 GB machine.
    plans = program.executorch_program.execution_plan
    delegates = {plan.name: [d.id for d in plan.delegates] for plan in plans}
    operators = {plan.name: [f"{o.name}.{o.overload}" if o.overload else o.name
                             for o in plan.operators if o.name not in COPY_OPERATORS]
                 for plan in plans}
    del program
    info = {"methods": {}, "max_context": int(max_context), "prefill_length": int(prefill_length),
            "vocab_size": int(model.config.vocab_size), "precision": precision,
            "weights": weights}
    for name in METHODS:
        count = sum(1 for backend in delegates.get(name, []) if backend == "KilnBackend")
        info["methods"][name] = {"kiln_delegates": count, "cpu_operators": operators.get(name, [])}
        if count != 1 or operators.get(name):
            raise ValueError(f"method {name}: {count} Kiln delegates and CPU operators "
                             f"{operators.get(name)}; expected one delegate and none")
    return info


def greedy_reference(model, prompt, new_tokens: int):
    """Eager HF's greedy continuation of `prompt` (a list of token ids): each step runs the whole
    sequence through `model` without a cache and takes the argmax of the last position's logits.
    Returns (tokens generated, [logits of each step, float32 [vocab]])."""
    tokens, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(new_tokens):
            out = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, -1].float()
            logits.append(out)
            tokens.append(int(out.argmax()))
    return tokens[len(prompt):], logits


def chunks(prompt_length: int, prefill_length: int, max_context: int):
    """The prefill chunks of a prompt: [(start, real tokens in the chunk)]. ValueError when the
    last chunk (padded to prefill_length) would pass max_context."""
    if prompt_length < 1:
        raise ValueError("the prompt is empty")
    out = [(s, min(prefill_length, prompt_length - s)) for s in range(0, prompt_length,
                                                                     prefill_length)]
    start = out[-1][0]
    if start + prefill_length > max_context:
        raise ValueError(f"a prompt of {prompt_length} tokens needs prefill rows up to "
                         f"{start + prefill_length}, past the cache's {max_context}")
    return out


def run_generation(run, prompt, new_tokens: int, prefill_length: int, max_context: int):
    """Greedy generation through `run(method, inputs) -> [logits, token]` (a runtime or the
    reference interpreter): the prompt in chunks through prefill, then decode, each next token the
    argmax of the logits (ValueError when the method's own token output says otherwise). Returns
    (tokens generated, [logits of each step, float32 [vocab]])."""
    if len(prompt) + new_tokens > max_context:
        raise ValueError(f"{len(prompt)} prompt tokens + {new_tokens} new ones do not fit the "
                         f"cache's {max_context} rows")
    logits = None
    for start, n in chunks(len(prompt), prefill_length, max_context):
        chunk = prompt[start:start + n] + [0] * (prefill_length - n)
        logits, token = run("prefill", [torch.tensor([chunk]),
                                        torch.arange(start, start + prefill_length),
                                        torch.tensor([n - 1])])
    out, steps = [], []
    position = len(prompt)
    for step in range(new_tokens):
        last = logits.reshape(-1).float()
        steps.append(last)
        out.append(int(last.argmax()))
        chosen = int(token.reshape(-1)[0])
        if chosen != out[-1]:
            raise ValueError(f"step {step}: the method's token output {chosen} is not the argmax "
                             f"of its logits ({out[-1]})")
        if step + 1 == new_tokens:
            break
        logits, token = run("decode", [torch.tensor([[out[-1]]]), torch.tensor([position])])
        position += 1
    return out, steps
