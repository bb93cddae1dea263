"""Properties of the Prompt-GDRO adversary (SPEC section 4)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax.controllers import prompt_gdro


def _run_scan(adversary, bins_TN, losses_TN):
    """Runs `update` over a sequence of batches; returns q (before each update) and the state."""
    present_TB = jax.vmap(
        lambda b: jax.ops.segment_max(jnp.ones_like(b), b, num_segments=adversary.num_bins) > 0
    )(bins_TN)

    def step(state, inputs):
        bins, losses, present = inputs
        q = adversary.distribution(state, present)
        return adversary.update(state, bins, losses=losses), q

    state, q_TB = jax.lax.scan(step, adversary.init(), (bins_TN, losses_TN, present_TB))
    return np.asarray(q_TB), state


def _frequent_and_rare_batches(num_steps, seed):
    """Bins 0 and 1 at 10:1 frequency with the same true loss (Bernoulli 0.5)."""
    rng = np.random.default_rng(seed)
    bins = np.tile(np.array([0] * 10 + [1], np.int32), (num_steps, 1))
    losses = rng.binomial(1, 0.5, size=bins.shape).astype(np.float32)
    return bins, losses


def test_mean_loss_score_has_no_frequency_bias_while_running_sum_drifts():
    adversary = prompt_gdro(num_bins=2, eta=0.65, gamma=0.0, ema=0.12, share_normalize=False)
    bins, losses = _frequent_and_rare_batches(num_steps=3000, seed=0)
    q_TB, _ = _run_scan(adversary, bins, losses)
    log_ratio = np.log(q_TB[1000:, 0]) - np.log(q_TB[1000:, 1])
    # Equal true losses: the time-averaged log weight ratio is eta * E[S0 - S1] = 0. Its standard
    # error here is about 0.01 (EMA noise of a one-sample bin, autocorrelation ~1/beta steps).
    assert abs(log_ratio.mean()) < 0.05
    # Contrast computed here: a score that sums every sample's loss grows 10x faster for the
    # frequent bin, so exponential weights on it go to the frequent bin.
    sample_sums = np.array([losses[:, :10].sum(), losses[:, 10:].sum()])
    contrast_q = np.exp(0.65 * (sample_sums - sample_sums.max()))
    contrast_q /= contrast_q.sum()
    assert sample_sums[0] > 8 * sample_sums[1]
    assert contrast_q[0] > 0.999


def test_share_normalisation_weight_ratio_matches_closed_form():
    eta, gamma, floor, clip = 0.65, 0.01, 0.02, 10.0
    adversary = prompt_gdro(
        num_bins=3, eta=eta, gamma=gamma, ema=0.12, share_floor=floor, clip=clip
    )
    bins = np.tile(np.array([0] * 10 + [1], np.int32), (50, 1))
    losses = np.full(bins.shape, 0.5, np.float32)
    _, state = _run_scan(adversary, bins, losses)
    q = np.asarray(adversary.distribution(state, np.array([True, True, False])))
    # Closed form: constant loss L, so S(b) = L / max(share(b), floor) from the first step on.
    scores = np.array([0.5 / (10 / 11), 0.5 / max(1 / 11, floor)])
    soft = np.exp(eta * np.clip(scores, -clip, clip))
    expected = (1 - gamma) * soft / soft.sum() + gamma / 2
    np.testing.assert_allclose(q[:2], expected, rtol=1e-5)
    assert q[2] == 0.0
    assert q[1] / q[0] == pytest.approx(expected[1] / expected[0], rel=1e-5)


def test_weights_follow_the_bin_whose_loss_stays_higher():
    adversary = prompt_gdro(num_bins=4, share_normalize=False)
    rng = np.random.default_rng(1)
    bins = np.tile(np.repeat(np.arange(4, dtype=np.int32), 8), (200, 1))
    true_loss = np.array([0.3, 0.3, 0.7, 0.3], np.float32)
    losses = rng.binomial(1, true_loss[bins]).astype(np.float32)
    q_TB, _ = _run_scan(adversary, bins, losses)
    final = q_TB[-50:].mean(axis=0)
    assert final.argmax() == 2
    # eta * (0.7 - 0.3) = 0.26 in log space: the high-loss bin gets about e^0.26 = 1.3x the others.
    assert final[2] > 1.2 * final[[0, 1, 3]].max()


def test_ema_scores_track_a_flip_within_a_few_inverse_rates():
    beta = 0.12
    adversary = prompt_gdro(num_bins=2, ema=beta, gamma=0.0, share_normalize=False)
    flip_at, num_steps = 100, 200
    bins = np.tile(np.array([0, 1], np.int32), (num_steps, 1))
    losses = np.where(np.arange(num_steps)[:, None] < flip_at, [0.9, 0.1], [0.1, 0.9])
    q_TB, _ = _run_scan(adversary, bins, losses.astype(np.float32))
    assert q_TB[flip_at - 1, 0] > q_TB[flip_at - 1, 1]
    # The EMA gap (1-beta)^t * 0.8 changes sign once (1-beta)^t < 1/2, i.e. t > ln 2 / beta.
    crossing = flip_at + 1 + np.argmax(q_TB[flip_at + 1 :, 1] > q_TB[flip_at + 1 :, 0])
    assert crossing - flip_at <= math.ceil(3 / beta)
    assert np.all(
        q_TB[flip_at + math.ceil(3 / beta) :, 1] > q_TB[flip_at + math.ceil(3 / beta) :, 0]
    )


def _hedge_regret(losses_TB, eta):
    num_steps, num_bins = losses_TB.shape
    adversary = prompt_gdro(
        num_bins=num_bins, eta=eta, gamma=0.0, ema=None, share_normalize=False, clip=None
    )
    bins = np.tile(np.arange(num_bins, dtype=np.int32), (num_steps, 1))
    q_TB, _ = _run_scan(adversary, bins, losses_TB)
    q_TB = q_TB.astype(np.float64)
    played = np.sum(q_TB * losses_TB)
    return losses_TB.sum(axis=0).max() - played


@pytest.mark.parametrize("kind", ["random", "switching", "anti_learner"])
def test_running_sum_regret_stays_under_the_hedge_bound(kind):
    num_steps, num_bins, max_loss = 400, 5, 1.0
    eta = math.sqrt(8 * math.log(num_bins) / num_steps)
    rng = np.random.default_rng(2)
    if kind == "random":
        losses = rng.uniform(0, max_loss, size=(num_steps, num_bins))
    elif kind == "switching":
        # The best bin changes every 50 steps; the cumulative leader changes hands repeatedly.
        best = (np.arange(num_steps) // 50) % num_bins
        losses = np.where(np.arange(num_bins)[None] == best[:, None], max_loss, 0.0)
    else:
        # Adversarial to this learner: the bin it currently weights least gets the loss. The
        # learner's weights are a function of the past losses, so this is computed sequentially.
        losses = np.zeros((num_steps, num_bins))
        sums = np.zeros(num_bins)
        for t in range(num_steps):
            losses[t, np.argmin(sums)] = max_loss
            sums += losses[t]
    losses = losses.astype(np.float32)
    regret = _hedge_regret(losses, eta)
    bound = math.log(num_bins) / eta + eta * num_steps * max_loss**2 / 8
    assert regret <= bound + 1e-3
    if kind == "anti_learner":
        assert regret > 0.1 * bound  # the sequence really is hard: the bound is not vacuous here


@pytest.mark.parametrize("ema", [None, 0.12])
def test_distribution_is_finite_for_huge_losses_and_a_million_steps(ema):
    adversary = prompt_gdro(num_bins=3, ema=ema, clip=None)
    bins = jnp.array([0, 0, 1, 2], jnp.int32)
    signs = jnp.array([1.0, 1.0, -1.0, 1.0], jnp.float32)

    @jax.jit
    def run(state):
        def step(state, t):
            losses = signs * jnp.where(t % 3 == 0, 1e30, -1e30)
            return adversary.update(state, bins, losses=losses), None

        state, _ = jax.lax.scan(step, state, jnp.arange(1_000_000))
        return state

    state = run(adversary.init())
    assert np.all(np.isfinite(np.asarray(state.scores)))
    for present in ([True, True, True], [False, True, False], [False, False, False]):
        q = np.asarray(adversary.distribution(state, np.array(present)))
        assert np.all(np.isfinite(q))
        assert q.sum() == pytest.approx(1.0, abs=1e-6)
    w = np.asarray(adversary.weights(state, bins))
    assert np.all(np.isfinite(w)) and np.all(w <= 15.0)


def test_nan_losses_are_ignored_as_if_the_prompt_were_absent():
    adversary = prompt_gdro(num_bins=3)
    state = adversary.update(
        adversary.init(), jnp.array([0, 1, 2]), losses=jnp.array([0.2, 0.5, 0.9])
    )
    bins = jnp.array([0, 0, 1, 2], jnp.int32)
    with_nan = adversary.update(state, bins, losses=jnp.array([0.4, jnp.nan, jnp.inf, 0.1]))
    dropped = adversary.update(
        state,
        bins,
        losses=jnp.array([0.4, 0.0, 0.0, 0.1]),
        valid=jnp.array([True, False, False, True]),
    )
    np.testing.assert_array_equal(with_nan.scores, dropped.scores)
    assert np.all(np.isfinite(np.asarray(with_nan.scores)))
    # Bin 1 saw only an infinite loss: its score is unchanged.
    assert with_nan.scores[1] == state.scores[1]
    all_nan = adversary.update(state, bins, losses=jnp.full((4,), jnp.nan))
    np.testing.assert_array_equal(all_nan.scores, state.scores)


def test_weights_have_mean_one_over_responses_and_respect_the_cap():
    adversary = prompt_gdro(num_bins=3, eta=0.65, max_weight=15.0)
    state = adversary.update(
        adversary.init(), jnp.array([0, 1, 2]), losses=jnp.array([3.0, 0.0, 1.0])
    )
    bins = jnp.array([0, 1, 1, 2, 2, 2], jnp.int32)
    num_rollouts = jnp.array([2, 6, 4, 3, 4, 5], jnp.int32)
    w = np.asarray(adversary.weights(state, bins, num_rollouts=num_rollouts))
    q = np.asarray(adversary.distribution(state, np.array([True, True, True])))
    expected = q[np.asarray(bins)] / np.average(q[np.asarray(bins)], weights=num_rollouts)
    np.testing.assert_allclose(w, expected, rtol=1e-6)
    assert np.average(w, weights=num_rollouts) == pytest.approx(1.0, rel=1e-6)
    capped = prompt_gdro(num_bins=3, eta=5.0, max_weight=2.0, clip=None)
    state = capped.update(capped.init(), jnp.array([0, 1, 2]), losses=jnp.array([10.0, 0.0, 0.0]))
    w = np.asarray(capped.weights(state, jnp.array([0, 1, 2, 1, 2, 1])))
    assert w.max() == pytest.approx(2.0)
    # The uniform adversary is plain GRPO: every multiplier is exactly one.
    uniform = prompt_gdro(num_bins=3, eta=0.0)
    np.testing.assert_allclose(uniform.weights(uniform.init(), bins), np.ones(6), rtol=1e-6)


def test_importance_weighting_divides_the_bin_loss():
    adversary = prompt_gdro(num_bins=2, ema=1.0, share_normalize=False)
    state = adversary.update(
        adversary.init(),
        jnp.array([0, 1]),
        losses=jnp.array([0.4, 0.3]),
        importance=jnp.array([0.8, 0.2]),
    )
    np.testing.assert_allclose(state.scores, [0.4 / 0.8, 0.3 / 0.2], rtol=1e-6)


def test_first_observation_initialises_and_absent_bins_keep_their_score():
    adversary = prompt_gdro(num_bins=3, ema=0.5, share_normalize=False)
    state = adversary.update(adversary.init(), jnp.array([0, 0]), losses=jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(state.scores, [0.5, 0.0, 0.0])
    np.testing.assert_array_equal(state.seen, [True, False, False])
    state = adversary.update(state, jnp.array([0, 2]), losses=jnp.array([1.5, 2.0]))
    np.testing.assert_allclose(state.scores, [0.5 * 0.5 + 0.5 * 1.5, 0.0, 2.0])
    assert int(state.step) == 2


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_bins=0), "num_bins"),
        (dict(eta=-0.1), "eta"),
        (dict(gamma=1.5), "gamma"),
        (dict(gamma=-0.01), "gamma"),
        (dict(ema=0.0), "ema"),
        (dict(share_floor=0.0), "share_floor"),
        (dict(clip=-1.0), "clip"),
        (dict(max_weight=0.0), "max_weight"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name}={list(kwargs.values())[0]!r}"):
        prompt_gdro(**kwargs)
