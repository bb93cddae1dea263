"""The update of one GRPO/GDRO step (SPEC section 7), the last of plan, rollout, reward, update:

    advantages over the slots' groups -> Prompt-GDRO multipliers -> mini-batch loss/grad ->
    optimizer; the three controller state transitions; the finite-or-keep guard; SPEC 10 metrics

With `GRPOConfig.micro_batch_slots` a mini-batch's gradient is accumulated over micro-batches of
that many slots (a `lax.scan`, one compiled body), each divided by the whole mini-batch's token
and sequence counts, so the optimizer step, the loss and the metrics are the unaccumulated ones
up to float rounding while only one micro-batch's activations are alive at a time.

The update is jitted once with explicit shardings and the state donated; every array in it has a
static shape (R slots whatever the allocation), so nothing recompiles when the controllers change
their decisions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from gdro_jax import losses, models, sampling
from gdro_jax.controllers import MultiAdversary, Plan
from gdro_jax.sampling import completion_logprobs
from gdro_jax.step._engines import Rollouts
from gdro_jax.step._grpo import GRPOConfig
from gdro_jax.step._guard import keep_if_finite
from gdro_jax.step._metrics import step_metrics
from gdro_jax.step._state import TrainState


def _check_micro_batches(
    config: GRPOConfig, slots_per_minibatch: int, num_slots: int | None = None
) -> None:
    """Raises a ValueError unless `config.micro_batch_slots` divides a mini-batch's slots."""
    micro = config.micro_batch_slots
    if micro is not None and slots_per_minibatch % micro:
        sizes = f"the {slots_per_minibatch} slots of a mini-batch"
        if num_slots is not None:
            sizes += f" (R = {num_slots} slots / grpo.num_minibatches={config.num_minibatches})"
        raise ValueError(
            f"grpo.micro_batch_slots must divide {sizes}; choose a divisor of "
            f"{slots_per_minibatch} or None, got grpo.micro_batch_slots={micro}"
        )


def _zero_gradients(graphdef: nnx.GraphDef, params: nnx.State) -> nnx.State:
    """Zeros shaped and placed like `params`: the gradient sum carried over micro-batches."""
    zeros = jax.tree.map(jnp.zeros_like, params)
    model = nnx.merge(graphdef, zeros)
    if model.mesh is None:
        return zeros
    return jax.lax.with_sharding_constraint(zeros, models.parameter_shardings(model, model.mesh))


def _token_logprobs(graphdef, params, rollouts: Rollouts, idx, config: GRPOConfig) -> jax.Array:
    """Per-token log-probs of the slots `idx` under `params` (the sampling temperature applied)."""
    model = nnx.merge(graphdef, params)
    return completion_logprobs(
        model,
        rollouts.prompt_tokens[idx],
        rollouts.prompt_lengths[idx],
        rollouts.tokens[idx],
        rollouts.lengths[idx],
        temperature=config.temperature,
        chunk_size=config.logprob_chunk_tokens,
    )


