"""DAPO's dynamic sampling: keep the groups that carry a signal until a batch of them is ready.

A group whose rewards are all equal has all-zero advantages, so it adds nothing to GRPO's
gradient. DAPO drops such groups and keeps sampling until N groups with a signal are ready, then
takes one update on them. With static shapes this becomes rounds:

- every round samples the same R = N * n slots (N prompts, n rollouts each);
- `keep` marks the round's groups whose rewards are not all equal;
- `add` writes the kept groups, in batch order, into a fixed buffer of N groups (the groups past
  a full buffer are dropped, as the released code truncates its batch);
- the update is taken when the buffer is full (`ready`), on the buffer's N groups, and `take`
  empties it. A buffer that is still not full after `max_rounds` rounds is taken as it is: its
  empty groups carry no tokens and no advantage, and `DynamicSamplingInfo.partial` says so.

The buffer's groups are a pytree whose leaves have a leading axis of N groups (e.g. the step's
rollouts reshaped to `[N, n, ...]`), so the same functions hold any per-group data. Every round
samples R rollouts, so a run of T rounds samples `T * R` rollouts whatever it keeps: the rounds
are the unit of equal compute, and the updates are fewer than the rounds.

Where we differ from the released code (`BytedTsinghua-SIA/DAPO`, verl's
`algorithm.filter_groups` in `recipe/dapo`): it decides on the standard deviation of a group's
metric (`std > 0`), we on its rewards being not all equal (the same groups for finite rewards);
after `max_num_gen_batches` rounds it raises an error, we update on the groups we have.

References:
  Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", 2025
  (arXiv 2503.14476); verl `recipe/dapo` (`algorithm.filter_groups`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.controllers._groups import check_groups


class DynamicSamplingState(NamedTuple):
    """The buffer of kept groups and the rounds' counts (fixed shapes: a `lax.scan` carry)."""

    groups: Any  # pytree, every leaf [N, ...]: the kept groups, the first `count` filled
    count: jax.Array  # [] int32 groups in the buffer
    rounds: jax.Array  # [] int32 rounds since the buffer was last taken
    sampled: jax.Array  # [] int32 groups sampled over the run
    kept: jax.Array  # [] int32 groups kept (written to the buffer) over the run
    updates: jax.Array  # [] int32 buffers taken (optimizer updates) over the run


class DynamicSamplingInfo(NamedTuple):
    """What `add` decided, for logging."""

    ready: jax.Array  # [] bool take the buffer now (full, or `max_rounds` reached)
    partial: jax.Array  # [] bool ready with fewer than N groups (the round cap was reached)
    kept: jax.Array  # [N] bool the round's groups written to the buffer
    signal: jax.Array  # [N] bool the round's groups with a signal (kept or past a full buffer)
    rounds: jax.Array  # [] int32 rounds into this buffer, this one included


class DynamicSamplingSelection(NamedTuple):
    """What `select` chose: the round samples the batch it is given."""

    prompt_ids: jax.Array  # [N] int32


class DynamicSampling(NamedTuple):
    """DAPO's dynamic sampling as pure functions; build it with `dynamic_sampling`."""

    init: Callable[[Any], DynamicSamplingState]
    select: Callable[..., DynamicSamplingSelection]
    keep: Callable[[ArrayLike], jax.Array]
    add: Callable[..., tuple[DynamicSamplingState, DynamicSamplingInfo]]
    take: Callable[[DynamicSamplingState], tuple[Any, jax.Array, DynamicSamplingState]]
    # (state after the round, DynamicSamplingInfo) -> the `filter/...` and `prompt/kept` metrics
    metrics: Callable[[DynamicSamplingState, DynamicSamplingInfo], dict[str, jax.Array]]
    num_groups: int
    max_rounds: int
    rows_per_group: int = 1  # each buffered group is one row of n_mean rollouts
    draws_prompts: bool = False  # the rounds sample the batches the data gives


