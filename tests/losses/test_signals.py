"""Prompt-GDRO's per-prompt loss signals against a loop reference (SPEC 4, step 1)."""

import functools
import math

import jax
import numpy as np
import pytest

from gdro_jax.controllers import prompt_gdro
from gdro_jax.losses import group_advantages, prompt_loss_signal

NUM_PROMPTS = 4
# Ragged groups: prompt 0 owns 3 slots, 1 owns 1, 2 owns 4 (the last one invalid), 3 owns none.
SLOTS = np.array([0, 0, 0, 1, 2, 2, 2, 2], np.int32)
VALID = np.array([True] * 7 + [False])
CORRECT = np.array([1, 0, 1, 1, 0, 0, 1, 1], np.float32)
LENGTHS = [3, 5, 1, 2, 4, 5, 2, 3]
T = 5
EPS_LOW, EPS_HIGH, KL_COEF = 0.2, 0.28, 0.1


def make_tokens(seed=0):
    rng = np.random.default_rng(seed)
    mask = np.array([[t < n for t in range(T)] for n in LENGTHS])
    old_logp = rng.uniform(-3.0, -0.1, size=mask.shape).astype(np.float32)
    logp = (old_logp + rng.uniform(-0.5, 0.5, size=mask.shape)).astype(np.float32)
    ref_logp = (old_logp + rng.uniform(-0.5, 0.5, size=mask.shape)).astype(np.float32)
    adv = np.array([0.7, -1.4, 0.7, 0.0, 1.2, -0.8, -0.4, 3.0], np.float32)
    return logp, old_logp, ref_logp, adv, mask


def reference_signal(kind, logp, old_logp, ref_logp, adv, mask, kl_coef):
    """Per prompt: pool the per-token losses of its valid slots' valid tokens, then average."""
    losses = np.zeros(NUM_PROMPTS)
    for prompt in range(NUM_PROMPTS):
        total, count = 0.0, 0
        for j in range(len(SLOTS)):
            if SLOTS[j] != prompt or not VALID[j]:
                continue
            for t in range(T):
                if not mask[j, t]:
                    continue
                rho = math.exp(float(logp[j, t]) - float(old_logp[j, t]))
                a = float(adv[j])
                loss = -min(rho * a, min(max(rho, 1 - EPS_LOW), 1 + EPS_HIGH) * a)
                if kind == "surrogate_kl":
                    u = math.exp(float(ref_logp[j, t]) - float(logp[j, t]))
                    loss += kl_coef * (u - math.log(u) - 1)
                total += loss
                count += 1
        losses[prompt] = total / count if count else 0.0
    return losses


@functools.partial(jax.jit, static_argnames=("kind",))
def jitted_signal(kind, logp, old_logp, ref_logp, adv, mask, correct):
    return prompt_loss_signal(
        kind,
        prompt_of_slot_R=SLOTS,
        num_prompts=NUM_PROMPTS,
        logp_RT=logp,
        old_logp_RT=old_logp,
        adv_R=adv,
        mask_RT=mask,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        kl_coef=KL_COEF,
        ref_logp_RT=ref_logp,
        correct_R=correct,
        valid_R=VALID,
    )


@pytest.fixture(scope="module")
def tokens():
    return make_tokens()


@pytest.mark.parametrize("kind", ["surrogate", "surrogate_kl"])
def test_surrogate_signals_match_the_reference(tokens, kind):
    logp, old_logp, ref_logp, adv, mask = tokens
    got = jitted_signal(kind, logp, old_logp, ref_logp, adv, mask, CORRECT)
    expected = reference_signal(kind, logp, old_logp, ref_logp, adv, mask, KL_COEF)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)
    assert float(got[3]) == 0.0  # the prompt without slots


