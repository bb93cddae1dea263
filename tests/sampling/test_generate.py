"""The KV-cache sampler: log-probs equal to a forward pass, top-k/top-p kept sets, per-sequence
stopping (matching transformers), determinism, prefill sharing, input forms, one compilation."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hypothesis import given, settings

from gdro_jax.models import from_pretrained
from gdro_jax.sampling import (
    FinishReason,
    completion_logprobs,
    generate,
    sample_logits,
    sequence_logprobs,
)
from gdro_jax.sampling._continuous import _generate_continuous
from gdro_jax.sampling._generate import _generate
from tests.models.hf_helpers import VOCAB, make_hf_model, padded_batch, random_prompts

PROMPTS = random_prompts((9, 4, 6, 1), seed=5)
SLOTS = np.array([0, 0, 1, 2, 2, 2, 3, 3], np.int32)  # GRPO-style: several slots per prompt
M = 24
_completion_logprobs = nnx.jit(completion_logprobs, static_argnames="chunk_size")


@pytest.fixture(scope="module")
def hf_and_model(tmp_path_factory):
    hf_model = make_hf_model("qwen3_untied", seed=4)
    folder = tmp_path_factory.mktemp("q3")
    hf_model.save_pretrained(folder)
    return hf_model, from_pretrained(folder)


@pytest.fixture(scope="module")
def model(hf_and_model):
    return hf_and_model[1]


@pytest.fixture(scope="module")
def sampled(model):
    """Temperature 0.8 with top-k 8 and top-p 0.9 over the slot map."""
    return generate(
        model,
        PROMPTS,
        key=jax.random.key(7),
        max_new_tokens=M,
        temperature=0.8,
        top_k=8,
        top_p=0.9,
        prompt_of_slot=SLOTS,
        prompt_bucket=16,
    )


def _kept_set(scaled_V: np.ndarray, top_k: int, top_p: float) -> set[int]:
    """Reference kept set, in float64: top-k first, then the nucleus of the renormalised rest."""
    order = np.argsort(-scaled_V, kind="stable")
    candidates = order[:top_k] if top_k else order
    logits = scaled_V[candidates].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    return set(candidates[before < top_p + 1e-5].tolist())


def test_sampler_logprobs_equal_a_forward_pass(model, sampled):
    expected = _completion_logprobs(
        model,
        sampled.prompt_tokens,
        sampled.prompt_lengths,
        sampled.tokens,
        sampled.lengths,
        temperature=0.8,
    )
    np.testing.assert_allclose(np.asarray(sampled.logprobs), np.asarray(expected), atol=1e-4)
    chunked = _completion_logprobs(
        model,
        sampled.prompt_tokens,
        sampled.prompt_lengths,
        sampled.tokens,
        sampled.lengths,
        temperature=0.8,
        chunk_size=8,
    )
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(expected), atol=1e-6)


def test_a_logprob_chunk_longer_than_the_sequence_pads_nothing(model, sampled):
    """A chunk of 1,000 positions over sequences of P + M: one chunk of exactly P + M (no
    array in the program holds 1,000 positions), and the same log-probs as no chunk."""
    args = (sampled.prompt_tokens, sampled.prompt_lengths, sampled.tokens, sampled.lengths)
    graphdef, state = nnx.split(model)

    def chunked(state):
        return completion_logprobs(nnx.merge(graphdef, state), *args, chunk_size=1000)

    shapes = [v.aval.shape for eqn in jax.make_jaxpr(chunked)(state).eqns for v in eqn.outvars]
    assert not [shape for shape in shapes if 1000 in shape]
    np.testing.assert_allclose(
        np.asarray(jax.jit(chunked)(state)),
        np.asarray(_completion_logprobs(model, *args)),
        atol=1e-6,
    )


def test_completions_stay_inside_the_top_k_top_p_set(model, sampled):
    tokens = np.asarray(sampled.tokens)
    prompts, prompt_lengths = np.asarray(sampled.prompt_tokens), np.asarray(sampled.prompt_lengths)
    P = prompts.shape[1]
    sequence = np.concatenate([prompts, tokens], axis=1)
    mask = np.arange(P + M)[None] >= (P - prompt_lengths)[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits = np.asarray(nnx.jit(lambda m, a, b, c: m(a, b, c))(model, sequence, positions, mask))
    for r in range(len(SLOTS)):
        for t in range(int(sampled.lengths[r])):
            kept = _kept_set(logits[r, P + t - 1] / 0.8, top_k=8, top_p=0.9)
            assert tokens[r, t] in kept, (r, t)
    assert len({tuple(row) for row in tokens[SLOTS == 2]}) > 1  # the slots really differ


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    top_k=st.sampled_from([0, 1, 3, 20]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 0.05]),
    temperature=st.floats(0.3, 2.0),
)
def test_sample_logits_never_emits_outside_the_kept_set(seed, top_k, top_p, temperature):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((64, VOCAB)) * 3).astype(np.float32)
    token, logprob = _sample(logits, jax.random.key(seed), temperature, top_p, top_k, top_p < 1)
    scaled = logits / np.float32(temperature)
    for row in range(64):
        assert int(token[row]) in _kept_set(scaled[row], top_k, top_p)
    log_softmax = scaled - jax.nn.logsumexp(scaled, axis=-1, keepdims=True)
    np.testing.assert_allclose(
        logprob, np.take_along_axis(log_softmax, np.asarray(token)[:, None], 1)[:, 0], atol=1e-5
    )


_sample = jax.jit(
    lambda logits, key, temperature, top_p, top_k, use_top_p: sample_logits(
        logits, key, temperature=temperature, top_p=top_p, top_k=top_k, use_top_p=use_top_p
    ),
    static_argnums=(4, 5),
)


def test_eos_stops_each_sequence_like_transformers(hf_and_model):
    hf_model, model = hf_and_model
    free = generate(model, PROMPTS, key=jax.random.key(0), max_new_tokens=M, temperature=0.0)
    eos = int(free.tokens[0, 3])  # sequence 0 will stop at step 3 (or earlier)
    stopped = generate(
        model, PROMPTS, key=jax.random.key(0), max_new_tokens=M, temperature=0.0, eos_ids=[eos, 95]
    )
    width = max(map(len, PROMPTS))
    ids, mask, _ = padded_batch(PROMPTS, width, left=True)
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            max_new_tokens=M,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=[eos, 95],
        )[:, width:].numpy()
    tokens = np.asarray(stopped.tokens)
    np.testing.assert_array_equal(tokens[:, : out.shape[1]], out)
    np.testing.assert_array_equal(tokens[:, out.shape[1] :], 0)
    free_tokens = np.asarray(free.tokens)
    for r in range(len(PROMPTS)):
        hits = np.flatnonzero(np.isin(free_tokens[r], [eos, 95]))
        length = hits[0] + 1 if hits.size else M
        assert int(stopped.lengths[r]) == length
        expected_reason = FinishReason.EOS if hits.size else FinishReason.LENGTH
        assert int(stopped.finish_reasons[r]) == expected_reason
        np.testing.assert_array_equal(tokens[r, :length], free_tokens[r, :length])
        assert np.all(np.asarray(stopped.logprobs)[r, length:] == 0)
    assert int(stopped.lengths[0]) <= 4 and int(stopped.finish_reasons[0]) == FinishReason.EOS


def test_same_key_same_result_other_key_other_result(model, sampled):
    again = generate(
        model,
        PROMPTS,
        key=jax.random.key(7),
        max_new_tokens=M,
        temperature=0.8,
        top_k=8,
        top_p=0.9,
        prompt_of_slot=SLOTS,
        prompt_bucket=16,
    )
    for a, b in zip(again, sampled, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = generate(
        model,
        PROMPTS,
        key=jax.random.key(8),
        max_new_tokens=M,
        temperature=0.8,
        top_k=8,
        top_p=0.9,
        prompt_of_slot=SLOTS,
        prompt_bucket=16,
    )
    assert not np.array_equal(np.asarray(other.tokens), np.asarray(sampled.tokens))


def _compiled() -> int:
    """Compilations of both decode loops (share_prefill=False runs the static one)."""
    return _generate._cache_size() + _generate_continuous._cache_size()


def test_prefill_sharing_changes_nothing_and_compiles_once(model, sampled):
    compiled_before = _compiled()
    kwargs = dict(key=jax.random.key(7), max_new_tokens=M, top_k=8, prompt_bucket=16)
    unshared = generate(
        model,
        PROMPTS,
        **kwargs,
        temperature=0.8,
        top_p=0.9,
        prompt_of_slot=SLOTS,
        share_prefill=False,
    )
    np.testing.assert_array_equal(np.asarray(unshared.tokens), np.asarray(sampled.tokens))
    np.testing.assert_allclose(
        np.asarray(unshared.logprobs), np.asarray(sampled.logprobs), atol=1e-5
    )
    # Each slot's prompt written out explicitly, as a right-padded array: the same completions.
    dense = np.zeros((len(SLOTS), 16), np.int32)
    for r, p in enumerate(SLOTS):
        dense[r, : len(PROMPTS[p])] = PROMPTS[p]
    lengths = np.array([len(PROMPTS[p]) for p in SLOTS])
    explicit = generate(model, dense, prompt_lengths=lengths, **kwargs, temperature=0.8, top_p=0.9)
    np.testing.assert_array_equal(np.asarray(explicit.tokens), np.asarray(sampled.tokens))
    np.testing.assert_array_equal(
        np.asarray(explicit.prompt_tokens), np.asarray(sampled.prompt_tokens)
    )
    compiled = _compiled()
    assert compiled == compiled_before + 2  # share_prefill=False, and R = 8 prompts
    # New values of everything traced (key, temperature, top_p, slot map, prompt contents) and a
    # prompt length within the same bucket: no new compilation.
    generate(
        model,
        random_prompts((3, 16, 2, 5), seed=9),
        key=jax.random.key(1),
        max_new_tokens=M,
        temperature=1.3,
        top_k=8,
        top_p=0.5,
        prompt_of_slot=SLOTS[::-1].copy(),
        prompt_bucket=16,
    )
    assert _compiled() == compiled


def test_all_stopped_early_leaves_padding_and_lengths(model):
    # Every token id is a stop id: each sequence stops after its first token.
    result = generate(
        model, PROMPTS, key=jax.random.key(0), max_new_tokens=M, eos_ids=np.arange(VOCAB)
    )
    np.testing.assert_array_equal(np.asarray(result.lengths), 1)
    np.testing.assert_array_equal(np.asarray(result.finish_reasons), FinishReason.EOS)
    np.testing.assert_array_equal(np.asarray(result.tokens)[:, 1:], 0)


def test_sequence_logprobs_of_right_padded_rows_match_left_padded(model):
    left = padded_batch(PROMPTS, 9, left=True)
    right = padded_batch(PROMPTS, 9, left=False)
    scores = nnx.jit(lambda m, ids, mask: sequence_logprobs(m, ids, attention_mask_BT=mask))
    lp_left = np.asarray(scores(model, jnp.asarray(left[0]), jnp.asarray(left[1])))
    lp_right = np.asarray(scores(model, jnp.asarray(right[0]), jnp.asarray(right[1])))
    np.testing.assert_allclose(lp_left[left[1]], lp_right[right[1]], atol=1e-5)
    # Zero on padding and on each row's first real token (no context); negative elsewhere.
    first = np.zeros_like(left[1])
    first[np.arange(len(PROMPTS)), 9 - np.array([len(p) for p in PROMPTS])] = True
    assert np.all(lp_left[~left[1] | first] == 0) and np.all(lp_left[left[1] & ~first] < 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=VOCAB + 1), "top_k"),
        (dict(prompt_of_slot=np.array([0, 4])), "prompt_of_slot"),
    ],
)
def test_invalid_arguments_raise_naming_them(model, kwargs, match):
    arguments = dict(key=jax.random.key(0), max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=match):
        generate(model, PROMPTS, **arguments)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[1, 2], []], key=jax.random.key(0), max_new_tokens=4)
