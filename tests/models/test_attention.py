"""The attention backend a full forward pass takes (`DecoderConfig.attention`)."""

import pytest

from gdro_jax import configs, models
from gdro_jax.models import DecoderConfig

TINY = dict(vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=32)


@pytest.mark.parametrize(
    ("attention", "platform", "compute_dtype", "want"),
    [
        ("auto", "cpu", "float32", "xla"),
        ("auto", "cpu", "bfloat16", "xla"),
        ("auto", "tpu", "bfloat16", "xla"),
        ("auto", "gpu", "float32", "xla"),  # cuDNN's fused kernel takes no float32
        ("auto", "gpu", "bfloat16", "cudnn"),
        ("auto", "gpu", "float16", "cudnn"),
        ("xla", "gpu", "bfloat16", "xla"),
        ("cudnn", "cpu", "float32", "cudnn"),  # asked for: jax then says what it cannot do
    ],
)
def test_auto_takes_the_fused_kernel_on_gpus_in_half_precision_only(
    attention, platform, compute_dtype, want
):
    config = DecoderConfig.tiny(**TINY, attention=attention, compute_dtype=compute_dtype)
    assert models.attention_implementation(config, platform) == want


def test_auto_is_xla_on_this_cpu_machine():
    assert models.attention_implementation(DecoderConfig.tiny(**TINY)) == "xla"


def test_an_unknown_backend_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"DecoderConfig\.attention must be one of .*'flash'"):
        DecoderConfig.tiny(**TINY, attention="flash")


def test_a_runs_attention_reaches_a_policy_loaded_from_its_folder(tmp_path):
    """`config.model.attention` travels with the run's other policy overrides into
    `from_pretrained` (a run with `init_from` loads its policy that way)."""
    models.save_pretrained(models.init_decoder(DecoderConfig.tiny(**TINY), seed=0), tmp_path)
    config = configs.run_config()
    config.model.attention = "xla"
    overrides = configs.policy_overrides(config)
    dtype = overrides.pop("param_dtype")  # as train.load_policy does
    policy = models.from_pretrained(tmp_path, dtype=dtype, **overrides)
    assert policy.config.attention == "xla"
    config.init_from = str(tmp_path)
    assert configs.policy_config(config).attention == "xla"
