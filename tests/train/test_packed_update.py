"""The packed update (`GRPOConfig.pack_sequences`) equals the padded one, and packing places every
token once.

Three references:
- the layout against a first-fit-decreasing loop written in numpy, and every sequence read back
  from its row (tokens, per-segment positions, segment ids) with no cell used twice;
- the packed log-probs against an independent per-sequence loop: each slot's own prompt and
  completion through the model alone, no padding, no other sequence in the row;
- one optimizer mini-batch (`minibatch_step`) packed against padded, on
  `test_grad_accumulation`'s ragged batch (one empty response, micro-batches of very different
  lengths): gradients, parameters after AdamW, loss, every metric and both log-probs, for every
  aggregation with and without the KL term, with and without micro-batches, and with the TIS
  weights of another engine's samples; and a whole update on an 8-device mesh, twice with
  different lengths, compiled once.

Seen failing on planted bugs: a segment mask that leaks across segments (`hidden_states`
without the segment test: the per-sequence log-probs, every mini-batch case and the sharded
update fail), positions not reset per segment (the row's column as the RoPE position: the layout
test fails; RoPE is relative, so the log-probs then move only by rounding), and a token counted
twice (`unpack_completion_logprobs` taking a slot of the next pass's rows as its own: the log-probs,
every mini-batch case and the sharded update fail).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdro_jax import controllers, losses, sampling, train
from gdro_jax.step import GRPOConfig, make_update
from tests.train.configs import tiny_config
from tests.train.test_grad_accumulation import (
    COMPILE,
    KL_COEF,
    TEMPERATURE,
    TX,
    _assert_trees_close,
    _grpo,
    _one_minibatch,
    setup,  # noqa: F401  (the module fixture: policy, seeded controllers, ragged batch)
    sharded,
)
from tests.train.test_update_reference import MAX_NEW_TOKENS, NUM_PROMPTS, NUM_SLOTS

# float32 sums in another order (attention over a packed row of other segments' masked keys).
RTOL, ATOL = 1e-5, 1e-6


# ------------------------------------------------------------------ the layout


def _first_fit_decreasing(lengths, row_length):
    """Row and start of each sequence: longest first (ties by index), each in the first row
    with room, a row opened when none has; written as a plain loop."""
    rows_free, row, start = [], {}, {}
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fitting = [r for r, free in enumerate(rows_free) if free >= lengths[i]]
        if not fitting:
            rows_free.append(row_length)
        r = fitting[0] if fitting else len(rows_free) - 1
        row[i], start[i] = r, row_length - rows_free[r]
        rows_free[r] -= lengths[i]
    return (
        [row[i] for i in range(len(lengths))],
        [start[i] for i in range(len(lengths))],
        len(rows_free),
    )


@pytest.mark.parametrize("seed", range(4))
def test_the_layout_is_first_fit_decreasing_and_holds_every_token_once(seed):
    rng = np.random.default_rng(seed)
    num_slots, width, max_new = 12, 7, 9
    prompt_lengths = rng.integers(1, width + 1, num_slots)
    lengths = rng.integers(0, max_new + 1, num_slots)
    if seed == 0:
        lengths[:] = max_new  # the worst case: every sequence fills a row
        prompt_lengths[:] = width
    prompts = np.zeros((num_slots, width), np.int32)
    completions = np.zeros((num_slots, max_new), np.int32)
    for i in range(num_slots):
        prompts[i, width - prompt_lengths[i] :] = rng.integers(1, 100, prompt_lengths[i])
        completions[i, : lengths[i]] = rng.integers(1, 100, lengths[i])
    packed = jax.jit(sampling.pack_completions)(prompts, prompt_lengths, completions, lengths)
    packed = jax.tree.map(np.asarray, packed)
    want_row, want_start, want_used = _first_fit_decreasing(
        list(prompt_lengths + lengths), width + max_new
    )
    np.testing.assert_array_equal(packed.row_S, want_row)
    np.testing.assert_array_equal(packed.start_S, want_start)
    assert packed.num_rows_used == want_used
    assert (packed.segments_BL[want_used:] == 0).all(), "rows past the used ones stay empty"
    cells = np.zeros(packed.tokens_BL.shape, int)
    for i in range(num_slots):
        n = prompt_lengths[i] + lengths[i]
        r, s = packed.row_S[i], packed.start_S[i]
        sequence = np.concatenate(
            [prompts[i, width - prompt_lengths[i] :], completions[i, : lengths[i]]]
        )
        np.testing.assert_array_equal(packed.tokens_BL[r, s : s + n], sequence)
        np.testing.assert_array_equal(packed.positions_BL[r, s : s + n], np.arange(n))
        np.testing.assert_array_equal(packed.segments_BL[r, s : s + n], i + 1)
        cells[r, s : s + n] += 1
    assert cells.max() <= 1, "no cell holds two tokens"
    assert (packed.segments_BL > 0).sum() == cells.sum() == (prompt_lengths + lengths).sum()


# ------------------------------------------------------------------ log-probs


def _per_sequence_logprobs(model, prompts, prompt_lengths, completions, lengths, temperature):
    """Each slot alone: its real prompt and completion tokens, positions 0.., one forward pass
    (jitted once per sequence length), log softmax(logits / T) of each completion token (numpy,
    [S, M], 0 past the end)."""
    graphdef, params = nnx.split(model)

    @jax.jit
    def logp_of_sequence(params, sequence_T):
        logits = nnx.merge(graphdef, params)(sequence_T[None], jnp.arange(len(sequence_T))[None])
        return jax.nn.log_softmax(logits[0] / temperature, axis=-1)

    width, max_new = prompts.shape[1], completions.shape[1]
    out = np.zeros((len(lengths), max_new), np.float32)
    for i in range(len(lengths)):
        sequence = np.concatenate(
            [prompts[i, width - prompt_lengths[i] :], completions[i, : lengths[i]]]
        )
        logp = np.asarray(logp_of_sequence(params, jnp.asarray(sequence)))
        for j in range(lengths[i]):
            out[i, j] = logp[prompt_lengths[i] - 1 + j, completions[i, j]]
    return out


def test_packed_logprobs_equal_a_per_sequence_loop_and_the_padded_layout(setup):  # noqa: F811
    batch, params = setup["batch"], setup["state"].params
    model = nnx.merge(setup["graphdef"], params)
    arrays = (batch.prompt_tokens, batch.prompt_lengths, batch.tokens, batch.lengths)
    want = _per_sequence_logprobs(model, *map(np.asarray, arrays), TEMPERATURE)
    assert np.abs(want).max() > 1.0
    for rows_per_pass in (1, 3, NUM_SLOTS):  # 3 does not divide the 32 slots
        packed = jax.jit(
            functools.partial(
                sampling.packed_completion_logprobs,
                model,
                rows_per_pass=rows_per_pass,
                temperature=TEMPERATURE,
            )
        )(*arrays)
        np.testing.assert_allclose(packed, want, rtol=RTOL, atol=ATOL, err_msg=str(rows_per_pass))
    padded = sampling.completion_logprobs(model, *arrays, temperature=TEMPERATURE)
    np.testing.assert_allclose(padded, want, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ one mini-batch


def _tis_weights(batch):
    """Truncated importance weights of an engine whose log-probs sit off the trainer's."""
    mask = jnp.arange(MAX_NEW_TOKENS)[None] < batch.lengths[:, None]
    noise = jax.random.normal(jax.random.key(11), batch.logprobs.shape) * 0.4
    engine = jnp.where(mask, batch.logprobs + noise, 0.0)
    return losses.truncated_is_weights(batch.logprobs, engine, mask, cap=2.0)


