"""Checkpoints with orbax over any pytree: save, restore and checksums.

The trainer's use (`gdro_jax.train`): exact resume of a run after a crash, a kill or a
preemption; the resume rules live in `configs.check_resumable`, the metrics cursor in the
trainer's log writers, signal handling in its loop.

One checkpoint is one orbax step folder `<directory>/<step>/` with up to three items:

    state  the pytree (for a run: the whole `TrainState`), saved leaf by leaf under its pytree
           path; typed PRNG keys as their key data
    data   a grain iterator's position (grain's own orbax handler), when one is given
    meta   JSON: the caller's fields (a run's config, its metrics cursor, the policy's
           architecture), the format, the step and a checksum of every state leaf

Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it when every item is on disk,
so a process killed mid-write leaves the previous checkpoint as the latest complete one (the
temporary folder is removed when the next manager opens). A step folder that fails to restore
(missing or truncated files, garbled bytes caught by tensorstore or by the leaf checksums) is
reported by name and the previous step is tried; once an older step is restored the unusable
newer ones are moved to `workdir/checkpoints_corrupt/` (kept for inspection, never deleted) so
the resumed run can write those steps again.

Checksums: orbax does not checksum array bytes, so a garbled byte inside an uncompressed chunk
would restore silently. Each leaf's bits are summed as uint32 words, plain and weighted by
position (a Fletcher-style pair), on the device in one jitted pass: exact, independent of the
reduction order and of the sharding, and cheap next to a training step.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

CHECKPOINT_DIR = "checkpoints"  # inside the workdir
CORRUPT_DIR = "checkpoints_corrupt"  # unusable step folders are moved here, never deleted
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A training run's checkpoint folder where checkpoints exist but none can be restored. (An
    HF model folder that does not match its config raises `models.ModelFolderError`.)"""


class Checkpoint(NamedTuple):
    """A restored checkpoint."""

    step: int  # its step (for a run: the number of completed RL steps)
    state: Any  # placed with the shardings of the template it was restored into
    meta: dict[str, Any]  # the caller's fields, "checksums", "format", "step"
    path: str  # its step folder


def checkpoint_manager(
    directory: str | os.PathLike, *, keep: int, read_only: bool = False
) -> ocp.CheckpointManager:
    """An orbax manager for `directory` that saves synchronously and keeps the newest `keep`.

    Opening it removes temporary folders left by a save that was killed mid-write, unless
    `read_only` (evaluating a run that may be saving at this moment). A relative `directory` is
    taken from the current directory (orbax needs absolute paths).
    """
    path = os.path.abspath(os.fspath(directory))
    # Orbax warns that a read-only manager will not save or clean up, which is what is asked.
    verbosity = absl_logging.get_verbosity()
    if read_only:
        absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=False,
            cleanup_tmp_directories=not read_only,
            preservation_policy=ocp.checkpoint_managers.LatestN(keep),
            create=not read_only,
            read_only=read_only,
        )
        return ocp.CheckpointManager(path, options=options)
    finally:
        absl_logging.set_verbosity(verbosity)


def step_path(manager: ocp.CheckpointManager, step: int) -> str:
    """The folder of checkpoint `step`."""
    return os.path.join(os.fspath(manager.directory), str(step))


# --- the state as a nested dict of arrays --------------------------------------------------------


