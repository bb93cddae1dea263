"""One GRPO/GDRO step: plan, rollout, reward, update (SPEC section 7).

    plan    (jit): bins <- classifier; n_i <- Rollout-GDRO; slot map; Prompt-GDRO multipliers
    rollout (jit): R = N * n_mean completions with the KV-cache sampler, and log pi_old per token
    reward       : a jittable function of the completions (the task's exact-match grader)
    update  (jit): advantages over segments -> multipliers -> mini-batch loss/grad -> optimizer;
                   the three controller state transitions; SPEC section 10 metrics

The update is jitted once with explicit shardings and the state donated; every array in it has a
static shape (R slots whatever the allocation), so nothing recompiles when the controllers change
their decisions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from gdro_jax import losses
from gdro_jax.controllers import MultiAdversary, Plan, PromptGDRO
from gdro_jax.sampling import completion_logprobs, generate
from gdro_jax.train._state import TrainState


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyperparameters of the GRPO update (SPEC section 2) and of the adversaries' loss signal."""

    num_minibatches: int = 2  # optimizer steps per rollout batch (paper: 256 prompts / 128)
    eps_low: float = 0.2
    eps_high: float = 0.28  # clip-higher
    aggregation: str = "token_mean"  # see gdro_jax.losses.AGGREGATIONS
    kl_coef: float = 0.0  # beta; 0 builds and runs no reference model
    normalize_std: bool = True  # False: Dr.GRPO advantages
    advantage_clip: float = 5.0
    loss_signal: str = "failure_rate"  # Prompt-GDRO's per-prompt signal, see losses.SIGNALS
    temperature: float = 1.0  # sampling temperature; log-probs are taken under it

    def __post_init__(self):
        if not isinstance(self.num_minibatches, int) or self.num_minibatches < 1:
            raise ValueError(
                "num_minibatches must be a positive int, got "
                f"num_minibatches={self.num_minibatches!r}"
            )
        if self.aggregation not in losses.AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {losses.AGGREGATIONS}, got "
                f"aggregation={self.aggregation!r}"
            )
        if self.loss_signal not in losses.SIGNALS:
            raise ValueError(
                f"loss_signal must be one of {losses.SIGNALS}, got loss_signal={self.loss_signal!r}"
            )
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got kl_coef={self.kl_coef!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got temperature={self.temperature!r}")


class Rollouts(NamedTuple):
    """The R sampled completions of one step, their sampling log-probs and rewards."""

    prompt_tokens: jax.Array  # [R, P] int32 each slot's prompt, left-padded
    prompt_lengths: jax.Array  # [R] int32
    tokens: jax.Array  # [R, M] int32 completion tokens (stop token included)
    lengths: jax.Array  # [R] int32 completion lengths
    logprobs: jax.Array  # [R, M] float32 log pi_old of each completion token
    rewards: jax.Array  # [R] float32
    correct: jax.Array  # [R] bool


def sample_rollouts(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    plan: Plan,
    prompt_tokens_NP: jax.Array,
    prompt_lengths_N: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float,
    eos_ids: tuple[int, ...],
) -> Rollouts:
    """Samples `R = len(plan.prompt_of_slot)` completions; rewards are scored afterwards.

    Args:
      graphdef: the policy's static graph.
      params: the policy's parameters.
      plan: the controllers' plan (its `prompt_of_slot` maps slots to the N prompts).
      prompt_tokens_NP: the N prompts, right-padded.
      prompt_lengths_N: their lengths.
      key: sampling key.
      max_new_tokens: M.
      temperature: sampling temperature.
      eos_ids: stop ids.

    Returns:
      The `Rollouts` with rewards 0 and correct False: the run's reward phase fills them in
      (`Rollouts._replace`), on the device or on the host.
    """
    model = nnx.merge(graphdef, params)
    result = generate(
        model,
        prompt_tokens_NP,
        prompt_lengths=prompt_lengths_N,
        prompt_of_slot=plan.prompt_of_slot,
        key=key,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_ids=eos_ids,
    )
    num_slots = result.lengths.shape[0]
    return Rollouts(
        prompt_tokens=result.prompt_tokens,
        prompt_lengths=result.prompt_lengths,
        tokens=result.tokens,
        lengths=result.lengths,
        logprobs=result.logprobs,
        rewards=jnp.zeros((num_slots,), jnp.float32),
        correct=jnp.zeros((num_slots,), bool),
    )


def _per_bin(values_N: jax.Array, bins_N: jax.Array, num_bins: int) -> jax.Array:
    return jax.ops.segment_sum(values_N, bins_N, num_segments=num_bins)


def make_update(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    gdro: MultiAdversary,
    config: GRPOConfig,
    *,
    num_prompts: int,
    num_bins: int,
    prompt_adversary: PromptGDRO | None = None,
) -> Callable[[TrainState, Plan, jax.Array, Rollouts], tuple[TrainState, dict]]:
    """Builds the (unjitted) update `(state, plan, prompt_ids, rollouts) -> (state, metrics)`.

    Args:
      graphdef: the policy's static graph.
      tx: the optimizer.
      gdro: the composed controllers.
      config: GRPO hyperparameters.
      num_prompts: N, prompts per step.
      num_bins: number of difficulty bins B (for per-bin metrics).
      prompt_adversary: the Prompt-GDRO adversary inside `gdro`, if any; used for the `q` and
        score metrics only.

    Returns:
      The update function. Jit it with the state donated (see `jit_update`).
    """
    num_slots = num_prompts * gdro.n_mean
    if num_slots % config.num_minibatches:
        raise ValueError(
            f"R = N * n_mean = {num_slots} slots must divide into "
            f"num_minibatches={config.num_minibatches} equal mini-batches"
        )
    slots_per_minibatch = num_slots // config.num_minibatches

    def token_logprobs(params, rollouts: Rollouts, idx):
        model = nnx.merge(graphdef, params)
        return completion_logprobs(
            model,
            rollouts.prompt_tokens[idx],
            rollouts.prompt_lengths[idx],
            rollouts.tokens[idx],
            rollouts.lengths[idx],
            temperature=config.temperature,
        )

    def update(state: TrainState, plan: Plan, prompt_ids: jax.Array, rollouts: Rollouts):
        key, perm_key = jax.random.split(state.key)
        prompt_of_slot = plan.prompt_of_slot
        max_new_tokens = rollouts.tokens.shape[1]
        mask_RM = jnp.arange(max_new_tokens)[None, :] < rollouts.lengths[:, None]
        adv_R = losses.group_advantages(
            rollouts.rewards,
            prompt_of_slot,
            num_prompts,
            normalize_std=config.normalize_std,
            clip=config.advantage_clip,
        )
        weighted_adv_R = losses.weighted_advantages(adv_R, prompt_of_slot, plan.advantage_weights)
        # Mini-batches are random subsets of slots: groups were normalised over all R slots above.
        order = jax.random.permutation(perm_key, num_slots)
        minibatch_idx = order.reshape(config.num_minibatches, slots_per_minibatch)

        def minibatch_step(carry, idx):
            params, opt_state = carry

            def loss_fn(params):
                logp = token_logprobs(params, rollouts, idx)
                ref_logp = None
                if config.kl_coef > 0:
                    ref_logp = jax.lax.stop_gradient(
                        token_logprobs(state.ref_params, rollouts, idx)
                    )
                loss, metrics = losses.policy_loss(
                    logp,
                    rollouts.logprobs[idx],
                    weighted_adv_R[idx],
                    mask_RM[idx],
                    eps_low=config.eps_low,
                    eps_high=config.eps_high,
                    aggregation=config.aggregation,
                    kl_coef=config.kl_coef,
                    ref_logp_RT=ref_logp,
                    max_length=max_new_tokens,
                )
                return loss, (metrics, logp, ref_logp)

            (_, (metrics, logp, ref_logp)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params
            )
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
            ref_logp = jnp.zeros_like(logp) if ref_logp is None else ref_logp
            return (params, opt_state), (metrics, jax.lax.stop_gradient(logp), ref_logp)

        (params, opt_state), (mb_metrics, logp_bSM, ref_bSM) = jax.lax.scan(
            minibatch_step, (state.params, state.opt_state), minibatch_idx
        )
        # The current-policy log-probs of every slot, as seen by its mini-batch, back in slot order.
        flat_idx = minibatch_idx.reshape(-1)
        logp_RM = (
            jnp.zeros_like(rollouts.logprobs)
            .at[flat_idx]
            .set(logp_bSM.reshape(num_slots, max_new_tokens))
        )
        ref_RM = (
            jnp.zeros_like(rollouts.logprobs)
            .at[flat_idx]
            .set(ref_bSM.reshape(num_slots, max_new_tokens))
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
            state.gdro, plan, prompt_ids, num_correct=num_correct_N, losses=signal_N
        )
        # Guard: a step with a non-finite loss, gradient or reward is skipped whole
        # (parameters, optimizer and controller states keep their pre-step values), counted, and
        # reported; the step counter and the key still advance so the next step samples afresh.
        # Non-finite rewards count too: group statistics would silently zero their advantages.
        finite = (
            jnp.all(jnp.isfinite(mb_metrics["loss"]))
            & jnp.all(jnp.isfinite(mb_metrics["grad_norm"]))
            & jnp.all(jnp.isfinite(rollouts.rewards))
        )

        def keep_if_finite(new, old):
            return jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)

        new_state = state._replace(
            params=keep_if_finite(params, state.params),
            opt_state=keep_if_finite(opt_state, state.opt_state),
            gdro=keep_if_finite(gdro_state, state.gdro),
            key=key,
            step=state.step + 1,
            skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32),
            consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1),
        )
        metrics = {name: jnp.mean(value) for name, value in mb_metrics.items()}
        metrics.update(
            skipped=(~finite).astype(jnp.int32),
            skipped_steps=new_state.skipped_steps,
            consecutive_skips=new_state.consecutive_skips,
        )
        metrics.update(
            step_metrics(
                state,
                plan,
                rollouts,
                adv_R,
                mask_RM,
                signal_N,
                num_bins=num_bins,
                prompt_adversary=prompt_adversary,
            )
        )
        return new_state, metrics

    return update


