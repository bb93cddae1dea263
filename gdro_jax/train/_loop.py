"""The RL loop: `run_step` (plan, rollout, reward, update, timed by phase) and `train`.

`train(config, workdir)` builds the run (`build_run`), resumes from the newest usable checkpoint,
steps with a progress bar, writes metrics, checkpoints, and saves the final policy. Library code
never reads flags: `experiments/train.py` passes the config in.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from gdro_jax import checkpoint, configs, models, step
from gdro_jax.runtime import (
    COMPILING_NOTE,
    agreed_signal,
    environment,
    global_array,
    is_primary,
    logging_above_bars,
    notice,
    to_host,
)
from gdro_jax.tasks import RewardFn
from gdro_jax.train._preemption import TrainingInterrupted, stop_on_signals
from gdro_jax.train._resume import open_checkpoints, resume
from gdro_jax.train._run import Run, build_run
from gdro_jax.train._writers import MetricsWriter, RowsOnly, read_metrics, rewind_metrics


def run_step(run: Run, state: step.TrainState, prompt_ids: np.ndarray):
    """One RL step. Returns `(state, metrics, seconds)` with seconds split by phase."""
    times = {}
    start = time.perf_counter()
    # `state.step` stays on the device (no host sync); fold_in gives the same key as its int.
    key = jax.random.fold_in(jax.random.key(run.settings.seed + 1), state.step)
    plan_key, sample_key = jax.random.split(key)
    if run.mesh is None:
        ids = jnp.asarray(prompt_ids, jnp.int32)
    else:
        # Every process drew the same ids: each supplies its own devices' copies.
        ids = global_array(np.asarray(prompt_ids, np.int32), NamedSharding(run.mesh, P()))
    plan = jax.block_until_ready(run.plan(state.gdro, ids, plan_key))
    if plan.prompt_ids is not None:  # Prompt-GDRO's `resample` draws the batch's prompts itself
        ids = plan.prompt_ids
    times["plan"] = time.perf_counter() - start
    start = time.perf_counter()
    rollouts = jax.block_until_ready(run.rollout(state.params, plan, ids, sample_key))
    times["rollout"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
        rollouts = jax.block_until_ready(run.reward(ids, rollouts, plan))
        step.check_rewards(run.reward_name, rollouts.rewards)
    except step.RewardError as error:
        # The step number is read from the device only on this error path.
        raise step.RewardError(f"step {int(state.step) + 1}: {error}") from error
    times["reward"] = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = run.update(state, plan, ids, rollouts)
    metrics = jax.block_until_ready(metrics)
    times["update"] = time.perf_counter() - start
    # Stops the run after too many non-finite steps in a row (each was skipped by the update).
    consecutive, limit = int(metrics["consecutive_skips"]), run.settings.max_consecutive_skips
    if limit and consecutive >= limit:
        step.check_skips(consecutive, limit, int(state.step))
    return state, metrics, times


def train(
    config: Mapping[str, Any] | configs.RunSettings,
    workdir: str | os.PathLike,
    *,
    reward_fn: RewardFn | None = None,
    host_reward_fn: RewardFn | None = None,
    rollout_engine: step.RolloutEngine | None = None,
) -> dict[str, Any]:
    """Runs `config.steps` RL steps, logging every step, and saves the final policy.

    With `config.checkpoint.enabled` the run resumes by itself: when `workdir/checkpoints/` holds
    a checkpoint, the newest usable one is restored (state, data position, metrics cursor) and
    the run continues exactly where it was, bit for bit on CPU. A checkpoint is written every
    `config.checkpoint.every_steps` steps, at the last step, and on SIGTERM/SIGINT (the step in
    flight finishes, is saved, and `TrainingInterrupted` is raised). Resuming under a config that
    changes the run (anything outside `configs.RESUMABLE_FIELDS`) raises a ValueError naming the
    fields before anything in `workdir` is touched.

    Args:
      config: a run config (`configs.run_schema` names every field; see
        `experiments/configs/tiny_cpu.py`) or its `RunSettings`.
      workdir: where `metrics.jsonl`, TensorBoard events (`tb/`), `config.json`,
        `summary.json`, `checkpoints/` and the final policy as an HF folder with its tokenizer
        (`model/`) go.
      reward_fn, host_reward_fn: a reward replacing the task's (see `build_run`).
      rollout_engine: another sampler behind the `RolloutEngine` interface (see `build_run`).

    Returns:
      A summary dict (the last step's metrics, mean step times, prompts skipped for length)
      plus `state` and `run`. A workdir whose run already reached `config.steps` returns at once
      with the saved state.

    Raises:
      TrainingInterrupted: on SIGTERM/SIGINT, after the checkpoint of the step reached is saved.
      CheckpointError: checkpoints exist but none can be restored.
    """
    # Read once: a config that cannot work is named before anything is touched.
    settings = configs.read_run_config(config)
    os.makedirs(workdir, exist_ok=True)
    manager = open_checkpoints(settings, workdir)
    try:
        run = build_run(
            settings,
            reward_fn=reward_fn,
            host_reward_fn=host_reward_fn,
            rollout_engine=rollout_engine,
        )
        try:
            run, resumed = resume(run, manager)
            if is_primary():
                with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as file:
                    file.write(settings.config.to_json_best_effort(indent=2))
            state, history, step_times = _train_loop(run, workdir, manager=manager, resumed=resumed)
            completed = int(state.step)
            finished = None if history else _finished_summary(workdir, completed)
            if finished is None:
                _save_policy(run, state, os.path.join(workdir, models.MODEL_DIR))
        finally:
            run.close()
    finally:
        if manager is not None:
            manager.close()
    if finished is not None:
        # Nothing to do: the workdir already holds this step's policy and summary.
        return dict(finished, state=state, run=run)
    if not history and os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        history = read_metrics(os.path.join(workdir, "metrics.jsonl"))[-1:]
    summary = {
        "method": settings.method.name,
        "steps": settings.steps,
        "completed_steps": completed,
        "skipped_prompts": run.task.skipped_prompts,
        "final": history[-1] if history else {},
        "mean_step_seconds": {
            name: float(np.mean([t[name] for t in step_times[1:] or step_times]))
            for name in (step_times[0] if step_times else {})
        },
        "environment": environment(),
    }
    if is_primary():
        with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as file:
            json.dump(summary, file, indent=2)
    return dict(summary, state=state, run=run)


def describe_outputs(result: dict[str, Any], workdir: str | os.PathLike) -> str:
    """A few lines for the end of a run: steps, final reward and accuracy, where outputs went,
    the command that opens its TensorBoard events and the one that draws its figures.

    Args:
      result: what `train` returned.
      workdir: the run's work directory.
    """
    workdir = os.fspath(workdir)
    final = result.get("final", {})
    numbers = ", ".join(
        f"{name} {final[name]:.3f}" for name in ("reward", "accuracy") if name in final
    )
    lines = [
        f"{result['method']}: {result['completed_steps']} of {result['steps']} steps done"
        + (f"; last step: {numbers}" if numbers else "")
    ]
    tensorboard = shlex.join(["tensorboard", "--logdir", os.path.join(workdir, "tb")])
    for name, what in (
        ("metrics.jsonl", "per-step metrics"),
        ("tb", f"TensorBoard events: {tensorboard} (the tensorboard extra: {TENSORBOARD_EXTRA})"),
        ("checkpoints", "checkpoints (rerun the same command to resume)"),
        (models.MODEL_DIR, "the final policy, an HF folder with its tokenizer"),
        (SNAPSHOT_DIR, "the policy after each of checkpoint.snapshot_steps, step_<s>/"),
        ("summary.json", "this summary"),
    ):
        path = os.path.join(workdir, name)
        if os.path.exists(path):
            lines.append(f"  {path}: {what}")
    # Drawn on demand: matplotlib stays out of the training process (a second of every start).
    plot = shlex.join(["python", "-m", "experiments.plot_run", f"--workdir={workdir}"])
    lines.append(
        f"  {os.path.join(workdir, 'plots')}: figures of reward, accuracy and the curriculum: "
        f"{plot} draws them"
    )
    return "\n".join(lines)


def _train_loop(run: Run, workdir, *, manager=None, resumed: checkpoint.Checkpoint | None = None):
    """Steps from the restored step (or 0) to `config.steps`; returns state, rows, step times."""
    settings = run.settings
    every_steps = settings.checkpoint.every_steps
    state = run.state
    start = 0 if resumed is None else resumed.step
    if start > settings.steps:
        logging.warning("the checkpoint holds step %d, past steps=%d", start, settings.steps)
    step_times: list[dict[str, float]] = []
    history: list[dict[str, Any]] = []
    writer = None
    if resumed is not None and start < settings.steps and is_primary():
        notice(_resume_line(workdir, resumed, settings.steps))
    bar = tqdm(
        initial=min(start, settings.steps),
        total=settings.steps,
        desc=settings.method.name,
        disable=not settings.progress,
    )
    if start < settings.steps:
        bar.set_postfix_str(COMPILING_NOTE)  # until the first step's numbers replace it
    try:
        with stop_on_signals() as stop, logging_above_bars():
            stop.steps = settings.steps
            for step_index in range(start, settings.steps):
                stop.step = step_index + 1
                prompt_ids = next(run.prompt_batches)
                state, metrics, times = run_step(run, state, prompt_ids)
                metrics = dict(metrics, **{f"time/{k}": v for k, v in times.items()})
                metrics.update(run.task.grader_counts())  # cumulative timeouts, crashes, ...
                if writer is None:
                    # Opened at the first finished step: a run that fails before it leaves
                    # metrics.jsonl as it was.
                    writer = _open_metrics(workdir, settings, resumed)
                row = writer.write(step_index + 1, metrics)
                history.append(row)
                step_times.append(times)
                bar.set_postfix(
                    reward=f"{row['reward']:.3f}",
                    step_s=f"{sum(times.values()):.2f}",
                    refresh=False,
                )
                last = step_index + 1 == settings.steps
                # Several processes stop together: a signal to any one stops them all here.
                signum = agreed_signal(stop.poll())
                if step_index + 1 in settings.checkpoint.snapshot_steps:
                    _save_policy(run, state, snapshot_path(workdir, step_index + 1))
                path = None
                if manager is not None and ((step_index + 1) % every_steps == 0 or last or signum):
                    path = _save(manager, run, state, writer.size())
                bar.update(1)  # the step is done (and saved): the bar, notices and checkpoint agree
                if signum is not None and not last:
                    raise TrainingInterrupted(step_index + 1, signum, path, settings.steps)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return state, history, step_times


def _resume_line(workdir, resumed: checkpoint.Checkpoint, steps: int) -> str:
    """One line before the bar of a resumed run: from which step, of how many, from where."""
    saved = resumed.meta.get("config", {}).get("steps")
    if isinstance(saved, int) and resumed.step >= saved and steps > saved:
        return (
            f"extending the finished run in {workdir} from {saved} to {steps} steps "
            f"(checkpoint {resumed.path})"
        )
    return f"resuming the run in {workdir} from step {resumed.step} of {steps} ({resumed.path})"


SNAPSHOT_DIR = "snapshots"
TENSORBOARD_EXTRA = "pip install -e '.[tensorboard]'"  # where the tensorboard command comes from


def snapshot_path(workdir: str | os.PathLike, step: int) -> str:
    """Where `train` saves the policy after `step` when it is one of
    `config.checkpoint.snapshot_steps`: an HF folder with its tokenizer."""
    return os.path.join(os.fspath(workdir), SNAPSHOT_DIR, f"step_{step}")


def _save_policy(run: Run, state: step.TrainState, folder: str) -> None:
    """The policy as an HF folder with its tokenizer: gathered on every process (a
    collective), written by process 0."""
    params = to_host(state.params) if jax.process_count() > 1 else state.params
    if is_primary():
        models.save_pretrained(
            nnx.merge(run.program.graphdef, params), folder, tokenizer=run.task.tokenizer
        )


def _save(manager, run: Run, state: step.TrainState, metrics_bytes: int) -> str:
    """Checkpoint `state.step`: the state, the prompt iterator's position, and in its meta the
    run's config, the metrics cursor and the policy's architecture (`checkpoint.restore_policy`
    rebuilds the policy from it alone)."""
    meta = {
        "config": configs.config_dict(run.settings.config),
        "metrics_bytes": int(metrics_bytes),
        "policy": run.policy.to_dict(),
    }
    return checkpoint.save_checkpoint(
        manager, int(state.step), state, data_iterator=run.prompt_batches, meta=meta
    )


def _open_metrics(workdir, settings, resumed) -> MetricsWriter | RowsOnly:
    if not is_primary():
        return RowsOnly(workdir)
    if resumed is None:
        # A new run: metrics.jsonl starts afresh, so the rows are this run's only.
        return MetricsWriter(workdir, tensorboard=settings.tensorboard, append=False)
    path = os.path.join(workdir, "metrics.jsonl")
    dropped = rewind_metrics(path, resumed.step, resumed.meta["metrics_bytes"])
    if dropped:
        logging.info("dropped %d metrics rows after step %d (redone)", dropped, resumed.step)
    return MetricsWriter(
        workdir, tensorboard=settings.tensorboard, append=True, purge_step=resumed.step + 1
    )


def _finished_summary(workdir, step: int) -> dict[str, Any] | None:
    """The summary of `workdir` if it holds the final policy of a run that completed `step`."""
    path = os.path.join(workdir, "summary.json")
    if not (os.path.exists(path) and os.path.isdir(os.path.join(workdir, models.MODEL_DIR))):
        return None
    with open(path, encoding="utf-8") as file:
        summary = json.load(file)
    return summary if summary.get("completed_steps") == step else None
