"""The mesh convention, its one home: every mesh is `data` x `fsdp` x `tensor` with Auto axes, and
None stands for one device.

Parameters go on `fsdp` and `tensor` (`ShardingConfig`); batches (prompts, rollout slots,
supervised rows) on `data` x `fsdp` by their leading axis. A spec is fitted to a concrete shape
before use: a mesh axis that does not divide its dimension is dropped (that dimension is
replicated instead), so tiny test shapes and batch-1 calls still run on any mesh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the axes the batch (and the sampler's slots) are split over


def make_mesh(
    data: int = 1, fsdp: int = 1, tensor: int = 1, *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A `data` x `fsdp` x `tensor` mesh with Auto axes (the compiler propagates shardings).

    Args:
      data: size of the data-parallel axis.
      fsdp: size of the axis that shards parameters and the batch.
      tensor: size of the tensor-parallel axis (heads, MLP width, vocabulary).
      devices: devices to use (default: the first data*fsdp*tensor of `jax.devices()`).

    Returns:
      The mesh.
    """
    for name, size in (("data", data), ("fsdp", fsdp), ("tensor", tensor)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"make_mesh: {name} must be a positive int, got {size!r}")
    count = data * fsdp * tensor
    if devices is None:
        devices = jax.devices()[:count]
    if len(devices) != count:
        raise ValueError(
            f"make_mesh: data*fsdp*tensor = {count} devices needed, {len(devices)} available"
        )
    grid = np.asarray(devices, dtype=object).reshape(data, fsdp, tensor)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def run_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1) -> Mesh | None:
    """The `data` x `fsdp` x `tensor` mesh over the first devices; None for 1 x 1 x 1."""
    shape = (data, fsdp, tensor)
    return None if shape == (1, 1, 1) else make_mesh(*shape)


def mesh_shape(mesh: Mesh | None) -> tuple[int, int, int]:
    """`(data, fsdp, tensor)` of `mesh`; (1, 1, 1) for None (one device)."""
    if mesh is None:
        return (1, 1, 1)
    return tuple(int(mesh.shape[axis]) for axis in MESH_AXES)


def check_mesh(mesh: Mesh) -> None:
    """Raises ValueError unless `mesh` has exactly the Auto axes `data`, `fsdp`, `tensor`."""
    if tuple(mesh.axis_names) != MESH_AXES:
        raise ValueError(f"mesh axis names must be {MESH_AXES}, got {tuple(mesh.axis_names)}")
    if any(t != AxisType.Auto for t in mesh.axis_types):
        raise ValueError(
            f"mesh axis types must all be Auto (use gdro_jax.models.make_mesh), got "
            f"{mesh.axis_types}"
        )


def fit_spec(spec: P, shape: Sequence[int], axis_sizes: Mapping[str, int]) -> P:
    """Drops mesh axes that do not divide their dimension, so `spec` is valid for `shape`.

    Args:
      spec: the declared PartitionSpec (shorter than `shape` means trailing dims replicated).
      shape: the array shape.
      axis_sizes: mesh axis name -> size.

    Returns:
      A PartitionSpec of length len(shape) whose every sharded dimension divides evenly.
    """
    fitted = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept: list[str] = []
        for axis in axes:
            size = int(np.prod([axis_sizes[a] for a in kept])) * axis_sizes[axis]
            if dim % size == 0:
                kept.append(axis)
        kept = [a for a in kept if axis_sizes[a] > 1]
        fitted.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*fitted)


def named_sharding(mesh: Mesh, spec: P, shape: Sequence[int]) -> NamedSharding:
    """The NamedSharding of `spec` fitted to `shape` on `mesh`."""
    return NamedSharding(mesh, fit_spec(spec, shape, dict(mesh.shape)))


def batch_sharding(mesh: Mesh | None, shape: tuple[int, ...]) -> NamedSharding | None:
    """Leading (batch) axis on `data` x `fsdp`, fitted to `shape`; None without a mesh."""
    if mesh is None:
        return None
    return named_sharding(mesh, P(BATCH_AXES), shape)


def constrain_batch(mesh: Mesh | None, tree):
    """Inside jit: every leaf's leading axis on the batch axes (nothing without a mesh)."""
    if mesh is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape)), tree
    )
