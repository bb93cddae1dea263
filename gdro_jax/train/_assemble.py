"""`build_run`: a config in, everything a run needs out (task, policy, controllers, jitted phases).

    plan    jit(gdro.plan)                     replicated out
    rollout jit(KVCacheEngine.generate)        slots on the batch axes (or another RolloutEngine)
    reward  jit(device reward) or a host call  under config.reward_timeout_s
    update  jit(make_update), state donated    explicit out shardings

The task is used as given: a reward passed to `build_run` replaces the task's inside the `Run`,
never on the task itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax import controllers, models, tasks
from gdro_jax.models import fit_spec
from gdro_jax.tasks import RewardFn, RLTask
from gdro_jax.train._components import (
    build_controllers,
    make_optimizer,
    mesh_from_config,
    num_bins,
)
from gdro_jax.train._distributed import to_host
from gdro_jax.train._guards import (
    HostRewardCaller,
    check_model_fits,
    micro_batch_slots,
    validate_config,
)
from gdro_jax.train._plan import check_memory_plan
from gdro_jax.train._rollouts import KVCacheEngine, RolloutEngine, Rollouts, WeightSync
from gdro_jax.train._state import TrainState, init_train_state, state_shardings
from gdro_jax.train._step import GRPOConfig, make_update


class Run(NamedTuple):
    """Everything one training run needs, built once by `build_run`. Call `close()` when done."""

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
    reward_name: str  # how reward errors name the reward function
    closers: tuple[Callable[[], None], ...]  # what `close` stops (grader workers, reward thread)

    def close(self) -> None:
        """Stops the math grader's workers and the host reward's thread, if any."""
        for close in self.closers:
            close()


def batch_sharding(mesh, shape: tuple[int, ...]) -> NamedSharding | None:
    """Leading (batch) axis on `data` x `fsdp`, fitted to the shape; None without a mesh."""
    if mesh is None:
        return None
    spec = fit_spec(P(("data", "fsdp")), shape, dict(mesh.shape))
    return NamedSharding(mesh, spec)


def _constrain(mesh, tree):
    """Places every leaf's leading axis on the batch axes (inside jit)."""
    if mesh is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape)), tree
    )


def as_device_rewards(rewards_R, correct_R, sharding) -> tuple[jax.Array, jax.Array]:
    """Host rewards as device arrays, placed like the rollouts when a sharding is given."""
    rewards_R = jnp.asarray(rewards_R, jnp.float32)
    correct_R = jnp.asarray(correct_R, bool)
    if sharding is not None:
        rewards_R = jax.device_put(rewards_R, sharding)
        correct_R = jax.device_put(correct_R, sharding)
    return rewards_R, correct_R


def _load_policy(config: ml_collections.ConfigDict, mesh) -> models.Decoder:
    """The policy with float32 master parameters and `config.model.compute_dtype` activations.

    `init_from` checkpoints of any stored dtype are read into float32; the optimizer state
    follows the parameters, so AdamW's small steps (lr 1e-6) are never rounded away.
    """
    if config.init_from:
        compute_dtype = config.model.get("compute_dtype", "float32")
        return models.from_pretrained(
            config.init_from,
            dtype="float32",
            compute_dtype=compute_dtype,
            mesh=mesh,
            # The checkpoint fixes the architecture; how it runs comes from the config.
            remat=config.model.get("remat", False),
            scan_layers=config.model.get("scan_layers", True),
        )
    model_config = models.DecoderConfig(**config.model.to_dict())
    return models.init_decoder(model_config, seed=config.seed, mesh=mesh)


def _device_reward_phase(reward_fn: RewardFn, mesh) -> Callable:
    """The reward phase for a jittable `(ids, tokens, lengths, prompt_of_slot)` reward."""

    @jax.jit
    def reward(prompt_ids, rollouts: Rollouts, plan: controllers.Plan) -> Rollouts:
        rewards_R, correct_R = reward_fn(
            prompt_ids, rollouts.tokens, rollouts.lengths, plan.prompt_of_slot
        )
        scored = rollouts._replace(
            rewards=jnp.asarray(rewards_R, jnp.float32), correct=jnp.asarray(correct_R, bool)
        )
        return _constrain(mesh, scored)

    return reward


def _host_reward_phase(caller: HostRewardCaller, mesh, num_slots: int) -> Callable:
    """The reward phase for a numpy reward: device -> host -> checked -> device."""
    slot_sharding = batch_sharding(mesh, (num_slots,))

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
    ids_N = to_host(prompt_ids)  # replicated: every process holds all of them
    prompt_of_slot_R = to_host(plan.prompt_of_slot)
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


