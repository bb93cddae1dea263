"""Gradient accumulation (`GRPOConfig.micro_batch_slots`) equals the unaccumulated update.

The unaccumulated update (`micro_batch_slots=None`) is itself pinned to a hand-written reference in
`test_update_reference.py`, whose policy, seeded controllers and batch this module reuses. Here
the batch's response lengths are set by position in each mini-batch so that its micro-batches of
4 slots hold 24, 3, 16 and 5 tokens and one response is empty: a micro-batch that divides by its
own token or sequence count (or a mean of the micro-batches' means) gives another loss, gradient
and metrics. One optimizer mini-batch (`minibatch_step`) is compared with the unaccumulated one:
gradients, the parameters after the update, loss and metrics, and the per-token log-probs it
returns in the mini-batch's slot order. Every aggregation runs with and without KL and sees both
micro-batch sizes, 1 and 4 (one size per KL setting, alternating, as each case costs a compile of
the step and its reference). A whole Prompt-GDRO + Rollout-GDRO update (`make_update`, whose loss
signal reads those log-probs back in slot order) with micro-batches of 4 on an 8-device mesh is
compared too, and compiles once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax import losses, models
from gdro_jax.step import GRPOConfig, init_train_state, make_update, minibatch_step
from tests.train.test_update_reference import (
    EPS_HIGH,
    EPS_LOW,
    FAST_COMPILE,
    GRAD_CLIP,
    LEARNING_RATE,
    MAX_NEW_TOKENS,
    NUM_PROMPTS,
    NUM_SLOTS,
    SCORES,
    VOCAB,
    _batch,
    _controllers,
    _seeded,
    reference_logprobs,
)

NUM_MINIBATCHES = 2
SLOTS_PER_MINIBATCH = NUM_SLOTS // NUM_MINIBATCHES  # 16
TEMPERATURE, KL_COEF = 0.8, 0.2
# Response lengths by position in a mini-batch: micro-batches of 4 slots hold 24, 3, 16 and 5
# tokens and 4, 3, 4, 4 responses (one empty).
LENGTHS_BY_POSITION = np.array([6, 6, 6, 6, 1, 1, 0, 1, 3, 6, 2, 5, 1, 2, 1, 1])
MICRO_BATCH_SLOTS = (1, 4)
# (aggregation, kl_coef, micro_batch_slots): each aggregation with and without KL, the two
# micro-batch sizes alternating, so each aggregation sees both and each size both KL settings.
CASES = [
    (aggregation, kl_coef, MICRO_BATCH_SLOTS[(i + with_kl) % 2])
    for i, aggregation in enumerate(losses.AGGREGATIONS)
    for with_kl, kl_coef in enumerate((0.0, KL_COEF))
]
# test_update_reference's fast-compile options, and XLA CPU's older fusion emitters, which
# compile this module's programs in under half the time.
COMPILE = {**FAST_COMPILE, "xla_cpu_use_fusion_emitters": False}
# float32 sums in another order: gradients, loss, metrics and log-probs to rtol 1e-5, atol 1e-6.
RTOL, ATOL = 1e-5, 1e-6


def recorded_gradients() -> optax.GradientTransformation:
    """A pass-through transformation whose state is the last gradient it saw (pre-clip)."""
    return optax.GradientTransformation(
        init=lambda params: jax.tree.map(jnp.zeros_like, params),
        update=lambda updates, state, params=None: (updates, updates),
    )


# Adam's first step is lr * g / (|g| + eps): with the usual eps 1e-8 its slope 1 / eps at g ~ 0
# turns the rounding of near-zero gradient entries (~1e-9) into parameter differences of ~1e-5;
# eps 1e-4 keeps those under 1e-6, so parameters are compared at the tolerance of gradients.
TX = optax.chain(
    recorded_gradients(), optax.clip_by_global_norm(GRAD_CLIP), optax.adam(LEARNING_RATE, eps=1e-4)
)


@jax.jit(compiler_options=COMPILE)
def _perturbed(params, key):
    """`params` plus N(0, 0.05^2) noise: a reference policy away from the current one, so k3 and
    its gradient live."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    noisy = [p + 0.05 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(treedef, noisy)


