"""SPEC section 10's metrics by value, on a hand-built batch, against numpy loops.

Four prompts in bins 0, 3, 3 and 4 of five (bins 1 and 2 empty, bin 1 with the largest score so
that a distribution over all bins would show), ragged groups of 5, 2, 3 and 2 rollouts, Prompt-GDRO
multipliers other than 1, completions of different lengths whose padding holds garbage log-probs.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers
from gdro_jax.step import Rollouts, step_metrics

NUM_BINS = 5
BINS = np.array([0, 3, 3, 4])
NUM_ROLLOUTS = np.array([5, 2, 3, 2])
WEIGHTS = np.array([1.6, 0.5, 0.9, 1.1])
SCORES = np.array([0.5, 9.0, -1.0, 1.5, 3.0])
ETA, GAMMA, CLIP = 0.65, 0.1, 2.0
REWARDS = np.array([1, -1, 1, 1, -1, 1, 1, -1, -1, 1, -1, -1], np.float64)
LENGTHS = np.array([3, 1, 6, 2, 4, 5, 6, 1, 2, 3, 4, 2])
MAX_NEW_TOKENS = 6
PROMPT_OF_SLOT = np.repeat(np.arange(len(BINS)), NUM_ROLLOUTS)
MU = 0.125


def _inputs(with_prompt_adversary):
    rng = np.random.default_rng(0)
    valid = np.arange(MAX_NEW_TOKENS)[None] < LENGTHS[:, None]
    logprobs = np.where(valid, -rng.uniform(0.1, 3.0, size=valid.shape), -50.0)
    reports = {}
    if with_prompt_adversary:  # what the adversary reports at planning, as the plan holds it
        adversary = controllers.prompt_gdro(NUM_BINS, eta=ETA, gamma=GAMMA, clip=CLIP)
        prompt_state = adversary.init()._replace(
            scores=jnp.asarray(SCORES, jnp.float32), seen=jnp.ones((NUM_BINS,), bool)
        )
        present = np.isin(np.arange(NUM_BINS), BINS)
        reports["prompt_adversary"] = adversary.metrics(prompt_state, jnp.asarray(present))
    plan = controllers.Plan(
        bins=jnp.asarray(BINS, jnp.int32),
        p_hat=jnp.zeros((len(BINS),), jnp.float32),
        num_rollouts=jnp.asarray(NUM_ROLLOUTS, jnp.int32),
        prompt_of_slot=jnp.asarray(PROMPT_OF_SLOT, jnp.int32),
        advantage_weights=jnp.asarray(WEIGHTS, jnp.float32),
        mu=jnp.asarray(MU, jnp.float32),
        reports=reports,
    )
    rollouts = Rollouts(
        prompt_tokens=jnp.ones((len(REWARDS), 2), jnp.int32),
        prompt_lengths=jnp.full((len(REWARDS),), 2, jnp.int32),
        tokens=jnp.ones((len(REWARDS), MAX_NEW_TOKENS), jnp.int32),
        lengths=jnp.asarray(LENGTHS, jnp.int32),
        logprobs=jnp.asarray(logprobs, jnp.float32),
        rewards=jnp.asarray(REWARDS, jnp.float32),
        correct=jnp.asarray(REWARDS > 0),
        engine_logprobs=jnp.asarray(logprobs, jnp.float32),
    )
    metrics = step_metrics(
        plan,
        rollouts,
        jnp.zeros((len(REWARDS),)),
        jnp.asarray(valid),
        jnp.zeros((len(BINS),)),
        num_bins=NUM_BINS,
    )
    return {name: np.asarray(value) for name, value in metrics.items()}, logprobs, valid


def _reference_q(with_prompt_adversary):
    """SPEC 4's q over the present bins (uniform over them without Prompt-GDRO)."""
    present = sorted(set(BINS.tolist()))
    q = np.zeros(NUM_BINS)
    if not with_prompt_adversary:
        q[present] = 1.0 / len(present)
        return q
    logits = np.array([ETA * min(max(SCORES[b], -CLIP), CLIP) for b in present])
    soft = np.exp(logits) / np.exp(logits).sum()
    q[present] = (1 - GAMMA) * soft + GAMMA / len(present)
    return q


