"""Continuous batching: C decode lanes and a queue of R requests. Each request's completion is the
one the static loop gives it (its own key, whatever lane it ran in and whenever it entered) and the
one a full forward pass gives it alone; stopped lanes write nothing; one compilation serves every
key and slot map."""

import jax
import numpy as np
import pytest

from gdro_jax import models
from gdro_jax.sampling import FinishReason, generate
from gdro_jax.sampling._continuous import _generate_continuous, _lanes_after_queue
from tests.sampling._reference import (
    BUCKET,
    CONFIG,
    PROMPTS,
    RNG,
    SLOTS,
    M,
    assert_same,
    sample,
    sample_alone,
)

# A request's log-probs against the static loop's: the same tokens, whose logits come from
# matmuls over batches of another composition (float32 rounding; 0 on this CPU so far).
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return models.init_decoder(CONFIG, seed=0)


@pytest.fixture(scope="module")
def static(model):
    return {top_p: sample(model, None, batching="static", top_p=top_p) for top_p in (1.0, 0.9)}


def _assert_equal_up_to_rounding(got, want):
    for name in ("tokens", "lengths", "finish_reasons", "prompt_tokens", "prompt_lengths"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=ATOL)


def test_with_a_lane_per_request_it_is_the_static_loop_bit_for_bit(model, static):
    # C = R: every request enters at the start, so the batch is the static loop's throughout.
    assert_same(sample(model, None, batching="continuous"), static[1.0])


# 5 and 8 lanes for 24 requests (19 and 16 enter at refills); one lane: every request in turn.
@pytest.mark.parametrize("lanes, top_p", [(5, 1.0), (8, 0.9), (1, 1.0)])
def test_a_queue_of_requests_gives_each_its_own_completion(model, static, lanes, top_p):
    got = sample(model, lanes, batching="continuous", top_p=top_p)
    _assert_equal_up_to_rounding(got, static[top_p])
    lengths = np.asarray(got.lengths)
    assert lengths.min() < M and lengths.max() == M, lengths  # early stops and full lengths
    # Nothing after a request's end: its stop token, then padding and log-prob 0.
    after_end = np.arange(M)[None, :] >= lengths[:, None]
    assert np.all(np.asarray(got.tokens)[after_end] == 0)
    assert np.all(np.asarray(got.logprobs)[after_end] == 0)


def _lanes_active_after_the_queue(lengths, lanes: int) -> list[int]:
    """The active lanes at each decode step after the queue empties, simulated from the requests'
    lengths: requests enter free lanes in order, a request's first token comes as it enters, and
    a lane freed by a stop takes the next request before the following step."""
    queue, remaining, counts = list(lengths), [0] * lanes, []
    while True:
        for lane in range(lanes):
            if remaining[lane] == 0 and queue:
                remaining[lane] = queue.pop(0) - 1  # its first token drawn as it enters
        active = sum(r > 0 for r in remaining)
        if active == 0 and not queue:
            return counts
        if not queue:
            counts.append(active)
        remaining = [max(r - 1, 0) for r in remaining]


def test_the_lanes_halve_after_the_queue_and_each_request_keeps_its_completion(model):
    # 16 lanes for 24 requests of up to 24 tokens, 7 stop ids in 64: once the queue is empty the
    # loop halves to 8, 4, 2 and 1 lanes, with tokens still to sample at each size.
    assert _lanes_after_queue(16, 1, 4) == [8, 4, 2, 1]
    kwargs = dict(
        key=jax.random.key(3), max_new_tokens=24, eos_ids=tuple(range(1, 8)),
        prompt_of_slot=SLOTS, prompt_bucket=BUCKET,
    )  # fmt: skip
    want = generate(model, PROMPTS, batching="static", **kwargs)
    got = generate(model, PROMPTS, micro_batch_slots=16, batching="continuous", **kwargs)
    _assert_equal_up_to_rounding(got, want)
    active = _lanes_active_after_the_queue(np.asarray(got.lengths).tolist(), 16)
    # This workload decodes at every size: steps with 5-8, 3-4, 2 and 1 lanes active.
    for low, high in ((5, 8), (3, 4), (2, 2), (1, 1)):
        assert any(low <= n <= high for n in active), (low, high, active)