# (aggregation, kl_coef, micro_batch_slots, tis): every aggregation with and without KL, packed
# passes of 2 rows (micro-batches of 2) or the default (an eighth of the slots), TIS in two.
CASES = [
    (aggregation, kl_coef, (2, None)[(i + with_kl) % 2], i == with_kl)
    for i, aggregation in enumerate(losses.AGGREGATIONS)
    for with_kl, kl_coef in enumerate((0.0, KL_COEF))
]


# Three in `make test` (each aggregation once, KL on and off, both pass sizes, TIS), all six in
# the slow tier.
FAST_CASES = {CASES[0], CASES[3], CASES[5]}


@pytest.fixture(
    scope="module",
    params=[c if c in FAST_CASES else pytest.param(c, marks=pytest.mark.slow) for c in CASES],
    ids=lambda c: "{}-kl{}-micro{}-tis{}".format(*c),
)
def outcomes(request, setup):  # noqa: F811
    aggregation, kl_coef, micro, tis = request.param
    weights = _tis_weights(setup["batch"]) if tis else None
    packed = _grpo(aggregation, kl_coef, micro, pack_sequences=True)
    padded = _grpo(aggregation, kl_coef, micro, pack_sequences=False)
    return dict(
        got=_one_minibatch(setup, packed, weights), want=_one_minibatch(setup, padded, weights)
    )


def test_the_packed_mini_batch_equals_the_padded(outcomes):
    got, want = outcomes["got"], outcomes["want"]
    assert set(got["metrics"]) == set(want["metrics"])
    assert want["metrics"]["clip_fraction_low"] + want["metrics"]["clip_fraction_high"] > 0.05
    for name in want["metrics"]:
        np.testing.assert_allclose(
            got["metrics"][name], want["metrics"][name], rtol=RTOL, atol=ATOL, err_msg=name
        )
    for name in ("grads", "params", "logp", "ref_logp"):
        _assert_trees_close(got[name], want[name])
    assert np.abs(want["logp"]).max() > 0.1


