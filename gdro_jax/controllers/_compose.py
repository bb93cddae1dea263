"""A method's decisions composed into one training step's controllers.

`multi_adversary` threads the classifier and a method's parts, each reached only through its
decision's protocol (`_protocols.py`: prompt sampler, rollout allocator, prompt adversary, group
filter), through one `init`/`plan`/`update` triple over a single `GDROState` pytree, following
the step of SPEC section 7:

    plan   (before rollouts): bins from history up to t-1, the batch (a sampler's or Prompt-GDRO's
                              `resample` draw), rollouts per prompt, slot map, multipliers;
    update (after rewards):   the classifier's and every part's state transitions.

A decision left to GRPO (`None`) means the ids given, unweighted advantages, `n_mean` rollouts per
prompt and every group kept. The total number of rollout slots is always `R = N * n_mean`, so
nothing downstream recompiles when the decisions change (SPEC section 6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.controllers._passk import PassKClassifier, PassKState
from gdro_jax.controllers._protocols import (
    GroupFilter,
    PromptAdversary,
    PromptSampler,
    RolloutAllocator,
)


class GDROState(NamedTuple):
    """The classifier's and the parts' states; a decision left to GRPO holds `None`."""

    classifier: PassKState
    prompt: Any  # the prompt adversary's state (`PromptGDROState`), or None
    rollout: Any  # the rollout allocation's state (`RolloutGDROState`, `KnapsackState`), or None
    # [N] int32 under `bins_from="previous_batch"`: the bins the classifier gave the previous
    # batch's prompts, by position (-1 before the first update); None otherwise.
    previous_bins: jax.Array | None = None
    # The prompt sampler's state (MoPPS's posteriors); None when the batches come from the data.
    sampler: Any = None


class Plan(NamedTuple):
    """What the controllers decided for one batch, before any rollout is drawn."""

    bins: jax.Array  # [N] int32 difficulty bin of each prompt (0 hardest)
    p_hat: jax.Array  # [N] float32 the classifier's pass-rate estimate of each prompt
    num_rollouts: jax.Array  # [N] int32 rollouts per prompt; sums to N * n_mean
    prompt_of_slot: jax.Array  # [R] int32 which prompt each of the R rollout slots belongs to
    advantage_weights: jax.Array  # [N] float32 Prompt-GDRO multipliers (ones when off)
    mu: jax.Array  # [] float32 Rollout-GDRO shadow price (0 when off)
    # [N] int32 the batch's prompts: the ids given to `plan`, or under Prompt-GDRO's `resample`
    # realisation the ids it drew (the step samples, grades and updates on these).
    prompt_ids: jax.Array | None = None
    # [B] float32 under `resample`: the probability q(b) with which each bin was drawn.
    importance: jax.Array | None = None
    # [N] float32 the method's own estimate of each prompt's success rate, beside the
    # classifier's `p_hat` (Knapsack-RL's recent rate, MoPPS's Thompson sample); None: none.
    estimate: jax.Array | None = None


# Where `plan` takes each prompt's bin from: its own classification (ours), or the classification
# of the prompt at the same position in the previous batch (the authors' released code).
BINS_FROM = ("prompt", "previous_batch")


class AdversaryUpdate(Protocol):
    """`update(state, plan, prompt_ids, *, num_correct, losses, valid=None) -> GDROState`."""

    def __call__(
        self,
        state: GDROState,
        plan: Plan,
        prompt_ids: ArrayLike,
        *,
        num_correct: ArrayLike,
        losses: ArrayLike,
        valid: ArrayLike | None = None,
    ) -> GDROState: ...


class MultiAdversary(NamedTuple):
    """A method's decisions composed: pure functions over a `GDROState` (see `multi_adversary`).

    The parts it was built from stay readable: the step logs the prompt adversary's
    distribution, a group filter's buffer lives beside the `GDROState` in the train state (its
    groups are rollouts, which the controllers never hold), and a trainer that cannot realise a
    decision (a fixed number of rollouts per prompt, say) can tell which parts it was given.
    """

    init: Callable[[], GDROState]
    plan: Callable[[GDROState, ArrayLike, jax.Array], Plan]  # (state, prompt_ids, key) -> Plan
    update: AdversaryUpdate
    n_mean: int
    num_bins: int  # the classifier's bins B
    prompt_adversary: PromptAdversary | None = None
    group_filter: GroupFilter | None = None
    rollout_allocator: RolloutAllocator | None = None
    prompt_sampler: PromptSampler | None = None

    @property
    def draws_prompts(self) -> bool:
        """Whether `plan` draws the batch itself (a prompt sampler, or Prompt-GDRO's
        `resample` realisation), so that the ids given to it count only for their number."""
        resample = self.prompt_adversary is not None and (
            self.prompt_adversary.realisation == "resample"
        )
        return self.prompt_sampler is not None or resample


def slots_from_counts(num_rollouts: ArrayLike, total: int) -> jax.Array:
    """Maps `total` rollout slots to prompts: prompt `i` owns `num_rollouts[i]` consecutive slots.

    Args:
      num_rollouts: int[N] rollouts per prompt, summing to `total`.
      total: the static number of slots `R`.

    Returns:
      int32[R] prompt index of each slot, sorted ascending.
    """
    num_rollouts = jnp.asarray(num_rollouts, jnp.int32)
    prompts = jnp.arange(num_rollouts.shape[0], dtype=jnp.int32)
    return jnp.repeat(prompts, num_rollouts, total_repeat_length=total)


def multi_adversary(
    classifier: PassKClassifier,
    prompt: PromptAdversary | None = None,
    rollout: RolloutAllocator | None = None,
    *,
    sampler: PromptSampler | None = None,
    group_filter: GroupFilter | None = None,
    n_mean: int = 4,
    bins_from: str = "prompt",
    num_prompts: int | None = None,
) -> MultiAdversary:
    """Composes the classifier with a method's parts, one per decision (`_protocols.py`).

    Args:
      classifier: from `passk_classifier`.
      prompt: a `PromptAdversary` (`prompt_gdro`), or `None` for unweighted advantages.
      rollout: a `RolloutAllocator` (`rollout_gdro` by bin, `knapsack` by prompt), or `None` for
        `n_mean` rollouts per prompt. When given, its `n_mean` is used.
      sampler: a `PromptSampler` (`mopps`) that draws each batch itself (`Plan.prompt_ids`;
        the ids given to `plan` count only for their number N) and learns from every group;
        None: the batches are the ids given.
      group_filter: a `GroupFilter` (`dynamic_sampling`) over `num_prompts` groups, carried for
        the update, which keeps its buffer (`step.TrainState.buffer`); it combines with neither
        a rollout allocation nor a prompt adversary. None: the update keeps every group.
      n_mean: rollouts per prompt when `rollout` is `None`.
      bins_from: `"prompt"` (default): each prompt's bin is its own classification from history
        up to the previous step (SPEC 3). `"previous_batch"`: the authors' released code, where
        the bin at position `i` is the one the classifier gave, after its last update, the prompt
        at position `i` of the previous batch (at the first step, the prompt's own bin). The
        adversaries then weight, allocate and learn with those lagged bins; `p_hat` stays the
        prompt's own. Kept for the ablation only.
      num_prompts: N, the prompts per batch; required with `bins_from="previous_batch"`, whose
        state holds the previous batch's N bins.

    With `prompt`'s `realisation="resample"` (SPEC 4), `plan` ignores the ids it is given
    except for their number N: it draws N prompts from the classifier's pool, each a bin drawn
    from `q` (over the bins the pool's prompts fill) and then a prompt uniformly inside it, with
    replacement (`Plan.prompt_ids`); advantages stay unweighted, and `update` divides each
    bin's loss by its `q` (`Plan.importance`, EXP3-style).

    Returns:
      A `MultiAdversary` with
        `init() -> GDROState`;
        `plan(state, prompt_ids, key) -> Plan`;
        `update(state, plan, prompt_ids, *, num_correct, losses, valid=None) -> GDROState`,
      where `num_correct` is int[N] correct rollouts per prompt and `losses` the float[N]
      per-prompt loss signal for the adversaries.
    """
    for name, adversary in (("prompt", prompt), ("rollout", rollout)):
        # An allocation by prompt (num_bins None) does not use the bins.
        if adversary is not None and adversary.num_bins not in (None, classifier.num_bins):
            raise ValueError(
                f"{name}.num_bins={adversary.num_bins} differs from the classifier's "
                f"num_bins={classifier.num_bins}"
            )
    if group_filter is not None:
        if prompt is not None or rollout is not None:
            raise ValueError(
                "a group filter trains on groups of n_mean rollouts from earlier rounds, so it "
                "does not combine with a rollout allocation or a prompt adversary"
            )
        if num_prompts is not None and group_filter.num_groups != num_prompts:
            raise ValueError(
                f"the group filter holds {group_filter.num_groups} groups; a step has "
                f"num_prompts={num_prompts}"
            )
    if rollout is not None:
        n_mean = rollout.n_mean
    if n_mean < 1:
        raise ValueError(f"n_mean must be >= 1, got n_mean={n_mean!r}")
    if bins_from not in BINS_FROM:
        raise ValueError(f"bins_from must be one of {BINS_FROM}, got bins_from={bins_from!r}")
    resample = prompt is not None and prompt.realisation == "resample"
    lagged = bins_from == "previous_batch"
    if lagged and (num_prompts is None or num_prompts < 1):
        raise ValueError(
            'num_prompts must be >= 1 with bins_from="previous_batch", '
            f"got num_prompts={num_prompts!r}"
        )
    if sampler is not None and (resample or lagged):
        raise ValueError(
            "a prompt sampler draws the batch itself: it does not combine with Prompt-GDRO's "
            'realisation="resample" or with bins_from="previous_batch"'
        )
    if lagged and resample:
        raise ValueError(
            'bins_from="previous_batch" does not combine with Prompt-GDRO\'s realisation='
            '"resample": the drawn prompts have no previous batch to take bins from by position'
        )

    def init() -> GDROState:
        return GDROState(
            classifier=classifier.init(),
            prompt=None if prompt is None else prompt.init(),
            rollout=None if rollout is None else rollout.init(),
            previous_bins=jnp.full((num_prompts,), -1, jnp.int32) if lagged else None,
            sampler=None if sampler is None else sampler.init(),
        )

    num_dataset = classifier.num_prompts

    def draw(state: GDROState, num_prompts: int, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`resample`: N pool prompts, each a bin drawn from q (over the bins the pool fills)
        then a prompt uniformly inside it, with replacement; and q."""
        pool_bins = classifier.bins(state.classifier, jnp.arange(num_dataset, dtype=jnp.int32))
        counts_B = jax.ops.segment_sum(
            jnp.ones((num_dataset,), jnp.float32), pool_bins, num_segments=classifier.num_bins
        )
        q_B = prompt.distribution(state.prompt, counts_B > 0)
        # P(prompt d) = q(b_d) / count(b_d): a bin from q, then uniform inside it.
        logits_D = jnp.log(q_B[pool_bins]) - jnp.log(counts_B[pool_bins])
        ids = jax.random.categorical(key, logits_D, shape=(num_prompts,)).astype(jnp.int32)
        return ids, q_B

    def plan(state: GDROState, prompt_ids: ArrayLike, key: jax.Array) -> Plan:
        prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
        num_prompts = prompt_ids.shape[0]
        importance = estimate = None
        if resample:
            draw_key, key = jax.random.split(key)
            prompt_ids, importance = draw(state, num_prompts, draw_key)
        if sampler is not None:
            draw_key, key = jax.random.split(key)
            drawn = sampler.draw(state.sampler, num_prompts, draw_key)
            prompt_ids, estimate = drawn.prompt_ids, drawn.sampled_rate
        bins = classifier.bins(state.classifier, prompt_ids)
        if lagged:
            if state.previous_bins.shape[0] != num_prompts:
                raise ValueError(
                    f"plan got {num_prompts} prompt ids; this multi_adversary was built "
                    f"with num_prompts={state.previous_bins.shape[0]}"
                )
            bins = jnp.where(state.previous_bins >= 0, state.previous_bins, bins)
        p_hat = classifier.p_hat(state.classifier, prompt_ids)
        if rollout is None:
            num_rollouts = jnp.full((num_prompts,), n_mean, jnp.int32)
            mu = jnp.zeros((), jnp.float32)
        else:
            num_rollouts, info = rollout.allocate(
                state.rollout, bins, p_hat, key, prompt_ids=prompt_ids
            )
            mu = info.mu
            if info.success_rate is not None:  # an allocation by prompt's own estimate
                estimate = info.success_rate
        if prompt is None or resample:
            weights = jnp.ones((num_prompts,), jnp.float32)
        else:
            weights = prompt.weights(state.prompt, bins, num_rollouts=num_rollouts)
        return Plan(
            bins=bins,
            p_hat=p_hat,
            num_rollouts=num_rollouts,
            prompt_of_slot=slots_from_counts(num_rollouts, num_prompts * n_mean),
            advantage_weights=weights,
            mu=mu,
            prompt_ids=prompt_ids,
            importance=importance,
            estimate=estimate,
        )

    def update(
        state: GDROState,
        plan: Plan,
        prompt_ids: ArrayLike,
        *,
        num_correct: ArrayLike,
        losses: ArrayLike,
        valid: ArrayLike | None = None,
    ) -> GDROState:
        classifier_state = classifier.update(
            state.classifier,
            prompt_ids,
            num_correct=num_correct,
            num_rollouts=plan.num_rollouts,
            valid=valid,
        )
        prompt_state = state.prompt
        if prompt is not None:
            prompt_state = prompt.update(
                state.prompt, plan.bins, losses=losses, importance=plan.importance, valid=valid
            )
        rollout_state = state.rollout
        if rollout is not None:
            rollout_state = rollout.update(
                state.rollout,
                plan.bins,
                p_hat=classifier.p_hat(classifier_state, prompt_ids),
                losses=losses,
                num_correct=num_correct,
                num_rollouts=plan.num_rollouts,
                valid=valid,
                prompt_ids=prompt_ids,
            )
        previous_bins = state.previous_bins
        if lagged:
            previous_bins = classifier.bins(classifier_state, prompt_ids)
        sampler_state = state.sampler
        if sampler is not None:
            sampler_state = sampler.update(
                state.sampler,
                prompt_ids=prompt_ids,
                num_correct=num_correct,
                num_rollouts=plan.num_rollouts,
                valid=valid,
            )
        return GDROState(
            classifier_state, prompt_state, rollout_state, previous_bins, sampler_state
        )

    return MultiAdversary(
        init=init,
        plan=plan,
        update=update,
        n_mean=n_mean,
        num_bins=classifier.num_bins,
        prompt_adversary=prompt,
        group_filter=group_filter,
        rollout_allocator=rollout,
        prompt_sampler=sampler,
    )
