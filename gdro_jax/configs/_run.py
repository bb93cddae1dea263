"""A run config read once: `read_run_config(config)` checks every field and returns `RunSettings`,
the typed record the trainer's layers take instead of a ConfigDict.

Every check names the field (`config.rollout_gdro.n_min`, `config.mesh`, ...) with what was
expected, before anything is built or written: positive sizes; the method and every controller
hyperparameter (the factories check their own); the rollout budget; the mesh against the devices;
the `R` slots against the batch axes and the mini-batches; the micro-batches; the GRPO update's,
the task's, the policy's and the optimizer's fields; the checkpoint and guard settings.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from gdro_jax import controllers, models, step, tasks
from gdro_jax.configs._parts import (
    ControllerSettings,
    OptimizerConfig,
    build_controllers,
    make_optimizer,
    policy_config,
)
from gdro_jax.configs._schema import check_known, complete, is_block, run_schema
from gdro_jax.step import GRPOConfig

TASK_KINDS = tasks.TASK_KINDS


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """`config.checkpoint`: where a run saves itself and how many it keeps."""

    enabled: bool
    every_steps: int
    keep: int
    snapshot_steps: tuple[int, ...] = ()  # the policy is also saved after these steps


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A run config, checked: what `build_run`, the step, the planner and the loop read.

    `config` is the whole config with every field of the schema (what checkpoints store and a
    resume compares); the other attributes are its fields, typed.
    """

    config: ml_collections.ConfigDict
    method: controllers.Method
    controllers: ControllerSettings  # the method, the classifier's and the parts' blocks
    # The method's composed decisions over the pool the config fixes (the chain task's
    # `pool_size` prompts), built once here; None for a math pool, known once it is read.
    decisions: controllers.MultiAdversary | None
    steps: int
    seed: int
    progress: bool
    tensorboard: bool
    num_prompts: int  # N
    n_mean: int
    max_new_tokens: int  # M
    reward_values: tuple[float, float]
    task_kind: str
    chain: tasks.ChainTaskConfig | None  # the chain task (task_kind "chain")
    math: tasks.MathTaskConfig | None  # the math task (task_kind "math")
    init_from: str
    tokenizer: str
    model: models.DecoderConfig | None  # a random policy's architecture; None with init_from
    compute_dtype: str
    remat: bool
    scan_layers: bool
    mesh: tuple[int, int, int]  # data, fsdp, tensor
    device_memory_gib: float | None
    checkpoint: CheckpointSettings
    optimizer: OptimizerConfig
    grpo: GRPOConfig
    # The engine, its micro-batch (None: all R slots at once, checked against the mesh),
    # batching and decode window, greedy decoding, the behaviour log-probs.
    rollout: step.RolloutConfig
    vllm: step.VLLMConfig
    max_consecutive_skips: int
    reward_timeout_s: float

    @functools.cached_property
    def policy(self) -> models.DecoderConfig:
        """The policy's architecture: `init_from`'s config.json (read when first asked, so a
        config can be checked where its weights are not), or the `model` block's."""
        return policy_config(self.config)

    @property
    def pool_size(self) -> int | None:
        """D of `decisions`: the chain task's pool; None for math."""
        return None if self.chain is None else self.chain.pool_size

    @property
    def num_slots(self) -> int:
        """R = N * n_mean rollout slots per step, whatever the allocation."""
        return self.num_prompts * self.n_mean


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    return value


def _built(block: str, factory, fields: Mapping[str, Any]):
    """`factory(**fields)`; its ValueError names the field under `config.<block>.`."""
    try:
        return factory(**fields)
    except ValueError as error:
        message = str(error).removeprefix("DecoderConfig.")
        raise ValueError(f"config.{block}.{message}") from None


def _rollout_budget(config: ml_collections.ConfigDict, method: controllers.Method) -> None:
    """N * n_mean rollouts must split with n_min <= n_i <= n_max (the allocation's own fields,
    n_min <= n_max included, are checked by its factory)."""
    part = method.rollout_allocation
    if part is None:
        return
    block = config[part]
    n_min, n_max = block.get("n_min"), block.get("n_max")
    if isinstance(n_min, int) and isinstance(n_max, int) and n_min <= n_max:
        if not n_min <= config.n_mean <= n_max:
            raise ValueError(
                f"the rollout budget is infeasible: N * n_mean = {config.num_prompts} * "
                f"{config.n_mean} rollouts cannot be split with n_min={n_min} <= n_i <= "
                f"n_max={n_max} per prompt; set config.n_mean inside [config.{part}.n_min, "
                f"config.{part}.n_max]"
            )


