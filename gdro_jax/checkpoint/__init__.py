"""Orbax checkpoints over any pytree, with a checksum of every leaf, and a run's policy alone.

- `checkpoint_manager`, `save_checkpoint`, `restore_checkpoint` (the newest usable step, damaged
  ones reported and set aside), `abstract_state` (a restore target that frees the fresh arrays
  first), `saved_meta`, `state_checksums`.
- `restore_policy(workdir)`: a training run's policy from its newest checkpoint, on one device
  or any mesh, without building the run (its task, data, grader or optimizer).
"""

from gdro_jax.checkpoint._orbax import (
    CHECKPOINT_DIR,
    CORRUPT_DIR,
    FORMAT_VERSION,
    Checkpoint,
    CheckpointError,
    abstract_state,
    checkpoint_manager,
    restore_checkpoint,
    save_checkpoint,
    saved_meta,
    state_checksums,
    step_path,
)
from gdro_jax.checkpoint._policy import (
    RestoredPolicy,
    checkpoint_directory,
    policy_architecture,
    restore_policy,
)

__all__ = [
    "CHECKPOINT_DIR",
    "CORRUPT_DIR",
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "RestoredPolicy",
    "abstract_state",
    "checkpoint_directory",
    "checkpoint_manager",
    "policy_architecture",
    "restore_checkpoint",
    "restore_policy",
    "save_checkpoint",
    "saved_meta",
    "state_checksums",
    "step_path",
]
