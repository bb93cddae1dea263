"""Decode windows (`window_ends`): the KV cache is kept in blocks, one a window.

The static loop's step reads the blocks up to its own: its live positions rounded up to a window.
The continuous loop's lanes share a ring of completion slots in those blocks, and a step skips
(`lax.cond`) the ring blocks no active lane has written into since it entered; with a lane per
request (no queue) it first runs the static loop's windows, no cond. The completions are those
of one window over the whole `P + M` cache (the samplers before windows) and of a full forward
pass alone; one compilation serves every live length; a block marked dead is not read at all
(NaN there stays out of the result). Planted, each seen failing: a window's key mask that
hides the earlier windows' slots while they are live, a window that skips the blocks between the
first and its own, and (continuous) a live ring block taken for dead and a window loop (no queue)
running a step past its block. With `skip_dead_blocks=False` the continuous loop reads every
block, with no per-block cond, and its completions are the same (planted: its step's key and
value written into the last block instead of the one holding its ring slot)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import models
from gdro_jax.models import KVCache
from gdro_jax.sampling import window_ends
from gdro_jax.sampling._continuous import _generate_continuous
from gdro_jax.sampling._generate import _generate
from tests.sampling._reference import CONFIG, EOS, SLOTS, M, sample, sample_alone, sub_jaxprs

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
    _assert_long_ones_match_a_forward_pass(model, _sample(model, 3), range(len(SLOTS)))


def _assert_long_ones_match_a_forward_pass(model, got, slots):
    """Up to 4 of `slots` whose completions ran past 6 tokens (at least 2), each against full
    forward passes of that slot alone."""
    long = [s for s in slots if int(got.lengths[s]) > 6][:4]
    assert len(long) >= 2
    for slot in long:
        tokens, logprobs = sample_alone(model, slot, top_p=1.0)
        length = int(got.lengths[slot])
        np.testing.assert_array_equal(np.asarray(got.tokens)[slot, :length], tokens)
        np.testing.assert_allclose(np.asarray(got.logprobs)[slot, :length], logprobs, atol=ATOL)


# Other keys and stop ids (as many: their number is a shape), so that requests stop in other
# windows.
OTHER_RUNS = ((4, 0), (5, 12), (6, 24), (7, 36))


def _runs_after_the_first(jitted, run):
    """`run(key, eos_ids)` for each of OTHER_RUNS after a first call, asserting that `jitted`
    compiled none of them; their completions' lengths."""
    run(3, tuple(range(24)))
    compiled = jitted._cache_size()
    lengths = [
        np.asarray(run(key, tuple(range(first, first + 24))).lengths) for key, first in OTHER_RUNS
    ]
    assert jitted._cache_size() == compiled
    return lengths


def test_one_compilation_serves_every_live_length(model):
    lengths = _runs_after_the_first(
        _generate, lambda key, eos_ids: _sample(model, 3, key=key, eos_ids=eos_ids)
    )
    longest = [n.reshape(3, 8).max(axis=1) for n in lengths]  # per chunk
    assert len({int(n) for n in np.concatenate(longest)}) >= 3, longest


def test_a_bad_window_is_named(model):
    with pytest.raises(ValueError, match="decode_window must be an int >= 0"):
        _sample(model, -1)


# --- The continuous loop ------------------------------------------------------------------------


def _lanes(model, lanes, window, *, key=3, eos_ids=EOS, top_p=1.0):
    """The shared workload from a queue on `lanes` decode lanes, ring blocks of `window`."""
    return sample(
        model, lanes, batching="continuous", key=key, eos_ids=eos_ids, top_p=top_p,
        decode_window=window,
    )  # fmt: skip


# 1 lane: each request alone, its ring slots wrapping from wherever the last one stopped; 5 and
# 8: requests of every age side by side, so the blocks read wrap around the ring's end. 24 (a
# lane per request) and 32 (8 lanes idle): no queue, so the static loop's windows first, then
# the halved lanes' ring blocks.
@pytest.mark.parametrize("lanes, top_p", [(1, 1.0), (5, 1.0), (8, 0.9), (24, 1.0), (32, 0.9)])
def test_continuous_windows_give_the_whole_caches_completions(model, lanes, top_p):
    want = sample(model, 8, batching="static", decode_window=M, top_p=top_p)
    got = _lanes(model, lanes, 3, top_p=top_p)  # blocks of 24 + 3, 3, 3 and 1 slots
    for name in ("tokens", "lengths", "finish_reasons", "prompt_tokens"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=ATOL)


def test_continuous_windows_match_a_forward_pass_alone(model):
    """Requests that entered at refills and ran across several blocks of the ring."""
    _assert_long_ones_match_a_forward_pass(model, _lanes(model, 5, 3), range(5, len(SLOTS)))


@pytest.mark.parametrize("lanes", [5, 24])
def test_continuous_windows_compile_once_for_every_live_length(model, lanes):
    lengths = _runs_after_the_first(
        _generate_continuous,
        lambda key, eos_ids: _lanes(model, lanes, 3, key=key, eos_ids=eos_ids),
    )
    assert len({int(n) for n in np.concatenate(lengths)}) >= 5, lengths


