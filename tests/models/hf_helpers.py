"""Tiny random transformers models and padded batches shared by the model and sampler tests."""

from __future__ import annotations

import numpy as np
import torch
import transformers

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    # Wider than transformers' 0.02 so next-token logits have clear gaps: greedy parity then
    # tests the model, not float32 rounding between two near-tied tokens.
    initializer_range=0.1,
    rope_theta=10_000.0,
    # No default stop ids (Llama's config would bring eos 2): stopping is tested explicitly.
    bos_token_id=None,
    eos_token_id=None,
)
ARCHS = {
    "qwen3_tied": (transformers.Qwen3Config, dict(tie_word_embeddings=True)),
    "qwen3_untied": (transformers.Qwen3Config, dict(tie_word_embeddings=False)),
    "llama": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    "llama_biased": (
        transformers.LlamaConfig,
        dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True),
    ),
}


def make_hf_model(arch: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A random float32 transformers model; norms and biases randomised too (not 1 and 0)."""
    config_class, extra = ARCHS[arch]
    torch.manual_seed(seed)
    config = config_class(**_COMMON, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model


def save_hf_model(model: transformers.PreTrainedModel, path) -> str:
    model.save_pretrained(str(path))
    return str(path)


def random_prompts(lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, n).tolist() for n in lengths]


def padded_batch(prompts, width: int, *, left: bool):
    """(ids, mask, positions) int64/bool/int64 [B, width], padded with 0 on the chosen side."""
    ids = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros((len(prompts), width), bool)
    for i, prompt in enumerate(prompts):
        span = slice(width - len(prompt), width) if left else slice(0, len(prompt))
        ids[i, span] = prompt
        mask[i, span] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return ids, mask, positions


def hf_logits(model, ids, mask, positions) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(positions),
        )
    return out.logits.numpy()
