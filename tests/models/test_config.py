"""DecoderConfig: presets, validation, the HF config translation both ways, Llama 3 RoPE, and the
eval_shape memory footprint."""

import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from gdro_jax.models import (
    DecoderConfig,
    Llama3RopeScaling,
    init_decoder,
    make_mesh,
    memory_footprint,
    rope_inverse_frequencies,
)


def _parameter_count(c: DecoderConfig) -> int:
    attention = c.d_model * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    attention += c.num_heads * c.head_dim * c.d_model + 2 * c.head_dim * c.qk_norm
    layer = attention + 3 * c.d_model * c.mlp_dim + 2 * c.d_model
    heads = 1 if c.tie_embeddings else 2
    return c.num_layers * layer + heads * c.vocab_size * c.d_model + c.d_model


@pytest.mark.parametrize(
    "preset, billions",
    [("qwen3_0p6b", 0.6), ("qwen3_1p7b", 1.7), ("qwen3_4b", 4.0), ("qwen3_8b", 8.2)],
)
def test_presets_have_the_published_sizes(preset, billions):
    config = getattr(DecoderConfig, preset)()
    footprint = memory_footprint(config)
    assert footprint.param_count == _parameter_count(config)
    assert abs(footprint.param_count / 1e9 - billions) < 0.05 * billions


def test_footprint_per_device_matches_real_shards():
    config = DecoderConfig.tiny()
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    model = init_decoder(config, mesh=mesh)
    per_device = {}
    for leaf in jax.tree.leaves(nnx.state(model)):
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    footprint = memory_footprint(config, data=2, fsdp=2, tensor=2)
    assert footprint.param_bytes_per_device == max(per_device.values())
    assert footprint.param_bytes_per_device < footprint.param_bytes / 2


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_kv_heads", 3),
        ("head_dim", 15),
        ("d_model", 0),
        ("param_dtype", "int8"),
        ("family", "mistral"),
        ("rms_norm_eps", 0.0),
    ],
)
def test_invalid_fields_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DecoderConfig.tiny(**{field: value})


@pytest.mark.parametrize(
    "config_class, extra",
    [
        (transformers.Qwen3Config, dict(tie_word_embeddings=True)),
        (transformers.LlamaConfig, dict(attention_bias=True, mlp_bias=True)),
        (transformers.Qwen2Config, dict()),
    ],
)
def test_hf_config_translation_round_trips(config_class, extra):
    sizes = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=3)
    hf_config = config_class(
        **sizes, num_attention_heads=4, num_key_value_heads=2, rope_theta=5e5, **extra
    )
    config = DecoderConfig.from_hf_config(hf_config)
    assert (config.vocab_size, config.d_model, config.num_layers) == (100, 32, 3)
    assert config.head_dim == (getattr(hf_config, "head_dim", None) or 32 // 4)
    assert config.rope_theta == 5e5
    assert config.qk_norm == (config_class is transformers.Qwen3Config)
    assert config.qkv_bias == (config_class is not transformers.Qwen3Config)
    assert config.mlp_bias == (config_class is transformers.LlamaConfig)
    again = DecoderConfig.from_hf_config(config.to_hf_config())
    assert again == config
    # transformers reads our config.json back into the same architecture.
    reread = transformers.AutoConfig.for_model(**config.to_hf_config())
    assert type(reread) is config_class
    assert DecoderConfig.from_hf_config(reread) == config


def test_llama3_rope_frequencies_match_transformers():
    scaling = Llama3RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    )
    config = DecoderConfig.tiny(family="llama", qk_norm=False, rope_scaling=scaling, head_dim=32)
    hf_config = transformers.LlamaConfig(**config.to_hf_config())
    assert hf_config.rope_parameters["rope_type"] == "llama3"
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, torch.device("cpu"))
    np.testing.assert_allclose(rope_inverse_frequencies(config), expected.numpy(), rtol=1e-6)
    assert DecoderConfig.from_hf_config(config.to_hf_config()) == config


def test_export_rejects_flags_the_family_cannot_express():
    with pytest.raises(ValueError, match="qk_norm"):
        DecoderConfig.tiny(family="llama").to_hf_config()
    with pytest.raises(ValueError, match="attention_bias"):
        DecoderConfig.tiny(qkv_bias=True).to_hf_config()


def test_config_is_frozen_and_hashable():
    config = DecoderConfig.qwen3_8b(param_dtype=np.dtype("float32"))
    assert config.param_dtype == "float32" and hash(config) == hash(DecoderConfig.qwen3_8b())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 3
