"""Sampling on the 8-device fake CPU mesh (data 2, fsdp 2, tensor 2) equals one device's, and
the compiled rollout on a mesh holds each layer's weights and prefix rows once, per device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdro_jax.models import (
    DecoderConfig,
    abstract_decoder,
    from_pretrained,
    make_mesh,
    parameter_shardings,
)
from gdro_jax.sampling import _generate, generate
from gdro_jax.sampling._continuous import _generate_continuous, _lanes_after_queue
from tests.models.hf_helpers import make_hf_model, random_prompts

PROMPTS = random_prompts((9, 4, 6, 1), seed=6)
# Slots continue prompts out of order, so a chunk's slots need prefix rows held by other devices.
SLOTS = np.array([3, 0, 2, 1, 1, 3, 0, 2], np.int32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q3")
    make_hf_model("qwen3_tied", seed=2).save_pretrained(folder)
    return from_pretrained(folder), from_pretrained(folder, mesh=make_mesh(2, 2, 2))


@pytest.mark.parametrize(
    "temperature, top_k, top_p, micro_batch_slots",
    [
        (0.0, 0, 1.0, None),
        pytest.param(1.0, 10, 0.9, None, marks=pytest.mark.slow),
        (1.0, 10, 0.9, 4),
    ],
)
def test_sharded_sampling_equals_single_device(
    models, temperature, top_k, top_p, micro_batch_slots
):
    single, sharded = models
    kwargs = dict(
        key=jax.random.key(3),
        max_new_tokens=16,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        prompt_of_slot=SLOTS,
        prompt_bucket=16,
        eos_ids=[5],
    )
    expected = generate(single, PROMPTS, **kwargs)
    result = generate(sharded, PROMPTS, micro_batch_slots=micro_batch_slots, **kwargs)
    assert len(sharded.layers.q[...].sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(result.tokens), np.asarray(expected.tokens))
    np.testing.assert_array_equal(np.asarray(result.lengths), np.asarray(expected.lengths))
    np.testing.assert_array_equal(
        np.asarray(result.finish_reasons), np.asarray(expected.finish_reasons)
    )
    np.testing.assert_allclose(
        np.asarray(result.logprobs), np.asarray(expected.logprobs), atol=1e-5
    )


def test_sharded_lanes_halve_within_their_shards(models):
    # 8 lanes over 4 batch shards for 16 requests with frequent stops: once the queue is empty
    # each shard halves its own 2 lanes to 1 when at most one of them is active.
    single, sharded = models
    kwargs = dict(
        key=jax.random.key(1), max_new_tokens=16, prompt_of_slot=np.tile(SLOTS, 2),
        prompt_bucket=16, eos_ids=list(range(1, 12)), micro_batch_slots=8,
    )  # fmt: skip
    assert _lanes_after_queue(8, 4, 4) == [4]
    expected = generate(single, PROMPTS, **kwargs)
    result = generate(sharded, PROMPTS, **kwargs)
    lengths = np.asarray(expected.lengths)
    assert lengths.min() < 4 and lengths.max() == 16, lengths
    np.testing.assert_array_equal(np.asarray(result.tokens), np.asarray(expected.tokens))
    np.testing.assert_array_equal(np.asarray(result.lengths), lengths)
    np.testing.assert_allclose(
        np.asarray(result.logprobs), np.asarray(expected.logprobs), atol=1e-5
    )


def _rollout_temporaries(config: DecoderConfig, *, N, P, M, R, C, batching) -> int:
    """Compiled temporary bytes per device of `generate`'s jitted body (the continuous or the
    static loop) on a 1 x 4 x 1 mesh."""
    mesh = make_mesh(1, 4, 1)
    model = abstract_decoder(config, mesh=mesh)
    graphdef, state = nnx.split(model)
    state = jax.tree.map(
        lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
        state,
        parameter_shardings(model, mesh),
    )
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    arrays = (
        graphdef, state, ints(N, P), ints(N), ints(R), ints(1), jax.random.key(0), scalar, scalar,
    )  # fmt: skip
    static = dict(max_new_tokens=M, top_k=0, greedy=False, use_top_p=False, pad_id=0)
    if batching == "continuous":
        lowered = _generate_continuous.lower(*arrays, **static, decode_slots=C)
    else:
        lowered = _generate._generate.lower(
            *arrays, **static, share_prefill=True, micro_batch_slots=C
        )
    return lowered.compile().memory_analysis().temp_size_in_bytes


def _per_layer(config: DecoderConfig, **shapes) -> float:
    """What one more layer adds to the rollout's temporaries (4 layers against 2)."""
    deep = _rollout_temporaries(config.replace(num_layers=4), **shapes)
    shallow = _rollout_temporaries(config.replace(num_layers=2), **shapes)
    return (deep - shallow) / 2


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["continuous", "static"])
@pytest.mark.parametrize("P, M", [(256, 4), (128, 256)])
def test_rollout_holds_each_layers_prefix_rows_on_their_devices_only(batching, P, M):
    """A layer adds its shards of the chunk's KV cache and of the shared prefill cache, nothing
    more: gathering a chunk's prefix rows from a cache split by prompt would first build the
    chunk's C x P rows of every layer on every device (3x this layer cost at P = 256, M = 4).
    With completions longer than the prompts (M = 256), a refill whose gathered rows stay split
    by position makes XLA move the lanes' whole cache rows to that split and back instead
    (4.1x)."""
    config = DecoderConfig.tiny(compute_dtype="bfloat16")
    N, R, C = 16, 64, 32
    per_kv_slot = 2 * config.num_kv_heads * config.head_dim * 2  # keys and values, bfloat16
    own_shards = (C * (P + M) + N * P) * per_kv_slot / 4  # 4 batch shards
    growth = _per_layer(config, N=N, P=P, M=M, R=R, C=C, batching=batching)
    assert growth < 1.5 * own_shards, (growth, own_shards)


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_rollout_gathers_each_layers_weights_once(batching):
    """The prefill and the decode loop read one gathered copy of the weights: a layer adds at
    most one gathered copy (in float32: XLA:CPU computes bfloat16 dots in float32), not one for
    the prefill and another hoisted out of the decode loop (2x)."""
    config = DecoderConfig.tiny(
        compute_dtype="bfloat16", d_model=256, mlp_dim=1024, num_heads=8, num_kv_heads=4,
        head_dim=32,
    )  # fmt: skip
    D, F, H = config.d_model, config.mlp_dim, config.head_dim
    layer_float32 = 4 * (2 * D * config.num_heads * H + 2 * D * config.num_kv_heads * H + 3 * D * F)
    growth = _per_layer(config, N=4, P=16, M=4, R=8, C=4, batching=batching)
    assert growth < 1.5 * layer_float32, (growth, layer_float32)
