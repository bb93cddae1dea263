"""The RL training loop: GRPO, Prompt-GDRO, Rollout-GDRO, or both, on the chain or math task.

`build_run(config)` assembles everything a run needs (task pool and reward, policy on its mesh,
controllers, optimizer, jitted plan/rollout/reward/update) after `validate_config` has checked the
config; `run_step` performs one step, times its phases and applies the guards; `train(config,
workdir)` loops with a progress bar, writes metrics, checkpoints with orbax and resumes exactly
from the newest usable checkpoint, and saves the final policy. Library code never reads flags:
`experiments/train.py` passes the config in.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from gdro_jax import controllers, models, tasks
from gdro_jax.models import fit_spec
from gdro_jax.train._checkpoint import (
    CHECKPOINT_DIR,
    Checkpoint,
    CheckpointError,
    TrainingInterrupted,
    abstract_state,
    check_config,
    checkpoint_manager,
    checkpoint_options,
    restore_checkpoint,
    rewind_metrics,
    save_checkpoint,
    saved_config,
    stop_on_signals,
)
from gdro_jax.train._guards import (
    HostRewardCaller,
    RewardError,
    check_model_fits,
    check_rewards,
    check_skips,
    max_skips,
    validate_config,
)
from gdro_jax.train._metrics import MetricsWriter, read_metrics
from gdro_jax.train._rl_tasks import (
    RewardFn,
    RLTask,
    as_device_rewards,
    chain_task,
    check_vocab,
    math_task,
    task_kind,
)
from gdro_jax.train._state import TrainState, init_train_state, state_shardings
from gdro_jax.train._step import GRPOConfig, make_update, sample_rollouts

METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "gdro_both")
MODEL_DIR = "model"  # the final policy, an HF folder with the tokenizer, inside the workdir


class Run(NamedTuple):
    """Everything one training run needs, built once by `build_run`."""

    config: ml_collections.ConfigDict
    task: RLTask  # the training prompt pool (host arrays) and its reward
    task_config: tasks.ChainTaskConfig | None  # the chain task's config; None for math
    splits: tasks.ChainSplits | None  # the chain task's train/validation/test rows; None for math
    mesh: jax.sharding.Mesh | None
    graphdef: nnx.GraphDef
    state: TrainState
    gdro: controllers.MultiAdversary
    plan: Callable  # jitted (gdro_state, prompt_ids, key) -> Plan
    rollout: Callable  # jitted (params, plan, prompt_ids, key) -> Rollouts, rewards still 0
    reward: Callable  # (prompt_ids, rollouts, plan) -> scored Rollouts; jitted for device rewards
    update: Callable  # jitted, state donated: (state, plan, prompt_ids, rollouts) -> (state, m)
    prompt_batches: Any  # grain iterator of [N] prompt-index batches


def build_controllers(
    config: ml_collections.ConfigDict, num_dataset_prompts: int
) -> tuple[controllers.MultiAdversary, controllers.PromptGDRO | None]:
    """The classifier and the adversaries that `config.method` switches on."""
    if config.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got method={config.method!r}")
    classifier = controllers.passk_classifier(num_dataset_prompts, **config.classifier.to_dict())
    prompt = rollout = None
    if config.method in ("prompt_gdro", "gdro_both"):
        prompt = controllers.prompt_gdro(classifier.num_bins, **config.prompt_gdro.to_dict())
    if config.method in ("rollout_gdro", "gdro_both"):
        rollout = controllers.rollout_gdro(
            classifier.num_bins, n_mean=config.n_mean, **config.rollout_gdro.to_dict()
        )
    gdro = controllers.multi_adversary(classifier, prompt, rollout, n_mean=config.n_mean)
    return gdro, prompt


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW with optional global-norm clipping and linear warmup (SPEC 2: AdamW, lr 1e-6)."""
    opt = config.optimizer
    schedule = optax.linear_schedule(0.0, opt.learning_rate, max(opt.warmup_steps, 1))
    if opt.warmup_steps == 0:
        schedule = opt.learning_rate
    parts = []
    if opt.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(opt.grad_clip))
    parts.append(
        optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
    )
    return optax.chain(*parts)


