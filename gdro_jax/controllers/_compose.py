"""A method's decisions composed: the one place where a step's decisions combine.

`multi_adversary` threads the classifier and a method's parts, each reached only through its
decision's protocol (`_protocols.py`: prompt sampler, rollout allocator, prompt adversary, group
filter), through one `init`/`plan`/`filter`/`update` set over a single `GDROState` pytree,
following the step of SPEC section 7:

    plan   (before rollouts): bins from history up to t-1, the batch (a sampler's or Prompt-GDRO's
                              `resample` draw), rollouts per prompt, slot map, multipliers, and
                              what each part reports (`Plan.reports`);
    filter (after rewards):   a group filter's round: the groups with a signal into its buffer
                              (held in the `GDROState`), and whether the update is taken now, on
                              the buffer's groups;
    update (after the loss):  the classifier's and every part's state transitions.

A decision left to GRPO (`None`) means the ids given, unweighted advantages, `n_mean` rollouts per
prompt and every group kept. The total number of rollout slots is always `R = N * n_mean`, so
nothing downstream recompiles when the decisions change (SPEC section 6).

The trainer (`gdro_jax.step`) gives one part per decision. The simulator (`gdro_jax.sim`) gives
the same function several alternative parts per decision, by name, and chooses the applied one
with a traced `applied` map, so one compilation serves every method; there every part held
observes every step (it learns from the applied decisions' data), as the trainer's parts do.
Which decisions combine is `check_combination`, written once.

One module over 400 lines, on purpose: the types a step's decisions pass (`GDROState`, `Plan`,
`Filtered`) and the one function whose closures make them are read together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    """The classifier's and the parts' states; a decision left to GRPO holds `None`.

    A decision given one part holds that part's state; given alternatives by name (the
    simulator's), it holds `{name: state}`.
    """

    classifier: PassKState
    prompt: Any  # the prompt adversary's state (`PromptGDROState`), or None
    rollout: Any  # the rollout allocation's state (`RolloutGDROState`, `KnapsackState`), or None
    # [N] int32 under `bins_from="previous_batch"`: the bins the classifier gave the previous
    # batch's prompts, by position (-1 before the first update); None otherwise.
    previous_bins: jax.Array | None = None
    # The prompt sampler's state (MoPPS's posteriors); None when the batches come from the data.
    sampler: Any = None
    # The group filter's buffer of kept groups (DAPO dynamic sampling's); None: no filter.
    filter: Any = None


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
    # What each part held reported at planning (its protocol's `metrics`), by the part's name:
    # its decision's name for a part given alone, else the name it was given under.
    reports: Mapping[str, Mapping[str, jax.Array]] | None = None
    # What each group filter held selected for the round (its `select`), by the part's name;
    # its `add` takes it back after the rewards. Empty without a group filter.
    selections: Mapping[str, Any] | None = None


class Filtered(NamedTuple):
    """What a group filter's round decided (`MultiAdversary.filter`)."""

    active: Any  # [] bool (or True) a group filter is applied: the update trains on `groups`
    ready: Any  # [] bool take the update now (always, when no filter is applied)
    groups: Any  # the buffer's groups (leaves [N, ...]) to train on when ready; None: no filter
    filled: jax.Array | None  # [N] bool which of `groups` hold one
    # [N] int32 the GRPO group of each row of `groups` (a group may span rows: Pilot-Commit's
    # pilot and commit); None: no filter.
    group_of_row: jax.Array | None
    # The round's report of each group filter held (its protocol's `metrics`), by name.
    reports: Mapping[str, Mapping[str, jax.Array]]


# Where `plan` takes each prompt's bin from: its own classification (ours), or the classification
# of the prompt at the same position in the previous batch (the authors' released code).
BINS_FROM = ("prompt", "previous_batch")