def _key_name(entry) -> str:
    for attribute in ("name", "key", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    raise TypeError(f"unsupported pytree path entry {entry!r}")


def _named_leaves(tree) -> tuple[list[tuple[tuple[str, ...], Any]], Any]:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [(tuple(_key_name(e) for e in path), leaf) for path, leaf in leaves], treedef


def _is_key(leaf) -> bool:
    return jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _nest(named: Iterable[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in named:
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return nested


def _lookup(nested: Mapping[str, Any], path: tuple[str, ...]):
    for part in path:
        nested = nested[part]
    return nested


def _saveable(state) -> tuple[list[tuple[tuple[str, ...], jax.Array]], Any]:
    """Every leaf under its path, PRNG keys replaced by their key data."""
    named, treedef = _named_leaves(state)
    return [(p, jax.random.key_data(x) if _is_key(x) else x) for p, x in named], treedef


def _abstract_leaf(leaf) -> jax.ShapeDtypeStruct:
    sharding = getattr(leaf, "sharding", None)
    if _is_key(leaf):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
        return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def abstract_state(state):
    """`state` with every array replaced by its shape, dtype and sharding (a restore target).

    Keeping only this lets the freshly built arrays be freed before a checkpoint is restored, so
    a resumed run never holds two copies of the parameters and optimizer state. PRNG keys stay
    concrete (a few bytes): restoring one needs its implementation.
    """

    def abstract(leaf):
        if _is_key(leaf):
            return leaf
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)

    return jax.tree.map(abstract, state)


def _path_name(path: tuple[str, ...]) -> str:
    return "/".join(path)


@jax.jit
def _checksums(leaves: list[jax.Array]) -> jax.Array:
    """[L, 2] uint32: per leaf, the sum of its bits as words, plain and weighted by position."""
    rows = []
    for leaf in leaves:
        if leaf.dtype == jnp.bool_:
            words = leaf.astype(jnp.uint32)
        else:
            unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[leaf.dtype.itemsize]
            words = jax.lax.bitcast_convert_type(leaf, unsigned).astype(jnp.uint32)
        # The linear index without a reshape, so a sharded leaf is never gathered.
        position = jnp.ones(words.shape, jnp.uint32)
        stride = 1
        for axis in reversed(range(words.ndim)):
            iota = jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis)
            position = position + iota * jnp.uint32(stride % 2**32)
            stride *= words.shape[axis]
        rows.append(jnp.stack([jnp.sum(words), jnp.sum(words * position)]))
    return jnp.stack(rows) if rows else jnp.zeros((0, 2), jnp.uint32)


def state_checksums(state) -> dict[str, list[int]]:
    """`{leaf path: [sum, position-weighted sum]}` of the bits of every state leaf (mod 2^32)."""
    named, _ = _saveable(state)
    sums = np.asarray(jax.device_get(_checksums([x for _, x in named])))
    return {_path_name(p): [int(a), int(b)] for (p, _), (a, b) in zip(named, sums, strict=True)}


# --- save and restore ----------------------------------------------------------------------------


def save_checkpoint(
    manager: ocp.CheckpointManager,
    step: int,
    state,
    *,
    data_iterator: grain.DatasetIterator | None = None,
    meta: dict[str, Any] | None = None,
) -> str:
    """Saves `state` (and the iterator's position) as checkpoint `step`, with `meta`.

    Synchronous: when it returns the step folder is complete and renamed into place, and the
    oldest checkpoints beyond the manager's `keep` are deleted.

    Args:
      manager: from `checkpoint_manager`.
      step: the checkpoint's step.
      state: any pytree of arrays (a run's `TrainState` before it is donated to the next update).
      data_iterator: a grain iterator whose position to save (a run's prompt batches, positioned
        at the next step's batch), or None.
      meta: JSON fields stored beside the state (a run's config, its metrics cursor, ...);
        `format`, `step` and the leaf `checksums` are added.

    Returns:
      The step folder.
    """
    named, _ = _saveable(state)
    meta = {
        **(meta or {}),
        "format": FORMAT_VERSION,
        "step": int(step),
        "checksums": state_checksums(state),
    }
    items = {"state": ocp.args.StandardSave(_nest(named)), "meta": ocp.args.JsonSave(meta)}
    if data_iterator is not None:
        items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    manager.save(int(step), args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()
    return step_path(manager, int(step))


def _restore_step(manager, step: int, template, data_iterator, check) -> Checkpoint:
    path = step_path(manager, step)
    named, treedef = _named_leaves(template)
    target = _nest((p, _abstract_leaf(x)) for p, x in named)
    items = {"state": ocp.args.StandardRestore(target), "meta": ocp.args.JsonRestore()}
    if data_iterator is not None:
        items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    meta = restored["meta"]
    if meta.get("format") != FORMAT_VERSION or meta.get("step") != step:
        raise ValueError(f"meta names format {meta.get('format')} step {meta.get('step')}")
    leaves = []
    for path_parts, leaf in named:
        value = _lookup(restored["state"], path_parts)
        if _is_key(leaf):
            value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
        leaves.append(value)
    state = jax.tree_util.tree_unflatten(treedef, leaves)
    if check is not None:
        check(state, meta)
    expected, got = meta["checksums"], state_checksums(state)
    bad = [name for name in got if expected.get(name) != got[name]]
    missing = sorted(set(expected) - set(got))
    if bad or missing:
        raise ValueError(
            f"leaf checksums differ for {bad[:5]}{' ...' if len(bad) > 5 else ''}"
            + (f"; saved leaves this state lacks: {missing[:5]}" if missing else "")
        )
    return Checkpoint(step=step, state=state, meta=meta, path=path)


def restore_checkpoint(
    manager: ocp.CheckpointManager,
    template,
    data_iterator: grain.DatasetIterator | None = None,
    *,
    set_aside: bool = True,
    check: Callable[[Any, dict[str, Any]], None] | None = None,
) -> Checkpoint | None:
    """Restores the newest usable checkpoint into `template`'s structure and shardings.

    A step folder that fails (unreadable, truncated, garbled, or a state of another structure)
    is logged as a warning naming it, and the previous step is tried. After a success, the
    failed newer folders are moved to `checkpoints_corrupt/` next to the checkpoint folder so
    that the resumed run can save those steps again.

    Args:
      manager: from `checkpoint_manager`.
      template: the pytree to restore into (arrays or `abstract_state`; for a run, the fresh
        `TrainState` of the run being resumed); restored leaves get its shapes, dtypes and
        shardings, so a resumed run is placed like a new one.
      data_iterator: an iterator whose position is set from the checkpoint (a run's prompt
        batches), or None.
      set_aside: move the failed newer folders away after a success (a resume saves those
        steps again); False only reads.
      check: called with each restored state and its meta before the checksums; a ValueError
        it raises counts the step as unusable (a run checks its state's step).

    Returns:
      The `Checkpoint`, or None when the folder holds no checkpoint.

    Raises:
      CheckpointError: checkpoints exist but none can be restored (each folder and its error
        are named); nothing is moved in that case.
    """
    steps = sorted(manager.all_steps(), reverse=True)
    if not steps:
        return None
    failures = []
    for step in steps:
        try:
            checkpoint = _restore_step(manager, step, template, data_iterator, check)
        except Exception as error:  # noqa: BLE001 (any failure: report it and try an older step)
            message = f"{type(error).__name__}: {error}"
            failures.append((step, message))
            logging.warning(
                "checkpoint %s cannot be restored (%s); falling back to the previous checkpoint",
                step_path(manager, step),
                message[:2000],
            )
            continue
        if failures and set_aside:
            _set_aside(manager, [step for step, _ in failures])
        return checkpoint
    raise CheckpointError(
        f"no checkpoint in {manager.directory} can be restored: "
        + "; ".join(f"{step_path(manager, s)}: {m[:500]}" for s, m in failures)
    )


def _set_aside(manager: ocp.CheckpointManager, steps: list[int]) -> None:
    root = os.path.join(os.path.dirname(os.fspath(manager.directory)), CORRUPT_DIR)
    os.makedirs(root, exist_ok=True)
    for step in steps:
        source = step_path(manager, step)
        target = os.path.join(root, str(step))
        suffix = 1
        while os.path.exists(target):
            target = os.path.join(root, f"{step}.{suffix}")
            suffix += 1
        shutil.move(source, target)
        logging.warning("moved the unusable checkpoint %s to %s", source, target)
    manager.reload()


def saved_meta(manager: ocp.CheckpointManager) -> tuple[str, dict[str, Any]] | None:
    """`(step folder, meta)` of the newest checkpoint whose meta is readable; None if none."""
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return step_path(manager, step), meta["meta"]
        except Exception as error:  # noqa: BLE001 (any unreadable meta: try an older step)
            logging.warning("cannot read the meta of %s: %s", step_path(manager, step), error)
    return None
