"""The token draw (`sample_logits`): its frequencies against the softmax of the kept set, computed
in float64 (a chi-square test over many independent draws), and the draw's edges, where rounding
would land on a token of zero weight (a uniform at the top of [0, 1])."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from gdro_jax.sampling import sample_logits
from gdro_jax.sampling._generate import _inverse_cdf_draw

# 50 tokens: blocks of 8 (the last holds 2 tokens and 6 of padding), so every block boundary
# and the padding are crossed.
V = 50
DRAWS = 40_000


def _probabilities(scaled: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The kept set's renormalised softmax, in float64: top-k (ties kept), then the smallest
    nucleus whose mass reaches top_p."""
    scaled = scaled.astype(np.float64)
    keep = np.ones(V, bool)
    if top_k:
        keep &= scaled >= np.sort(scaled)[-top_k]
    if top_p < 1:
        order = np.argsort(-scaled, kind="stable")
        candidates = order[keep[order]]
        probs = np.exp(scaled[candidates] - scaled[candidates].max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        keep &= scaled >= scaled[candidates][before < top_p].min()
    weights = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    return weights / weights.sum()


@pytest.mark.parametrize(
    "top_k, top_p, keys",
    [(0, 1.0, "per row"), (0, 1.0, "one"), (5, 1.0, "per row"), (0, 0.8, "per row"),
     (12, 0.9, "one")],
)  # fmt: skip
def test_the_draws_follow_the_softmax_of_the_kept_set(top_k, top_p, keys):
    rng = np.random.default_rng(top_k * 10 + round(top_p * 10))
    logits = (rng.standard_normal(V) * 1.5).astype(np.float32)
    key = jax.random.key(11)
    key = jax.random.split(key, DRAWS) if keys == "per row" else key
    tokens, logprobs = jax.jit(
        lambda logits_RV, key: sample_logits(
            logits_RV, key, temperature=0.7, top_k=top_k, top_p=top_p, use_top_p=top_p < 1
        )
    )(jnp.broadcast_to(logits, (DRAWS, V)), key)
    scaled = logits / np.float32(0.7)
    probs = _probabilities(scaled, top_k, top_p)
    counts = np.bincount(np.asarray(tokens), minlength=V)
    assert counts.size == V and np.all(counts[probs == 0] == 0)
    kept = probs > 0
    # 40,000 draws: a wrong token in a block, or a block's mass misread, moves a count by far more.
    assert stats.chisquare(counts[kept], DRAWS * probs[kept]).pvalue > 1e-4
    shifted = scaled.astype(np.float64) - scaled.max()
    log_softmax = shifted - np.log(np.sum(np.exp(shifted)))  # before any filter, as documented
    np.testing.assert_allclose(logprobs, log_softmax[np.asarray(tokens)], atol=1e-5)


def _draw(uniform: float, scaled: np.ndarray, floor: float | None):
    scaled = jnp.asarray(scaled, jnp.float32)[None]
    token, value, kept = _inverse_cdf_draw(
        jnp.full((1, 1), uniform, jnp.float32),
        scaled,
        jnp.max(scaled, axis=-1),
        None if floor is None else jnp.full((1,), floor, jnp.float32),
    )
    return int(token[0]), float(value[0]), float(kept[0])


@pytest.mark.parametrize("uniform", [1.0, float(np.nextafter(np.float32(1), np.float32(0)))])
def test_a_uniform_at_the_top_draws_a_token_of_positive_weight(uniform):
    # The target at (or a rounding below) the total: every cumulative mass is <= it. The draw
    # must stop at the last block of positive mass and, inside it, at a token of positive
    # weight, not run into the padding or the filtered tail.
    scaled = np.linspace(3.0, -3.0, V).astype(np.float32)  # descending: the kept set is a prefix
    for floor, kept in ((None, V), (float(scaled[19]), 20), (float(scaled[8]), 9)):
        token, value, total = _draw(uniform, scaled, floor)
        assert 0 <= token < kept, (floor, token)
        assert value == scaled[token]
        want = np.exp(scaled[:kept].astype(np.float64) - scaled[0]).sum()
        np.testing.assert_allclose(total, want, rtol=1e-6)


def test_a_uniform_at_zero_draws_the_first_token_of_positive_weight():
    scaled = np.full(V, -np.inf, np.float32)
    scaled[[17, 30, 49]] = (0.5, 2.0, 1.0)
    assert _draw(0.0, scaled, None)[0] == 17
    assert _draw(1.0, scaled, None)[0] == 49
