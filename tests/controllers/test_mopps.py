"""MoPPS against references written from the paper and the released code: the Beta posteriors
with decay against a loop, and the batch's selection frequencies against the Thompson
probabilities integrated with scipy's Beta distributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from gdro_jax import controllers


def _posterior_loop(visits, num_prompts, *, decay, prior_alpha, prior_beta):
    """The released code's update, one visit at a time: alpha <- decay * alpha +
    (1 - decay) * prior + successes, and the same for beta with failures."""
    alpha = np.full(num_prompts, prior_alpha, np.float64)
    beta = np.full(num_prompts, prior_beta, np.float64)
    for prompt, correct, rollouts in visits:
        success_rate = correct / rollouts
        alpha[prompt] = alpha[prompt] * decay + prior_alpha * (1 - decay) + success_rate * rollouts
        beta[prompt] = (
            beta[prompt] * decay + prior_beta * (1 - decay) + (1 - success_rate) * rollouts
        )
    return alpha, beta


@pytest.mark.parametrize("decay", [1.0, 0.5, 0.0])
def test_posteriors_decay_toward_the_prior_and_add_each_group(decay):
    sampler = controllers.mopps(6, decay=decay, prior_alpha=2.0, prior_beta=0.5)
    update = jax.jit(sampler.update)
    rng = np.random.default_rng(1)
    state, visits = sampler.init(), []
    for _ in range(5):
        ids = rng.integers(0, 6, 4)  # repeats inside a batch are visits one after the other
        rollouts = rng.integers(1, 9, 4)
        correct = rng.integers(0, rollouts + 1)
        valid = rng.random(4) < 0.8
        state = update(
            state, prompt_ids=jnp.asarray(ids), num_correct=jnp.asarray(correct),
            num_rollouts=jnp.asarray(rollouts), valid=jnp.asarray(valid),
        )  # fmt: skip
        visits += [
            v
            for v, keep in zip(zip(ids, correct, rollouts, strict=True), valid, strict=True)
            if keep
        ]
    alpha, beta = _posterior_loop(visits, 6, decay=decay, prior_alpha=2.0, prior_beta=0.5)
    np.testing.assert_allclose(state.alpha, alpha, rtol=1e-5)
    np.testing.assert_allclose(state.beta, beta, rtol=1e-5)
    np.testing.assert_array_equal(state.visits, np.bincount([v[0] for v in visits], minlength=6))
    np.testing.assert_allclose(
        sampler.posterior_mean(state, jnp.arange(6)), alpha / (alpha + beta), rtol=1e-5
    )


def _thompson_probabilities(alpha, beta, target):
    """P(candidate i's sample lies nearest `target`), integrated over its sample's distance:
    the density of |theta_i - target| at x times every other distance exceeding x."""

    def distance_survival(a, b, x):  # P(|theta - target| > x)
        inside = stats.beta.cdf(min(target + x, 1.0), a, b) - stats.beta.cdf(
            max(target - x, 0.0), a, b
        )
        return 1.0 - inside

    def distance_density(a, b, x):
        density = 0.0
        if target + x <= 1.0:
            density += stats.beta.pdf(target + x, a, b)
        if target - x >= 0.0 and x > 0:
            density += stats.beta.pdf(target - x, a, b)
        return density

    top = max(target, 1 - target)
    probabilities = []
    for i in range(len(alpha)):
        others = [j for j in range(len(alpha)) if j != i]

        def integrand(x, i=i, others=others):
            survival = np.prod([distance_survival(alpha[j], beta[j], x) for j in others])
            return distance_density(alpha[i], beta[i], x) * survival

        probabilities.append(integrate.quad(integrand, 0.0, top, limit=200)[0])
    return np.array(probabilities)


def test_selection_frequencies_match_the_thompson_probabilities():
    """Three prompts, one drawn a batch from all three: how often each is drawn, over 20000
    independent draws, against the probability that its Beta sample is nearest the target."""
    alpha = np.array([2.0, 6.0, 1.0])
    beta = np.array([2.0, 2.0, 5.0])
    target = 0.4
    sampler = controllers.mopps(3, candidates=3, target=target)
    state = sampler.init()._replace(alpha=jnp.asarray(alpha, jnp.float32), beta=jnp.asarray(beta))
    keys = jax.random.split(jax.random.key(0), 20000)
    drawn = jax.jit(jax.vmap(lambda key: sampler.draw(state, 1, key).prompt_ids[0]))(keys)
    frequencies = np.bincount(np.asarray(drawn), minlength=3) / len(keys)
    expected = _thompson_probabilities(alpha, beta, target)
    assert expected.sum() == pytest.approx(1.0, abs=1e-6)
    # 4 standard errors of a frequency over 20000 draws (at most 0.0035 each).
    standard_error = np.sqrt(expected * (1 - expected) / len(keys))
    np.testing.assert_array_less(np.abs(frequencies - expected), 4 * standard_error + 1e-4)


def test_the_batch_is_the_candidates_nearest_the_target():
    sampler = controllers.mopps(40, candidates=2, target=0.3)
    rng = np.random.default_rng(2)
    state = sampler.init()._replace(
        alpha=jnp.asarray(rng.uniform(0.5, 9.0, 40), jnp.float32),
        beta=jnp.asarray(rng.uniform(0.5, 9.0, 40), jnp.float32),
    )
    for seed in range(4):
        draw = jax.jit(sampler.draw, static_argnums=1)(state, 8, jax.random.key(seed))
        candidates = np.asarray(draw.candidates)
        assert len(candidates) == 16 and len(set(candidates.tolist())) == 16
        assert len(set(np.asarray(draw.prompt_ids).tolist())) == 8
        assert set(np.asarray(draw.prompt_ids).tolist()) <= set(candidates.tolist())
        # Every candidate left out is at least as far from the target as every one drawn.
        chosen = np.abs(np.asarray(draw.sampled_rate) - 0.3)
        _, sample_key = jax.random.split(jax.random.key(seed))
        theta = np.asarray(
            jax.random.beta(sample_key, state.alpha[candidates], state.beta[candidates])
        )
        left_out = [
            abs(t - 0.3) for c, t in zip(candidates, theta, strict=True)
            if c not in set(np.asarray(draw.prompt_ids).tolist())
        ]  # fmt: skip
        assert chosen.max() <= min(left_out) + 1e-7


def test_a_pool_smaller_than_the_candidates_is_drawn_whole():
    sampler = controllers.mopps(5, candidates=8)
    draw = sampler.draw(sampler.init(), 3, jax.random.key(0))
    assert sorted(np.asarray(draw.candidates).tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="pool of at least"):
        sampler.draw(sampler.init(), 6, jax.random.key(0))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"candidates": 0}, "candidates"),
        ({"target": 1.5}, "target"),
        ({"decay": -0.1}, "decay"),
        ({"prior_alpha": 0.0}, "prior_alpha"),
        ({"prior_beta": -1.0}, "prior_beta"),
    ],
)
def test_bad_hyperparameters_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        controllers.mopps(10, **kwargs)
