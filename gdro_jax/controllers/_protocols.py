"""One `typing.Protocol` per decision of a step: what a part must answer to fill it.

As optax has one `GradientTransformation` that `chain` composes, a step has four decisions and
each has one protocol; `multi_adversary` composes parts through these protocols alone, and
`tests/controllers/test_contract.py` drives every part of `PARTS` through its decision's
protocol (jit, vmap, scan, a mesh and, for an allocation, the exact total).

    prompt_sampler      PromptSampler      draw(state, N, key) -> SamplerDraw; update(visits)
    rollout_allocation  RolloutAllocator   allocate(state, bins, p_hat, key, *, prompt_ids)
    prompt_adversary    PromptAdversary    weights, distribution, update(bins, losses)
    group_filter        GroupFilter        select(buffer, ids, key), keep(rewards),
                                           add(buffer, groups, keep, rewards, selection), take

Each protocol also declares `metrics`: the named arrays its part reports for the step to log
(`"bin/q"`, `"mu"`, `"filter/updated"`, ...), so the trainer and the simulator read no field of
a concrete part's state or info. Their shapes are fixed: a scalar, or one value per bin or per
prompt (a name starting `bin/` or `prompt/`).

A part is a `NamedTuple` of pure functions with a fixed-shape `NamedTuple` state (STYLE.md). Each
protocol is `runtime_checkable`, so `isinstance(part, RolloutAllocator)` checks that a part has
the members its decision queries.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
from jax.typing import ArrayLike


class SamplerDraw(Protocol):
    """What a prompt sampler's `draw` returns."""

    prompt_ids: jax.Array  # [N] int32 the batch it drew from the pool
    sampled_rate: jax.Array  # [N] float32 its own estimate of each drawn prompt's success rate


class Allocation(Protocol):
    """What an allocation's `allocate` returns beside the counts (logged by the step)."""

    mu: jax.Array  # [] float32 the price of the last rollout handed out (0: none)
    # [N] float32 the allocation's own estimate of each prompt's success rate; None: it uses
    # the classifier's bins only.
    success_rate: jax.Array | None


@runtime_checkable
class PromptSampler(Protocol):
    """Draws each batch itself from the pool (MoPPS), and learns from every group."""

    num_prompts: int  # D, the pool it draws from

    def init(self) -> Any: ...

    def draw(self, state: Any, batch_size: int, key: jax.Array) -> SamplerDraw: ...

    def update(
        self,
        state: Any,
        bins: ArrayLike | None = None,
        *,
        prompt_ids: ArrayLike,
        num_correct: ArrayLike,
        num_rollouts: ArrayLike,
        valid: ArrayLike | None = None,
    ) -> Any: ...

    def metrics(self, drawn: SamplerDraw) -> dict[str, jax.Array]: ...


@runtime_checkable
class RolloutAllocator(Protocol):
    """Splits the fixed `N * n_mean` rollouts of a batch over its prompts.

    `allocate` returns int32 `[N]` counts that sum to exactly `N * n_mean`, whatever the state.
    `num_bins` is the classifier's bin count it allocates over, or None for an allocation by
    prompt (Knapsack-RL), which ignores the bins and keeps a history per prompt.
    """

    n_mean: int
    num_bins: int | None

    def init(self) -> Any: ...

    def allocate(
        self,
        state: Any,
        bins: ArrayLike,
        p_hat: ArrayLike | None = None,
        key: jax.Array | None = None,
        *,
        prompt_ids: ArrayLike,
    ) -> tuple[jax.Array, Allocation]: ...

    def update(
        self,
        state: Any,
        bins: ArrayLike,
        *,
        p_hat: ArrayLike | None = None,
        losses: ArrayLike | None = None,
        num_correct: ArrayLike | None = None,
        num_rollouts: ArrayLike | None = None,
        valid: ArrayLike | None = None,
        prompt_ids: ArrayLike | None = None,
    ) -> Any: ...

    def metrics(self, info: Allocation) -> dict[str, jax.Array]: ...


@runtime_checkable
class PromptAdversary(Protocol):
    """Weighs each bin's prompts by a distribution over bins that it learns from their losses.

    `realisation` is how its distribution reaches the update: "reweight" (advantage
    multipliers, `weights`) or "resample" (the batch drawn from `distribution`).
    """

    num_bins: int
    realisation: str

    def init(self) -> Any: ...

    def distribution(self, state: Any, present: ArrayLike) -> jax.Array: ...

    def weights(
        self,
        state: Any,
        bins: ArrayLike,
        *,
        num_rollouts: ArrayLike | None = None,
        valid: ArrayLike | None = None,
    ) -> jax.Array: ...

    def update(
        self,
        state: Any,
        bins: ArrayLike,
        *,
        losses: ArrayLike,
        importance: ArrayLike | None = None,
        valid: ArrayLike | None = None,
    ) -> Any: ...

    def metrics(self, state: Any, present: ArrayLike) -> dict[str, jax.Array]:
        """What it plays, for the batch whose bins `present` [B] bool holds: at least
        `"bin/q"`, its distribution."""
        ...


@runtime_checkable
class GroupFilter(Protocol):
    """Decides which groups the update trains on, from a buffer of `num_groups` rows.

    A round samples the N prompts `select` chooses (the batch given, for DAPO's dynamic sampling;
    buffered prompts to commit and new candidates to pilot, for Pilot-Commit), `n_mean` rollouts
    each; `add` takes the round's groups into the buffer, and when its info says `ready` the
    update trains on `take`'s N rows, `rows_per_group` rows of `n_mean` rollouts making one GRPO
    group (unweighted). So a group filter combines with neither a rollout allocation nor a prompt
    adversary.
    """

    num_groups: int
    rows_per_group: int
    draws_prompts: bool  # `select` chooses the prompts (from the pool), not only passes them

    def init(self, example_groups: Any) -> Any: ...

    def select(self, state: Any, prompt_ids: ArrayLike, key: jax.Array | None) -> Any:
        """The round's prompts: a tuple with at least `prompt_ids` [N]."""
        ...

    def keep(self, rewards_NG: ArrayLike) -> jax.Array: ...

    def add(
        self,
        state: Any,
        groups: Any,
        *,
        keep: ArrayLike,
        rewards_NG: ArrayLike | None = None,
        selection: Any = None,
    ) -> tuple[Any, Any]: ...

    def take(self, state: Any) -> tuple[Any, jax.Array, Any]: ...

    def metrics(self, state: Any, info: Any) -> dict[str, jax.Array]:
        """The round's report from the buffer after it and `add`'s info."""
        ...
