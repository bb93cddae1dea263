"""Micro-batched sampling in static chunks: chunks of slots give the unchunked completions, a
slot's completion does not depend on the other slots, the prompts are prefilled once outside the
chunk loop, and one compilation serves every key and slot map (test_continuous.py holds the
continuous loop to the same references)."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from gdro_jax import models
from gdro_jax.sampling._generate import _generate
from tests.sampling._reference import (
    BUCKET,
    CONFIG,
    EOS,
    PROMPTS,
    RNG,
    SLOTS,
    M,
    assert_same,
    sample,
    sample_alone,
)


@pytest.fixture(scope="module")
def model():
    return models.init_decoder(CONFIG, seed=0)


_sample = functools.partial(sample, batching="static")


@pytest.fixture(scope="module")
def unchunked(model):
    return {top_p: _sample(model, None, top_p=top_p) for top_p in (1.0, 0.9)}


# 8 divides R = 24 (3 chunks); 5 does not (5 chunks, the last padded with one stopped slot),
# there with the top-p filter on.
@pytest.mark.parametrize("micro_batch_slots, top_p", [(8, 1.0), (5, 0.9)])
def test_chunked_sampling_equals_unchunked(model, unchunked, micro_batch_slots, top_p):
    chunked = _sample(model, micro_batch_slots, top_p=top_p)
    assert_same(chunked, unchunked[top_p])
    lengths = np.asarray(chunked.lengths)
    assert lengths.min() < M and lengths.max() == M, lengths  # early stops and full lengths


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_slot_alone_gives_its_completion_in_the_batch(model, unchunked, top_p):
    batch = unchunked[top_p]
    for slot in (0, 9, 17, 23):  # prompts 0, 2, 1, 3 at various places of the map
        tokens, logprobs = sample_alone(model, slot, top_p=top_p)
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
