"""The policy of a training checkpoint, for evaluation or export.

`policy_from_checkpoint(workdir)` rebuilds the run from the config stored in the newest
checkpoint whose meta is readable, restores the newest usable checkpoint into it, and returns the
policy with the task's tokenizer. It only reads: unlike a resume, damaged checkpoints are skipped
in place (a warning names each) and nothing in the workdir is moved or written.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections
from flax import nnx

from gdro_jax.models import Decoder
from gdro_jax.train._assemble import build_run
from gdro_jax.train._checkpoint import (
    CHECKPOINT_DIR,
    abstract_state,
    checkpoint_manager,
    restore_checkpoint,
    saved_config,
)


def policy_from_checkpoint(workdir: str | os.PathLike) -> tuple[Decoder, Any, int]:
    """Returns `(model, tokenizer, step)` from the newest usable checkpoint of a training run.

    Args:
      workdir: the run's work directory (the one holding `checkpoints/`).

    Raises:
      FileNotFoundError: `workdir` has no checkpoint folder, or no checkpoint with a readable
        config in it.
      CheckpointError: no checkpoint can be restored (each is named with its error).
    """
    directory = os.path.join(os.fspath(workdir), CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{os.fspath(workdir)!r} holds no {CHECKPOINT_DIR}/ folder")
    manager = checkpoint_manager(directory, keep=1, read_only=True)
    try:
        saved = saved_config(manager)
        if saved is None:
            raise FileNotFoundError(f"{directory!r} holds no checkpoint")
        config = ml_collections.ConfigDict(saved[1])
        config.progress = False
        run = build_run(config)
        try:
            checkpoint = restore_checkpoint(
                manager, abstract_state(run.state), run.prompt_batches, set_aside=False
            )
        finally:
            run.close()
        return nnx.merge(run.graphdef, checkpoint.state.params), run.task.tokenizer, checkpoint.step
    finally:
        manager.close()
