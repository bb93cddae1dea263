"""Guards at the trainer's boundary: configs that cannot work, rewards that misbehave, NaN steps.

- `validate_config` checks a run config before anything is built or written, and names the
  field (`config.rollout_gdro.n_min`, `config.mesh`, ...) with what was expected.
- `HostRewardCaller` calls a host reward function with an optional wall-clock limit and
  raises `RewardError` naming the function and what went wrong (it raised, timed out, returned
  the wrong shape or a non-finite value); `run_step` adds the step.
- `check_rewards` checks device rewards the same way (one host copy of `R` floats).
- `check_skips` stops a run after too many steps in a row were skipped for a non-finite loss or
  gradient (the update itself skips them: see `make_update`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from gdro_jax.train._components import build_controllers
from gdro_jax.train._distributed import to_host

DEFAULT_MAX_CONSECUTIVE_SKIPS = 3


class RewardError(RuntimeError):
    """A reward function raised, timed out, or returned rewards that cannot be used."""


class NonFiniteStepsError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    return value


def validate_config(config: ml_collections.ConfigDict, *, num_devices: int | None = None) -> None:
    """Raises `ValueError` naming the field of a run config that cannot work.

    Checks: positive sizes; the rollout budget `N * n_mean` within `[N * n_min, N * n_max]` when
    Rollout-GDRO is on; the method and every controller hyperparameter (by building the
    controllers, whose factories validate them); the mesh against the devices; the `R` slots
    against the mesh's batch axes and the mini-batches; the rollout micro-batch; the guard limit.

    Args:
      config: a run config (see `experiments/configs/tiny_cpu.py`).
      num_devices: devices available (default: `jax.device_count()`).
    """
    num_prompts = _positive_int(config.num_prompts, "config.num_prompts")
    n_mean = _positive_int(config.n_mean, "config.n_mean")
    _positive_int(config.max_new_tokens, "config.max_new_tokens")
    if isinstance(config.steps, bool) or not isinstance(config.steps, int) or config.steps < 0:
        raise ValueError(f"config.steps must be an int >= 0, got config.steps={config.steps!r}")
    # The budget is the trainer's: N * n_mean slots whatever the allocation. The rollout block's
    # own fields (n_min <= n_max, ...) are checked by its factory in build_controllers below.
    rollout = config.get("rollout_gdro", None)
    if config.get("method") in ("rollout_gdro", "gdro_both") and rollout is not None:
        n_min, n_max = rollout.get("n_min"), rollout.get("n_max")
        if isinstance(n_min, int) and isinstance(n_max, int) and n_min <= n_max:
            if not n_min <= n_mean <= n_max:
                raise ValueError(
                    f"the rollout budget is infeasible: N * n_mean = {num_prompts} * {n_mean} "
                    f"rollouts cannot be split with n_min={n_min} <= n_i <= n_max={n_max} per "
                    "prompt; set config.n_mean inside [config.rollout_gdro.n_min, "
                    "config.rollout_gdro.n_max]"
                )
    build_controllers(config, num_dataset_prompts=num_prompts)
    param_dtype = config.get("model", {}).get("param_dtype", "float32")
    if param_dtype != "float32":
        raise ValueError(
            "config.model.param_dtype must be float32 (the master weights the optimizer updates: "
            "an AdamW step at lr 1e-6 is below bfloat16's 2^-8 resolution and would be rounded "
            f"away); compute in bfloat16 with config.model.compute_dtype, got "
            f"param_dtype={param_dtype!r}"
        )
    sizes = {axis: config.mesh[axis] for axis in ("data", "fsdp", "tensor")}
    for axis, size in sizes.items():
        _positive_int(size, f"config.mesh.{axis}")
    needed = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
    available = jax.device_count() if num_devices is None else num_devices
    if needed > available:
        raise ValueError(
            f"config.mesh data x fsdp x tensor = {sizes['data']} x {sizes['fsdp']} x "
            f"{sizes['tensor']} = {needed} devices, but only {available} are available"
        )
    batch_shards = sizes["data"] * sizes["fsdp"]
    num_slots = num_prompts * n_mean
    if num_slots % batch_shards:
        raise ValueError(
            f"R = config.num_prompts * config.n_mean = {num_slots} rollouts must divide evenly "
            f"over the mesh's batch axes (data x fsdp = {batch_shards})"
        )
    minibatches = _positive_int(config.grpo.num_minibatches, "config.grpo.num_minibatches")
    if num_slots % minibatches:
        raise ValueError(
            f"R = {num_slots} rollouts must split into config.grpo.num_minibatches={minibatches} "
            "equal mini-batches"
        )
    chunk = micro_batch_slots(config)
    if chunk is not None and chunk < num_slots and chunk % batch_shards:
        raise ValueError(
            f"config.rollout.micro_batch_slots must be a multiple of the mesh's batch axes "
            f"(data x fsdp = {batch_shards}), so each chunk's slots split evenly over the "
            f"devices, got micro_batch_slots={chunk}"
        )
    accumulate = config.grpo.get("micro_batch_slots", None)
    per_minibatch = num_slots // minibatches
    valid = isinstance(accumulate, int) and not isinstance(accumulate, bool) and accumulate > 0
    if valid and per_minibatch % accumulate == 0 and accumulate % batch_shards:
        # (GRPOConfig and make_update refuse sizes that are not positive or do not divide.)
        raise ValueError(
            f"config.grpo.micro_batch_slots must be a multiple of the mesh's batch axes "
            f"(data x fsdp = {batch_shards}), or every device would compute the whole "
            f"micro-batch, got micro_batch_slots={accumulate}"
        )
    max_skips(config)


def micro_batch_slots(config: ml_collections.ConfigDict) -> int | None:
    """`config.rollout.micro_batch_slots`, validated: rollout slots decoded at a time (the KV
    cache holds that many sequences); None (also when the block is absent, as in configs older
    than the field) or 0: all R slots at once."""
    rollout = config.get("rollout", None)
    chunk = None if rollout is None else rollout.get("micro_batch_slots", None)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0):
        raise ValueError(
            "config.rollout.micro_batch_slots must be None or an int >= 0 (0 or None: all "
            f"slots in one batch), got micro_batch_slots={chunk!r}"
        )
    return chunk or None


def max_skips(config: ml_collections.ConfigDict) -> int:
    """`config.guards.max_consecutive_skips` (default 3), validated; 0 never stops the run."""
    guards = config.get("guards", None)
    limit = DEFAULT_MAX_CONSECUTIVE_SKIPS if guards is None else guards.max_consecutive_skips
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(
            "config.guards.max_consecutive_skips must be an int >= 0, got "
            f"max_consecutive_skips={limit!r}"
        )
    return limit


def check_model_fits(prompt_width: int, max_new_tokens: int, max_positions: int) -> None:
    """Raises when the longest prompt plus the completion exceeds the policy's positions."""
    if prompt_width + max_new_tokens > max_positions:
        raise ValueError(
            f"the longest prompt ({prompt_width} tokens) plus config.max_new_tokens="
            f"{max_new_tokens} exceeds the policy's max_position_embeddings={max_positions}"
        )


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
    rewards = np.asarray(to_host(rewards_R))  # every process sees every slot's reward
    _check_values(name, rewards, np.zeros(rewards.shape, bool), rewards.shape[0])


def check_skips(consecutive_skips: int, limit: int, step: int) -> None:
    """Raises `NonFiniteStepsError` once `limit` steps in a row were skipped (0: never)."""
    if limit and consecutive_skips >= limit:
        raise NonFiniteStepsError(
            f"step {step}: {consecutive_skips} consecutive steps had a non-finite loss or "
            f"gradient and were skipped (config.guards.max_consecutive_skips={limit}); "
            "parameters were never updated with them"
        )


__all__ = [
    "HostRewardCaller",
    "NonFiniteStepsError",
    "RewardError",
    "check_model_fits",
    "check_rewards",
    "check_skips",
    "max_skips",
    "validate_config",
]