def _load_policy(config: ml_collections.ConfigDict, mesh) -> models.Decoder:
    if config.init_from:
        return models.from_pretrained(config.init_from, mesh=mesh)
    model_config = models.DecoderConfig(**config.model.to_dict())
    return models.init_decoder(model_config, seed=config.seed, mesh=mesh)


def _make_mesh(config: ml_collections.ConfigDict):
    shape = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    if shape == (1, 1, 1):
        return None
    return models.make_mesh(*shape)


def batch_sharding(mesh, shape: tuple[int, ...]) -> NamedSharding | None:
    """Leading (batch) axis on `data` x `fsdp`, fitted to the shape; None without a mesh."""
    if mesh is None:
        return None
    spec = fit_spec(P(("data", "fsdp")), shape, dict(mesh.shape))
    return NamedSharding(mesh, spec)


def build_run(
    config: ml_collections.ConfigDict,
    *,
    reward_fn: RewardFn | None = None,
    host_reward_fn: RewardFn | None = None,
) -> Run:
    """Builds the task, policy, controllers, optimizer and the jitted step functions.

    Args:
      config: the run's config (see `experiments/configs/tiny_cpu.py`; `task_kind="math"` with a
        `math` block trains on a math dataset, see `experiments/configs/paper_qwen3_1p7b.py`).
      reward_fn: optional jittable `(prompt_ids_N, completion_tokens_RM, completion_lengths_R,
        prompt_of_slot_R) -> (rewards_R, correct_R)` replacing the task's reward. Default: the
        chain task's exact match of the whole worked solution, or the math grader, mapped to
        `config.reward_values`.
      host_reward_fn: the same signature on numpy arrays, run on the host (e.g. a grader that
        cannot be jitted), under `config.reward_timeout_s`. At most one of the two.

    Returns:
      The `Run`. Call `run.task.close()` when done (it stops the math grader's workers).
    """
    validate_config(config)
    kind = task_kind(config)
    task_config = splits = None
    if kind == "chain":
        task_config = tasks.ChainTaskConfig(**config.task.to_dict())
        splits = tasks.build_splits(task_config)
        task = chain_task(config, task_config)
    else:
        task = math_task(config)
    try:
        return _assemble(config, task, task_config, splits, reward_fn, host_reward_fn)
    except BaseException:
        task.close()
        raise


