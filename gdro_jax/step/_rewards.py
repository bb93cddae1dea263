"""The reward phase of a step, and the checks at its boundary.

    device reward  a jittable `(prompt_ids_N, tokens_RM, lengths_R, prompt_of_slot_R) ->
                   (rewards_R, correct_R)`, run in one jit on the rollouts where they lie
    host reward    the same signature on numpy arrays (a grader that cannot be jitted), called
                   through `HostRewardCaller` under a wall-clock limit; with several processes
                   each grades the slots on its own devices

`HostRewardCaller` raises `RewardError` naming the function and what went wrong (it raised,
timed out, returned the wrong shape or a non-finite value); `check_rewards` checks device
rewards the same way. The loop adds the step to the message.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gdro_jax import controllers, models, runtime
from gdro_jax.step._engines import Rollouts


class RewardError(RuntimeError):
    """A reward function raised, timed out, or returned rewards that cannot be used."""


def _check_values(name: str, rewards_R, correct_R, num_slots: int):
    rewards_R = np.asarray(rewards_R)
    correct_R = np.asarray(correct_R)
    if rewards_R.shape != (num_slots,) or correct_R.shape != (num_slots,):
        raise RewardError(
            f"reward function {name} returned rewards of shape {rewards_R.shape} "
            f"and correct of shape {correct_R.shape}; expected ({num_slots},) each"
        )
    bad = np.flatnonzero(~np.isfinite(rewards_R.astype(np.float64)))
    if bad.size:
        raise RewardError(
            f"reward function {name} returned non-finite rewards for "
            f"{bad.size} of {num_slots} rollouts (slots {bad[:8].tolist()}, values "
            f"{rewards_R[bad[:8]].tolist()})"
        )
    return rewards_R, correct_R


class HostRewardCaller:
    """Calls a host reward function with an optional wall-clock limit, checking what it returns.

    Args:
      fn: `(prompt_ids_N, tokens_RM, lengths_R, prompt_of_slot_R) -> (rewards_R, correct_R)`
        on numpy arrays.
      name: how errors name the function.
      timeout_s: seconds before `RewardError`; 0 or None waits forever. A timed-out call keeps
        running in its thread (Python cannot stop it), so the run must stop: the error says so.
    """

    def __init__(self, fn: Callable, name: str, timeout_s: float | None = None):
        self.fn, self.name, self.timeout_s = fn, name, timeout_s or None
        self._pool = None
        if self.timeout_s is not None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reward")

    def __call__(self, ids_N, tokens_RM, lengths_R, prompt_of_slot_R):
        num_slots = len(lengths_R)
        try:
            if self._pool is None:
                result = self.fn(ids_N, tokens_RM, lengths_R, prompt_of_slot_R)
            else:
                future = self._pool.submit(self.fn, ids_N, tokens_RM, lengths_R, prompt_of_slot_R)
                result = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise RewardError(
                f"reward function {self.name} did not return within "
                f"{self.timeout_s} s (config.reward_timeout_s); the run stops"
            ) from None
        except Exception as error:
            raise RewardError(
                f"reward function {self.name} raised {type(error).__name__}: {error}"
            ) from error
        try:
            rewards_R, correct_R = result
        except (TypeError, ValueError):
            raise RewardError(
                f"reward function {self.name} must return (rewards, correct), "
                f"got {type(result).__name__}"
            ) from None
        return _check_values(self.name, rewards_R, correct_R, num_slots)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def check_rewards(name: str, rewards_R: jax.Array) -> None:
    """Raises `RewardError` when device rewards hold a NaN or an infinity."""
    rewards = np.asarray(runtime.to_host(rewards_R))  # every process sees every slot's reward
    _check_values(name, rewards, np.zeros(rewards.shape, bool), rewards.shape[0])


def as_device_rewards(rewards_R, correct_R, sharding) -> tuple[jax.Array, jax.Array]:
    """Host rewards as device arrays, placed like the rollouts when a sharding is given."""
    rewards_R = jnp.asarray(rewards_R, jnp.float32)
    correct_R = jnp.asarray(correct_R, bool)
    if sharding is not None:
        rewards_R = jax.device_put(rewards_R, sharding)
        correct_R = jax.device_put(correct_R, sharding)
    return rewards_R, correct_R


def device_reward_phase(reward_fn: Callable, mesh) -> Callable:
    """The reward phase for a jittable `(ids, tokens, lengths, prompt_of_slot)` reward."""

    @jax.jit
    def reward(prompt_ids, rollouts: Rollouts, plan: controllers.Plan) -> Rollouts:
        rewards_R, correct_R = reward_fn(
            prompt_ids, rollouts.tokens, rollouts.lengths, plan.prompt_of_slot
        )
        scored = rollouts._replace(
            rewards=jnp.asarray(rewards_R, jnp.float32), correct=jnp.asarray(correct_R, bool)
        )
        return models.constrain_batch(mesh, scored)

    return reward


def host_reward_phase(caller: HostRewardCaller, mesh, num_slots: int) -> Callable:
    """The reward phase for a numpy reward: device -> host -> checked -> device."""
    slot_sharding = models.batch_sharding(mesh, (num_slots,))

    def reward(prompt_ids, rollouts: Rollouts, plan: controllers.Plan) -> Rollouts:
        if jax.process_count() > 1:
            return _grade_local_slots(caller, prompt_ids, rollouts, plan, slot_sharding)
        rewards_R, correct_R = caller(
            jax.device_get(prompt_ids),
            jax.device_get(rollouts.tokens),
            jax.device_get(rollouts.lengths),
            jax.device_get(plan.prompt_of_slot),
        )
        rewards_R, correct_R = as_device_rewards(rewards_R, correct_R, slot_sharding)
        return rollouts._replace(rewards=rewards_R, correct=correct_R)

    return reward


def _grade_local_slots(caller, prompt_ids, rollouts: Rollouts, plan, slot_sharding) -> Rollouts:
    """Several processes: each grades only the slots on its own devices, on its own host, and
    the scores are assembled into global arrays placed like the slots."""
    ids_N = runtime.to_host(prompt_ids)  # replicated: every process holds all of them
    prompt_of_slot_R = runtime.to_host(plan.prompt_of_slot)
    num_slots = prompt_of_slot_R.shape[0]

    def rows(index) -> tuple[int, int]:
        return index[0].start or 0, num_slots if index[0].stop is None else index[0].stop

    tokens = {rows(shard.index): shard.data for shard in rollouts.tokens.addressable_shards}
    lengths = {rows(shard.index): shard.data for shard in rollouts.lengths.addressable_shards}
    graded = {
        (start, stop): caller(
            ids_N,
            np.asarray(tokens[start, stop]),
            np.asarray(lengths[start, stop]),
            prompt_of_slot_R[start:stop],
        )
        for start, stop in sorted(tokens)
    }
    placed = slot_sharding.addressable_devices_indices_map((num_slots,))

    def assemble(which: int, dtype) -> jax.Array:
        arrays = [
            jax.device_put(np.asarray(graded[rows(index)][which], dtype), device)
            for device, index in placed.items()
        ]
        return jax.make_array_from_single_device_arrays((num_slots,), slot_sharding, arrays)

    return rollouts._replace(rewards=assemble(0, np.float32), correct=assemble(1, bool))
