"""Resuming a run: which config changes a resume allows, and restoring into a freshly built run.

A checkpoint stores the run's config; a run that wants to resume from it may change only the
`RESUMABLE_FIELDS` (they do not change what the steps compute). Anything else is refused by
field before a file of the workdir is touched, so two runs are never mixed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from gdro_jax.models import CheckpointError
from gdro_jax.train._checkpoint import (
    CHECKPOINT_DIR,
    Checkpoint,
    abstract_state,
    checkpoint_manager,
    config_dict,
    restore_checkpoint,
    saved_config,
)

# Config fields a resumed run may change: they do not change what the steps compute.
RESUMABLE_FIELDS = (
    "steps",
    "progress",
    "tensorboard",
    "checkpoint",
    "eval",
    "guards",
    "reward_timeout_s",
    "rollout.micro_batch_slots",
    "device_memory_gib",
    # Sums the same gradient in another order: the update up to float32 rounding, not bit for bit.
    "grpo.micro_batch_slots",
    "grpo.logprob_chunk_tokens",
    "math.data_dir",
    "math.grader_workers",
    "math.grader_timeout_s",
)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        flat: dict[str, Any] = {}
        for name, value in tree.items():
            flat.update(_flatten(value, f"{prefix}{name}."))
        return flat
    return {prefix[:-1]: tree}


def config_differences(saved: Mapping[str, Any], config: ml_collections.ConfigDict) -> list[str]:
    """Fields (dotted) whose value differs between a saved config and `config`.

    Fields in `RESUMABLE_FIELDS` (and below them) are ignored: a resumed run may change them.
    """
    old, new = _flatten(saved), _flatten(config_dict(config))

    def resumable(name: str) -> bool:
        return any(name == f or name.startswith(f + ".") for f in RESUMABLE_FIELDS)

    return [
        f"{name}: saved {old.get(name, '<absent>')!r}, now {new.get(name, '<absent>')!r}"
        for name in sorted(set(old) | set(new))
        if not resumable(name) and old.get(name, "<absent>") != new.get(name, "<absent>")
    ]


def check_config(saved: Mapping[str, Any], config: ml_collections.ConfigDict, where: str) -> None:
    """Raises a ValueError naming every field that makes `config` a different run.

    Args:
      saved: the config stored in a checkpoint (`config_dict` form).
      config: the config of the run that wants to resume from it.
      where: the checkpoint's folder, for the message.
    """
    differences = config_differences(saved, config)
    if differences:
        raise ValueError(
            f"the checkpoint {where} was written by a run with another config; resuming would mix "
            f"two runs. Differing fields: {'; '.join(differences)}. Use a new workdir, or the "
            "saved config (only " + ", ".join(RESUMABLE_FIELDS) + " may change on resume)."
        )


def open_checkpoints(config, workdir, *, enabled: bool, keep: int):
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


def resume(run, config, manager) -> tuple[Any, Checkpoint | None]:
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