def _assemble(config, task, task_config, splits, reward_fn, host_reward_fn) -> Run:
    if reward_fn is not None and host_reward_fn is not None:
        raise ValueError("pass reward_fn (jittable) or host_reward_fn (numpy), not both")
    if host_reward_fn is not None:
        task.device_reward, task.host_reward = None, host_reward_fn
    num_dataset_prompts = task.num_prompts
    mesh = _make_mesh(config)
    model = _load_policy(config, mesh)
    check_vocab(task, model.config.vocab_size)
    check_model_fits(
        task.prompt_tokens.shape[1], config.max_new_tokens, model.config.max_position_embeddings
    )
    grpo_config = GRPOConfig(**config.grpo.to_dict())
    gdro, prompt_adversary = build_controllers(config, num_dataset_prompts)
    tx = make_optimizer(config)
    graphdef, state = init_train_state(
        model, tx, gdro, seed=config.seed, with_reference=grpo_config.kl_coef > 0
    )
    num_prompts = config.num_prompts
    if num_prompts > num_dataset_prompts:
        raise ValueError(
            f"num_prompts={num_prompts} per step is more than the pool's {num_dataset_prompts} "
            "prompts"
        )
    num_bins = gdro_num_bins(config)
    prompt_tokens = jnp.asarray(task.prompt_tokens)
    prompt_lengths = jnp.asarray(task.prompt_lengths)

    def constrain(tree):
        if mesh is None:
            return tree
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape)), tree
        )

    @jax.jit
    def rollout(params, plan, prompt_ids, key):
        result = sample_rollouts(
            graphdef,
            params,
            plan,
            prompt_tokens[prompt_ids],
            prompt_lengths[prompt_ids],
            key,
            max_new_tokens=config.max_new_tokens,
            temperature=grpo_config.temperature,
            eos_ids=task.eos_ids,
        )
        return constrain(result)

    device_reward = reward_fn if reward_fn is not None else task.device_reward
    task.reward_name = f"of the {task.kind} task"
    if reward_fn is not None or host_reward_fn is not None:
        kind = "reward_fn" if reward_fn is not None else "host_reward_fn"
        task.reward_name = f"{kind} (passed to build_run)"
    if device_reward is not None:

        @jax.jit
        def reward(prompt_ids, rollouts, plan):
            rewards_R, correct_R = device_reward(
                prompt_ids, rollouts.tokens, rollouts.lengths, plan.prompt_of_slot
            )
            return constrain(
                rollouts._replace(
                    rewards=jnp.asarray(rewards_R, jnp.float32),
                    correct=jnp.asarray(correct_R, bool),
                )
            )

    else:
        num_slots = num_prompts * config.n_mean
        slot_sharding = None if mesh is None else batch_sharding(mesh, (num_slots,))
        host_reward = HostRewardCaller(
            task.host_reward, task.reward_name, config.get("reward_timeout_s", 0.0)
        )
        task.on_close(host_reward.close)

        def reward(prompt_ids, rollouts, plan):
            rewards_R, correct_R = host_reward(
                jax.device_get(prompt_ids),
                jax.device_get(rollouts.tokens),
                jax.device_get(rollouts.lengths),
                jax.device_get(plan.prompt_of_slot),
            )
            rewards_R, correct_R = as_device_rewards(rewards_R, correct_R, slot_sharding)
            return rollouts._replace(rewards=rewards_R, correct=correct_R)

    update_fn = make_update(
        graphdef,
        tx,
        gdro,
        grpo_config,
        num_prompts=num_prompts,
        num_bins=num_bins,
        prompt_adversary=prompt_adversary,
    )
    shardings = state_shardings(state)
    replicated = None if mesh is None else NamedSharding(mesh, P())
    update = jax.jit(update_fn, donate_argnums=0, out_shardings=(shardings, replicated))
    plan = jax.jit(gdro.plan, out_shardings=replicated)

    dataset = (
        grain.MapDataset.range(num_dataset_prompts)
        .shuffle(seed=config.seed)
        .repeat(None)
        .batch(num_prompts, drop_remainder=True)
    )
    return Run(
        config=config,
        task=task,
        task_config=task_config,
        splits=splits,
        mesh=mesh,
        graphdef=graphdef,
        state=state,
        gdro=gdro,
        plan=plan,
        rollout=rollout,
        reward=reward,
        update=update,
        prompt_batches=iter(dataset.to_iter_dataset()),
    )


def gdro_num_bins(config: ml_collections.ConfigDict) -> int:
    """Number of classifier bins implied by the config's edges."""
    edges = config.classifier.get("edges", controllers.DEFAULT_EDGES)
    return len(edges) + 1


