"""The update of every method against a hand-written reference, from a seeded controller state.

The controllers start from a state written by hand: every prompt already has a bin, Prompt-GDRO's
scores make the advantage multipliers differ from 1 (one of them capped), and Rollout-GDRO's
variances make the groups ragged, from 2 to 12 rollouts. Two prompts have all-equal rewards. The
batch is built by hand too (random prompts and completions of random lengths, old log-probs off
the current policy so ratios differ from 1 and some clip), then one update (two Adam mini-batches
behind a global-norm clip) runs against a reference written from SPEC 2 and 4 with numpy
advantages, a plain forward pass, log-softmax at the temperature, the clipped surrogate, k3 to a
reference policy and each aggregation. Loss and pre-clip gradient norm are compared as well as the
parameters: after a clip and Adam's first step, parameters alone do not see a wrong loss scale.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gdro_jax import controllers, models
from gdro_jax.step import GRPOConfig, Rollouts, init_train_state, make_update

NUM_PROMPTS, N_MEAN = 8, 4
NUM_SLOTS = NUM_PROMPTS * N_MEAN
PROMPT_WIDTH, MAX_NEW_TOKENS, VOCAB = 5, 6, 48
EPS_LOW, EPS_HIGH = 0.2, 0.28
LEARNING_RATE, GRAD_CLIP = 1e-2, 0.2
# Adam's eps at 1e-4, not 1e-8: the step lr g / (|g| + eps) is then well conditioned where a
# gradient entry is ~0, so float32 rounding of such an entry cannot swing the parameter by ~lr
# (as in tests/train/test_grad_accumulation.py). See test_parameters_equal_the_reference.
ADAM_EPS = 1e-4
PARAMS_ATOL = 2e-6

# The seeded controller state: bins of the 8 prompts, their p_hat, Prompt-GDRO's scores and
# Rollout-GDRO's per-bin variances (every bin seen). Bins 4, 6 and 8 hold no prompt.
BINS = np.array([0, 1, 2, 3, 5, 7, 9, 9], np.int32)
P_HAT = np.array([0.05, 0.15, 0.25, 0.35, 0.55, 0.75, 0.95, 1.0], np.float32)
SCORES = np.array([1.5, 0.2, -0.8, 0.9, 0.0, 2.6, 0.0, 14.0, 0.0, -1.2], np.float32)
VARIANCE = np.array([1000.0, 3.0, 1.0, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01], np.float32)
ETA, GAMMA, SCORE_CLIP, MAX_WEIGHT = 0.65, 0.01, 3.0, 2.0
ALL_CORRECT, ALL_WRONG = 2, 6  # prompts whose rollouts all get +1, all -1
# Half the compile time of these one-shot programs (as gdro_jax.sim.FAST_COMPILE_OPTIONS).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@dataclasses.dataclass(frozen=True)
class Case:
    method: str
    aggregation: str
    temperature: float
    kl_coef: float


CASES = {
    "grpo": Case("grpo", "token_mean", 1.0, 0.0),
    "prompt_gdro": Case("prompt_gdro", "seq_mean_token_mean", 0.7, 0.2),
    "rollout_gdro": Case("rollout_gdro", "seq_mean_token_sum_norm", 1.3, 0.2),
    "gdro_both": Case("gdro_both", "token_mean", 0.8, 0.5),
}


def _controllers(method):
    classifier = controllers.passk_classifier(NUM_PROMPTS, window=1, statistic="mean_accuracy")
    prompt = rollout = None
    if method in ("prompt_gdro", "gdro_both"):
        prompt = controllers.prompt_gdro(
            classifier.num_bins, eta=ETA, gamma=GAMMA, clip=SCORE_CLIP, max_weight=MAX_WEIGHT
        )
    if method in ("rollout_gdro", "gdro_both"):
        rollout = controllers.rollout_gdro(classifier.num_bins, n_min=2, n_max=12, n_mean=N_MEAN)
    return controllers.multi_adversary(classifier, prompt, rollout, n_mean=N_MEAN), prompt


def _seeded(gdro_state):
    ones = jnp.ones((len(SCORES),), bool)
    classifier = gdro_state.classifier._replace(
        history=jnp.asarray(P_HAT)[:, None],
        visits=jnp.ones((NUM_PROMPTS,), jnp.int32),
        last_bin=jnp.asarray(BINS),
    )
    prompt, rollout = gdro_state.prompt, gdro_state.rollout
    if prompt is not None:
        prompt = prompt._replace(scores=jnp.asarray(SCORES), seen=ones)
    if rollout is not None:
        rollout = rollout._replace(variance=jnp.asarray(VARIANCE), seen=ones)
    return gdro_state._replace(classifier=classifier, prompt=prompt, rollout=rollout)


# ------------------------------------------------------------------ the reference, from SPEC 2, 4


def reference_multipliers(bins, num_rollouts):
    """SPEC 4: q over the present bins, w_i = q(b_i) rescaled to mean 1 over responses, capped."""
    present = sorted(set(bins.tolist()))
    logits = {b: ETA * min(max(float(SCORES[b]), -SCORE_CLIP), SCORE_CLIP) for b in present}
    total = sum(np.exp(v) for v in logits.values())
    q = {b: (1 - GAMMA) * np.exp(logits[b]) / total + GAMMA / len(present) for b in present}
    w = np.array([q[b] for b in bins.tolist()])
    mean = np.sum(num_rollouts * w) / np.sum(num_rollouts)
    return np.minimum(w / mean, MAX_WEIGHT)


def reference_advantages(rewards, prompt_of_slot):
    """SPEC 2 with the released code's estimator: per group (r - mean) / (sample std + 1e-6),
    clipped to 5; all-equal gives 0 (groups here have n >= 2)."""
    adv = np.zeros(len(rewards))
    for prompt in np.unique(prompt_of_slot):
        members = prompt_of_slot == prompt
        r = rewards[members].astype(np.float64)
        if r.max() > r.min():
            adv[members] = np.clip((r - r.mean()) / (r.std(ddof=1) + 1e-6), -5.0, 5.0)
    return adv


def reference_aggregate(x, mask, mode):
    x = jnp.where(mask, x, 0.0)
    if mode == "token_mean":
        return jnp.sum(x) / jnp.sum(mask)
    if mode == "seq_mean_token_mean":
        return jnp.mean(jnp.sum(x, axis=1) / jnp.sum(mask, axis=1))
    return jnp.mean(jnp.sum(x, axis=1) / MAX_NEW_TOKENS)  # Dr.GRPO: a constant max length


def reference_logprobs(graphdef, params, batch, idx, temperature):
    """log softmax(logits / T) of each completion token, from one plain forward pass."""
    prompt_lengths = batch.prompt_lengths[idx]
    real_prompt = jnp.arange(PROMPT_WIDTH)[None] >= (PROMPT_WIDTH - prompt_lengths)[:, None]
    completion = jnp.arange(MAX_NEW_TOKENS)[None] < batch.lengths[idx][:, None]
    tokens = jnp.concatenate([batch.prompt_tokens[idx], batch.tokens[idx]], axis=1)
    mask = jnp.concatenate([real_prompt, completion], axis=1)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    logits = nnx.merge(graphdef, params)(tokens, positions, mask)
    logp_all = jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
    return logp[:, PROMPT_WIDTH - 1 :]


def reference_update(graphdef, state, tx, batch, adv, order, case):
    """Two mini-batches of `loss = -agg(min(rho A, clip(rho) A)) + beta agg(k3)` and the optimizer.

    Returns (params, mean loss, mean pre-clip gradient norm) over the mini-batches.
    """
    completion_mask = jnp.arange(MAX_NEW_TOKENS)[None] < batch.lengths[:, None]
    adv = jnp.asarray(adv, jnp.float32)

    def loss_fn(params, idx):
        logp = reference_logprobs(graphdef, params, batch, idx, case.temperature)
        mask = completion_mask[idx]
        ratio = jnp.exp(logp - batch.logprobs[idx])
        a = adv[idx][:, None]
        surrogate = jnp.minimum(ratio * a, jnp.clip(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
        loss = -reference_aggregate(surrogate, mask, case.aggregation)
        if case.kl_coef:
            ref = reference_logprobs(graphdef, state.ref_params, batch, idx, case.temperature)
            log_ratio = jax.lax.stop_gradient(ref) - logp  # log(pi_ref / pi)
            k3 = jnp.exp(log_ratio) - log_ratio - 1.0
            loss = loss + case.kl_coef * reference_aggregate(k3, mask, case.aggregation)
        return loss

    @jax.jit(compiler_options=FAST_COMPILE)
    def minibatch(params, opt_state, idx):
        loss, grads = jax.value_and_grad(loss_fn)(params, idx)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, norm

    params, opt_state = state.params, state.opt_state
    losses, norms = [], []
    for idx in np.asarray(order).reshape(2, -1):
        params, opt_state, loss, norm = minibatch(params, opt_state, jnp.asarray(idx))
        losses.append(float(loss))
        norms.append(float(norm))
    return params, np.mean(losses), np.mean(norms)


# ------------------------------------------------------------------ the batch and the fixture


def _batch(graphdef, params, plan, temperature, seed):
    """Random prompts and completions; rewards mixed but for two all-equal prompts; old log-probs
    are the current policy's plus noise, so ratios differ from 1 and some clip."""
    rng = np.random.default_rng(seed)
    prompt_of_slot = np.asarray(plan.prompt_of_slot)
    prompt_lengths_N = rng.integers(2, PROMPT_WIDTH + 1, size=NUM_PROMPTS)
    prompts_NP = rng.integers(1, VOCAB, size=(NUM_PROMPTS, PROMPT_WIDTH))
    prompts_NP[np.arange(PROMPT_WIDTH)[None] < (PROMPT_WIDTH - prompt_lengths_N)[:, None]] = 0
    lengths = rng.integers(1, MAX_NEW_TOKENS + 1, size=NUM_SLOTS)
    tokens = rng.integers(1, VOCAB, size=(NUM_SLOTS, MAX_NEW_TOKENS))
    tokens[np.arange(MAX_NEW_TOKENS)[None] >= lengths[:, None]] = 0
    rewards = rng.choice([-1.0, 1.0], size=NUM_SLOTS)
    for prompt in range(NUM_PROMPTS):
        members = np.flatnonzero(prompt_of_slot == prompt)
        if prompt in (ALL_CORRECT, ALL_WRONG):
            rewards[members] = 1.0 if prompt == ALL_CORRECT else -1.0
        else:  # mixed
            rewards[members[0]], rewards[members[-1]] = 1.0, -1.0
    batch = Rollouts(
        prompt_tokens=jnp.asarray(prompts_NP[prompt_of_slot], jnp.int32),
        prompt_lengths=jnp.asarray(prompt_lengths_N[prompt_of_slot], jnp.int32),
        tokens=jnp.asarray(tokens, jnp.int32),
        lengths=jnp.asarray(lengths, jnp.int32),
        logprobs=jnp.zeros((NUM_SLOTS, MAX_NEW_TOKENS), jnp.float32),
        rewards=jnp.asarray(rewards, jnp.float32),
        correct=jnp.asarray(rewards > 0),
        engine_logprobs=jnp.zeros((NUM_SLOTS, MAX_NEW_TOKENS), jnp.float32),
    )
    current = jax.jit(reference_logprobs, static_argnums=(0, 4), compiler_options=FAST_COMPILE)(
        graphdef, params, batch, jnp.arange(NUM_SLOTS), temperature
    )
    noise = rng.normal(0.0, 0.3, size=current.shape)
    valid = np.arange(MAX_NEW_TOKENS)[None] < lengths[:, None]
    old = np.where(valid, np.asarray(current) + noise, 0.0)
    return batch._replace(logprobs=jnp.asarray(old, jnp.float32))