def test_passes_cover_only_the_rows_in_use(setup):  # noqa: F811
    """A mini-batch's 16 sequences (prompts of 2-5 tokens, completions of 0-6) take the rows the
    first-fit-decreasing loop gives, fewer than the slots, and the passes of k rows cover those
    rows and no more."""
    batch, idx = setup["batch"], setup["idx"]
    prompt_lengths, lengths = batch.prompt_lengths[idx], batch.lengths[idx]
    packed = sampling.pack_completions(
        batch.prompt_tokens[idx], prompt_lengths, batch.tokens[idx], lengths
    )
    row_length = batch.prompt_tokens.shape[1] + MAX_NEW_TOKENS
    _, _, want_rows = _first_fit_decreasing(list(np.asarray(prompt_lengths + lengths)), row_length)
    assert int(packed.num_rows_used) == want_rows < len(idx)
    for rows_per_pass in (1, 2, 3, len(idx)):
        passes = int(sampling.packed_passes(packed, rows_per_pass))
        assert (passes - 1) * rows_per_pass < want_rows <= passes * rows_per_pass


# ------------------------------------------------------------------ the whole update, sharded


def _lengths_changed(batch, seed):
    """`batch` with other completion lengths (tokens past each end zeroed)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, MAX_NEW_TOKENS + 1, NUM_SLOTS)
    mask = np.arange(MAX_NEW_TOKENS)[None] < lengths[:, None]
    return batch._replace(
        lengths=jnp.asarray(lengths, jnp.int32),
        tokens=jnp.where(mask, batch.tokens, 0),
        logprobs=jnp.where(mask, batch.logprobs, 0.0),
    )


def _assert_updates_close(got, want):
    """Two updates' `(params, controllers' states, metrics)` equal to RTOL, ATOL."""
    for a, b in zip(got[:2], want[:2], strict=True):
        _assert_trees_close(a, b)
    assert set(got[2]) == set(want[2])
    for name in want[2]:
        np.testing.assert_allclose(got[2][name], want[2][name], rtol=RTOL, atol=ATOL, err_msg=name)


def test_a_sharded_packed_update_equals_the_padded_and_compiles_once(setup):  # noqa: F811
    graphdef, state, plan, prompt_ids, batch, replicated = sharded(setup)
    out_shardings = (jax.tree.map(lambda leaf: leaf.sharding, state), replicated)
    results = {}
    for pack in (False, True):
        grpo = _grpo("seq_mean_token_mean", KL_COEF, 4, loss_signal="surrogate_kl",
                     pack_sequences=pack)  # fmt: skip
        update = jax.jit(
            make_update(graphdef, TX, setup["gdro"], grpo, num_prompts=NUM_PROMPTS),
            out_shardings=out_shardings,
            compiler_options=COMPILE,
        )
        first, metrics = update(state, plan, prompt_ids, batch)
        # A second step on completions of other lengths: the same program.
        other = jax.device_put(_lengths_changed(batch, seed=int(pack)), replicated)
        second, _ = update(first, plan, prompt_ids, other)
        assert update._cache_size() == 1
        results[pack] = jax.tree.map(np.asarray, (first.params, first.gdro, metrics))
        del second
    _assert_updates_close(got=results[True], want=results[False])


@pytest.mark.slow
@pytest.mark.parametrize("method", controllers.METHODS)
def test_every_method_updates_alike_packed_and_padded(method):
    """One step of each method's run (its controllers, the group filter's buffer included):
    the update with packing equals it without, on the same plan and rollouts."""
    # One optimizer step from the same parameters, with AdamW's eps at 1e-4
    # (test_grad_accumulation's reason): with 1e-8 its first step turns the rounding of
    # near-zero gradient entries into parameter differences of ~1e-5, and a second mini-batch
    # would compound them.
    overrides = {"grpo.pack_sequences": False, "grpo.num_minibatches": 1, "optimizer.eps": 1e-4}
    config = tiny_config(method, **overrides)
    run = train.build_run(config)
    prompt_ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(run.state.gdro, prompt_ids, jax.random.key(1))
    rollouts = run.rollout(run.state.params, plan, prompt_ids, jax.random.key(2))
    rng = np.random.default_rng(3)
    correct = rng.random(rollouts.rewards.shape) < 0.5
    rollouts = rollouts._replace(
        rewards=jnp.where(correct, 1.0, -1.0).astype(jnp.float32), correct=jnp.asarray(correct)
    )
    assert int(jnp.min(rollouts.lengths)) < int(jnp.max(rollouts.lengths)), "uneven lengths"
    results = {}
    for pack in (False, True):
        program = run.program.replace(
            grpo=dataclasses.replace(run.program.grpo, pack_sequences=pack)
        )
        state = jax.tree.map(jnp.copy, run.state)
        new_state, metrics = program.update(state)(state, plan, prompt_ids, rollouts)
        results[pack] = jax.tree.map(np.asarray, (new_state.params, new_state.gdro, metrics))
    _assert_updates_close(got=results[True], want=results[False])


def test_the_switch_is_refused_unless_a_bool():
    with pytest.raises(ValueError, match="got pack_sequences=1"):
        GRPOConfig(pack_sequences=1)
