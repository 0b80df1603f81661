"""The models of the coverage report (bench/coverage.py): every torchvision classification model
and small configs of HF transformers architectures, random weights, nothing downloads.

MODELS maps a name to a builder returning (module, example inputs). torchvision models take one
image; the input side is SIZES' (the smallest that keeps the full-size model's operators: ViT and
MaxViT fix 224, AlexNet and VGG need 224 for their adaptive pools to reduce rather than upsample)
or DEFAULT_SIZE. HF models are 2-layer, width-64 configs of their architecture called with default
settings (the model builds its own position ids, token types and masks); their operators are those
of the full-size models, only the sizes differ.
"""
from __future__ import annotations

import torch
from torch import nn

DEFAULT_SIZE = 64
SIZES = {"alexnet": 224, "maxvit_t": 224, "googlenet": 112, "inception_v3": 112,
         **{f"vgg{n}{bn}": 224 for n in (11, 13, 16, 19) for bn in ("", "_bn")},
         **{f"vit_{v}": 224 for v in ("b_16", "b_32", "l_16", "l_32", "h_14")},
         **{f"swin_{v}": 112 for v in ("t", "s", "b", "v2_t", "v2_s", "v2_b")}}


class _Call(nn.Module):
    """An HF model called with one keyword input; returns its first output as a tensor."""

    def __init__(self, model, key="input_ids", **call):
        super().__init__()
        self.model, self.key, self.call = model, key, call

    def forward(self, x):
        out = self.model(**{self.key: x}, **self.call)
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))


VOCAB, SEQ = 1000, 16
# The common small config: 2 layers, width 64, 4 heads (2 KV heads where the architecture has
# grouped-query attention), FFN 128.
DECODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=128)
ENCODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)


def _ids():
    return (torch.randint(0, VOCAB, (1, SEQ)),)


def _image(size=32):
    return (torch.randn(1, 3, size, size),)


def _hf(model_cls, config_cls, config, inputs, key="input_ids", **call):
    def build():
        import transformers
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))
        return _Call(model, key, **call), inputs()
    return build


def _whisper_encoder():
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    config = transformers.WhisperConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=32, vocab_size=VOCAB)
    # The encoder takes 2 * max_source_positions mel frames (its two convolutions halve them).
    return _Call(WhisperEncoder(config), "input_features"), (torch.randn(1, 16, 64),)


HF_MODELS = {
    "hf_bert": _hf("BertModel", "BertConfig", {**ENCODER, "vocab_size": VOCAB,
                                              "max_position_embeddings": 128}, _ids),
    "hf_roberta": _hf("RobertaModel", "RobertaConfig", {**ENCODER, "vocab_size": VOCAB,
                                                       "max_position_embeddings": 130}, _ids),
    "hf_distilbert": _hf("DistilBertModel", "DistilBertConfig",
                         dict(n_layers=2, dim=64, n_heads=4, hidden_dim=128, vocab_size=VOCAB,
                              max_position_embeddings=128), _ids),
    "hf_gpt2": _hf("GPT2LMHeadModel", "GPT2Config", dict(n_layer=2, n_embd=64, n_head=4,
                                                        vocab_size=VOCAB, n_positions=128),
                   _ids, use_cache=False),
    "hf_llama": _hf("LlamaForCausalLM", "LlamaConfig", DECODER, _ids, use_cache=False),
    "hf_qwen2": _hf("Qwen2ForCausalLM", "Qwen2Config", DECODER, _ids, use_cache=False),
    "hf_qwen3": _hf("Qwen3ForCausalLM", "Qwen3Config", {**DECODER, "head_dim": 16}, _ids,
                    use_cache=False),
    "hf_mistral": _hf("MistralForCausalLM", "MistralConfig", DECODER, _ids, use_cache=False),
    "hf_gemma": _hf("GemmaForCausalLM", "GemmaConfig", {**DECODER, "head_dim": 16}, _ids,
                    use_cache=False),
    "hf_phi": _hf("PhiForCausalLM", "PhiConfig", DECODER, _ids, use_cache=False),
    "hf_t5_encoder": _hf("T5EncoderModel", "T5Config",
                         dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                              vocab_size=VOCAB), _ids),
    "hf_whisper_encoder": _whisper_encoder,
    "hf_vit": _hf("ViTModel", "ViTConfig", {**ENCODER, "image_size": 32, "patch_size": 8},
                  _image, key="pixel_values"),
    "hf_dinov2": _hf("Dinov2Model", "Dinov2Config", {**ENCODER, "image_size": 32,
                                                    "patch_size": 8}, _image,
                     key="pixel_values"),
    "hf_clip_text": _hf("CLIPTextModel", "CLIPTextConfig",
                        {**ENCODER, "vocab_size": VOCAB, "max_position_embeddings": 32}, _ids),
    "hf_clip_vision": _hf("CLIPVisionModel", "CLIPVisionConfig",
                          {**ENCODER, "image_size": 32, "patch_size": 8}, _image,
                          key="pixel_values"),
}


def _torchvision(name):
    def build():
        import torchvision
        size = SIZES.get(name, DEFAULT_SIZE)
        return getattr(torchvision.models, name)(weights=None), (torch.randn(1, 3, size, size),)
    return build


def torchvision_names():
    import torchvision
    return list(torchvision.models.list_models(module=torchvision.models))


# The largest torchvision models (over ~80 M parameters or slow to export on 2 cores) go last, so
# a run cut short has the rest.
LARGE = ["vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
         "convnext_base", "swin_b", "swin_v2_b", "vit_b_16", "vit_b_32", "resnext101_32x8d",
         "resnext101_64x4d", "wide_resnet101_2", "regnet_x_16gf", "regnet_y_16gf",
         "efficientnet_b7", "efficientnet_v2_l", "convnext_large", "vit_l_16", "vit_l_32",
         "regnet_x_32gf", "regnet_y_32gf", "vit_h_14", "regnet_y_128gf"]


# One small model of each torchvision family first, so a run cut short covers every family.
FIRST = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x0_5",
         "squeezenet1_1", "mnasnet0_5", "regnet_x_400mf", "regnet_y_400mf", "googlenet",
         "inception_v3", "swin_t", "swin_v2_t", "maxvit_t", "vit_b_32", "efficientnet_v2_s",
         "resnext50_32x4d", "wide_resnet50_2", "resnet50", "mobilenet_v3_large", "vgg11"]


def all_models():
    """{name: builder}: the HF configs, then every torchvision classification model (FIRST first,
    LARGE last)."""
    names = torchvision_names()
    names = [n for n in FIRST if n in names] + [n for n in names if n not in LARGE + FIRST] + \
        [n for n in LARGE if n in names and n not in FIRST]
    return {**HF_MODELS, **{name: _torchvision(name) for name in names}}