def run_step(run: Run, state: TrainState, prompt_ids: np.ndarray):
    """One RL step. Returns `(state, metrics, seconds)` with seconds split by phase."""
    times = {}
    start = time.perf_counter()
    # `state.step` stays on the device (no host sync); fold_in gives the same key as its int.
    key = jax.random.fold_in(jax.random.key(run.config.seed + 1), state.step)
    plan_key, sample_key = jax.random.split(key)
    ids = jnp.asarray(prompt_ids, jnp.int32)
    if run.mesh is not None:
        ids = jax.device_put(ids, NamedSharding(run.mesh, P()))
    plan = jax.block_until_ready(run.plan(state.gdro, ids, plan_key))
    times["plan"] = time.perf_counter() - start
    start = time.perf_counter()
    rollouts = jax.block_until_ready(run.rollout(state.params, plan, ids, sample_key))
    times["rollout"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
        rollouts = jax.block_until_ready(run.reward(ids, rollouts, plan))
        check_rewards(run.task.reward_name, rollouts.rewards)
    except RewardError as error:
        # The step number is read from the device only on this error path.
        raise RewardError(f"step {int(state.step) + 1}: {error}") from error
    times["reward"] = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = run.update(state, plan, ids, rollouts)
    metrics = jax.block_until_ready(metrics)
    times["update"] = time.perf_counter() - start
    # Stops the run after too many non-finite steps in a row (each was skipped by the update).
    consecutive, limit = int(metrics["consecutive_skips"]), max_skips(run.config)
    if limit and consecutive >= limit:
        check_skips(consecutive, limit, int(state.step))
    return state, metrics, times


def train(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    reward_fn: RewardFn | None = None,
    host_reward_fn: RewardFn | None = None,
) -> dict[str, Any]:
    """Runs `config.steps` RL steps, logging every step, and saves the final policy.

    With `config.checkpoint.enabled` the run resumes by itself: when `workdir/checkpoints/` holds
    a checkpoint, the newest usable one is restored (state, data position, metrics cursor) and
    the run continues exactly where it was, bit for bit on CPU. A checkpoint is written every
    `config.checkpoint.every_steps` steps, at the last step, and on SIGTERM/SIGINT (the step in
    flight finishes, is saved, and `TrainingInterrupted` is raised). Resuming under a config that
    changes the run (anything outside `RESUMABLE_FIELDS`) raises a ValueError naming the fields
    before anything in `workdir` is touched.

    Args:
      config: see `experiments/configs/tiny_cpu.py` for every field.
      workdir: where `metrics.jsonl`, TensorBoard events (`tb/`), `config.json`,
        `summary.json`, `checkpoints/` and the final policy as an HF folder with its tokenizer
        (`model/`) go.
      reward_fn, host_reward_fn: a reward replacing the task's (see `build_run`).

    Returns:
      A summary dict (the last step's metrics, mean step times, prompts skipped for length)
      plus `state` and `run`. A workdir whose run already reached `config.steps` returns at once
      with the saved state.

    Raises:
      TrainingInterrupted: on SIGTERM/SIGINT, after the checkpoint of the step reached is saved.
      CheckpointError: checkpoints exist but none can be restored.
    """
    validate_config(config)  # a config that cannot work is named before anything is touched
    os.makedirs(workdir, exist_ok=True)
    enabled, every_steps, keep = checkpoint_options(config)
    manager = _open_checkpoints(config, workdir, enabled=enabled, keep=keep)
    try:
        run = build_run(config, reward_fn=reward_fn, host_reward_fn=host_reward_fn)
        try:
            run, resumed = _resume(run, config, manager)
            with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as file:
                file.write(config.to_json_best_effort(indent=2))
            state, history, step_times = _train_loop(
                run, config, workdir, manager=manager, resumed=resumed, every_steps=every_steps
            )
            completed = int(state.step)
            finished = None if history else _finished_summary(workdir, completed)
            if finished is None:
                models.save_pretrained(
                    nnx.merge(run.graphdef, state.params),
                    os.path.join(workdir, MODEL_DIR),
                    tokenizer=run.task.tokenizer,
                )
        finally:
            run.task.close()
    finally:
        if manager is not None:
            manager.close()
    if finished is not None:
        # Nothing to do: the workdir already holds this step's policy and summary.
        return dict(finished, state=state, run=run)
    if not history and os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        history = read_metrics(os.path.join(workdir, "metrics.jsonl"))[-1:]
    summary = {
        "method": config.method,
        "steps": config.steps,
        "completed_steps": completed,
        "skipped_prompts": run.task.skipped_prompts,
        "final": history[-1] if history else {},
        "mean_step_seconds": {
            name: float(np.mean([t[name] for t in step_times[1:] or step_times]))
            for name in (step_times[0] if step_times else {})
        },
    }
    with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as file:
        json.dump(summary, file, indent=2)
    return dict(summary, state=state, run=run)


def _train_loop(
    run: Run,
    config: ml_collections.ConfigDict,
    workdir,
    *,
    manager=None,
    resumed: Checkpoint | None = None,
    every_steps: int = 1,
):
    """Steps from the restored step (or 0) to `config.steps`; returns state, rows, step times."""
    state = run.state
    start = 0 if resumed is None else resumed.step
    if start > config.steps:
        logging.warning("the checkpoint holds step %d, past steps=%d", start, config.steps)
    step_times: list[dict[str, float]] = []
    history: list[dict[str, Any]] = []
    writer = None
    bar = tqdm(
        range(start, config.steps),
        initial=min(start, config.steps),
        total=config.steps,
        desc=f"{config.method}",
        disable=not config.progress,
    )
    try:
        with stop_on_signals() as stop:
            for step in bar:
                prompt_ids = next(run.prompt_batches)
                state, metrics, times = run_step(run, state, prompt_ids)
                metrics = dict(metrics, **{f"time/{k}": v for k, v in times.items()})
                metrics.update(run.task.grader_counts())  # cumulative timeouts, crashes, ...
                if writer is None:
                    # Opened at the first finished step: a run that fails before it leaves
                    # metrics.jsonl as it was.
                    writer = _open_metrics(workdir, config, resumed)
                row = writer.write(step + 1, metrics)
                history.append(row)
                step_times.append(times)
                bar.set_postfix(
                    reward=f"{row['reward']:.3f}",
                    step_s=f"{sum(times.values()):.2f}",
                    refresh=False,
                )
                last = step + 1 == config.steps
                path = None
                if manager is not None and ((step + 1) % every_steps == 0 or last or stop.signum):
                    path = save_checkpoint(
                        manager,
                        state,
                        run.prompt_batches,
                        config=config,
                        metrics_bytes=os.path.getsize(writer.path),
                    )
                if stop.signum is not None and not last:
                    raise TrainingInterrupted(step + 1, stop.signum, path)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return state, history, step_times


def _open_checkpoints(config, workdir, *, enabled: bool, keep: int):
    """The checkpoint manager (None when disabled), after checking the saved config matches."""
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    if not enabled:
        if os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory)):
            raise ValueError(
                f"{directory} holds checkpoints of a run but checkpoint.enabled is False; enable "
                "checkpoints to resume that run, or use a new workdir"
            )
        return None
    manager = checkpoint_manager(directory, keep=keep)
    try:
        saved = saved_config(manager)
        if saved is not None:
            check_config(saved[1], config, saved[0])
    except BaseException:
        manager.close()
        raise
    return manager


