"""Pilot-Commit: pilot each candidate prompt with a few rollouts, then commit rollouts to the
informative ones.

The released recipe (`databricks/pilot-commit`, a verl recipe under `recipe/pc/`) spends a step's
rollouts in two stages. A pilot samples a few rollouts of each candidate prompt. A candidate
whose pilot success rate lies inside `[lower, 1 - upper]` is kept, with its pilot rollouts, in a
replay buffer. A later round commits more rollouts to buffered prompts, and the update trains on
each committed prompt's pilot and commit rollouts together (one GRPO group). Buffered prompts older
than a few steps are flushed.

With static shapes, every step here is one round of the same `R = N * n_mean` slots, N prompts
of `n_mean` rollouts each:

- `select` fills the first positions of the batch with up to `N / 2` buffered prompts, the oldest
  first (their commit), and the rest with new candidates (their pilot), drawn from the pool
  without replacement: prompts whose deferral has ended first, then the others, then (only
  when no other is left) the evicted ones; a prompt in the buffer or still deferred is never drawn.
- `add` (the round, after the rewards) stages each committed prompt's training group as two rows
  of `n_mean`: its buffered pilot group, then this round's commit group; the update trains on the
  staged pairs, one GRPO group per pair (`rows_per_group = 2`).
- A candidate's pilot decides where it goes: kept (`lower <= p <= 1 - upper`) into the buffer;
  too hard (`p < lower`) deferred, drawn again first `defer_steps` rounds later;
  solved (`p >= solved`) evicted from the pool for the rest of the run; the others (too easy but
  not solved) go back to the pool.
- Buffered prompts piloted more than `max_off_steps` rounds ago are flushed at the round's end.

Every round samples R rollouts, pilots included, and the classifier learns from all of them, so
a run of T rounds samples `T * R` rollouts, as every other method's. A round that commits nothing
(the first one) takes no update.

Where we differ from the recipe: it pilots a whole extra batch of candidates per round (8 rollouts
each) and keeps generating rounds (up to 10) until the train batch is full; we split one round's
N positions between commits and pilots, so the total per step is fixed. It samples buffered
prompts at random; we commit the oldest first (the ones closest to being flushed). It drops the
too-hard candidates until the next epoch and, with `exclude_threshold_upper` set, excludes the
too-easy ones from the next epoch; we defer the too-hard for `defer_steps` rounds and evict the
solved for good. It recomputes the old log-probs of the buffered pilot rollouts under the current
policy; the trainer keeps the log-probs of the policy that sampled them, so PPO's clip bounds how
much a stale pilot rollout moves the update.

References:
  Pilot-Commit (arXiv 2605.26606); `databricks/pilot-commit`, `recipe/pc/pc_ray_trainer.py`,
  `recipe/pc/replay_buffer.py`, `recipe/pc/config/pc_trainer.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.controllers._groups import check_groups

_NEVER = jnp.iinfo(jnp.int32).max  # the age key of an empty buffer slot
# Candidate scores: a Gumbel draw plus a priority. The gaps dwarf any Gumbel draw (float32).
_DUE, _EVICTED, _BLOCKED = 1e4, -1e4, -1e8


class PilotCommitState(NamedTuple):
    """The replay buffer, this round's staged pairs and the pool's verdicts (fixed shapes)."""

    pilots: Any  # pytree, every leaf [C, ...]: the buffered pilot groups (C = buffer_size)
    pilot_ids: jax.Array  # [C] int32 the prompt of each buffered group (-1: empty slot)
    pilot_round: jax.Array  # [C] int32 the round it was piloted in
    staged: Any  # pytree, every leaf [N, ...]: the round's training pairs (pilot row, commit row)
    staged_count: jax.Array  # [] int32 committed prompts staged (rows 0 .. 2 * count - 1)
    deferred_until: jax.Array  # [D] int32 the round a too-hard prompt returns from (0: none)
    evicted: jax.Array  # [D] bool solved in a pilot: out of the pool for the rest of the run
    rounds: jax.Array  # [] int32 rounds so far
    piloted: jax.Array  # [] int32 candidates piloted over the run
    committed: jax.Array  # [] int32 prompts committed (trained on) over the run
    expired: jax.Array  # [] int32 buffered prompts flushed unused over the run
    updates: jax.Array  # [] int32 rounds that took an update


class PilotCommitSelection(NamedTuple):
    """What `select` chose for a round's N positions."""

    prompt_ids: jax.Array  # [N] int32 the batch: commits first, then candidates
    committed: jax.Array  # [N] bool the position commits to a buffered prompt
    slots: jax.Array  # [N] int32 its buffer slot (C where the position pilots a candidate)