def _reference(with_prompt_adversary, logprobs, valid):
    q = _reference_q(with_prompt_adversary)
    per_bin = {
        name: np.zeros(NUM_BINS)
        for name in ("tokens", "reward", "rollouts_per_prompt", "rollouts", "prompts")
    }
    std = np.zeros(NUM_BINS)
    zero_advantage = np.zeros(NUM_BINS)
    for b in range(NUM_BINS):
        prompts = [i for i in range(len(BINS)) if BINS[i] == b]
        slots = [j for j in range(len(REWARDS)) if BINS[PROMPT_OF_SLOT[j]] == b]
        if not prompts:
            continue
        per_bin["prompts"][b] = len(prompts)
        per_bin["rollouts"][b] = len(slots)
        per_bin["rollouts_per_prompt"][b] = len(slots) / len(prompts)
        per_bin["tokens"][b] = sum(LENGTHS[j] for j in slots)
        per_bin["reward"][b] = np.mean(REWARDS[slots])
        std[b] = np.std(REWARDS[slots])
        groups = [REWARDS[PROMPT_OF_SLOT == i] for i in prompts]
        zero_advantage[b] = np.mean([len(set(group.tolist())) == 1 for group in groups])
    # Lead-lag gap: the mean bin under the responses' advantage-weight mass minus under the share.
    mass = np.array(
        [
            sum(NUM_ROLLOUTS[i] * WEIGHTS[i] for i in range(4) if BINS[i] == b)
            for b in range(NUM_BINS)
        ]
    )
    share = per_bin["prompts"] / len(BINS)
    bins = np.arange(NUM_BINS)
    present = per_bin["prompts"] > 0
    uniform = len(REWARDS) / len(BINS) * per_bin["prompts"]  # n-bar rollouts for every prompt
    return {
        "bin/q": q,
        "bin/score": SCORES if with_prompt_adversary else np.zeros(NUM_BINS),
        "bin/tokens": per_bin["tokens"],
        "bin/reward": per_bin["reward"],
        "bin/rollouts_per_prompt": per_bin["rollouts_per_prompt"],
        "lead_lag_gap": np.sum(bins * mass / mass.sum()) - np.sum(bins * share),
        "weighted_standard_error": np.sum(
            q[present] * std[present] / np.sqrt(per_bin["rollouts"][present])
        ),
        "uniform_standard_error": np.sum(q[present] * std[present] / np.sqrt(uniform[present])),
        "q_entropy": -sum(q[b] * np.log(q[b]) for b in range(NUM_BINS) if q[b] > 0),
        "q_mean_bin": sum(b * q[b] for b in range(NUM_BINS)),
        "bin/zero_advantage_fraction": zero_advantage,
        "entropy_estimate": -logprobs[valid].mean(),
        "mu": MU,
    }


@pytest.fixture(scope="module", params=[True, False], ids=["prompt_gdro", "no_prompt_gdro"])
def computed(request):
    got, logprobs, valid = _inputs(request.param)
    return got, _reference(request.param, logprobs, valid)


@pytest.mark.parametrize(
    "name",
    [
        "lead_lag_gap",
        "weighted_standard_error",
        "uniform_standard_error",
        "q_entropy",
        "q_mean_bin",
        "bin/zero_advantage_fraction",
        "entropy_estimate",
        "bin/q",
        "bin/score",
        "bin/tokens",
        "bin/reward",
        "bin/rollouts_per_prompt",
        "mu",
    ],
)
def test_metric_equals_the_numpy_reference(computed, name):
    got, expected = computed
    if name != "bin/score":  # without Prompt-GDRO the scores are zeros by design
        assert np.any(np.asarray(expected[name]) != 0), f"{name}: a zero reference shows nothing"
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_batch_is_not_degenerate():
    # Multipliers make the weight mass differ from the share; bins differ in reward spread.
    assert not np.allclose(WEIGHTS, 1.0)
    assert len(set(NUM_ROLLOUTS.tolist())) > 1
    assert max(SCORES[[1, 2]]) > max(SCORES[BINS]), "an absent bin's score must not count"
