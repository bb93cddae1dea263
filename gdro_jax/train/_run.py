"""`build_run`: a config in, everything a run needs out (task, policy, the step program, data).

    step     configs.step_program -> step.StepProgram: the parts and the jitted phases, built
             once; the memory plan (`planner.check_memory_plan`) lowers this same object
    plan     program.plan                            replicated out
    rollout  program.rollout_function(...)           the built-in engine, or another engine's
                                                     samples rescored by the trainer
    reward   step.device_reward_phase / host_reward_phase, under config.reward_timeout_s
    update   program.update(state), state donated    explicit out shardings

The config is read once (`configs.read_run_config`); the task is used as given: a reward passed
to `build_run` replaces the task's inside the `Run`, never on the task itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import grain
import jax

from gdro_jax import configs, models, planner, step, tasks
from gdro_jax.tasks import RewardFn, RLTask


class Run(NamedTuple):
    """Everything one training run needs, built once by `build_run`. Call `close()` when done."""

    settings: configs.RunSettings  # the checked config
    task: RLTask  # the training prompt pool (host arrays) and its reward
    task_config: tasks.ChainTaskConfig | None  # the chain task's config; None for math
    splits: tasks.ChainSplits | None  # the chain task's train/validation/test rows; None for math
    mesh: jax.sharding.Mesh | None
    policy: models.DecoderConfig  # the policy's architecture (stored with every checkpoint)
    program: step.StepProgram  # the step, wired once: its parts and its jitted phases
    state: step.TrainState
    plan: Callable  # jitted (gdro_state, prompt_ids, key) -> Plan
    rollout: Callable  # (params, plan, prompt_ids, key) -> Rollouts, rewards still 0
    reward: Callable  # (prompt_ids, rollouts, plan) -> scored Rollouts; jitted for device rewards
    update: Callable  # jitted, state donated: (state, plan, prompt_ids, rollouts) -> (state, m)
    prompt_batches: Any  # grain iterator of [N] prompt-index batches
    reward_name: str  # how reward errors name the reward function
    closers: tuple[Callable[[], None], ...]  # what `close` stops (grader workers, reward thread)

    @property
    def config(self):
        """The run's whole config (every field of the schema)."""
        return self.settings.config

    def close(self) -> None:
        """Stops the math grader's workers and the host reward's thread, if any."""
        for close in self.closers:
            close()


def check_model_fits(prompt_width: int, max_new_tokens: int, max_positions: int) -> None:
    """Raises when the longest prompt plus the completion exceeds the policy's positions."""
    if prompt_width + max_new_tokens > max_positions:
        raise ValueError(
            f"the longest prompt ({prompt_width} tokens) plus config.max_new_tokens="
            f"{max_new_tokens} exceeds the policy's max_position_embeddings={max_positions}"
        )


def load_policy(settings: configs.RunSettings, mesh) -> models.Decoder:
    """The run's initial policy on `mesh`: `init_from`'s weights read into float32 masters (the
    optimizer state follows them, so AdamW's small steps are never rounded away) with the run's
    compute dtype (`configs.policy_overrides`), or a random policy of the `model` block from
    `seed`."""
    if settings.init_from:
        overrides = configs.policy_overrides(settings.config)
        return models.from_pretrained(
            settings.init_from, dtype=overrides.pop("param_dtype"), mesh=mesh, **overrides
        )
    return models.init_decoder(settings.model, seed=settings.seed, mesh=mesh)


def _task(settings: configs.RunSettings) -> RLTask:
    if settings.task_kind == "chain":
        return tasks.chain_task(settings.chain, reward_values=settings.reward_values)
    tokenizer = models.load_tokenizer(configs.tokenizer_folder(settings.config))
    return tasks.math_task(settings.math, tokenizer, reward_values=settings.reward_values)


def _prompt_batches(settings: configs.RunSettings, num_dataset_prompts: int):
    """An endless, seeded, shuffled grain iterator of [N] prompt indices (resumable)."""
    dataset = (
        grain.MapDataset.range(num_dataset_prompts)
        .shuffle(seed=settings.seed)
        .repeat(None)
        .batch(settings.num_prompts, drop_remainder=True)
    )
    return iter(dataset.to_iter_dataset())


