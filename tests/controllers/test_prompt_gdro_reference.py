"""Prompt-GDRO, pinned step by step against a plain-Python loop written from SPEC 4.

The reference keeps its scores in float64 and walks bins and prompts with loops: per-bin mean of
the finite, valid losses; share normalisation `lbar / max(share, floor)`; an EMA whose first
observation initialises the bin (or a running sum); `q = (1 - gamma) softmax(eta clip(S)) +
gamma / |P|` over the present bins; multipliers `q(b_i)` rescaled to mean 1 over the valid
responses and capped. The cases are chosen so that every part binds at some step: the score clip,
the share floor, the cap, invalid prompts, NaN losses, and an EMA rate other than 0.5 (at 0.5,
swapping beta and 1 - beta changes nothing).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax.controllers import prompt_gdro

NUM_BINS, BATCH, STEPS = 6, 12, 14


@dataclasses.dataclass(frozen=True)
class Case:
    eta: float = 0.65
    gamma: float = 0.05
    ema: float | None = 0.3
    share_normalize: bool = True
    share_floor: float = 0.2
    clip: float | None = 1.5
    max_weight: float = 1.1


CASES = {
    "ema_share_floor_clip_cap": Case(),
    "ema_small_rate_no_share": Case(ema=0.12, share_normalize=False, clip=0.8),
    "running_sum_no_clip": Case(ema=None, clip=None, gamma=0.0, eta=0.3, max_weight=15.0),
    "ema_rate_one": Case(ema=1.0, share_floor=0.1, clip=3.0, max_weight=2.0),
}


class ReferencePromptGDRO:
    """SPEC 4 with loops and float64; counts how often the clip, the floor and the cap bind."""

    def __init__(self, case: Case):
        self.case = case
        self.scores = [0.0] * NUM_BINS
        self.seen = [False] * NUM_BINS
        self.bound = {"clip": 0, "floor": 0, "cap": 0}

    def update(self, bins, losses, valid):
        kept = [i for i in range(len(bins)) if valid[i] and math.isfinite(losses[i])]
        for b in range(NUM_BINS):
            members = [i for i in kept if bins[i] == b]
            if not members:
                continue
            signal = sum(float(losses[i]) for i in members) / len(members)
            if self.case.share_normalize:
                share = len(members) / len(kept)
                self.bound["floor"] += share < self.case.share_floor
                signal /= max(share, self.case.share_floor)
            if self.case.ema is None:
                self.scores[b] += signal
            elif self.seen[b]:
                self.scores[b] = (1 - self.case.ema) * self.scores[b] + self.case.ema * signal
            else:
                self.scores[b] = signal
            self.seen[b] = True

    def distribution(self, present):
        bins = [b for b in range(NUM_BINS) if present[b]]
        clip = math.inf if self.case.clip is None else self.case.clip
        self.bound["clip"] += sum(abs(self.scores[b]) > clip for b in bins)
        logits = {b: self.case.eta * min(max(self.scores[b], -clip), clip) for b in bins}
        top = max(logits.values())
        total = sum(math.exp(v - top) for v in logits.values())
        q = [0.0] * NUM_BINS
        for b in bins:
            q[b] = (1 - self.case.gamma) * math.exp(logits[b] - top) / total
            q[b] += self.case.gamma / len(bins)
        return q

    def weights(self, bins, num_rollouts, valid):
        present = [
            any(valid[i] and bins[i] == b for i in range(len(bins))) for b in range(NUM_BINS)
        ]
        q = self.distribution(present)
        w = [q[bins[i]] if valid[i] else 0.0 for i in range(len(bins))]
        responses = sum(num_rollouts[i] for i in range(len(bins)) if valid[i])
        mean = sum(num_rollouts[i] * w[i] for i in range(len(bins)) if valid[i]) / responses
        out = []
        for value in w:
            self.bound["cap"] += value / mean > self.case.max_weight
            out.append(min(value / mean, self.case.max_weight))
        return out


def _batches(seed):
    """Skewed bins (bin 5 rare, bin 4 never until late), losses in [0, 1] with NaNs, padding."""
    rng = np.random.default_rng(seed)
    bins = rng.choice(NUM_BINS, p=[0.3, 0.3, 0.2, 0.15, 0.0, 0.05], size=(STEPS, BATCH))
    bins[STEPS // 2 :, 0] = 4  # a bin first seen half way: its first observation initialises it
    losses = rng.uniform(0.0, 1.0, size=(STEPS, BATCH)) + (bins == 2) * 0.8
    losses[rng.random((STEPS, BATCH)) < 0.08] = np.nan
    valid = rng.random((STEPS, BATCH)) < 0.85
    num_rollouts = rng.integers(2, 13, size=(STEPS, BATCH))
    return bins.astype(np.int32), losses.astype(np.float32), valid, num_rollouts.astype(np.int32)


def _run(adversary, bins, losses, valid, num_rollouts):
    """A jitted scan: q and the multipliers before each update, the scores after it."""

    def step(state, batch):
        b, loss, keep, n = batch
        present = jax.ops.segment_max(keep.astype(jnp.int32), b, num_segments=NUM_BINS) > 0
        before = (
            adversary.distribution(state, present),
            adversary.weights(state, b, num_rollouts=n, valid=keep),
        )
        state = adversary.update(state, b, losses=loss, valid=keep)
        return state, (*before, state.scores, state.seen)

    run = jax.jit(lambda *xs: jax.lax.scan(step, adversary.init(), xs))
    return jax.tree.map(np.asarray, run(bins, losses, valid, num_rollouts))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_scores_q_and_multipliers_match_the_loop_reference(name, seed):
    case = CASES[name]
    adversary = prompt_gdro(NUM_BINS, **dataclasses.asdict(case))
    bins, losses, valid, num_rollouts = _batches(seed)
    final, (q_TB, w_TN, scores_TB, seen_TB) = _run(adversary, bins, losses, valid, num_rollouts)
    reference = ReferencePromptGDRO(case)
    for t in range(STEPS):
        b, loss, keep, n = bins[t].tolist(), losses[t].tolist(), valid[t].tolist(), num_rollouts[t]
        present = [any(keep[i] and b[i] == k for i in range(BATCH)) for k in range(NUM_BINS)]
        np.testing.assert_allclose(
            q_TB[t], reference.distribution(present), rtol=2e-5, atol=1e-7, err_msg=f"q, step {t}"
        )
        np.testing.assert_allclose(
            w_TN[t], reference.weights(b, n, keep), rtol=2e-5, atol=1e-7, err_msg=f"w, step {t}"
        )
        reference.update(b, loss, keep)
        np.testing.assert_allclose(
            scores_TB[t], reference.scores, rtol=2e-5, atol=1e-6, err_msg=f"scores, step {t}"
        )
        np.testing.assert_array_equal(seen_TB[t], reference.seen)
    assert int(final.step) == STEPS
    # The case exercises what it is named for.
    if case.clip is not None:
        assert reference.bound["clip"] > 0, "the score clip never bound"
    if case.share_normalize:
        assert reference.bound["floor"] > 0, "the share floor never bound"
    assert reference.bound["cap"] > 0, "max_weight never bound"


def test_weights_with_a_valid_mask_ignore_the_invalid_prompts_bins():
    # Bin 1 has the top score but only an invalid prompt: it must not be present, and the
    # invalid prompt's multiplier is 0 and its rollouts do not count in the mean.
    case = Case(gamma=0.1, clip=None, max_weight=15.0)
    adversary = prompt_gdro(NUM_BINS, **dataclasses.asdict(case))
    scores = np.array([0.2, 5.0, -0.4, 1.1, 0.0, 0.0], np.float32)
    state = adversary.init()._replace(scores=jnp.asarray(scores), seen=jnp.ones(NUM_BINS, bool))
    bins = [0, 1, 2, 3, 3, 0]
    valid = [True, False, True, True, True, True]
    num_rollouts = [4, 12, 2, 6, 3, 5]
    got = adversary.weights(
        state, jnp.asarray(bins), num_rollouts=jnp.asarray(num_rollouts), valid=jnp.asarray(valid)
    )
    reference = ReferencePromptGDRO(case)
    reference.scores = scores.astype(np.float64).tolist()
    expected = reference.weights(bins, num_rollouts, valid)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-7)
    assert float(got[1]) == 0.0
    kept = np.array(valid)
    mean = np.sum(np.array(num_rollouts)[kept] * np.asarray(got)[kept]) / np.sum(
        np.array(num_rollouts)[kept]
    )
    assert mean == pytest.approx(1.0, rel=1e-5)