# --- A block marked dead is not read ------------------------------------------------------------


def test_a_dead_block_is_not_read_and_the_write_lands_in_the_holding_block(model):
    """`extend_cache(live_blocks=...)` on blocks of 6, 4 and 5 slots, the last full of NaN, marked
    dead and masked: the hidden state is the one-array cache's with that block zero (masking
    alone would let 0 x NaN through the values), and the new key/value lands at slot 7 (block 1)
    with every other slot unchanged."""
    B, S, ends = 3, 15, (6, 10, 15)
    rng = np.random.default_rng(1)
    full = model.init_cache(B, S)
    full = KVCache(
        k=tuple(jnp.asarray(rng.normal(size=k.shape), k.dtype) for k in full.k),
        v=tuple(jnp.asarray(rng.normal(size=v.shape), v.dtype) for v in full.v),
    )
    full = KVCache(  # the last block's slots zero in the reference
        k=tuple(k.at[..., 10:].set(0) for k in full.k),
        v=tuple(v.at[:, :, 10:].set(0) for v in full.v),
    )

    def split(a, axis):
        starts = (0, *ends[:-1])
        return tuple(
            jax.lax.slice_in_dim(a, s, e, axis=axis) for s, e in zip(starts, ends, strict=True)
        )

    blocked = KVCache(
        k=tuple(split(k, 3)[:2] + (jnp.full_like(split(k, 3)[2], jnp.nan),) for k in full.k),
        v=tuple(split(v, 2)[:2] + (jnp.full_like(split(v, 2)[2], jnp.nan),) for v in full.v),
    )
    tokens_B1 = jnp.asarray([[3], [9], [27]], jnp.int32)
    positions_B1 = jnp.asarray([[7], [7], [5]], jnp.int32)
    mask_BS = np.zeros((B, S), bool)
    mask_BS[:, :8] = True
    mask_BS[2, :2] = False
    options = dict(cache_index=7, key_mask_BS=jnp.asarray(mask_BS), causal_by_slot=False)
    want_h, want_cache = model.extend_cache(tokens_B1, positions_B1, cache=full, **options)
    got_h, got_cache = model.extend_cache(
        tokens_B1, positions_B1, cache=blocked, live_blocks=jnp.asarray([True, True, False]),
        **options,
    )  # fmt: skip
    assert np.all(np.isfinite(np.asarray(got_h)))
    np.testing.assert_allclose(np.asarray(got_h), np.asarray(want_h), rtol=1e-5, atol=1e-6)
    for got, want, axis in ((got_cache.k, want_cache.k, 3), (got_cache.v, want_cache.v, 2)):
        for got_blocks, want_layer in zip(got, want, strict=True):
            wanted = split(want_layer, axis)
            np.testing.assert_array_equal(np.asarray(got_blocks[0]), np.asarray(wanted[0]))
            np.testing.assert_array_equal(np.asarray(got_blocks[1]), np.asarray(wanted[1]))
            assert np.all(np.isnan(np.asarray(got_blocks[2])))  # dead and untouched


# --- Every block read, no conds (`skip_dead_blocks=False`) --------------------------------------


def _block_conds(jaxpr) -> int:
    """The `cond`s of a jaxpr (nested) with a matmul in a branch: the per-block skips of the
    attention (the refill's cond gathers and draws, with no matmul)."""
    found = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond":
            found += any("dot_general" in str(branch.jaxpr) for branch in eqn.params["branches"])
        found += sum(_block_conds(inner) for inner in sub_jaxprs(eqn))
    return found


@pytest.mark.parametrize("lanes, top_p", [(8, 0.9), (32, 0.9)])
def test_reading_every_block_gives_the_whole_caches_completions(model, lanes, top_p):
    """With a queue (8 lanes) and after it (32: the halved lanes; one halving, so fewer loops to
    compile), every ring block read and the dead ones masked: the completions of one window over
    the whole cache."""
    want = sample(model, 8, batching="static", decode_window=M, top_p=top_p)
    got = sample(
        model, lanes, batching="continuous", top_p=top_p, decode_window=3, lane_halvings=1,
        skip_dead_blocks=False,
    )  # fmt: skip
    for name in ("tokens", "lengths", "finish_reasons", "prompt_tokens"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=ATOL)


def test_reading_every_block_leaves_no_cond_around_attention(model):
    def block_conds(skip):
        fn = lambda: sample(  # noqa: E731
            model, 5, batching="continuous", decode_window=3, skip_dead_blocks=skip
        )
        return _block_conds(jax.make_jaxpr(fn)().jaxpr)

    # Blocks of 24 + 3, 3, 3 and 1 slots: those after the first are skipped when dead.
    assert block_conds(True) >= 3
    assert block_conds(False) == 0


def test_skip_dead_blocks_must_be_a_bool(model):
    with pytest.raises(ValueError, match="skip_dead_blocks must be True or False, got 0"):
        sample(model, 5, batching="continuous", skip_dead_blocks=0)