def build_run(
    config: Mapping[str, Any] | configs.RunSettings,
    *,
    reward_fn: RewardFn | None = None,
    host_reward_fn: RewardFn | None = None,
    rollout_engine: step.RolloutEngine | None = None,
) -> Run:
    """Builds the task, policy, controllers, optimizer and the jitted step functions.

    Args:
      config: the run's config (see `experiments/configs/tiny_cpu.py`; `task_kind="math"` with a
        `math` block trains on a math dataset, see `experiments/configs/paper_qwen3_1p7b.py`),
        or its `RunSettings` (`configs.read_run_config`).
      reward_fn: optional jittable `(prompt_ids_N, completion_tokens_RM, completion_lengths_R,
        prompt_of_slot_R) -> (rewards_R, correct_R)` replacing the task's reward. Default: the
        chain task's exact match of the whole worked solution, or the math grader, mapped to
        `config.reward_values`.
      host_reward_fn: the same signature on numpy arrays, run on the host (e.g. a grader that
        cannot be jitted), under `config.reward_timeout_s`. At most one of the two.
      rollout_engine: what samples the rollouts (a `step.RolloutEngine`); default the one
        `config.rollout.engine` names: the built-in `step.KVCacheEngine`, fused into the jitted
        rollout phase, or `step.VLLMEngine`. Another engine is called outside jit, its
        `sync_weights` gets the parameters after every update, the trainer recomputes the
        log-probs of its samples and the step logs the gap ("rollout/logprob_mismatch_*").

    Returns:
      The `Run`. Call `run.close()` when done (it stops the math grader's workers).
    """
    settings = configs.read_run_config(config)
    if reward_fn is not None and host_reward_fn is not None:
        raise ValueError("pass reward_fn (jittable) or host_reward_fn (numpy), not both")
    task = _task(settings)
    closers = [task.close]
    try:
        return _assemble(settings, task, reward_fn, host_reward_fn, closers, rollout_engine)
    except BaseException:
        for close in closers:
            close()
        raise


def _reward_phase(settings, task, mesh, reward_fn, host_reward_fn, closers):
    reward_name = f"of the {task.kind} task"
    if reward_fn is not None or host_reward_fn is not None:
        kind = "reward_fn" if reward_fn is not None else "host_reward_fn"
        reward_name = f"{kind} (passed to build_run)"
    device_reward = task.device_reward if reward_fn is None else reward_fn
    host_reward = task.host_reward if host_reward_fn is None else host_reward_fn
    if device_reward is not None and host_reward_fn is None:
        return step.device_reward_phase(device_reward, mesh), reward_name
    caller = step.HostRewardCaller(host_reward, reward_name, settings.reward_timeout_s)
    closers.append(caller.close)
    return step.host_reward_phase(caller, mesh, settings.num_slots), reward_name


def _assemble(settings, task, reward_fn, host_reward_fn, closers, rollout_engine) -> Run:
    num_dataset_prompts = task.num_prompts
    if settings.num_prompts > num_dataset_prompts:
        raise ValueError(
            f"num_prompts={settings.num_prompts} per step is more than the pool's "
            f"{num_dataset_prompts} prompts"
        )
    mesh = configs.run_mesh(settings)
    program = configs.step_program(
        settings,
        mesh,
        prompt_width=task.prompt_tokens.shape[1],
        num_dataset_prompts=num_dataset_prompts,
        eos_ids=task.eos_ids,
        external_engine=rollout_engine is not None,
        prompt_features=(
            tasks.prompt_features(task) if configs.takes_prompt_features(settings.method) else None
        ),
    )
    # With device_memory_gib: the plan of this very program fails before anything is allocated.
    planner.check_memory_plan(settings, mesh, task=task, program=program)
    model = load_policy(settings, mesh)
    tasks.check_vocab(task, model.config.vocab_size)
    check_model_fits(
        task.prompt_tokens.shape[1], settings.max_new_tokens, model.config.max_position_embeddings
    )
    state = program.init_state(model)
    reward, reward_name = _reward_phase(settings, task, mesh, reward_fn, host_reward_fn, closers)
    update = program.update(state)
    sync = None
    if rollout_engine is None and settings.rollout.engine == "vllm":
        rollout_engine = step.VLLMEngine(
            program.graphdef,
            state.params,
            max_prompt_tokens=task.prompt_tokens.shape[1],
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.grpo.temperature,
            eos_ids=task.eos_ids,
            greedy=settings.rollout.greedy,
            settings=settings.vllm,
        )
        closers.append(rollout_engine.close)
    if rollout_engine is not None:
        # Another engine keeps its own weights: they follow every update.
        sync = step.WeightSync(rollout_engine)
        update = sync.after(update)
    task_config = settings.chain
    return Run(
        settings=settings,
        task=task,
        task_config=task_config,
        splits=None if task_config is None else tasks.build_splits(task_config),
        mesh=mesh,
        policy=model.config,
        program=program,
        state=state,
        plan=program.plan,
        rollout=program.rollout_function(task.prompt_tokens, task.prompt_lengths, sync),
        reward=reward,
        update=update,
        prompt_batches=_prompt_batches(settings, num_dataset_prompts),
        reward_name=reward_name,
        closers=tuple(closers),
    )