@pytest.fixture(scope="module")
def model():
    config = models.DecoderConfig.tiny(
        vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=64
    )
    return models.init_decoder(config, seed=0)


@pytest.fixture(scope="module", params=list(CASES))
def result(request, model):
    case = CASES[request.param]
    tx = optax.chain(optax.clip_by_global_norm(GRAD_CLIP), optax.adam(LEARNING_RATE, eps=ADAM_EPS))
    gdro, prompt = _controllers(case.method)
    graphdef, state = init_train_state(model, tx, gdro, seed=3, with_reference=case.kl_coef > 0)
    state = state._replace(gdro=_seeded(state.gdro))
    if case.kl_coef:  # a reference policy away from the current one, so k3 and its gradient live
        keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(state.params))))
        state = state._replace(
            ref_params=jax.tree.map(
                lambda p: p + 0.05 * jax.random.normal(next(keys), p.shape), state.params
            )
        )
    prompt_ids = jnp.arange(NUM_PROMPTS, dtype=jnp.int32)
    plan = jax.jit(gdro.plan)(state.gdro, prompt_ids, jax.random.key(1))
    batch = _batch(graphdef, state.params, plan, case.temperature, seed=2)

    grpo = GRPOConfig(
        num_minibatches=2,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        aggregation=case.aggregation,
        kl_coef=case.kl_coef,
        temperature=case.temperature,
    )
    update = make_update(
        graphdef,
        tx,
        gdro,
        grpo,
        num_prompts=NUM_PROMPTS,
    )
    new_state, metrics = jax.jit(update, compiler_options=FAST_COMPILE)(
        state, plan, prompt_ids, batch
    )

    # The reference: multipliers from the seeded scores, not from the plan.
    prompt_of_slot = np.asarray(plan.prompt_of_slot)
    num_rollouts = np.bincount(prompt_of_slot, minlength=NUM_PROMPTS)
    multipliers = np.ones(NUM_PROMPTS)
    if prompt is not None:
        multipliers = reference_multipliers(BINS, num_rollouts)
    adv = reference_advantages(np.asarray(batch.rewards), prompt_of_slot)
    adv = adv * multipliers[prompt_of_slot]
    # The update's mini-batches: a permutation of the slots from the second half of its key split.
    _, perm_key = jax.random.split(state.key)
    order = jax.random.permutation(perm_key, NUM_SLOTS)
    params, loss, grad_norm = reference_update(graphdef, state, tx, batch, adv, order, case)
    return dict(
        case=case,
        plan=jax.tree.map(np.asarray, plan),
        num_rollouts=num_rollouts,
        multipliers=multipliers,
        metrics=jax.tree.map(np.asarray, metrics),
        params=(jax.tree.map(np.asarray, new_state.params), jax.tree.map(np.asarray, params)),
        before=jax.tree.map(np.asarray, state.params),
        loss=loss,
        grad_norm=grad_norm,
        adv=adv,
    )