@jax.jit(compiler_options=COMPILE)
def _weighted_advantages(rewards_R, plan):
    adv_R = losses.group_advantages(rewards_R, plan.prompt_of_slot, NUM_PROMPTS)
    return losses.weighted_advantages(adv_R, plan.prompt_of_slot, plan.advantage_weights)


def _ragged(graphdef, params, batch, order):
    """`batch` with each mini-batch's lengths set by position (`LENGTHS_BY_POSITION`), fresh
    tokens, and old log-probs off the current policy (so ratios differ from 1 and some clip)."""
    rng = np.random.default_rng(5)
    lengths = np.empty(NUM_SLOTS, np.int32)
    lengths[np.asarray(order)] = np.tile(LENGTHS_BY_POSITION, NUM_MINIBATCHES)
    valid = np.arange(MAX_NEW_TOKENS)[None] < lengths[:, None]
    tokens = np.where(valid, rng.integers(1, VOCAB, size=valid.shape), 0)
    batch = batch._replace(tokens=jnp.asarray(tokens, jnp.int32), lengths=jnp.asarray(lengths))
    current = jax.jit(reference_logprobs, static_argnums=(0, 4), compiler_options=FAST_COMPILE)(
        graphdef, params, batch, jnp.arange(NUM_SLOTS), TEMPERATURE
    )
    old = np.where(valid, np.asarray(current) + rng.normal(0.0, 0.3, size=valid.shape), 0.0)
    return batch._replace(logprobs=jnp.asarray(old, jnp.float32))


def _policy(mesh=None):
    """`test_update_reference`'s one-layer policy, on `mesh` if given."""
    config = models.DecoderConfig.tiny(
        vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=64
    )
    return models.init_decoder(config, seed=0, mesh=mesh)


@pytest.fixture(scope="module")
def setup():
    model = _policy()
    gdro, prompt = _controllers("gdro_both")
    graphdef, state = init_train_state(model, TX, gdro, seed=3, with_reference=True)
    state = state._replace(
        gdro=_seeded(state.gdro), ref_params=_perturbed(state.params, jax.random.key(7))
    )
    prompt_ids = jnp.arange(NUM_PROMPTS, dtype=jnp.int32)
    plan = jax.jit(gdro.plan)(state.gdro, prompt_ids, jax.random.key(1))
    # make_update's mini-batches: a permutation of the slots from the second half of its key split.
    order = jax.random.permutation(jax.random.split(state.key)[1], NUM_SLOTS)
    batch = _batch(graphdef, state.params, plan, TEMPERATURE, seed=2)
    batch = _ragged(graphdef, state.params, batch, order)
    return dict(
        graphdef=graphdef,
        state=state,
        gdro=gdro,
        prompt=prompt,
        prompt_ids=prompt_ids,
        plan=plan,
        batch=batch,
        weighted_adv_R=_weighted_advantages(batch.rewards, plan),
        idx=order[:SLOTS_PER_MINIBATCH],
    )


def _grpo(aggregation, kl_coef, micro_batch_slots, **overrides):
    """The update's config; padded (micro-batches of slots) unless `overrides` say otherwise."""
    overrides = {"pack_sequences": False, **overrides}
    return GRPOConfig(
        num_minibatches=NUM_MINIBATCHES,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        aggregation=aggregation,
        kl_coef=kl_coef,
        temperature=TEMPERATURE,
        micro_batch_slots=micro_batch_slots,
        **overrides,
    )