class PlanKeys(NamedTuple):
    """The keys of `plan`'s random decisions. A single key given to `plan` is split into these
    (into `draw` and `allocate` when the batch is drawn, else it is `allocate`)."""

    draw: jax.Array | None  # the batch's draw: a prompt sampler's, or Prompt-GDRO's `resample`
    allocate: jax.Array  # the rollout allocation's


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

    The parts it was built from stay readable (a part given alone, or `{name: part}` for
    alternatives), so that a trainer that cannot realise a decision (a fixed number of rollouts
    per prompt, say) can tell which parts it was given.
    """

    init: Callable[..., GDROState]  # (example_groups=None) -> GDROState
    plan: Callable[..., Plan]  # (state, prompt_ids, key, *, applied=None) -> Plan
    update: AdversaryUpdate
    # (state, groups, rewards_NG, *, applied=None) -> (GDROState, Filtered)
    filter: Callable[..., tuple[GDROState, Filtered]]
    n_mean: int
    num_bins: int  # the classifier's bins B
    prompt_adversary: Any = None  # PromptAdversary, {name: PromptAdversary} or None
    group_filter: Any = None  # GroupFilter, {name: GroupFilter} or None
    rollout_allocator: Any = None  # RolloutAllocator, {name: RolloutAllocator} or None
    prompt_sampler: Any = None  # PromptSampler, {name: PromptSampler} or None

    @property
    def draws_prompts(self) -> bool:
        """Whether `plan` draws the batch itself (a prompt sampler, or Prompt-GDRO's
        `resample` realisation), so that the ids given to it count only for their number."""
        adversaries = _named("prompt_adversary", self.prompt_adversary)[0].values()
        resample = any(adversary.realisation == "resample" for adversary in adversaries)
        filters = _named("group_filter", self.group_filter)[0].values()
        selecting = any(part.draws_prompts for part in filters)
        return self.prompt_sampler is not None or resample or selecting


def check_combination(
    *,
    prompt_sampler: bool = False,
    rollout_allocation: bool = False,
    prompt_adversary: bool = False,
    group_filter: bool = False,
    resample: bool = False,
    lagged: bool = False,
    selecting_filter: bool = False,
) -> None:
    """Refuses decisions that do not combine; each flag says the decision is handed to a part
    (`resample`: Prompt-GDRO's realisation, `lagged`: `bins_from="previous_batch"`,
    `selecting_filter`: a group filter that chooses the round's prompts, Pilot-Commit).

    Raises:
      ValueError: saying why the two do not combine.
    """
    if group_filter and (rollout_allocation or prompt_adversary):
        raise ValueError(
            "a group filter trains on groups of n_mean rollouts from earlier rounds, so it "
            "does not combine with a rollout allocation or a prompt adversary"
        )
    if selecting_filter and (prompt_sampler or resample or lagged):
        raise ValueError(
            "a group filter that selects the round's prompts (Pilot-Commit) does not combine "
            'with a prompt sampler, Prompt-GDRO\'s realisation="resample" or '
            'bins_from="previous_batch"'
        )
    if prompt_sampler and (resample or lagged):
        raise ValueError(
            "a prompt sampler draws the batch itself: it does not combine with Prompt-GDRO's "
            'realisation="resample" or with bins_from="previous_batch"'
        )
    if lagged and resample:
        raise ValueError(
            'bins_from="previous_batch" does not combine with Prompt-GDRO\'s realisation='
            '"resample": the drawn prompts have no previous batch to take bins from by position'
        )


def _named(decision: str, given: Any) -> tuple[dict[str, Any], bool]:
    """`({name: part}, alone)`: a part given alone is named by its decision."""
    if given is None:
        return {}, True
    if isinstance(given, Mapping):
        return dict(given), False
    return {decision: given}, True


def _pick(flag: Any, new: Any, old: Any) -> Any:
    """`new` where `flag`, else `old` (leaf by leaf); `flag is True` takes `new` as it is."""
    if flag is True:
        return new
    return jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)


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
    prompt: PromptAdversary | Mapping[str, PromptAdversary] | None = None,
    rollout: RolloutAllocator | Mapping[str, RolloutAllocator] | None = None,
    *,
    sampler: PromptSampler | Mapping[str, PromptSampler] | None = None,
    group_filter: GroupFilter | Mapping[str, GroupFilter] | None = None,
    n_mean: int = 4,
    bins_from: str = "prompt",
    num_prompts: int | None = None,
) -> MultiAdversary:
    """Composes the classifier with a method's parts, one per decision (`_protocols.py`).

    Each part argument takes one part, or `{name: part}` alternatives of which `plan` and
    `filter` apply the one their `applied` map chooses (the simulator's traced method flags;
    at most one per decision).

    Args:
      classifier: from `passk_classifier`.
      prompt: a `PromptAdversary` (`prompt_gdro`), or `None` for unweighted advantages.
      rollout: a `RolloutAllocator` (`rollout_gdro` by bin, `knapsack` by prompt), or `None` for
        `n_mean` rollouts per prompt. When given, its `n_mean` is used.
      sampler: a `PromptSampler` (`mopps`) that draws each batch itself (`Plan.prompt_ids`;
        the ids given to `plan` count only for their number N) and learns from every group;
        None: the batches are the ids given.
      group_filter: a `GroupFilter` (`dynamic_sampling`, `pilot_commit`) over `num_prompts`
        groups; its buffer is the state's `filter` (`init(example_groups)` shapes it), `plan`
        takes the round's prompts from its `select` and `filter` runs its round. It combines with
        neither a rollout allocation nor a prompt adversary, and one that selects the prompts
        (`draws_prompts`) with no other draw (`check_combination`). None: the update keeps every
        group.
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
        `init(example_groups=None) -> GDROState` (`example_groups`: one round's groups, leaves
          `[N, ...]` arrays or ShapeDtypeStructs, needed with a group filter);
        `plan(state, prompt_ids, key, *, applied=None) -> Plan` (`key`: one key or `PlanKeys`;
          `applied`: `{name: [] bool}` over the alternatives, None when every part is alone);
        `filter(state, groups, rewards_NG, *, plan=None, applied=None) -> (GDROState,
          Filtered)`: the round's groups (leaves `[N, n_mean, ...]`), rewards `[N, n_mean]` and
          the plan they were sampled from (a group filter that selects, Pilot-Commit, needs it);
        `update(state, plan, prompt_ids, *, num_correct, losses, valid=None) -> GDROState`,
      where `num_correct` is int[N] correct rollouts per prompt and `losses` the float[N]
      per-prompt loss signal for the adversaries.
    """
    adversaries, adversary_alone = _named("prompt_adversary", prompt)
    allocations, allocation_alone = _named("rollout_allocation", rollout)
    samplers, sampler_alone = _named("prompt_sampler", sampler)
    filters, filter_alone = _named("group_filter", group_filter)
    for name, part in (*adversaries.items(), *allocations.items()):
        # An allocation by prompt (num_bins None) does not use the bins.
        if part.num_bins not in (None, classifier.num_bins):
            raise ValueError(
                f"{name}.num_bins={part.num_bins} differs from the classifier's "
                f"num_bins={classifier.num_bins}"
            )
    for part in filters.values():
        if num_prompts is not None and part.num_groups != num_prompts:
            raise ValueError(
                f"the group filter holds {part.num_groups} groups; a step has "
                f"num_prompts={num_prompts}"
            )
    n_means = {part.n_mean for part in allocations.values()}
    if len(n_means) > 1:
        raise ValueError(f"the rollout allocations have different n_mean {sorted(n_means)}")
    if n_means:
        n_mean = n_means.pop()
    if n_mean < 1:
        raise ValueError(f"n_mean must be >= 1, got n_mean={n_mean!r}")
    if bins_from not in BINS_FROM:
        raise ValueError(f"bins_from must be one of {BINS_FROM}, got bins_from={bins_from!r}")
    resampling = {n for n, a in adversaries.items() if a.realisation == "resample"}
    selecting = {n for n, f in filters.items() if f.draws_prompts}
    lagged = bins_from == "previous_batch"
    if lagged and (num_prompts is None or num_prompts < 1):
        raise ValueError(
            'num_prompts must be >= 1 with bins_from="previous_batch", '
            f"got num_prompts={num_prompts!r}"
        )
    everything_alone = adversary_alone and allocation_alone and sampler_alone and filter_alone
    if everything_alone:  # the decisions are these parts: check that they combine
        check_combination(
            prompt_sampler=bool(samplers),
            rollout_allocation=bool(allocations),
            prompt_adversary=bool(adversaries),
            group_filter=bool(filters),
            resample=bool(resampling),
            lagged=lagged,
            selecting_filter=bool(selecting),
        )
    else:  # alternatives: only what no choice of them can combine
        check_combination(prompt_sampler=bool(samplers), resample=bool(resampling), lagged=lagged)
        check_combination(lagged=lagged, selecting_filter=bool(selecting))
    names = [*adversaries, *allocations, *samplers, *filters]

    def switch(applied: Mapping[str, ArrayLike] | None) -> Callable[[str], Any]:
        """`on(name)`: whether the part `name` is applied (True: every part is alone)."""
        if applied is None:
            if not everything_alone:
                raise ValueError(
                    f"applied must say which of the alternative parts {names} are applied"
                )
            return lambda name: True
        missing = [name for name in names if name not in applied]
        if missing:
            raise ValueError(f"applied must name every part held {names}; missing {missing}")
        return lambda name: jnp.asarray(applied[name], bool)

    def packed(new: dict[str, Any], alone: bool) -> Any:
        if not new:
            return None
        return next(iter(new.values())) if alone else new

    def init(example_groups: Any = None) -> GDROState:
        if filters and example_groups is None:
            raise ValueError(
                "a group filter's buffer is shaped like one round's groups: "
                "init(example_groups=...)"
            )
        return GDROState(
            classifier=classifier.init(),
            prompt=packed({n: a.init() for n, a in adversaries.items()}, adversary_alone),
            rollout=packed({n: a.init() for n, a in allocations.items()}, allocation_alone),
            previous_bins=jnp.full((num_prompts,), -1, jnp.int32) if lagged else None,
            sampler=packed({n: s.init() for n, s in samplers.items()}, sampler_alone),
            filter=packed({n: f.init(example_groups) for n, f in filters.items()}, filter_alone),
        )

    def held(field: Any, alone: bool, parts: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """`(name, part, state)` of each part of a decision."""
        if alone:
            return [(name, part, field) for name, part in parts.items()]
        return [(name, part, field[name]) for name, part in parts.items()]

    num_dataset = classifier.num_prompts

    def draw(adversary, classifier_state, adversary_state, num_prompts: int, key: jax.Array):
        """`resample`: N pool prompts, each a bin drawn from q (over the bins the pool fills)
        then a prompt uniformly inside it, with replacement; and q."""
        pool_bins = classifier.bins(classifier_state, jnp.arange(num_dataset, dtype=jnp.int32))
        counts_B = jax.ops.segment_sum(
            jnp.ones((num_dataset,), jnp.float32), pool_bins, num_segments=classifier.num_bins
        )
        q_B = adversary.distribution(adversary_state, counts_B > 0)
        # P(prompt d) = q(b_d) / count(b_d): a bin from q, then uniform inside it.
        logits_D = jnp.log(q_B[pool_bins]) - jnp.log(counts_B[pool_bins])
        ids = jax.random.categorical(key, logits_D, shape=(num_prompts,)).astype(jnp.int32)
        return ids, q_B

    def plan_keys(key: Any) -> PlanKeys:
        if isinstance(key, PlanKeys):
            return key
        if samplers or resampling or selecting:
            draw_key, key = jax.random.split(key)
            return PlanKeys(draw=draw_key, allocate=key)
        return PlanKeys(draw=None, allocate=key)

    def plan(
        state: GDROState,
        prompt_ids: ArrayLike,
        key: jax.Array | PlanKeys,
        *,
        applied: Mapping[str, ArrayLike] | None = None,
    ) -> Plan:
        on = switch(applied)
        keys = plan_keys(key)
        prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
        num_prompts = prompt_ids.shape[0]
        importance = estimate = None
        reports = {}
        no_estimate = jnp.full((num_prompts,), jnp.nan, jnp.float32)
        for name, adversary, part_state in held(state.prompt, adversary_alone, adversaries):
            if name in resampling:
                drawn_ids, q_B = draw(
                    adversary, state.classifier, part_state, num_prompts, keys.draw
                )
                prompt_ids = _pick(on(name), drawn_ids, prompt_ids)
                importance = _pick(on(name), q_B, jnp.ones_like(q_B))
        for name, part, part_state in held(state.sampler, sampler_alone, samplers):
            drawn = part.draw(part_state, num_prompts, keys.draw)
            prompt_ids = _pick(on(name), drawn.prompt_ids, prompt_ids)
            old = no_estimate if estimate is None else estimate
            estimate = _pick(on(name), drawn.sampled_rate, old)
            reports[name] = part.metrics(drawn)
        selections = {}
        for name, part, part_state in held(state.filter, filter_alone, filters):
            selection = part.select(part_state, prompt_ids, keys.draw)
            prompt_ids = _pick(on(name), selection.prompt_ids, prompt_ids)
            selections[name] = selection
        bins = classifier.bins(state.classifier, prompt_ids)
        if lagged:
            if state.previous_bins.shape[0] != num_prompts:
                raise ValueError(
                    f"plan got {num_prompts} prompt ids; this multi_adversary was built "
                    f"with num_prompts={state.previous_bins.shape[0]}"
                )
            bins = jnp.where(state.previous_bins >= 0, state.previous_bins, bins)
        p_hat = classifier.p_hat(state.classifier, prompt_ids)
        num_rollouts = jnp.full((num_prompts,), n_mean, jnp.int32)
        mu = jnp.zeros((), jnp.float32)
        for name, part, part_state in held(state.rollout, allocation_alone, allocations):
            counts, info = part.allocate(
                part_state, bins, p_hat, keys.allocate, prompt_ids=prompt_ids
            )
            num_rollouts = _pick(on(name), counts, num_rollouts)
            mu = _pick(on(name), info.mu, mu)
            if info.success_rate is not None:  # an allocation by prompt's own estimate
                old = no_estimate if estimate is None else estimate
                estimate = _pick(on(name), info.success_rate, old)
            reports[name] = part.metrics(info)
        weights = jnp.ones((num_prompts,), jnp.float32)
        present_B = jnp.zeros((classifier.num_bins,), bool).at[bins].set(True)
        for name, adversary, part_state in held(state.prompt, adversary_alone, adversaries):
            reports[name] = adversary.metrics(part_state, present_B)
            if name not in resampling:
                part_weights = adversary.weights(part_state, bins, num_rollouts=num_rollouts)
                weights = _pick(on(name), part_weights, weights)
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
            reports=reports,
            selections=selections,
        )

    def filter_round(
        state: GDROState,
        groups: Any,
        rewards_NG: ArrayLike,
        *,
        plan: Plan | None = None,
        applied: Mapping[str, ArrayLike] | None = None,
    ) -> tuple[GDROState, Filtered]:
        on = switch(applied)
        active, ready, taken, filled, group_of_row = False, True, None, None, None
        buffers, reports = {}, {}
        for name, part, buffer in held(state.filter, filter_alone, filters):
            selection = None if plan is None else plan.selections[name]
            keep = part.keep(rewards_NG)
            buffer, info = part.add(
                buffer, groups, keep=keep, rewards_NG=rewards_NG, selection=selection
            )
            part_taken, part_filled, emptied = part.take(buffer)
            after = jax.tree.map(lambda e, b: jnp.where(info.ready, e, b), emptied, buffer)
            buffers[name], reports[name] = after, part.metrics(after, info)
            flag = on(name)
            active = flag if active is False else active | flag
            ready = _pick(flag, info.ready, ready)
            taken = part_taken if taken is None else _pick(flag, part_taken, taken)
            filled = part_filled if filled is None else _pick(flag, part_filled, filled)
            rows = jnp.arange(part.num_groups, dtype=jnp.int32) // part.rows_per_group
            group_of_row = rows if group_of_row is None else _pick(flag, rows, group_of_row)
        new_state = state._replace(filter=packed(buffers, filter_alone))
        return new_state, Filtered(
            active=active,
            ready=ready,
            groups=taken,
            filled=filled,
            group_of_row=group_of_row,
            reports=reports,
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
        prompt_states = {
            name: adversary.update(
                part_state, plan.bins, losses=losses, importance=plan.importance, valid=valid
            )
            for name, adversary, part_state in held(state.prompt, adversary_alone, adversaries)
        }
        p_hat_after = classifier.p_hat(classifier_state, prompt_ids)
        rollout_states = {
            name: part.update(
                part_state,
                plan.bins,
                p_hat=p_hat_after,
                losses=losses,
                num_correct=num_correct,
                num_rollouts=plan.num_rollouts,
                valid=valid,
                prompt_ids=prompt_ids,
            )
            for name, part, part_state in held(state.rollout, allocation_alone, allocations)
        }
        previous_bins = state.previous_bins
        if lagged:
            previous_bins = classifier.bins(classifier_state, prompt_ids)
        sampler_states = {
            name: part.update(
                part_state,
                prompt_ids=prompt_ids,
                num_correct=num_correct,
                num_rollouts=plan.num_rollouts,
                valid=valid,
            )
            for name, part, part_state in held(state.sampler, sampler_alone, samplers)
        }
        return GDROState(
            classifier_state,
            packed(prompt_states, adversary_alone),
            packed(rollout_states, allocation_alone),
            previous_bins,
            packed(sampler_states, sampler_alone),
            state.filter,
        )

    return MultiAdversary(
        init=init,
        plan=plan,
        update=update,
        filter=filter_round,
        n_mean=n_mean,
        num_bins=classifier.num_bins,
        prompt_adversary=packed(adversaries, adversary_alone),
        group_filter=packed(filters, filter_alone),
        rollout_allocator=packed(allocations, allocation_alone),
        prompt_sampler=packed(samplers, sampler_alone),
    )