def _rollout_phase(
    config, task: RLTask, graphdef, grpo_config: GRPOConfig, mesh, sync: WeightSync | None = None
) -> Callable:
    """The built-in KV-cache sampler in one jit, or `sync.engine` (passed to `build_run`) called
    eagerly after syncing its weights when the parameters changed (e.g. a resumed state)."""
    prompt_tokens = jnp.asarray(task.prompt_tokens)
    prompt_lengths = jnp.asarray(task.prompt_lengths)
    if sync is not None:

        def external_rollout(params, plan, prompt_ids, key):
            sync(params)
            result = sync.engine.generate(
                params, plan, prompt_tokens[prompt_ids], prompt_lengths[prompt_ids], key
            )
            return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.shape)), result)

        return external_rollout
    engine = KVCacheEngine(
        graphdef,
        max_new_tokens=config.max_new_tokens,
        temperature=grpo_config.temperature,
        eos_ids=task.eos_ids,
        micro_batch_slots=micro_batch_slots(config),
    )

    @jax.jit
    def rollout(params, plan, prompt_ids, key):
        result = engine.generate(
            params, plan, prompt_tokens[prompt_ids], prompt_lengths[prompt_ids], key
        )
        return _constrain(mesh, result)

    return rollout


def _prompt_batches(config, num_dataset_prompts: int):
    """An endless, seeded, shuffled grain iterator of [N] prompt indices (resumable)."""
    dataset = (
        grain.MapDataset.range(num_dataset_prompts)
        .shuffle(seed=config.seed)
        .repeat(None)
        .batch(config.num_prompts, drop_remainder=True)
    )
    return iter(dataset.to_iter_dataset())


def build_run(
    config: ml_collections.ConfigDict,
    *,
    reward_fn: RewardFn | None = None,
    host_reward_fn: RewardFn | None = None,
    rollout_engine: RolloutEngine | None = None,
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
      rollout_engine: what samples the rollouts (a `RolloutEngine`); default the built-in
        `KVCacheEngine`, fused into the jitted rollout phase. Another engine is called outside
        jit and its `sync_weights` gets the parameters after every update.

    Returns:
      The `Run`. Call `run.close()` when done (it stops the math grader's workers).
    """
    validate_config(config)
    if reward_fn is not None and host_reward_fn is not None:
        raise ValueError("pass reward_fn (jittable) or host_reward_fn (numpy), not both")
    task_config = splits = None
    if tasks.task_kind(config) == "chain":
        task_config = tasks.ChainTaskConfig(**config.task.to_dict())
        splits = tasks.build_splits(task_config)
        task = tasks.chain_task(config, task_config)
    else:
        task = tasks.math_task(config)
    closers = [task.close]
    try:
        return _assemble(
            config, task, task_config, splits, reward_fn, host_reward_fn, closers, rollout_engine
        )
    except BaseException:
        for close in closers:
            close()
        raise


def _assemble(
    config, task, task_config, splits, reward_fn, host_reward_fn, closers, rollout_engine=None
) -> Run:
    num_dataset_prompts = task.num_prompts
    if config.num_prompts > num_dataset_prompts:
        raise ValueError(
            f"num_prompts={config.num_prompts} per step is more than the pool's "
            f"{num_dataset_prompts} prompts"
        )
    mesh = mesh_from_config(config)
    check_memory_plan(config, mesh, task=task)  # with device_memory_gib: fails before allocating
    model = _load_policy(config, mesh)
    tasks.check_vocab(task, model.config.vocab_size)
    check_model_fits(
        task.prompt_tokens.shape[1], config.max_new_tokens, model.config.max_position_embeddings
    )
    grpo_config = GRPOConfig(**config.grpo.to_dict())
    gdro, prompt_adversary = build_controllers(config, num_dataset_prompts)
    tx = make_optimizer(config.optimizer)
    graphdef, state = init_train_state(
        model, tx, gdro, seed=config.seed, with_reference=grpo_config.kl_coef > 0
    )

    reward_name = f"of the {task.kind} task"
    if reward_fn is not None or host_reward_fn is not None:
        kind = "reward_fn" if reward_fn is not None else "host_reward_fn"
        reward_name = f"{kind} (passed to build_run)"
    device_reward = task.device_reward if reward_fn is None else reward_fn
    host_reward = task.host_reward if host_reward_fn is None else host_reward_fn
    if device_reward is not None and host_reward_fn is None:
        reward = _device_reward_phase(device_reward, mesh)
    else:
        caller = HostRewardCaller(host_reward, reward_name, config.get("reward_timeout_s", 0.0))
        closers.append(caller.close)
        reward = _host_reward_phase(caller, mesh, config.num_prompts * config.n_mean)

    update_fn = make_update(
        graphdef,
        tx,
        gdro,
        grpo_config,
        num_prompts=config.num_prompts,
        num_bins=num_bins(config),
        prompt_adversary=prompt_adversary,
    )
    replicated = None if mesh is None else NamedSharding(mesh, P())
    update = jax.jit(
        update_fn, donate_argnums=0, out_shardings=(state_shardings(state), replicated)
    )
    sync = None if rollout_engine is None else WeightSync(rollout_engine)
    return Run(
        config=config,
        task=task,
        task_config=task_config,
        splits=splits,
        mesh=mesh,
        graphdef=graphdef,
        state=state,
        gdro=gdro,
        plan=jax.jit(gdro.plan, out_shardings=replicated),
        rollout=_rollout_phase(config, task, graphdef, grpo_config, mesh, sync),
        reward=reward,
        update=update if sync is None else sync.after(update),
        prompt_batches=_prompt_batches(config, num_dataset_prompts),
        reward_name=reward_name,
        closers=tuple(closers),
    )