def _one_minibatch(setup, grpo, token_weight_RM=None):
    """`minibatch_step` on the first mini-batch (its tokens' surrogate terms weighted by
    `token_weight_RM`, if given): gradients, parameters, metrics, log-probs."""
    state, batch = setup["state"], setup["batch"]
    mask_RM = jnp.arange(MAX_NEW_TOKENS)[None] < batch.lengths[:, None]
    step = functools.partial(
        minibatch_step,
        setup["graphdef"],
        TX,
        grpo,
        rollouts=batch,
        weighted_adv_R=setup["weighted_adv_R"],
        mask_RM=mask_RM,
        ref_params=state.ref_params if grpo.kl_coef > 0 else None,
        token_weight_RM=token_weight_RM,
    )
    (params, opt_state), (metrics, logp, ref_logp) = jax.jit(step, compiler_options=COMPILE)(
        (state.params, state.opt_state), setup["idx"]
    )
    return jax.tree.map(
        np.asarray,
        dict(grads=opt_state[0], params=params, metrics=metrics, logp=logp, ref_logp=ref_logp),
    )


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "{}-kl{}-micro{}".format(*case))
def outcomes(request, setup):
    """The accumulated mini-batch ("got") and the unaccumulated one ("want")."""
    aggregation, kl_coef, micro = request.param
    return dict(
        got=_one_minibatch(setup, _grpo(aggregation, kl_coef, micro)),
        want=_one_minibatch(setup, _grpo(aggregation, kl_coef, None)),
    )


def _assert_trees_close(got, want, *, rtol=RTOL, atol=ATOL):
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_the_micro_batches_differ_in_length(setup):
    lengths = np.asarray(setup["batch"].lengths)[np.asarray(setup["idx"])]
    tokens_per_micro_batch = lengths.reshape(-1, 4).sum(axis=1)
    np.testing.assert_array_equal(tokens_per_micro_batch, [24, 3, 16, 5])
    assert (lengths == 0).sum() == 1


def test_gradients_equal_the_unaccumulated(outcomes):
    want = outcomes["want"]["grads"]
    assert optax.tree.norm(want) > GRAD_CLIP, "a non-trivial gradient"
    _assert_trees_close(outcomes["got"]["grads"], want)


def test_parameters_after_the_update_equal_the_unaccumulated(outcomes):
    _assert_trees_close(outcomes["got"]["params"], outcomes["want"]["params"])


def test_loss_and_metrics_equal_the_unaccumulated(outcomes):
    got, want = outcomes["got"]["metrics"], outcomes["want"]["metrics"]
    assert set(got) == set(want)
    assert want["clip_fraction_low"] + want["clip_fraction_high"] > 0.05, "some ratios clip"
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