# ------------------------------------------------------------------ the tests


def test_the_seeded_state_gives_multipliers_other_than_one_and_ragged_groups(result):
    case, plan, num_rollouts = result["case"], result["plan"], result["num_rollouts"]
    np.testing.assert_array_equal(plan.bins, BINS)
    np.testing.assert_array_equal(plan.num_rollouts, num_rollouts)
    assert num_rollouts.sum() == NUM_SLOTS
    if case.method in ("rollout_gdro", "gdro_both"):
        assert num_rollouts.min() == 2 and num_rollouts.max() == 12, num_rollouts
        assert len(set(num_rollouts.tolist())) >= 3
    else:
        np.testing.assert_array_equal(num_rollouts, N_MEAN)
    if case.method in ("prompt_gdro", "gdro_both"):
        w = result["multipliers"]
        assert w.min() < 0.8 and np.isclose(w.max(), MAX_WEIGHT), w  # spread, and the cap binds
    # All-equal groups carry no advantage; every other group does.
    adv, slots = result["adv"], plan.prompt_of_slot
    informative = [np.any(adv[slots == i] != 0) for i in range(NUM_PROMPTS)]
    assert sum(informative) == NUM_PROMPTS - 2
    # Old log-probs off the current policy: the ratio clip is active on some tokens.
    metrics = result["metrics"]
    assert metrics["clip_fraction_low"] + metrics["clip_fraction_high"] > 0.05