@pytest.mark.parametrize(
    "lanes, shards, halvings, sizes",
    [(64, 1, 4, [32, 16, 8, 4]), (64, 8, 4, [32, 16, 8]), (24, 8, 4, []), (48, 4, 4, [24, 12]),
     (5, 1, 4, []), (8, 1, 4, [4, 2, 1]), (128, 8, 4, [64, 32, 16, 8]), (128, 8, 1, [64]),
     (64, 1, 0, [])],
)  # fmt: skip
def test_the_lanes_halve_while_even_at_most_lane_halvings_times_over_the_shards(
    lanes, shards, halvings, sizes
):
    assert _lanes_after_queue(lanes, shards, halvings) == sizes


def test_lane_halvings_is_validated(model):
    for bad in (-1, 1.5, True):
        with pytest.raises(
            ValueError, match=f"lane_halvings must be an int >= 0, got lane_halvings={bad}"
        ):
            sample(model, 5, batching="continuous", lane_halvings=bad)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_requests_that_entered_at_refills_match_a_forward_pass_alone(model, top_p):
    got = sample(model, 5, batching="continuous", top_p=top_p)
    for slot in (0, 9, 17, 23):  # slot 0 enters at the start; 9, 17 and 23 at refills
        tokens, logprobs = sample_alone(model, slot, top_p=top_p)
        length = int(got.lengths[slot])
        np.testing.assert_array_equal(np.asarray(got.tokens)[slot, :length], tokens)
        np.testing.assert_allclose(np.asarray(got.logprobs)[slot, :length], logprobs, atol=ATOL)


def test_greedy_decoding_equals_the_static_loop_token_for_token(model):
    static = sample(model, None, batching="static", temperature=0.0)
    got = sample(model, 5, batching="continuous", temperature=0.0)
    _assert_equal_up_to_rounding(got, static)
    assert len(set(map(tuple, np.asarray(got.tokens).tolist()))) > 1


@pytest.mark.parametrize("max_new_tokens", [1, M])
def test_requests_that_stop_at_their_first_token_free_their_lane(model, max_new_tokens):
    # Every token is a stop id: each request stops as it enters, and the lane takes the next.
    result = generate(
        model,
        PROMPTS,
        key=jax.random.key(0),
        max_new_tokens=max_new_tokens,
        eos_ids=np.arange(CONFIG.vocab_size),
        prompt_of_slot=SLOTS,
        prompt_bucket=BUCKET,
        micro_batch_slots=5,
    )
    np.testing.assert_array_equal(np.asarray(result.lengths), 1)
    np.testing.assert_array_equal(np.asarray(result.finish_reasons), int(FinishReason.EOS))
    assert np.all(np.asarray(result.tokens)[:, 1:] == 0)
    assert np.all(np.asarray(result.logprobs)[:, 0] < 0)


def test_one_compilation_serves_every_key_slot_map_and_prompt(model, static):
    sample(model, 5, batching="continuous", top_p=0.9)
    compiled = _generate_continuous._cache_size()
    other_slots = np.sort(RNG.integers(0, len(PROMPTS), len(SLOTS))).astype(np.int32)
    other_prompts = [RNG.integers(1, 64, n).tolist() for n in (2, 16, 8, 4, 11)]
    for key, slots, prompts in ((4, SLOTS, PROMPTS), (5, other_slots, other_prompts)):
        result = sample(
            model, 5, batching="continuous", top_p=0.9, key=key, slots=slots, prompts=prompts
        )
        assert not np.array_equal(np.asarray(result.tokens), np.asarray(static[0.9].tokens))
    assert _generate_continuous._cache_size() == compiled


def test_batching_is_validated(model):
    with pytest.raises(ValueError, match="batching must be one of continuous, static"):
        sample(model, 5, batching="dynamic")
