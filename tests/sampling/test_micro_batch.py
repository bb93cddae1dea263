"""Micro-batched sampling: chunks of slots give the unchunked completions, a slot's completion does
not depend on the other slots, the prompts are prefilled once outside the chunk loop, and one
compilation serves every key and slot map."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdro_jax import models
from gdro_jax.sampling import generate, sample_logits
from gdro_jax.sampling._generate import _generate

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


@pytest.fixture(scope="module")
def model():
    return models.init_decoder(CONFIG, seed=0)


def _sample(model, micro_batch_slots, *, top_p=1.0, key=3, slots=SLOTS, prompts=PROMPTS):
    return generate(
        model,
        prompts,
        key=jax.random.key(key),
        max_new_tokens=M,
        temperature=1.0,
        top_p=top_p,
        prompt_of_slot=slots,
        prompt_bucket=BUCKET,
        eos_ids=EOS,
        micro_batch_slots=micro_batch_slots,
    )


@pytest.fixture(scope="module")
def unchunked(model):
    return {top_p: _sample(model, None, top_p=top_p) for top_p in (1.0, 0.9)}


def _assert_same(got, want):
    for name in ("tokens", "logprobs", "lengths", "finish_reasons", "prompt_tokens"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )


# 8 divides R = 24 (3 chunks); 5 does not (5 chunks, the last padded with one stopped slot),
# there with the top-p filter on.
@pytest.mark.parametrize("micro_batch_slots, top_p", [(8, 1.0), (5, 0.9)])
def test_chunked_sampling_equals_unchunked(model, unchunked, micro_batch_slots, top_p):
    chunked = _sample(model, micro_batch_slots, top_p=top_p)
    _assert_same(chunked, unchunked[top_p])
    lengths = np.asarray(chunked.lengths)
    assert lengths.min() < M and lengths.max() == M, lengths  # early stops and full lengths


@functools.partial(jax.jit, static_argnames=("graphdef", "use_top_p"))
def _next_token(graphdef, params, tokens_1T, mask_1T, index, key, *, use_top_p):
    """One token drawn after position `index` of a single sequence, by a full forward pass."""
    model = nnx.merge(graphdef, params)
    positions_1T = jnp.maximum(jnp.cumsum(mask_1T, axis=1) - 1, 0)
    logits_V = model(tokens_1T, positions_1T, mask_1T)[0, index]
    return sample_logits(logits_V[None], key[None], temperature=1.0, top_p=0.9, use_top_p=use_top_p)


def _alone(model, slot: int, *, top_p: float, key: int = 3):
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


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_slot_alone_gives_its_completion_in_the_batch(model, unchunked, top_p):
    batch = unchunked[top_p]
    for slot in (0, 9, 17, 23):  # prompts 0, 2, 1, 3 at various places of the map
        tokens, logprobs = _alone(model, slot, top_p=top_p)
        length = int(batch.lengths[slot])
        np.testing.assert_array_equal(np.asarray(batch.tokens)[slot, :length], tokens)
        # A forward pass over the whole sequence against the cache's one-token steps: float32
        # rounding of different reduction orders.
        np.testing.assert_allclose(np.asarray(batch.logprobs)[slot, :length], logprobs, atol=1e-5)


def _loop_shapes(jaxpr, inside_loop=False):
    """(shape, inside a scan/while body) of every value the traced sampler computes."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield tuple(getattr(var.aval, "shape", ())), inside_loop
        loop = inside_loop or eqn.primitive.name in ("scan", "while")
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _loop_shapes(sub, loop)


@pytest.mark.parametrize("share_prefill", [True, False])
def test_prompts_are_prefilled_once_outside_the_chunk_loop(model, share_prefill):
    graphdef, state = nnx.split(model)
    tokens = np.zeros((len(PROMPTS), BUCKET), np.int32)
    jaxpr = jax.make_jaxpr(
        functools.partial(
            _generate,
            graphdef,
            max_new_tokens=M,
            top_k=0,
            greedy=False,
            use_top_p=False,
            share_prefill=share_prefill,
            pad_id=0,
            micro_batch_slots=4,
        )
    )(
        state,
        tokens,
        np.full(len(PROMPTS), 3, np.int32),
        SLOTS,
        np.asarray(EOS, np.int32),
        jax.random.key(0),
        np.float32(1.0),
        np.float32(1.0),
    )
    # Prefill activations are [batch, P, D]; decode steps run [C, 1, D].
    prefills = {
        (shape[0], inside)
        for shape, inside in _loop_shapes(jaxpr.jaxpr)
        if len(shape) == 3 and shape[1:] == (BUCKET, CONFIG.d_model)
    }
    if share_prefill:
        assert prefills == {(len(PROMPTS), False)}  # the N prompts, once, before the chunks
    else:
        assert prefills == {(4, True)}  # each chunk prefills its own slots
    decodes = {
        inside for shape, inside in _loop_shapes(jaxpr.jaxpr) if shape == (4, 1, CONFIG.d_model)
    }
    assert decodes == {True}


def test_chunked_sampling_compiles_once(model, unchunked):
    _sample(model, 5, top_p=0.9)  # compiled by the test above, or here
    compiled = _generate._cache_size()
    other_slots = np.sort(RNG.integers(0, len(PROMPTS), len(SLOTS))).astype(np.int32)
    other_prompts = [RNG.integers(1, 64, n).tolist() for n in (2, 16, 8, 4, 11)]
    for key, slots, prompts in ((4, SLOTS, PROMPTS), (5, other_slots, other_prompts)):
        result = _sample(model, 5, top_p=0.9, key=key, slots=slots, prompts=prompts)
        assert not np.array_equal(np.asarray(result.tokens), np.asarray(unchunked[0.9].tokens))
    assert _generate._cache_size() == compiled


def test_micro_batch_slots_is_validated(model):
    with pytest.raises(ValueError, match="micro_batch_slots=-1"):
        _sample(model, -1)
