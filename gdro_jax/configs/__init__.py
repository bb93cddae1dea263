"""The config layer: every read of a run's ConfigDict happens here, once.

- One schema per config kind (`run_schema`, `pretrain_schema`): every field with its default and
  a line of help. `run_config()` / `pretrain_config()` hold every field, so a documented
  `--config.X=...` override works on any shipped config; `complete` fills the fields an older or
  hand-built config leaves out; `unknown_fields` names a misspelt one with its nearest names.
- `read_run_config(config)` checks a run config once and returns `RunSettings`, the typed record
  the step, the planner, the checkpoints and the loop read.
- The parts read off a config: `build_controllers` (from the method's record in
  `controllers.METHODS`), `make_optimizer`, `policy_config` (the policy's architecture without
  its weights), `run_mesh`.
- `RESUMABLE_FIELDS` and `check_resumable`: which changes a resumed run may make.
"""

from gdro_jax.configs._parts import (
    ControllerSettings,
    OptimizerConfig,
    build_controllers,
    make_optimizer,
    policy_config,
    policy_overrides,
    run_mesh,
    step_program,
    takes_prompt_features,
)
from gdro_jax.configs._resumable import (
    RESUMABLE_FIELDS,
    check_resumable,
    config_dict,
    config_differences,
)
from gdro_jax.configs._run import (
    TASK_KINDS,
    CheckpointSettings,
    RunSettings,
    chain_task_config,
    mesh_shape_of,
    read_run_config,
    task_kind,
    tokenizer_folder,
)
from gdro_jax.configs._schema import (
    RUN_LEVEL_ARGUMENTS,
    Field,
    canonical,
    check_known,
    complete,
    config_from_schema,
    describe,
    from_dataclass,
    nearest,
    pretrain_schema,
    run_schema,
    unknown_fields,
)


def run_config():
    """A run config holding every field at its default: the chain task, a tiny random policy,
    GRPO with the paper's controller settings. Shipped configs start from it."""
    return config_from_schema(run_schema())


def pretrain_config():
    """A warm-start config holding every field at its default (`experiments/configs/
    pretrain_tiny.py` starts from it)."""
    return config_from_schema(pretrain_schema())


__all__ = [
    "ControllerSettings",
    "RUN_LEVEL_ARGUMENTS",
    "RESUMABLE_FIELDS",
    "TASK_KINDS",
    "CheckpointSettings",
    "Field",
    "OptimizerConfig",
    "RunSettings",
    "build_controllers",
    "takes_prompt_features",
    "canonical",
    "chain_task_config",
    "check_known",
    "check_resumable",
    "complete",
    "config_dict",
    "config_differences",
    "config_from_schema",
    "describe",
    "from_dataclass",
    "make_optimizer",
    "mesh_shape_of",
    "nearest",
    "policy_config",
    "policy_overrides",
    "pretrain_config",
    "pretrain_schema",
    "read_run_config",
    "run_config",
    "run_mesh",
    "step_program",
    "run_schema",
    "task_kind",
    "tokenizer_folder",
    "unknown_fields",
]