def mesh_shape_of(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """`(data, fsdp, tensor)` of a run config's `mesh` block, each a positive int."""
    mesh = config["mesh"]
    return tuple(_positive_int(mesh[axis], f"config.mesh.{axis}") for axis in models.MESH_AXES)


def _mesh(config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
    sizes = dict(zip(models.MESH_AXES, mesh_shape_of(config), strict=True))
    needed = math.prod(sizes.values())
    if needed > num_devices:
        raise ValueError(
            f"config.mesh data x fsdp x tensor = {sizes['data']} x {sizes['fsdp']} x "
            f"{sizes['tensor']} = {needed} devices, but only {num_devices} are available"
        )
    return tuple(sizes.values())


def _slots(config: ml_collections.ConfigDict, batch_shards: int) -> int | None:
    """Checks the R slots against the batch axes, the mini-batches and both micro-batches;
    returns the rollout micro-batch (None: all R at once)."""
    num_slots = config.num_prompts * config.n_mean
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
    chunk = config.rollout.micro_batch_slots
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0):
        raise ValueError(
            "config.rollout.micro_batch_slots must be None or an int >= 0 (0 or None: all "
            f"slots in one batch), got micro_batch_slots={chunk!r}"
        )
    if chunk and chunk < num_slots and chunk % batch_shards:
        raise ValueError(
            f"config.rollout.micro_batch_slots must be a multiple of the mesh's batch axes "
            f"(data x fsdp = {batch_shards}), so each chunk's slots split evenly over the "
            f"devices, got micro_batch_slots={chunk}"
        )
    accumulate = config.grpo.micro_batch_slots
    per_minibatch = num_slots // minibatches
    valid = isinstance(accumulate, int) and not isinstance(accumulate, bool) and accumulate > 0
    if valid and per_minibatch % accumulate == 0 and accumulate % batch_shards:
        # (GRPOConfig and make_update refuse sizes that are not positive or do not divide.)
        raise ValueError(
            f"config.grpo.micro_batch_slots must be a multiple of the mesh's batch axes "
            f"(data x fsdp = {batch_shards}), or every device would compute the whole "
            f"micro-batch, got micro_batch_slots={accumulate}"
        )
    return chunk or None


def _rollout(config: ml_collections.ConfigDict, grpo: GRPOConfig):
    """The rollout block's `(RolloutConfig, VLLMConfig)`. With engine vllm, checks that vLLM is
    installed and can serve the policy's head width, before a run writes anything."""
    fields = {name: value for name, value in config.rollout.to_dict().items() if name != "vllm"}
    rollout = _built("rollout", step.RolloutConfig, fields)
    vllm = _built("rollout.vllm", step.VLLMConfig, config.rollout.vllm.to_dict())
    if rollout.greedy and grpo.temperature != 1.0:
        raise ValueError(
            "config.rollout.greedy decodes with log-probs under temperature 1, which the update "
            f"divides by: set config.grpo.temperature=1.0, got {grpo.temperature!r}"
        )
    if rollout.engine == "vllm":
        if jax.process_count() > 1:
            raise ValueError(
                "config.rollout.engine='vllm' samples in one process (vLLM in the trainer's "
                f"process); this run has {jax.process_count()}: use engine='kv_cache'"
            )
        step.check_vllm_installed()
        if config.init_from:
            head_dim = models.DecoderConfig.from_hf_config(
                models.read_hf_config(config.init_from)
            ).head_dim
        else:
            head_dim = config.model.head_dim
        try:
            step.check_vllm_model(head_dim)
        except ValueError as error:
            raise ValueError(f"config.rollout.engine='vllm': {error}") from None
    return rollout, vllm


def _checkpoint(block: ml_collections.ConfigDict) -> CheckpointSettings:
    every_steps, keep = block.every_steps, block.keep
    for name, value in (("every_steps", every_steps), ("keep", keep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.checkpoint.{name} must be an int >= 1, got {name}={value!r}")
    snapshots = block.get("snapshot_steps", ()) or ()
    if not isinstance(snapshots, list | tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in snapshots
    ):
        raise ValueError(
            "config.checkpoint.snapshot_steps must be a tuple of ints >= 1, got "
            f"snapshot_steps={snapshots!r}"
        )
    return CheckpointSettings(bool(block.enabled), every_steps, keep, tuple(sorted(set(snapshots))))


def _max_skips(block: ml_collections.ConfigDict) -> int:
    limit = block.max_consecutive_skips
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(
            "config.guards.max_consecutive_skips must be an int >= 0, got "
            f"max_consecutive_skips={limit!r}"
        )
    return limit


def _budget(gib: Any) -> float | None:
    if gib is None:
        return None
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not gib > 0:
        raise ValueError(
            "config.device_memory_gib must be None (no limit) or a positive number of GiB, got "
            f"device_memory_gib={gib!r}"
        )
    return float(gib)


def task_kind(config: Mapping[str, Any]) -> str:
    """A run (or warm-start) config's task: `task_kind`, "chain" when it has none."""
    kind = config.get("task_kind", "chain")
    if kind not in TASK_KINDS:
        raise ValueError(f"config.task_kind must be one of {TASK_KINDS}, got task_kind={kind!r}")
    return kind


def tokenizer_folder(config: Mapping[str, Any]) -> str:
    """The folder of a math run's tokenizer: `tokenizer`, else the one in `init_from`."""
    folder = config.get("tokenizer") or config.get("init_from")
    if not folder:
        raise ValueError(
            "the math task needs a tokenizer: set config.tokenizer or config.init_from to a "
            "folder with the tokenizer files"
        )
    return folder


def chain_task_config(config: Mapping[str, Any]) -> tasks.ChainTaskConfig:
    """The chain task of a run or warm-start config (its `task` block), e.g. as a run's
    `config.json` or a checkpoint stores it."""
    block = config.get("task")
    if not is_block(block):
        raise ValueError("the config has no task block")
    fields = block.to_dict() if hasattr(block, "to_dict") else dict(block)
    return _built("task", tasks.ChainTaskConfig, fields)


def read_run_config(
    config: Mapping[str, Any] | RunSettings,
    *,
    num_devices: int | None = None,
    needs_tokenizer: bool = True,
) -> RunSettings:
    """Checks a run config and returns its `RunSettings` (module docstring).

    Args:
      config: a run config (`experiments/configs/tiny_cpu.py`, `paper_qwen3_*.py`); a field it
        leaves out takes the schema's default (`configs.run_config()`). `RunSettings` are
        returned as they are (already checked).
      num_devices: the devices the mesh may use (default: `jax.device_count()`).
      needs_tokenizer: a math run must name its tokenizer (`tokenizer` or `init_from`); False
        for what needs only shapes (a memory plan).

    Returns:
      The `RunSettings`; `settings.config` holds every field.

    Raises:
      ValueError: naming the first field that cannot work (an unknown one with its nearest
        valid names).
    """
    if isinstance(config, RunSettings):
        return config
    schema = run_schema()
    check_known(config, schema)
    config = complete(config, schema)
    num_prompts = _positive_int(config.num_prompts, "config.num_prompts")
    _positive_int(config.n_mean, "config.n_mean")
    _positive_int(config.max_new_tokens, "config.max_new_tokens")
    if isinstance(config.steps, bool) or not isinstance(config.steps, int) or config.steps < 0:
        raise ValueError(f"config.steps must be an int >= 0, got config.steps={config.steps!r}")
    controller_settings = ControllerSettings.from_config(config)
    method = controller_settings.method
    _rollout_budget(config, method)
    if config.model.param_dtype != "float32":
        raise ValueError(
            "config.model.param_dtype must be float32 (the master weights the optimizer updates: "
            "an AdamW step at lr 1e-6 is below bfloat16's 2^-8 resolution and would be rounded "
            f"away); compute in bfloat16 with config.model.compute_dtype, got "
            f"param_dtype={config.model.param_dtype!r}"
        )
    mesh = _mesh(config, jax.device_count() if num_devices is None else num_devices)
    micro_batch_slots = _slots(config, mesh[0] * mesh[1])
    max_skips = _max_skips(config.guards)
    grpo = _built("grpo", GRPOConfig, config.grpo.to_dict())
    rollout, vllm = _rollout(config, grpo)
    kind = task_kind(config)
    chain = math_task = None
    if kind == "chain":
        chain = _built("task", tasks.ChainTaskConfig, config.task.to_dict())
    else:
        math_task = _built("math", tasks.MathTaskConfig, config.math.to_dict())
    if kind == "math" and needs_tokenizer:
        tokenizer_folder(config)
    # The factories check their fields. A math pool's size is known once the data is read: its
    # decisions are built then (by `step_program`), these only checked.
    pool_size = chain.pool_size if chain is not None else None
    decisions = build_controllers(controller_settings, pool_size or num_prompts)
    model = None
    if not config.init_from:
        model = _built("model", models.DecoderConfig.from_dict, {"fields": config.model.to_dict()})
    optimizer = OptimizerConfig.from_block(config.optimizer)
    _built("optimizer", make_optimizer, {"optimizer": optimizer})
    return RunSettings(
        config=config,
        method=method,
        controllers=controller_settings,
        decisions=decisions if pool_size is not None else None,
        steps=config.steps,
        seed=config.seed,
        progress=bool(config.progress),
        tensorboard=bool(config.tensorboard),
        num_prompts=num_prompts,
        n_mean=config.n_mean,
        max_new_tokens=config.max_new_tokens,
        reward_values=tuple(float(v) for v in config.reward_values),
        task_kind=kind,
        chain=chain,
        math=math_task,
        init_from=config.init_from,
        tokenizer=config.tokenizer,
        model=model,
        compute_dtype=config.model.compute_dtype,
        remat=bool(config.model.remat),
        scan_layers=bool(config.model.scan_layers),
        mesh=mesh,
        device_memory_gib=_budget(config.device_memory_gib),
        checkpoint=_checkpoint(config.checkpoint),
        optimizer=optimizer,
        grpo=grpo,
        rollout=dataclasses.replace(rollout, micro_batch_slots=micro_batch_slots),
        vllm=vllm,
        max_consecutive_skips=max_skips,
        reward_timeout_s=float(config.reward_timeout_s or 0.0),
    )