def dynamic_sampling(num_groups: int, *, max_rounds: int = 10) -> DynamicSampling:
    """Builds DAPO's dynamic sampling over rounds of `num_groups` groups.

    Args:
      num_groups: N, groups per round and per update (the run's prompts per step).
      max_rounds: rounds after which a buffer that is not full is taken as it is (the released
        recipe's `max_num_gen_batches`, 10 in its scripts; there it is an error).

    Returns:
      A `DynamicSampling` with
        `init(example_groups) -> state` (an empty buffer shaped like `example_groups`, a pytree
          of arrays or `jax.ShapeDtypeStruct`s with leading axis N);
        `select(state, prompt_ids, key) -> DynamicSamplingSelection`: the ids as given;
        `keep(rewards_NG) -> [N] bool`: the groups whose rewards are not all equal;
        `add(state, groups, *, keep, rewards_NG=None, selection=None) -> (state,
          DynamicSamplingInfo)`: the kept groups into the buffer, in order, up to N (the
          rewards and the selection are not needed);
        `take(state) -> (groups, filled [N] bool, state)`: the buffer's groups and which hold
          one; the returned state has an empty buffer and one more update.

    References:
      Yu et al., 2025 (arXiv 2503.14476), section 3.2; verl `recipe/dapo`.
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be an int >= 1, got num_groups={num_groups!r}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an int >= 1, got max_rounds={max_rounds!r}")

    def init(example_groups) -> DynamicSamplingState:
        check_groups(example_groups, num_groups)

        def zero():  # a fresh array each: a donated state must not hold one buffer twice
            return jnp.zeros((), jnp.int32)

        return DynamicSamplingState(
            groups=jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), example_groups),
            count=zero(),
            rounds=zero(),
            sampled=zero(),
            kept=zero(),
            updates=zero(),
        )

    def select(state: DynamicSamplingState, prompt_ids: ArrayLike, key=None):
        del state, key  # every round samples the batch it is given
        return DynamicSamplingSelection(prompt_ids=jnp.asarray(prompt_ids, jnp.int32))

    def keep(rewards_NG: ArrayLike) -> jax.Array:
        rewards_NG = jnp.asarray(rewards_NG)
        if rewards_NG.ndim != 2 or rewards_NG.shape[0] != num_groups:
            raise ValueError(
                f"rewards must be [num_groups={num_groups}, rollouts], got {rewards_NG.shape}"
            )
        return jnp.max(rewards_NG, axis=1) > jnp.min(rewards_NG, axis=1)

    def add(state: DynamicSamplingState, groups, *, keep: ArrayLike, rewards_NG=None,
            selection=None):  # fmt: skip
        del rewards_NG, selection  # `keep` says it all
        check_groups(groups, num_groups)
        signal = jnp.asarray(keep, bool)
        # The i-th kept group of the round goes to position count + i while there is room.
        position = state.count + jnp.cumsum(signal) - 1
        kept = signal & (position < num_groups)
        target = jnp.where(kept, position, num_groups)  # out of range: dropped

        def write(buffer, new):
            return buffer.at[target].set(new, mode="drop")

        count = state.count + jnp.sum(kept, dtype=jnp.int32)
        rounds = state.rounds + 1
        full = count >= num_groups
        ready = full | (rounds >= max_rounds)
        new_state = state._replace(
            groups=jax.tree.map(write, state.groups, groups),
            count=count,
            rounds=rounds,
            sampled=state.sampled + num_groups,
            kept=state.kept + jnp.sum(kept, dtype=jnp.int32),
        )
        info = DynamicSamplingInfo(
            ready=ready, partial=ready & ~full, kept=kept, signal=signal, rounds=rounds
        )
        return new_state, info

    def take(state: DynamicSamplingState):
        filled = jnp.arange(num_groups) < state.count
        empty = jax.tree.map(jnp.zeros_like, state.groups)
        emptied = state._replace(
            groups=empty,
            count=jnp.zeros((), jnp.int32),
            rounds=jnp.zeros((), jnp.int32),
            updates=state.updates + 1,
        )
        return state.groups, filled, emptied

    def metrics(state: DynamicSamplingState, info: DynamicSamplingInfo) -> dict[str, jax.Array]:
        return {
            "filter/updated": info.ready.astype(jnp.int32),
            "filter/partial": info.partial.astype(jnp.int32),
            "filter/rounds": info.rounds,
            "filter/kept_fraction": jnp.mean(info.kept.astype(jnp.float32)),
            "filter/signal_fraction": jnp.mean(info.signal.astype(jnp.float32)),
            "filter/buffered": state.count,
            "filter/updates": state.updates,
            "prompt/kept": info.kept.astype(jnp.int32),
        }

    return DynamicSampling(
        init=init,
        select=select,
        keep=keep,
        add=add,
        take=take,
        metrics=metrics,
        num_groups=num_groups,
        max_rounds=max_rounds,
    )
