"""Resuming a run: opening its checkpoints (refusing another run's) and restoring the newest
usable one into a freshly built run.

A run may resume only under a config that changes nothing but `configs.RESUMABLE_FIELDS`; any
other difference is refused by field before a file of the workdir is touched, so two runs are
never mixed.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from gdro_jax import checkpoint, configs
from gdro_jax.checkpoint import CheckpointError


def open_checkpoints(settings: configs.RunSettings, workdir):
    """The checkpoint manager (None when disabled), after checking the saved config matches."""
    directory = os.path.join(workdir, checkpoint.CHECKPOINT_DIR)
    if not settings.checkpoint.enabled:
        if os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory)):
            raise ValueError(
                f"{directory} holds checkpoints of a run but checkpoint.enabled is False; enable "
                "checkpoints to resume that run, or use a new workdir"
            )
        return None
    manager = checkpoint.checkpoint_manager(directory, keep=settings.checkpoint.keep)
    try:
        saved = checkpoint.saved_meta(manager)
        if saved is not None:
            configs.check_resumable(saved[1]["config"], settings.config, saved[0])
    except BaseException:
        manager.close()
        raise
    return manager


def _same_step(state, meta: dict[str, Any]) -> None:
    if int(state.step) != meta["step"]:
        raise ValueError(f"the state holds step {int(state.step)}")


def resume(run, manager) -> tuple[Any, checkpoint.Checkpoint | None]:
    """Restores the newest usable checkpoint into `run` (its state and data position)."""
    if manager is None or not manager.all_steps():
        return run, None
    template = checkpoint.abstract_state(run.state)
    # Drops the fresh arrays before restoring, so the parameters are never held twice.
    run = run._replace(state=template)
    resumed = checkpoint.restore_checkpoint(manager, template, run.prompt_batches, check=_same_step)
    if resumed is None:
        raise CheckpointError(f"{manager.directory} lost its checkpoints while resuming")
    configs.check_resumable(resumed.meta["config"], run.settings.config, resumed.path)
    logging.info("resuming from %s (step %d)", resumed.path, resumed.step)
    return run._replace(state=resumed.state), resumed
