"""The policy alone from a training run's checkpoint, for evaluation and export.

`restore_policy(path)` reads the newest checkpoint's meta (the run's config and the policy's
architecture), builds the policy's abstract parameters on the mesh asked for (one device by
default, whatever mesh the run trained on), and restores only the parameters: no task, no
training data, no grader, no optimizer state, and never the run's `init_from` folder. The
restored leaves are checked against the checkpoint's checksums. It only reads: a damaged
checkpoint is skipped in place (a warning names it) and the previous one is tried.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from gdro_jax import configs, models
from gdro_jax.checkpoint._orbax import (
    CHECKPOINT_DIR,
    FORMAT_VERSION,
    CheckpointError,
    _abstract_leaf,
    _lookup,
    _named_leaves,
    _nest,
    checkpoint_manager,
    saved_meta,
    state_checksums,
    step_path,
)


class RestoredPolicy(NamedTuple):
    """A training checkpoint's policy."""

    model: models.Decoder  # placed on the mesh asked for (one device by default)
    step: int  # the completed RL steps of the checkpoint
    config: dict[str, Any]  # the run's config, as the checkpoint stores it
    path: str  # the checkpoint's step folder


def checkpoint_directory(path: str | os.PathLike) -> str:
    """The `checkpoints/` folder of a run's work directory, or `path` when it is that folder."""
    path = os.fspath(path)
    inside = os.path.join(path, CHECKPOINT_DIR)
    return inside if os.path.isdir(inside) else path


def policy_architecture(meta: dict[str, Any]) -> models.DecoderConfig:
    """The policy's architecture from a checkpoint's meta: the one it stores, or (checkpoints
    written before it did) the one its run config implies (`configs.policy_config`)."""
    if "policy" in meta:
        return models.DecoderConfig.from_dict(meta["policy"])
    return configs.policy_config(configs.complete(meta["config"], configs.run_schema()))


def _restore_parameters(manager, step: int, template) -> Any:
    """The `params` subtree of checkpoint `step`'s state, into `template`'s shardings."""
    named, treedef = _named_leaves({"params": template})
    target = _nest((p, _abstract_leaf(x)) for p, x in named)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True
            ),
            meta=ocp.args.JsonRestore(),
        ),
    )
    meta = restored["meta"]
    if meta.get("format") != FORMAT_VERSION or meta.get("step") != step:
        raise ValueError(f"meta names format {meta.get('format')} step {meta.get('step')}")
    leaves = [_lookup(restored["state"], path) for path, _ in named]
    params = jax.tree_util.tree_unflatten(treedef, leaves)
    got = state_checksums(params)
    bad = [name for name, sums in got.items() if meta["checksums"].get(name) != sums]
    if bad:
        raise ValueError(f"leaf checksums differ for {bad[:5]}{' ...' if len(bad) > 5 else ''}")
    return params["params"], meta


def restore_policy(path: str | os.PathLike, *, mesh: Mesh | None = None) -> RestoredPolicy:
    """The policy of the newest usable checkpoint of a training run.

    Args:
      path: the run's work directory (holding `checkpoints/`), or its `checkpoints/` folder.
      mesh: a `data` x `fsdp` x `tensor` mesh to place the parameters on; None: one device
        (any run opens on one device, whatever mesh it trained on).

    Returns:
      The `RestoredPolicy`: the model (with the run's compute dtype, float32 parameters), its
      step and the run's config.

    Raises:
      FileNotFoundError: `path` holds no checkpoint with a readable meta.
      CheckpointError: no checkpoint can be restored (each is named with its error).
    """
    directory = checkpoint_directory(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{os.fspath(path)!r} holds no {CHECKPOINT_DIR}/ folder")
    manager = checkpoint_manager(directory, keep=1, read_only=True)
    try:
        found = saved_meta(manager)
        if found is None:
            raise FileNotFoundError(f"{directory!r} holds no checkpoint")
        architecture = policy_architecture(found[1])
        abstract = models.abstract_decoder(architecture, mesh=mesh)
        graphdef, params = nnx.split(abstract, nnx.Param)
        if mesh is None:
            device = SingleDeviceSharding(jax.local_devices()[0])
            shardings = jax.tree.map(lambda _: device, params)
        else:
            shardings = models.parameter_shardings(abstract, mesh)
        template = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            params,
            shardings,
        )
        failures = []
        for step in sorted(manager.all_steps(), reverse=True):
            try:
                restored, meta = _restore_parameters(manager, step, template)
            except Exception as error:  # noqa: BLE001 (any failure: report it, try an older one)
                where, why = step_path(manager, step), f"{type(error).__name__}: {error}"
                failures.append(f"{where}: {why}")
                logging.warning("checkpoint %s cannot be restored (%s)", where, why[:2000])
                continue
            model = nnx.merge(graphdef, restored)
            return RestoredPolicy(model, step, meta["config"], step_path(manager, step))
        raise CheckpointError(
            f"no checkpoint in {directory} can be restored: " + "; ".join(f[:500] for f in failures)
        )
    finally:
        manager.close()


__all__ = ["RestoredPolicy", "checkpoint_directory", "policy_architecture", "restore_policy"]