def minibatch_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    config: GRPOConfig,
    carry: tuple[nnx.State, optax.OptState],
    idx: jax.Array,
    *,
    rollouts: Rollouts,
    weighted_adv_R: jax.Array,
    mask_RM: jax.Array,
    ref_params: nnx.State | None,
    token_weight_RM: jax.Array | None = None,
):
    """One optimizer step on the slots `idx`: the clipped-surrogate loss, its gradient, AdamW.

    `token_weight_RM`, when given, weights each token's surrogate term (the truncated importance
    weights of an engine's samples, `losses.truncated_is_weights`).

    With `config.micro_batch_slots` the S slots are taken in micro-batches of that many (in the
    order of `idx`) by a `lax.scan` that sums their gradients, losses and metrics; every
    micro-batch divides by the whole mini-batch's counts (`losses.aggregation_normalizer`), so the
    sums are the mini-batch's values for every aggregation, KL and token-mean metric included.

    Returns:
      `((params, opt_state), (metrics, logp_SM, ref_logp_SM))`: the policy's and the reference's
      per-token log-probs of the mini-batch in the order of `idx` (zeros without KL) feed the
      adversaries' loss signal.
    """
    params, opt_state = carry
    max_new_tokens = rollouts.tokens.shape[1]
    _check_micro_batches(config, idx.shape[0])
    normalizer = losses.aggregation_normalizer(mask_RM[idx])
    if config.pack_sequences:
        grads, (metrics, logp, ref_logp) = _packed_gradients(
            graphdef, config, params, idx, rollouts=rollouts, weighted_adv_R=weighted_adv_R,
            mask_RM=mask_RM, ref_params=ref_params, token_weight_RM=token_weight_RM,
            normalizer=normalizer,
        )  # fmt: skip
        return _apply(tx, params, opt_state, grads, metrics, logp, ref_logp)

    def loss_fn(params, micro_idx):
        logp = _token_logprobs(graphdef, params, rollouts, micro_idx, config)
        ref_logp = None
        if config.kl_coef > 0:
            ref_logp = jax.lax.stop_gradient(
                _token_logprobs(graphdef, ref_params, rollouts, micro_idx, config)
            )
        loss, metrics = _policy_loss(
            config,
            logp,
            rollouts.logprobs[micro_idx],
            weighted_adv_R[micro_idx],
            mask_RM[micro_idx],
            ref_logp,
            normalizer,
            None if token_weight_RM is None else token_weight_RM[micro_idx],
        )
        ref_logp = jnp.zeros_like(logp) if ref_logp is None else ref_logp
        return loss, (metrics, jax.lax.stop_gradient(logp), ref_logp)

    loss_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
    if config.micro_batch_slots is None:
        (_, (metrics, logp, ref_logp)), grads = loss_and_grad(params, idx)
    else:

        def accumulate(grads_sum, micro_idx):
            (_, micro_outputs), grads = loss_and_grad(params, micro_idx)
            return jax.tree.map(jnp.add, grads_sum, grads), micro_outputs

        micro_idx_mK = idx.reshape(-1, config.micro_batch_slots)
        grads, (shares, logp_mKM, ref_mKM) = jax.lax.scan(
            accumulate, _zero_gradients(graphdef, params), micro_idx_mK
        )
        # Each share is already divided by the mini-batch's counts: the sum is the mean.
        metrics = {name: jnp.sum(share_m) for name, share_m in shares.items()}
        logp = logp_mKM.reshape(idx.shape[0], max_new_tokens)
        ref_logp = ref_mKM.reshape(idx.shape[0], max_new_tokens)
    return _apply(tx, params, opt_state, grads, metrics, logp, ref_logp)


def _policy_loss(config: GRPOConfig, logp, old_logp, adv, mask, ref_logp, normalizer, weight):
    """`losses.policy_loss` with the config's clip range, aggregation and KL coefficient; a
    pass's share of its mini-batch (`normalizer`); Dr.GRPO's constant is M."""
    return losses.policy_loss(
        logp,
        old_logp,
        adv,
        mask,
        eps_low=config.eps_low,
        eps_high=config.eps_high,
        aggregation=config.aggregation,
        kl_coef=config.kl_coef,
        ref_logp_RT=ref_logp,
        max_length=logp.shape[1],
        normalizer=normalizer,
        token_weight_RT=weight,
    )


def _apply(tx, params, opt_state, grads, metrics, logp, ref_logp):
    """The optimizer step on the mini-batch's gradient: `minibatch_step`'s return value."""
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return (params, opt_state), (metrics, logp, ref_logp)


