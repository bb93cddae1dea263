"""Per-step metrics: computed on the device (SPEC 10), written to `metrics.jsonl` and TensorBoard.

`step_metrics` makes the curriculum visible inside the jitted update. `MetricsWriter` writes
one JSON object per line (scalars as numbers; per-bin arrays, names starting `bin/`, as lists)
and one TensorBoard scalar per bin (`bin/q/3`); every line carries `step`. `rewind_metrics` cuts
the file back to a checkpoint's cursor when a run resumes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gdro_jax import losses
from gdro_jax.controllers import Plan, PromptGDRO
from gdro_jax.train._distributed import broadcast_from_primary
from gdro_jax.train._rollouts import Rollouts
from gdro_jax.train._state import TrainState


def _per_bin(values_N: jax.Array, bins_N: jax.Array, num_bins: int) -> jax.Array:
    return jax.ops.segment_sum(values_N, bins_N, num_segments=num_bins)


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
    # GRPO's wasted groups: rewards all equal, so every advantage is zero (per bin, of its groups).
    groups_B = _per_bin((stats.count_N > 0).astype(jnp.float32), bins, num_bins)
    wasted_N = (stats.count_N > 0) & ~stats.informative_N
    zero_advantage_B = _per_bin(wasted_N.astype(jnp.float32), bins, num_bins)
    zero_advantage_B = zero_advantage_B / jnp.maximum(groups_B, 1.0)
    # The same per-bin spread over a uniform allocation of the same R slots (n-bar per prompt).
    uniform_rollouts_B = prompts_B * (plan.prompt_of_slot.shape[0] / num_prompts)
    q_log_q = jnp.where(q_B > 0, q_B * jnp.log(jnp.where(q_B > 0, q_B, 1.0)), 0.0)
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
        "uniform_standard_error": jnp.sum(
            jnp.where(
                present_B, q_B * reward_std_B / jnp.sqrt(jnp.maximum(uniform_rollouts_B, 1.0)), 0.0
            )
        ),
        "q_entropy": -jnp.sum(q_log_q),
        "q_mean_bin": jnp.sum(bin_index * q_B),
        "bin/q": q_B,
        "bin/score": scores_B,
        "bin/prompts": prompts_B,
        "bin/rollouts": rollouts_B,
        "bin/rollouts_per_prompt": rollouts_B / jnp.maximum(prompts_B, 1.0),
        "bin/tokens": tokens_B,
        "bin/reward": reward_mean_B,
        "bin/zero_advantage_fraction": zero_advantage_B,
    }


def to_host(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Device scalars and arrays to Python floats and lists (NaN and inf kept as strings)."""

    def convert(value):
        array = np.asarray(value)
        if array.ndim == 0:
            number = array.item()
            if isinstance(number, float) and not math.isfinite(number):
                return str(number)
            return number
        return [convert(v) for v in array]

    return {name: convert(value) for name, value in metrics.items()}


class MetricsWriter:
    """Writes step metrics to `workdir/metrics.jsonl` and TensorBoard event files in `workdir/tb`.

    Args:
      workdir: the run's folder (created if missing).
      tensorboard: also write TensorBoard event files.
      append: keep the rows already in `metrics.jsonl` (a resumed run); False starts the file
        afresh (a new run in the same folder).
      purge_step: for a resumed run, the first step to be redone: TensorBoard hides events of
        this step and later that an earlier process wrote, so redone steps are not drawn twice.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        append: bool = True,
        purge_step: int | None = None,
    ):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        mode = "a" if append else "w"
        self._file = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=purge_step)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Writes one step's metrics; returns them as host values."""
        row = {"step": int(step), **to_host(metrics)}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in row.items():
                if name == "step":
                    continue
                if isinstance(value, list):
                    for index, item in enumerate(value):
                        if isinstance(item, int | float):
                            self._tb.add_scalar(f"{name}/{index}", item, step)
                elif isinstance(value, int | float):
                    self._tb.add_scalar(name, value, step)
        return row

    def size(self) -> int:
        """Bytes of `metrics.jsonl` written so far (every process gets process 0's figure)."""
        return broadcast_from_primary(os.path.getsize(self.path))

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RowsOnly:
    """The `MetricsWriter` of processes other than 0 in a multi-process run: rows, no files."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = os.path.join(workdir, "metrics.jsonl")

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        return {"step": int(step), **to_host(metrics)}

    def size(self) -> int:
        return broadcast_from_primary(0)

    def close(self) -> None:
        pass


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Reads a `metrics.jsonl` file back into a list of dicts (one per step)."""
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def rewind_metrics(path: str | os.PathLike, step: int, metrics_bytes: int) -> int:
    """Cuts `metrics.jsonl` back to the rows of steps <= `step` (those after it are redone).

    The first `metrics_bytes` bytes (the checkpoint's cursor) are kept byte for byte when they
    end with the row of `step`; otherwise (the file was edited) the leading rows with steps <=
    `step` are kept, with a warning.

    Returns:
      The number of rows dropped.
    """
    if not os.path.exists(path):
        if step > 0:
            logging.warning("%s is missing; rows of steps 1-%d are lost", path, step)
        return 0
    with open(path, "rb") as file:
        content = file.read()
    head = content[:metrics_bytes]
    lines = head.splitlines()
    if len(head) == metrics_bytes and (
        (metrics_bytes == 0 and step == 0)
        or (head.endswith(b"\n") and lines and _row_step(lines[-1]) == step)
    ):
        keep = head
    else:
        logging.warning(
            "%s does not match the checkpoint's cursor (%d bytes up to step %d); keeping its "
            "leading rows of steps <= %d",
            path,
            metrics_bytes,
            step,
            step,
        )
        kept = []
        for line in content.splitlines(keepends=True):
            row_step = _row_step(line)
            if row_step is None or row_step > step:
                break
            kept.append(line)
        keep = b"".join(kept)
    dropped = len(content[len(keep) :].splitlines())
    if len(keep) != len(content):
        with open(path, "r+b") as file:
            file.truncate(len(keep))
    return dropped


def _row_step(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
