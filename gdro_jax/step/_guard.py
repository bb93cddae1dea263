"""The non-finite-step policy: a step whose loss, gradient or rewards are not finite is skipped
whole inside the jitted update (`keep_if_finite`), and too many in a row stop the run
(`check_skips`, called by the loop after each step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdro_jax.step._state import TrainState

DEFAULT_MAX_CONSECUTIVE_SKIPS = 3


class NonFiniteStepsError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


def keep_if_finite(
    state: TrainState, candidate: TrainState, finite: jax.Array, key: jax.Array
) -> TrainState:
    """The guard: `candidate`'s params, optimizer and controllers (a group filter's buffer with
    them) if `finite`, else `state`'s.

    A step with a non-finite loss, gradient or reward is skipped whole and counted; the step
    counter and the key still advance so the next step samples afresh.
    """

    def pick(new, old):
        return jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)

    return state._replace(
        params=pick(candidate.params, state.params),
        opt_state=pick(candidate.opt_state, state.opt_state),
        gdro=pick(candidate.gdro, state.gdro),
        key=key,
        step=state.step + 1,
        skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32),
        consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1),
    )


def check_skips(consecutive_skips: int, limit: int, step: int) -> None:
    """Raises `NonFiniteStepsError` once `limit` steps in a row were skipped (0: never)."""
    if limit and consecutive_skips >= limit:
        raise NonFiniteStepsError(
            f"step {step}: {consecutive_skips} consecutive steps had a non-finite loss or "
            f"gradient and were skipped (config.guards.max_consecutive_skips={limit}); "
            "parameters were never updated with them"
        )