def test_logprobs_come_back_in_the_minibatch_order(outcomes):
    got, want = outcomes["got"], outcomes["want"]
    assert np.abs(want["logp"]).max() > 0.1
    np.testing.assert_allclose(got["logp"], want["logp"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["ref_logp"], want["ref_logp"], rtol=RTOL, atol=ATOL)


def _scan_lengths(jaxpr) -> list[int]:
    """The lengths of every `scan` in a jaxpr, nested ones included, outermost first."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn.params["length"])
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                found.extend(_scan_lengths(inner))
    return found


def sharded(setup):
    """`setup`'s state, plan and batch with the policy on a 2 x 2 x 2 mesh (8 fake CPU devices)
    and the rest replicated, as in build_run: `(graphdef, state, plan, prompt_ids, batch,
    replicated)`."""
    mesh = models.make_mesh(2, 2, 2)
    replicated = NamedSharding(mesh, P())
    graphdef, state = init_train_state(
        _policy(mesh), TX, setup["gdro"], seed=3, with_reference=True
    )
    state = state._replace(
        gdro=jax.device_put(setup["state"].gdro, replicated),
        ref_params=jax.device_put(
            _perturbed(state.params, jax.random.key(7)),
            jax.tree.map(lambda leaf: leaf.sharding, state.params),
        ),
    )
    plan, prompt_ids, batch = jax.device_put(
        (setup["plan"], setup["prompt_ids"], setup["batch"]), replicated
    )
    return graphdef, state, plan, prompt_ids, batch, replicated


def test_a_sharded_update_equals_the_unaccumulated_and_compiles_once(setup):
    graphdef, state, plan, prompt_ids, batch, replicated = sharded(setup)

    def build(micro):
        grpo = _grpo("seq_mean_token_mean", KL_COEF, micro, loss_signal="surrogate_kl")
        return make_update(
            graphdef,
            TX,
            setup["gdro"],
            grpo,
            num_prompts=NUM_PROMPTS,
        )

    # One micro-batch body inside the mini-batch loop, not a Python loop unrolled.
    accumulated = build(4)
    scans = _scan_lengths(jax.make_jaxpr(accumulated)(state, plan, prompt_ids, batch).jaxpr)
    assert scans.index(NUM_MINIBATCHES) < scans.index(SLOTS_PER_MINIBATCH // 4), scans
    assert scans.count(SLOTS_PER_MINIBATCH // 4) == 1, scans
    out_shardings = (jax.tree.map(lambda leaf: leaf.sharding, state), replicated)
    results = {}
    for micro, update in ((None, build(None)), (4, accumulated)):
        update = jax.jit(update, out_shardings=out_shardings, compiler_options=COMPILE)
        new_state, metrics = update(state, plan, prompt_ids, batch)
        update(new_state, plan, prompt_ids, batch)  # a second step: no recompilation
        assert update._cache_size() == 1
        results[micro] = jax.tree.map(np.asarray, (new_state.params, new_state.gdro, metrics))
    (params, gdro_state, metrics), (want_params, want_gdro, want_metrics) = (
        results[4],
        results[None],
    )
    _assert_trees_close(params, want_params)
    # Prompt-GDRO's scores moved by the surrogate + KL signal, which reads the returned log-probs.
    assert np.abs(want_gdro.prompt.scores - SCORES).max() > 1e-3
    _assert_trees_close(gdro_state, want_gdro)
    for name in want_metrics:
        np.testing.assert_allclose(
            metrics[name], want_metrics[name], rtol=RTOL, atol=ATOL, err_msg=name
        )


@pytest.mark.parametrize("value", [0, -2, 2.0, True, "4"])
def test_a_bad_micro_batch_size_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match=f"got micro_batch_slots={value!r}"):
        _grpo("token_mean", 0.0, value)
    with pytest.raises(ValueError, match=f"got logprob_chunk_tokens={value!r}"):
        _grpo("token_mean", 0.0, None, logprob_chunk_tokens=value)


def test_a_micro_batch_size_that_does_not_divide_the_minibatch_is_refused(setup):
    with pytest.raises(
        ValueError,
        match=r"grpo\.micro_batch_slots must divide the 16 slots of a mini-batch \(R = 32 slots / "
        r"grpo\.num_minibatches=2\).* got grpo\.micro_batch_slots=3",
    ):
        make_update(
            setup["graphdef"],
            TX,
            setup["gdro"],
            _grpo("token_mean", 0.0, 3),
            num_prompts=NUM_PROMPTS,
        )


def test_a_chunked_output_projection_gives_the_same_update(setup):
    """`logprob_chunk_tokens` (5: not a divisor of the P + M positions, so the last chunk is
    padded) with accumulation over micro-batches of 4 gives the unchunked, unaccumulated
    mini-batch: gradients, parameters and both log-probs."""
    positions = setup["batch"].prompt_tokens.shape[1] + MAX_NEW_TOKENS
    assert positions % 5, positions
    got = _one_minibatch(setup, _grpo("token_mean", KL_COEF, 4, logprob_chunk_tokens=5))
    want = _one_minibatch(setup, _grpo("token_mean", KL_COEF, None))
    for name in ("grads", "params", "logp", "ref_logp"):
        _assert_trees_close(got[name], want[name])
