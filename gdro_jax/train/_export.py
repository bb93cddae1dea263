"""The policy of a training checkpoint, for evaluation or export.

`policy_from_checkpoint(workdir)` rebuilds the run from the config stored in the newest usable
checkpoint of `workdir/checkpoints/`, restores its state there, and returns the policy with the
task's tokenizer. It reads only: unlike a resume, damaged checkpoints are skipped in place (a
warning names each) and nothing in the workdir is moved or written.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from gdro_jax.models import Decoder
from gdro_jax.train._checkpoint import (
    CHECKPOINT_DIR,
    CheckpointError,
    _restore_step,
    abstract_state,
    checkpoint_manager,
    step_path,
)
from gdro_jax.train._loop import build_run


def policy_from_checkpoint(workdir: str | os.PathLike) -> tuple[Decoder, Any, int]:
    """Returns `(model, tokenizer, step)` from the newest usable checkpoint of a training run.

    Args:
      workdir: the run's work directory (the one holding `checkpoints/`).

    Raises:
      FileNotFoundError: `workdir` has no checkpoint folder or no checkpoint in it.
      CheckpointError: no checkpoint can be restored (each is named with its error).
    """
    directory = os.path.join(os.fspath(workdir), CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{os.fspath(workdir)!r} holds no {CHECKPOINT_DIR}/ folder")
    manager = checkpoint_manager(directory, keep=1_000_000)  # keep all: this only reads
    try:
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"{directory!r} holds no checkpoint")
        failures = []
        run = None
        for step in steps:
            try:
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
                meta = meta["meta"]
                config = ml_collections.ConfigDict(meta["config"])
                config.progress = False
                if run is None:
                    run = build_run(config)
                checkpoint = _restore_step(
                    manager, step, abstract_state(run.state), run.prompt_batches
                )
            except Exception as error:  # noqa: BLE001 (try an older step, as a resume does)
                failures.append(f"{step_path(manager, step)}: {type(error).__name__}: {error}")
                logging.warning("skipping checkpoint %s", failures[-1][:2000])
                continue
            model = nnx.merge(run.graphdef, checkpoint.state.params)
            run.task.close()
            return model, run.task.tokenizer, checkpoint.step
        if run is not None:
            run.task.close()
        raise CheckpointError(f"no checkpoint in {directory} can be read: " + "; ".join(failures))
    finally:
        manager.close()