def _packed_gradients(
    graphdef, config: GRPOConfig, params, idx, *, rollouts: Rollouts, weighted_adv_R, mask_RM,
    ref_params, token_weight_RM, normalizer,
):  # fmt: skip
    """The mini-batch's gradient, metrics and log-probs from its sequences packed into rows
    (`sampling.pack_completions`), in passes of `config.packed_rows_per_pass(S)` rows over only
    the rows in use (a `lax.fori_loop` with a traced trip count).

    A pass's loss is `losses.policy_loss` over the mini-batch's `[S, M]` layout with the mask of
    the slots its rows hold, divided by the whole mini-batch's counts: its shares sum over the
    passes to the mini-batch's loss, gradient and metrics, as the padded micro-batches' do.
    """
    num_slots, max_new_tokens = idx.shape[0], rollouts.tokens.shape[1]
    rows_per_pass = config.packed_rows_per_pass(num_slots)
    prompt_lengths_S, lengths_S = rollouts.prompt_lengths[idx], rollouts.lengths[idx]
    packed = sampling.pack_completions(
        rollouts.prompt_tokens[idx],
        prompt_lengths_S,
        rollouts.tokens[idx],
        lengths_S,
        num_rows=sampling.packed_buffer_rows(num_slots, rows_per_pass),
    )
    old_logp_SM, mask_SM = rollouts.logprobs[idx], mask_RM[idx]
    adv_S = weighted_adv_R[idx]
    token_weight_SM = None if token_weight_RM is None else token_weight_RM[idx]

    def completion_logprobs(params, first_row):
        logp_BL = sampling.packed_rows_logprobs(
            nnx.merge(graphdef, params), packed, first_row, rows_per_pass,
            temperature=config.temperature, chunk_size=config.logprob_chunk_tokens,
        )  # fmt: skip
        return sampling.unpack_completion_logprobs(
            logp_BL, packed, first_row, prompt_lengths_S, lengths_S, max_new_tokens
        )

    def loss_fn(params, first_row):
        logp_SM, in_pass_S = completion_logprobs(params, first_row)
        own_S1 = in_pass_S[:, None]
        # Tokens of other passes: ratio 1 and k3 0 (their mask is off; this keeps their terms,
        # and so the gradient, finite).
        logp_SM = jnp.where(own_S1, logp_SM, old_logp_SM)
        ref_SM = None
        if config.kl_coef > 0:
            ref_SM = jax.lax.stop_gradient(completion_logprobs(ref_params, first_row)[0])
            ref_SM = jnp.where(own_S1, ref_SM, old_logp_SM)
        loss, metrics = _policy_loss(
            config,
            logp_SM,
            old_logp_SM,
            adv_S,
            mask_SM & own_S1,
            ref_SM,
            normalizer,
            token_weight_SM,
        )
        logp_SM = jnp.where(own_S1, jax.lax.stop_gradient(logp_SM), 0.0)
        ref_SM = jnp.zeros_like(logp_SM) if ref_SM is None else jnp.where(own_S1, ref_SM, 0.0)
        return loss, (metrics, logp_SM, ref_SM)

    loss_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

    def one_pass(index, sums):
        (_, outputs), grads = loss_and_grad(params, index * rows_per_pass)
        return jax.tree.map(jnp.add, sums, (grads, outputs))

    shapes = jax.eval_shape(loss_and_grad, params, 0)
    zeros = (
        _zero_gradients(graphdef, params),
        jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[0][1]),
    )
    num_passes = sampling.packed_passes(packed, rows_per_pass)
    grads, outputs = jax.lax.fori_loop(0, num_passes, one_pass, zeros)
    return grads, outputs


def _in_slot_order(values_bSM: jax.Array, minibatch_idx: jax.Array, like_RM: jax.Array):
    """Per-mini-batch `[b, S, M]` rows scattered back to `[R, M]` slot order."""
    flat_idx = minibatch_idx.reshape(-1)
    return jnp.zeros_like(like_RM).at[flat_idx].set(values_bSM.reshape(like_RM.shape))