class PilotCommitInfo(NamedTuple):
    """What a round (`add`) decided, for logging and the update."""

    ready: jax.Array  # [] bool update now: at least one prompt committed
    committed: jax.Array  # [N] bool positions that committed
    kept: jax.Array  # [N] bool candidates kept in the buffer
    deferred: jax.Array  # [N] bool candidates too hard: deferred
    solved: jax.Array  # [N] bool candidates solved: evicted
    success: jax.Array  # [N] float32 each position's success rate this round
    expired: jax.Array  # [] int32 buffered prompts flushed this round


class PilotCommit(NamedTuple):
    """Pilot-Commit as pure functions; build it with `pilot_commit`."""

    init: Callable[[Any], PilotCommitState]
    select: Callable[..., PilotCommitSelection]
    keep: Callable[[ArrayLike], jax.Array]
    add: Callable[..., tuple[PilotCommitState, PilotCommitInfo]]
    take: Callable[[PilotCommitState], tuple[Any, jax.Array, PilotCommitState]]
    metrics: Callable[[PilotCommitState, PilotCommitInfo], dict[str, jax.Array]]
    num_groups: int
    num_prompts: int
    rows_per_group: int = 2  # a training group is a pair of rows: its pilot and its commit
    draws_prompts: bool = True  # `select` chooses the round's prompts from the pool


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {name}={value!r}")


