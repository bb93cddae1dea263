"""The workload and the independent reference that the static and the continuous samplers' tests
share: one slot sampled alone by full forward passes, without a KV cache or a batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gdro_jax import models
from gdro_jax.sampling import generate, sample_logits

CONFIG = models.DecoderConfig.tiny(
    vocab_size=64, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=64
)
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(1, 64, n).tolist() for n in (5, 9, 3, 12, 7)]
BUCKET = 24  # P: every prompt is padded to 24 tokens (not a weight dimension)
# R = 24 slots in uneven groups (GRPO with Rollout-GDRO), a prompt's slots not all adjacent.
SLOTS = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 4, 4, 4, 4, 4, 0, 1, 2, 3, 4, 4, 3, 3], np.int32)
M = 10
EOS = (5, 7, 9)  # frequent enough that some slots stop early and others run to M


def sample(
    model,
    micro_batch_slots,
    *,
    batching,
    top_p=1.0,
    key=3,
    slots=SLOTS,
    prompts=PROMPTS,
    temperature=1.0,
    eos_ids=EOS,
    **options,
):
    """The workload's completions from `generate` (`options`: its other arguments)."""
    return generate(
        model,
        prompts,
        key=jax.random.key(key),
        max_new_tokens=M,
        temperature=temperature,
        top_p=top_p,
        prompt_of_slot=slots,
        prompt_bucket=BUCKET,
        eos_ids=eos_ids,
        micro_batch_slots=micro_batch_slots,
        batching=batching,
        **options,
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "use_top_p"))
def _next_token(graphdef, params, tokens_1T, mask_1T, index, key, *, use_top_p):
    """One token drawn after position `index` of a single sequence, by a full forward pass."""
    model = nnx.merge(graphdef, params)
    positions_1T = jnp.maximum(jnp.cumsum(mask_1T, axis=1) - 1, 0)
    logits_V = model(tokens_1T, positions_1T, mask_1T)[0, index]
    return sample_logits(logits_V[None], key[None], temperature=1.0, top_p=0.9, use_top_p=use_top_p)


def sample_alone(model, slot: int, *, top_p: float, key: int = 3):
    """Slot `slot` sampled by itself with the documented scheme (token t drawn with the key
    fold_in(fold_in(key, slot), t)) and full forward passes, no KV cache and no batch."""
    prompt = PROMPTS[SLOTS[slot]]
    tokens, mask = np.zeros((1, BUCKET + M), np.int32), np.zeros((1, BUCKET + M), bool)
    tokens[0, : len(prompt)], mask[0, : len(prompt)] = prompt, True
    slot_key = jax.random.fold_in(jax.random.key(key), slot)
    graphdef, params = nnx.split(model)
    drawn, logprobs = [], []
    for t in range(M):
        end = len(prompt) + t
        token, logprob = _next_token(
            graphdef,
            params,
            jnp.asarray(tokens),
            jnp.asarray(mask),
            end - 1,
            jax.random.fold_in(slot_key, t),
            use_top_p=top_p < 1,
        )
        drawn.append(int(token[0]))
        logprobs.append(float(logprob[0]))
        tokens[0, end], mask[0, end] = drawn[-1], True
        if drawn[-1] in EOS:
            break
    return np.asarray(drawn), np.asarray(logprobs)


def assert_same(got, want):
    """Every output of two `GenerationResult`s equal, bit for bit."""
    for name in ("tokens", "logprobs", "lengths", "finish_reasons", "prompt_tokens"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )


def sub_jaxprs(eqn):
    """The jaxprs nested in one equation's parameters (a loop's body, a cond's branches)."""
    for param in eqn.params.values():
        for sub in param if isinstance(param, tuple | list) else (param,):
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                yield inner