def make_update(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    gdro: MultiAdversary,
    config: GRPOConfig,
    *,
    num_prompts: int,
    mismatch_cap: float | None = None,
    correct_mismatch: bool = False,
) -> Callable[[TrainState, Plan, jax.Array, Rollouts], tuple[TrainState, dict]]:
    """Builds the (unjitted) update `(state, plan, prompt_ids, rollouts) -> (state, metrics)`.

    Advantages over the R slots' groups -> Prompt-GDRO multipliers -> `num_minibatches`
    optimizer steps over random slot subsets (`minibatch_step`, each accumulated over
    micro-batches of `micro_batch_slots` slots if set) -> the adversaries' loss signal
    and the three controller transitions -> the finite-or-keep guard (`keep_if_finite`) -> the
    SPEC 10 metrics (`step_metrics`).

    With a `group_filter` (DAPO's dynamic sampling) a step is one round: `gdro.filter` puts its
    groups with a signal into the buffer (in `state.gdro`), and the optimizer steps run (a
    `lax.cond`) only when the buffer is ready, on the buffer's N groups, which were all sampled
    under the current parameters (nothing updates them while the buffer fills). The controllers
    learn from every round.

    Args:
      graphdef: the policy's static graph.
      tx: the optimizer.
      gdro: the method's composed decisions (one part per decision): what each part reports
        (`Plan.reports`, `Filtered.reports`) is logged, and a group filter's round is
        `gdro.filter` (`n_mean` rollouts per prompt, no prompt weights).
      config: GRPO hyperparameters.
      num_prompts: N, prompts per step.
      mismatch_cap: for an engine with log-probs of its own (`Rollouts.engine_logprobs`, vLLM):
        the truncation C of the importance weights `pi_trainer / pi_engine`; the step then logs
        the gap (`losses.logprob_mismatch`: "rollout/logprob_mismatch_mean", "..._max",
        "rollout/is_weight_capped_fraction"). None (the built-in engine): nothing logged.
      correct_mismatch: weight each token's surrogate term by `min(pi_trainer / pi_engine, C)`
        (truncated importance sampling, `rollout.logprobs_from="engine"`); needs mismatch_cap.

    Returns:
      The update function. `StepProgram.update` jits it with the state donated.
    """
    num_bins, group_filter = gdro.num_bins, gdro.group_filter
    if correct_mismatch and mismatch_cap is None:
        raise ValueError("correct_mismatch needs mismatch_cap, the truncation C of the weights")
    num_slots = num_prompts * gdro.n_mean
    if num_slots % config.num_minibatches:
        raise ValueError(
            f"R = N * n_mean = {num_slots} slots must divide into "
            f"num_minibatches={config.num_minibatches} equal mini-batches"
        )
    slots_per_minibatch = num_slots // config.num_minibatches
    config = config.for_minibatch(slots_per_minibatch)
    _check_micro_batches(config, slots_per_minibatch, num_slots)
    if group_filter is not None and group_filter.num_groups != num_prompts:
        raise ValueError(
            f"the group filter holds {group_filter.num_groups} groups; a step has "
            f"num_prompts={num_prompts}"
        )

    def optimize(state: TrainState, rollouts: Rollouts, mask_RM, adv_R, prompt_of_slot, weights_N,
                 perm_key):  # fmt: skip
        """The mini-batch optimizer steps on `rollouts` (their completion mask and advantages
        given): `(params, opt_state, metrics of each mini-batch, current log-probs [R, M] and
        reference log-probs [R, M] in slot order)`."""
        weighted_adv_R = losses.weighted_advantages(adv_R, prompt_of_slot, weights_N)
        token_weight_RM = None
        if correct_mismatch:
            token_weight_RM = losses.truncated_is_weights(
                rollouts.logprobs, rollouts.engine_logprobs, mask_RM, cap=mismatch_cap
            )
        # Mini-batches are random subsets of slots: groups were normalised over all R slots above.
        order = jax.random.permutation(perm_key, num_slots)
        minibatch_idx = order.reshape(config.num_minibatches, slots_per_minibatch)
        step = functools.partial(
            minibatch_step,
            graphdef,
            tx,
            config,
            rollouts=rollouts,
            weighted_adv_R=weighted_adv_R,
            mask_RM=mask_RM,
            ref_params=state.ref_params,
            token_weight_RM=token_weight_RM,
        )
        (params, opt_state), (mb_metrics, logp_bSM, ref_bSM) = jax.lax.scan(
            step, (state.params, state.opt_state), minibatch_idx
        )
        # The current-policy log-probs of every slot, as seen by its mini-batch, in slot order.
        logp_RM = _in_slot_order(logp_bSM, minibatch_idx, rollouts.logprobs)
        ref_RM = _in_slot_order(ref_bSM, minibatch_idx, rollouts.logprobs)
        return params, opt_state, mb_metrics, logp_RM, ref_RM

    def filtered_optimize(state: TrainState, plan: Plan, rollouts: Rollouts, perm_key):
        """A round of the group filter (`gdro.filter`): its signal groups into the buffer, the
        optimizer steps on the buffer when it is ready (else the parameters stay)."""
        groups = jax.tree.map(lambda x: x.reshape(num_prompts, gdro.n_mean, *x.shape[1:]), rollouts)
        gdro_state, filtered = gdro.filter(state.gdro, groups, groups.rewards, plan=plan)
        # The buffer's rows are n_mean slots each (the plan allocates nothing); a GRPO group
        # spans the rows `group_of_row` gives it (one, or Pilot-Commit's pilot and commit).
        group_of_slot = filtered.group_of_row[plan.prompt_of_slot]

        def take_and_step(held):
            held = jax.tree.map(lambda x: x.reshape(num_slots, *x.shape[2:]), held)
            ones_N = jnp.ones((num_prompts,), jnp.float32)
            held_adv_R = _advantages(held, group_of_slot, config, num_prompts)
            params, opt_state, mb_metrics, _, _ = optimize(
                state, held, _completion_mask(held), held_adv_R, group_of_slot, ones_N, perm_key,
            )  # fmt: skip
            return params, opt_state, mb_metrics

        def wait(held):
            shapes = jax.eval_shape(take_and_step, held)[2]
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
            return state.params, state.opt_state, zeros

        params, opt_state, mb_metrics = jax.lax.cond(
            filtered.ready, take_and_step, wait, filtered.groups
        )
        metrics = {}
        for report in filtered.reports.values():
            metrics.update(report)
        # The adversaries' signal of this round's groups, under the parameters that sampled them.
        logp = rollouts.logprobs
        return params, opt_state, mb_metrics, logp, logp, gdro_state, metrics

    def update(state: TrainState, plan: Plan, prompt_ids: jax.Array, rollouts: Rollouts):
        key, perm_key = jax.random.split(state.key)
        prompt_of_slot = plan.prompt_of_slot
        mask_RM = _completion_mask(rollouts)
        adv_R = _advantages(rollouts, prompt_of_slot, config, num_prompts)
        gdro_state, filter_metrics = state.gdro, {}
        if group_filter is None:
            params, opt_state, mb_metrics, logp_RM, ref_RM = optimize(
                state, rollouts, mask_RM, adv_R, prompt_of_slot, plan.advantage_weights, perm_key
            )
        else:
            params, opt_state, mb_metrics, logp_RM, ref_RM, gdro_state, filter_metrics = (
                filtered_optimize(state, plan, rollouts, perm_key)
            )
        signal_N = losses.prompt_loss_signal(
            config.loss_signal,
            prompt_of_slot_R=prompt_of_slot,
            num_prompts=num_prompts,
            logp_RT=logp_RM,
            old_logp_RT=rollouts.logprobs,
            adv_R=adv_R,
            mask_RT=mask_RM,
            eps_low=config.eps_low,
            eps_high=config.eps_high,
            kl_coef=config.kl_coef,
            ref_logp_RT=ref_RM if config.kl_coef > 0 else None,
            correct_R=rollouts.correct,
        )
        num_correct_N = jax.ops.segment_sum(
            rollouts.correct.astype(jnp.int32), prompt_of_slot, num_segments=num_prompts
        )
        gdro_state = gdro.update(
            gdro_state, plan, prompt_ids, num_correct=num_correct_N, losses=signal_N
        )
        # Non-finite rewards count too: group statistics would silently zero their advantages.
        finite = (
            jnp.all(jnp.isfinite(mb_metrics["loss"]))
            & jnp.all(jnp.isfinite(mb_metrics["grad_norm"]))
            & jnp.all(jnp.isfinite(rollouts.rewards))
        )
        candidate = state._replace(params=params, opt_state=opt_state, gdro=gdro_state)
        new_state = keep_if_finite(state, candidate, finite, key)
        metrics = {name: jnp.mean(value) for name, value in mb_metrics.items()}
        metrics.update(
            skipped=(~finite).astype(jnp.int32),
            skipped_steps=new_state.skipped_steps,
            consecutive_skips=new_state.consecutive_skips,
        )
        metrics.update(
            step_metrics(
                plan,
                rollouts,
                adv_R,
                mask_RM,
                signal_N,
                num_bins=num_bins,
            )
        )
        metrics.update(filter_metrics)
        if mismatch_cap is not None:
            gap = losses.logprob_mismatch(
                rollouts.logprobs, rollouts.engine_logprobs, mask_RM, cap=mismatch_cap
            )
            metrics.update({f"rollout/{name}": value for name, value in gap.items()})
        metrics["prompt/ids"] = prompt_ids  # the batch's prompts, as the step drew them
        metrics["prompt/correct"] = num_correct_N
        return new_state, metrics

    return update


def _completion_mask(rollouts: Rollouts) -> jax.Array:
    """[R, M] bool: the completion tokens of each slot."""
    max_new_tokens = rollouts.tokens.shape[1]
    return jnp.arange(max_new_tokens)[None, :] < rollouts.lengths[:, None]


def _advantages(rollouts: Rollouts, prompt_of_slot, config: GRPOConfig, num_prompts: int):
    return losses.group_advantages(
        rollouts.rewards,
        prompt_of_slot,
        num_prompts,
        normalize_std=config.normalize_std,
        clip=config.advantage_clip,
        estimator=config.advantage_estimator,
    )
