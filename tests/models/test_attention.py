"""The attention backend a full forward pass takes (`DecoderConfig.attention`)."""

import jax.numpy as jnp
import numpy as np
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


def _reference_attention(q, k, v, allowed):
    """Loops over rows, query heads and positions: query head n reads key/value head n // G,
    a softmax over the allowed keys (float64; zeros where a query has none)."""
    B, T, N, H = q.shape
    G = N // k.shape[2]
    out = np.zeros((B, T, N, H))
    for b in range(B):
        for n in range(N):
            for t in range(T):
                keys = np.flatnonzero(allowed[b, t])
                if not len(keys):
                    continue
                scores = k[b, keys, n // G] @ q[b, t, n] / np.sqrt(H)
                weights = np.exp(scores - scores.max())
                out[b, t, n] = weights @ v[b, keys, n // G] / weights.sum()
    return out


def test_the_fused_calls_mask_and_is_causal_give_the_models_attention():
    """`fused_attention` (the cuDNN path) hands `jax.nn.dot_product_attention` the model's mask
    with `is_causal=True`. Run through jax's XLA implementation of that same call (cuDNN needs a
    GPU): left-padded rows and a packed row of two segments, against a loop (float32, within
    1e-5), with and without `is_causal` (the mask is causal already, so nothing changes) and
    against the einsum path the sampler takes. Rows with no allowed key (left padding) are left
    out: no loss reads them."""
    from gdro_jax.models._decoder import _attention

    B, T, N, K, H = 3, 7, 4, 2, 8
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, T, heads, H)).astype(np.float32) for heads in (N, K, K))
    real = np.arange(T)[None] >= np.array([[0], [3], [0]])  # row 1 left-padded by 3
    segment = np.where(np.arange(T)[None] < np.array([[T], [T], [4]]), 1, 2)  # row 2 packed
    causal = np.arange(T)[None, :] <= np.arange(T)[:, None]
    allowed = real[:, None, :] & causal & (segment[:, :, None] == segment[:, None, :])
    some = allowed.any(axis=-1)
    want = _reference_attention(q, k, v, allowed)[some]
    args = (jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(allowed))
    for is_causal in (True, False):
        got = models.fused_attention(*args, implementation="xla", causal=is_causal)
        np.testing.assert_allclose(np.asarray(got)[some], want, rtol=0, atol=1e-5)
    einsum = _attention(
        args[0], args[1].transpose(0, 2, 3, 1), args[2].transpose(0, 2, 1, 3), args[3]
    )
    np.testing.assert_allclose(np.asarray(einsum)[some], want, rtol=0, atol=1e-5)