def pilot_commit(
    num_groups: int,
    num_prompts: int,
    *,
    lower: float = 0.25,
    upper: float = 0.25,
    solved: float = 1.0,
    buffer_size: int | None = None,
    max_off_steps: int = 4,
    defer_steps: int = 16,
    reward_values: tuple[float, float] = (-1.0, 1.0),
) -> PilotCommit:
    """Builds Pilot-Commit over rounds of `num_groups` prompts drawn from a pool of `num_prompts`.

    Args:
      num_groups: N, prompts per round (even: up to N / 2 commits, each trained as a pair).
      num_prompts: D, the pool the candidates are drawn from (at least N + the buffer's size,
        so that a round always finds N prompts it may draw).
      lower: a candidate whose pilot success rate is below `lower` is too hard (the recipe's
        `diversity_threshold_lower`, 0.25).
      upper: above `1 - upper` it is too easy (`diversity_threshold_upper`, 0.25).
      solved: at or above this rate it is solved and evicted (the recipe's
        `exclude_threshold_upper`, off there by default; 1.0: every pilot rollout correct).
      buffer_size: C, the prompts the replay buffer holds (default N); kept candidates past a
        full buffer are dropped back to the pool.
      max_off_steps: rounds a buffered prompt may wait for its commit (the recipe's
        `buffer_max_off_steps`, 4).
      defer_steps: a candidate too hard in round t is drawn again, before any other, in round
        `t + defer_steps` (or the first round after it with room).
      reward_values: (wrong, correct) rewards; a rollout succeeds above their midpoint.

    Returns:
      A `PilotCommit` with
        `init(example_groups) -> state` (the buffer shaped like one group, the staged pairs like
          `example_groups`, a pytree with leading axis N);
        `select(state, prompt_ids, key) -> PilotCommitSelection` (the ids given count only for
          their number N);
        `keep(rewards_NG) -> [N] bool`: pilot rates inside `[lower, 1 - upper]`;
        `add(state, groups, *, keep, rewards_NG, selection) -> (state, PilotCommitInfo)`: the
          round (stage the commits' pairs, buffer, defer or evict the candidates, flush);
        `take(state) -> (pairs, filled [N] bool, state)`: the staged pairs (rows `2i, 2i + 1`
          are one prompt's group) and which rows hold one.
    """
    _check_int("num_groups", num_groups, 2)
    if num_groups % 2:
        raise ValueError(f"num_groups must be even (commits train as pairs), got {num_groups}")
    buffer_size = num_groups if buffer_size is None else buffer_size
    _check_int("buffer_size", buffer_size, 1)
    _check_int("max_off_steps", max_off_steps, 1)
    _check_int("defer_steps", defer_steps, 1)
    _check_int("num_prompts", num_prompts, num_groups + buffer_size)
    if not 0.0 <= lower <= 1.0 - upper <= 1.0:
        raise ValueError(
            f"lower and upper must satisfy 0 <= lower <= 1 - upper <= 1, got lower={lower!r}, "
            f"upper={upper!r}"
        )
    if not 1.0 - upper < solved <= 1.0:
        raise ValueError(f"solved must lie in (1 - upper, 1], got solved={solved!r}")
    if len(reward_values) != 2 or not reward_values[0] < reward_values[1]:
        raise ValueError(f"reward_values must be (wrong, correct), got {reward_values!r}")
    midpoint = 0.5 * (float(reward_values[0]) + float(reward_values[1]))
    half = num_groups // 2
    commits = min(half, buffer_size)  # the most prompts a round commits

    def init(example_groups) -> PilotCommitState:
        check_groups(example_groups, num_groups)

        def zero():  # a fresh array each: a donated state must not hold one buffer twice
            return jnp.zeros((), jnp.int32)

        return PilotCommitState(
            pilots=jax.tree.map(
                lambda leaf: jnp.zeros((buffer_size, *leaf.shape[1:]), leaf.dtype), example_groups
            ),
            pilot_ids=jnp.full((buffer_size,), -1, jnp.int32),
            pilot_round=jnp.zeros((buffer_size,), jnp.int32),
            staged=jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), example_groups),
            staged_count=zero(),
            deferred_until=jnp.zeros((num_prompts,), jnp.int32),
            evicted=jnp.zeros((num_prompts,), bool),
            rounds=zero(),
            piloted=zero(),
            committed=zero(),
            expired=zero(),
            updates=zero(),
        )

    def select(state: PilotCommitState, prompt_ids: ArrayLike, key: jax.Array):
        if jnp.shape(prompt_ids) != (num_groups,):
            raise ValueError(
                f"select takes the round's {num_groups} prompt ids, got {jnp.shape(prompt_ids)}"
            )
        valid = state.pilot_ids >= 0
        # The oldest buffered prompts commit (stable: equal ages keep their slot order).
        order = jnp.argsort(jnp.where(valid, state.pilot_round, _NEVER), stable=True)
        slots = jnp.zeros((num_groups,), jnp.int32).at[:commits].set(order[:commits])
        committed = (jnp.arange(num_groups) < commits) & valid[slots]
        slots = jnp.where(committed, slots, buffer_size)
        # Candidates: never a buffered prompt or a deferred one still waiting.
        held = jnp.where(valid, state.pilot_ids, num_prompts)  # an empty slot (-1) marks none
        buffered = jnp.zeros((num_prompts,), bool).at[held].set(True, mode="drop")
        waiting = state.deferred_until > state.rounds
        due = (state.deferred_until > 0) & ~waiting
        score = (
            jax.random.gumbel(key, (num_prompts,))
            + jnp.where(due, _DUE, 0.0)
            + jnp.where(state.evicted, _EVICTED, 0.0)
            + jnp.where(buffered | waiting, _BLOCKED, 0.0)
        )
        _, candidates = jax.lax.top_k(score, num_groups)
        rank = jnp.cumsum(~committed) - 1
        buffered_id = state.pilot_ids[jnp.minimum(slots, buffer_size - 1)]
        ids = jnp.where(committed, buffered_id, candidates[jnp.clip(rank, 0, num_groups - 1)])
        return PilotCommitSelection(
            prompt_ids=ids.astype(jnp.int32), committed=committed, slots=slots
        )

    def success_rate(rewards_NG: ArrayLike) -> jax.Array:
        rewards_NG = jnp.asarray(rewards_NG)
        if rewards_NG.ndim != 2 or rewards_NG.shape[0] != num_groups:
            raise ValueError(
                f"rewards must be [num_groups={num_groups}, rollouts], got {rewards_NG.shape}"
            )
        return jnp.mean((rewards_NG > midpoint).astype(jnp.float32), axis=1)

    def keep(rewards_NG: ArrayLike) -> jax.Array:
        p = success_rate(rewards_NG)
        return (p >= lower) & (p <= 1.0 - upper)

    def add(
        state: PilotCommitState,
        groups,
        *,
        keep: ArrayLike,
        rewards_NG: ArrayLike | None = None,
        selection: PilotCommitSelection | None = None,
    ):
        check_groups(groups, num_groups)
        if selection is None or rewards_NG is None:
            raise ValueError(
                "Pilot-Commit's round needs the rewards and the selection its select made: "
                "add(state, groups, keep=..., rewards_NG=..., selection=...)"
            )
        p = success_rate(rewards_NG)
        committed = jnp.asarray(selection.committed, bool)
        candidate = ~committed
        ids = selection.prompt_ids

        # Stage each commit's pair: its buffered pilot group, then this round's group.
        commit_H = committed[:half]
        slot_H = jnp.minimum(selection.slots[:half], buffer_size - 1)

        def pair(buffer, new):
            rows = jnp.stack([buffer[slot_H], new[:half]], axis=1)  # [N/2, 2, ...]
            mask = commit_H.reshape((half,) + (1,) * (rows.ndim - 1))
            return jnp.where(mask, rows, jnp.zeros_like(rows)).reshape(new.shape)

        staged = jax.tree.map(pair, state.pilots, groups)
        staged_count = jnp.sum(commit_H, dtype=jnp.int32)
        pilot_ids = state.pilot_ids.at[selection.slots].set(-1, mode="drop")  # popped

        # The candidates' verdicts.
        kept_all = candidate & jnp.asarray(keep, bool)
        deferred = candidate & (p < lower)
        solved_ = candidate & (p >= solved)
        # Kept candidates take free slots in order; past a full buffer they go back to the pool.
        free = pilot_ids < 0
        free_slots = jnp.argsort(~free, stable=True)  # the free slots first, in slot order
        position = jnp.cumsum(kept_all) - 1
        kept = kept_all & (position < jnp.sum(free))
        target = jnp.where(kept, free_slots[jnp.clip(position, 0, buffer_size - 1)], buffer_size)

        def write(buffer, new):
            return buffer.at[target].set(new, mode="drop")

        pilots = jax.tree.map(write, state.pilots, groups)
        pilot_ids = pilot_ids.at[target].set(ids, mode="drop")
        pilot_round = state.pilot_round.at[target].set(state.rounds, mode="drop")
        # A piloted candidate's deferral ends; a too-hard one is deferred again.
        piloted_at = jnp.where(candidate, ids, num_prompts)
        deferred_until = state.deferred_until.at[piloted_at].set(0, mode="drop")
        deferred_until = deferred_until.at[jnp.where(deferred, ids, num_prompts)].set(
            state.rounds + defer_steps, mode="drop"
        )
        evicted = state.evicted.at[jnp.where(solved_, ids, num_prompts)].set(True, mode="drop")
        # Flush: a prompt piloted in round t may commit up to round t + max_off_steps.
        stale = (pilot_ids >= 0) & (state.rounds - pilot_round >= max_off_steps)
        pilot_ids = jnp.where(stale, -1, pilot_ids)
        expired = jnp.sum(stale, dtype=jnp.int32)

        new_state = state._replace(
            pilots=pilots,
            pilot_ids=pilot_ids,
            pilot_round=pilot_round,
            staged=staged,
            staged_count=staged_count,
            deferred_until=deferred_until,
            evicted=evicted,
            rounds=state.rounds + 1,
            piloted=state.piloted + jnp.sum(candidate, dtype=jnp.int32),
            committed=state.committed + staged_count,
            expired=state.expired + expired,
        )
        info = PilotCommitInfo(
            ready=staged_count > 0,
            committed=committed,
            kept=kept,
            deferred=deferred,
            solved=solved_,
            success=p,
            expired=expired,
        )
        return new_state, info

    def take(state: PilotCommitState):
        filled = jnp.arange(num_groups) < 2 * state.staged_count
        emptied = state._replace(
            staged=jax.tree.map(jnp.zeros_like, state.staged),
            staged_count=jnp.zeros((), jnp.int32),
            updates=state.updates + 1,
        )
        return state.staged, filled, emptied

    def metrics(state: PilotCommitState, info: PilotCommitInfo) -> dict[str, jax.Array]:
        candidates = jnp.maximum(jnp.sum(~info.committed), 1)
        return {
            "filter/updated": info.ready.astype(jnp.int32),
            "filter/committed": jnp.sum(info.committed, dtype=jnp.int32),
            "filter/kept_fraction": jnp.sum(info.kept) / candidates,
            "filter/deferred_fraction": jnp.sum(info.deferred) / candidates,
            "filter/solved_fraction": jnp.sum(info.solved) / candidates,
            "filter/buffered": jnp.sum(state.pilot_ids >= 0, dtype=jnp.int32),
            "filter/expired": info.expired,
            "filter/evicted": jnp.sum(state.evicted, dtype=jnp.int32),
            "filter/updates": state.updates,
            "filter/piloted_total": state.piloted,
            "filter/committed_total": state.committed,
            "filter/expired_total": state.expired,
            "prompt/kept": info.kept.astype(jnp.int32),
            "prompt/committed": info.committed.astype(jnp.int32),
        }

    return PilotCommit(
        init=init,
        select=select,
        keep=keep,
        add=add,
        take=take,
        metrics=metrics,
        num_groups=num_groups,
        num_prompts=num_prompts,
    )