def test_failure_rate_is_one_minus_mean_correctness_over_valid_slots(tokens):
    got = np.asarray(jitted_signal("failure_rate", *tokens, CORRECT))
    expected = []
    for prompt in range(NUM_PROMPTS):
        outcomes = [CORRECT[j] for j in range(len(SLOTS)) if SLOTS[j] == prompt and VALID[j]]
        expected.append(1.0 - sum(outcomes) / len(outcomes) if outcomes else 0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_surrogate_is_near_zero_at_unit_ratio_with_grpo_advantages():
    # SPEC 4's note: at rho = 1 with equal lengths, J = A and GRPO advantages sum to zero per
    # prompt, so the "surrogate" signal vanishes. Unequal lengths make it non-zero.
    rewards = np.array([1, 0, 0, 1, 1, 1, 0, 0], np.float32)
    slots = np.array([0, 0, 0, 1, 1, 1, 1, 1], np.int32)
    adv = np.asarray(group_advantages(rewards, slots, 2))
    logp = np.full((8, 4), -1.0, np.float32)

    def signal(mask):
        return np.asarray(
            prompt_loss_signal(
                "surrogate",
                prompt_of_slot_R=slots,
                num_prompts=2,
                logp_RT=logp,
                old_logp_RT=logp,
                adv_R=adv,
                mask_RT=mask,
            )
        )

    np.testing.assert_allclose(signal(np.ones((8, 4), bool)), 0.0, atol=1e-6)
    ragged = np.arange(4)[None, :] < np.array([1, 4, 4, 4, 4, 4, 4, 4])[:, None]
    assert abs(signal(ragged)[0]) > 0.1


def test_surrogate_kl_without_a_coefficient_equals_surrogate_and_needs_no_reference(tokens):
    logp, old_logp, _, adv, mask = tokens
    kwargs = dict(
        prompt_of_slot_R=SLOTS,
        num_prompts=NUM_PROMPTS,
        logp_RT=logp,
        old_logp_RT=old_logp,
        adv_R=adv,
        mask_RT=mask,
        valid_R=VALID,
    )
    np.testing.assert_array_equal(
        np.asarray(prompt_loss_signal("surrogate_kl", kl_coef=0.0, ref_logp_RT=None, **kwargs)),
        np.asarray(prompt_loss_signal("surrogate", **kwargs)),
    )


def test_jit_equals_eager(tokens):
    logp, old_logp, ref_logp, adv, mask = tokens
    eager = prompt_loss_signal(
        "surrogate_kl",
        prompt_of_slot_R=SLOTS,
        num_prompts=NUM_PROMPTS,
        logp_RT=logp,
        old_logp_RT=old_logp,
        adv_R=adv,
        mask_RT=mask,
        kl_coef=KL_COEF,
        ref_logp_RT=ref_logp,
        valid_R=VALID,
    )
    jitted = jitted_signal("surrogate_kl", logp, old_logp, ref_logp, adv, mask, CORRECT)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-6, atol=1e-7)


def test_signal_feeds_the_prompt_gdro_adversary(tokens):
    # The signal's shape and meaning fit `prompt_gdro.update`: the prompt with the highest
    # failure rate puts its bin's score on top.
    adversary = prompt_gdro(num_bins=NUM_PROMPTS, ema=1.0)
    losses = jitted_signal("failure_rate", *tokens, CORRECT)
    bins = np.arange(NUM_PROMPTS, dtype=np.int32)
    state = adversary.update(
        adversary.init(), bins, losses=losses, valid=np.array([1, 1, 1, 0], bool)
    )
    assert int(np.argmax(np.asarray(state.scores))) == int(np.argmax(np.asarray(losses)[:3]))


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        ("hinge", {}, "kind='hinge'"),
        ("failure_rate", {}, "correct_R is required"),
        ("surrogate", {"correct_R": CORRECT}, "logp_RT is required"),
        ("surrogate_kl", {"kl_coef": -0.5}, "kl_coef=-0.5"),
        ("surrogate_kl", {"kl_coef": 0.5, "ref_logp_RT": None}, "ref_logp_RT is required"),
        ("surrogate", {"eps_low": -0.2}, "eps_low=-0.2"),
    ],
)
def test_bad_arguments_raise_naming_the_parameter(tokens, kind, kwargs, message):
    logp, old_logp, ref_logp, adv, mask = tokens
    arrays = dict(logp_RT=logp, old_logp_RT=old_logp, adv_R=adv, mask_RT=mask, ref_logp_RT=ref_logp)
    if "correct_R" in kwargs:
        arrays = {}
    with pytest.raises(ValueError, match=message):
        prompt_loss_signal(
            kind, prompt_of_slot_R=SLOTS, num_prompts=NUM_PROMPTS, **{**arrays, **kwargs}
        )