def _resume(run: Run, config, manager) -> tuple[Run, Checkpoint | None]:
    """Restores the newest usable checkpoint into `run` (its state and data position)."""
    if manager is None or not manager.all_steps():
        return run, None
    template = abstract_state(run.state)
    # Drops the fresh arrays before restoring, so the parameters are never held twice.
    run = run._replace(state=template)
    resumed = restore_checkpoint(manager, template, run.prompt_batches)
    if resumed is None:
        raise CheckpointError(f"{manager.directory} lost its checkpoints while resuming")
    check_config(resumed.meta["config"], config, resumed.path)
    logging.info("resuming from %s (step %d)", resumed.path, resumed.step)
    return run._replace(state=resumed.state), resumed


def _open_metrics(workdir, config, resumed: Checkpoint | None) -> MetricsWriter:
    if resumed is None:
        # A new run: metrics.jsonl starts afresh, so the rows are this run's only.
        return MetricsWriter(workdir, tensorboard=config.tensorboard, append=False)
    path = os.path.join(workdir, "metrics.jsonl")
    dropped = rewind_metrics(path, resumed.step, resumed.meta["metrics_bytes"])
    if dropped:
        logging.info("dropped %d metrics rows after step %d (redone)", dropped, resumed.step)
    return MetricsWriter(
        workdir, tensorboard=config.tensorboard, append=True, purge_step=resumed.step + 1
    )


def _finished_summary(workdir, step: int) -> dict[str, Any] | None:
    """The summary of `workdir` if it holds the final policy of a run that completed `step`."""
    path = os.path.join(workdir, "summary.json")
    if not (os.path.exists(path) and os.path.isdir(os.path.join(workdir, MODEL_DIR))):
        return None
    with open(path, encoding="utf-8") as file:
        summary = json.load(file)
    return summary if summary.get("completed_steps") == step else None
