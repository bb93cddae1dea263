"""The static loop's decode windows (`window_ends`): the KV cache is kept in blocks, one a
window, and a decode step reads the blocks up to its own: its live positions rounded up to a
window. The completions are those
of one window over the whole `P + M` cache (the sampler before windows) and of a full forward
pass alone; one compilation serves every live length. Planted, each seen failing: a window's key
mask that hides the earlier windows' slots while they are live, and a window that skips the
blocks between the first and its own."""

import numpy as np
import pytest

from gdro_jax import models
from gdro_jax.sampling import window_ends
from gdro_jax.sampling._generate import _generate
from tests.sampling._reference import CONFIG, EOS, SLOTS, M, sample, sample_alone

ATOL = 1e-5  # log-probs: matmuls over caches of other lengths round differently


@pytest.fixture(scope="module")
def model():
    return models.init_decoder(CONFIG, seed=0)


def _sample(model, window, *, key=3, eos_ids=EOS):
    """The shared workload in static chunks of 8 slots, with windows of `window` tokens."""
    return sample(model, 8, batching="static", key=key, eos_ids=eos_ids, decode_window=window)


@pytest.fixture(scope="module")
def whole(model):
    """One window: the cache of P + M slots from the first step (the sampler before windows)."""
    return _sample(model, M)


def test_window_ends_by_hand():
    assert window_ends(10, 3) == (3, 6, 9, 10)
    assert window_ends(10, 5) == (5, 10)
    assert window_ends(10, 10) == window_ends(10, 64) == (10,)
    assert window_ends(100) == (100,)  # automatic: at least 128 tokens a window
    assert window_ends(512) == (128, 256, 384, 512)
    assert window_ends(4096) == tuple(range(512, 4097, 512))  # automatic: at most 8 windows


def test_windows_give_the_whole_caches_completions(model, whole):
    got = _sample(model, 3)  # windows of 3: the cache in blocks of 24 + 3, 3, 3 and 1 slots
    for name in ("tokens", "lengths", "finish_reasons", "prompt_tokens"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(whole, name)), err_msg=name
        )
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(whole.logprobs), atol=ATOL)
    lengths = np.asarray(got.lengths)
    assert lengths.min() < 4 and lengths.max() == M, lengths  # stops in the first window and last


def test_windows_match_a_forward_pass_alone(model):
    """Slots that run past several windows, each against full forward passes without a cache."""
    got = _sample(model, 3)
    long = [s for s in range(len(SLOTS)) if int(got.lengths[s]) > 6][:4]
    assert len(long) >= 2
    for slot in long:
        tokens, logprobs = sample_alone(model, slot, top_p=1.0)
        length = int(got.lengths[slot])
        np.testing.assert_array_equal(np.asarray(got.tokens)[slot, :length], tokens)
        np.testing.assert_allclose(np.asarray(got.logprobs)[slot, :length], logprobs, atol=ATOL)


def test_one_compilation_serves_every_live_length(model):
    _sample(model, 3, eos_ids=tuple(range(24)))
    compiled = _generate._cache_size()
    # Other keys and stop ids (as many: their number is a shape), so that the chunks stop in
    # other windows.
    longest = []
    for key, first in ((4, 0), (5, 12), (6, 24), (7, 36)):
        result = _sample(model, 3, key=key, eos_ids=tuple(range(first, first + 24)))
        longest.append(np.asarray(result.lengths).reshape(3, 8).max(axis=1))  # per chunk
    assert _generate._cache_size() == compiled
    assert len({int(n) for n in np.concatenate(longest)}) >= 3, longest


def test_a_bad_window_is_named(model):
    with pytest.raises(ValueError, match="decode_window must be an int >= 0"):
        _sample(model, -1)