def step_metrics(
    state: TrainState,
    plan: Plan,
    rollouts: Rollouts,
    adv_R: jax.Array,
    mask_RM: jax.Array,
    signal_N: jax.Array,
    *,
    num_bins: int,
    prompt_adversary: PromptGDRO | None,
) -> dict[str, jax.Array]:
    """The curriculum made visible (SPEC section 10): per-bin arrays and scalars of one step."""
    num_prompts = plan.bins.shape[0]
    bins, n_N = plan.bins, plan.num_rollouts.astype(jnp.float32)
    slot_bins = bins[plan.prompt_of_slot]
    prompts_B = _per_bin(jnp.ones((num_prompts,)), bins, num_bins)
    rollouts_B = _per_bin(n_N, bins, num_bins)
    tokens_R = rollouts.lengths.astype(jnp.float32)
    tokens_B = jax.ops.segment_sum(tokens_R, slot_bins, num_segments=num_bins)
    ones_R = jnp.ones_like(rollouts.rewards)
    reward_mean_B, _ = losses.segment_mean(rollouts.rewards, slot_bins, ones_R, num_bins)
    reward_sq_B, _ = losses.segment_mean(rollouts.rewards**2, slot_bins, ones_R, num_bins)
    reward_std_B = jnp.sqrt(jnp.maximum(reward_sq_B - reward_mean_B**2, 0.0))
    present_B = prompts_B > 0
    share_B = prompts_B / num_prompts
    if prompt_adversary is not None:
        q_B = prompt_adversary.distribution(state.gdro.prompt, present_B)
        scores_B = state.gdro.prompt.scores
    else:
        q_B = jnp.where(present_B, 1.0 / jnp.maximum(present_B.sum(), 1), 0.0)
        scores_B = jnp.zeros((num_bins,))
    # Advantage-weight mass of each bin over the batch's responses, against the bin's share.
    mass_B = _per_bin(n_N * plan.advantage_weights, bins, num_bins)
    weight_share_B = mass_B / jnp.maximum(mass_B.sum(), 1e-12)
    bin_index = jnp.arange(num_bins, dtype=jnp.float32)
    stats = losses.group_statistics(rollouts.rewards, plan.prompt_of_slot, num_prompts)
    logp_tokens = jnp.where(mask_RM, rollouts.logprobs, 0.0)
    return {
        "reward": jnp.mean(rollouts.rewards),
        "accuracy": jnp.mean(rollouts.correct.astype(jnp.float32)),
        "response_length": jnp.mean(tokens_R),
        "tokens": jnp.sum(tokens_R),
        "entropy_estimate": -jnp.sum(logp_tokens) / jnp.maximum(mask_RM.sum(), 1),
        "advantage_abs_mean": jnp.mean(jnp.abs(adv_R)),
        "nonzero_advantage_fraction": losses.informative_fraction(stats),
        "loss_signal_mean": jnp.mean(signal_N),
        "mu": plan.mu,
        "lead_lag_gap": jnp.sum(bin_index * weight_share_B) - jnp.sum(bin_index * share_B),
        "weighted_standard_error": jnp.sum(
            jnp.where(present_B, q_B * reward_std_B / jnp.sqrt(jnp.maximum(rollouts_B, 1.0)), 0.0)
        ),
        "bin/q": q_B,
        "bin/score": scores_B,
        "bin/prompts": prompts_B,
        "bin/rollouts": rollouts_B,
        "bin/rollouts_per_prompt": rollouts_B / jnp.maximum(prompts_B, 1.0),
        "bin/tokens": tokens_B,
        "bin/reward": reward_mean_B,
    }