def test_plan_multipliers_equal_the_reference(result):
    np.testing.assert_allclose(
        result["plan"].advantage_weights, result["multipliers"], rtol=1e-5, atol=1e-7
    )


def test_loss_equals_the_reference(result):
    assert abs(result["loss"]) > 1e-3
    np.testing.assert_allclose(result["metrics"]["loss"], result["loss"], rtol=2e-5, atol=1e-7)


def test_pre_clip_gradient_norm_equals_the_reference(result):
    assert result["grad_norm"] > GRAD_CLIP, "the global-norm clip should bind"
    np.testing.assert_allclose(result["metrics"]["grad_norm"], result["grad_norm"], rtol=1e-4)


def test_parameters_equal_the_reference(result):
    got, want = result["params"]
    for a, b, old in zip(
        jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(result["before"]), strict=True
    ):
        # Adam's step is lr g / (|g| + eps), whose slope in g is at most lr / eps = 1e2 (ADAM_EPS).
        # The two programs sum in other orders (and another CPU's vector width orders them again):
        # gradient entries (|g| <= ~1e-2 after the clip) differ by ~1e-6 relative, <= ~1e-8 in all,
        # so each step's parameters by <= 1e-6 and two steps' by <= 2e-6; measured <= 2.5e-7 under
        # --xla_cpu_max_isa SSE4_2, AVX and AVX2. With eps 1e-8 the slope 1e6 at g ~ 0 turned
        # rounding into 2.4e-5 on an AVX-512 machine.
        np.testing.assert_allclose(a, b, atol=PARAMS_ATOL, rtol=0)
        assert np.abs(a - old).max() > 1e-3, "every parameter should move"
