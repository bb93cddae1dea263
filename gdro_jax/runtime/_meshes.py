"""The run's mesh, one convention throughout: `data` x `fsdp` x `tensor`, and None for one device.

Parameters go on `fsdp`/`tensor` (`models.ShardingConfig`); batches (prompts, rollout slots,
supervised rows) on `data` x `fsdp` by their leading axis.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax import models


def run_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1) -> Mesh | None:
    """The `data` x `fsdp` x `tensor` mesh over the first devices; None for 1 x 1 x 1."""
    shape = (data, fsdp, tensor)
    return None if shape == (1, 1, 1) else models.make_mesh(*shape)


def mesh_shape(mesh: Mesh | None) -> tuple[int, int, int]:
    """`(data, fsdp, tensor)` of `mesh`; (1, 1, 1) for None (one device)."""
    if mesh is None:
        return (1, 1, 1)
    return tuple(int(mesh.shape[axis]) for axis in models.MESH_AXES)


def batch_sharding(mesh: Mesh | None, shape: tuple[int, ...]) -> NamedSharding | None:
    """Leading (batch) axis on `data` x `fsdp`, fitted to `shape`; None without a mesh."""
    if mesh is None:
        return None
    spec = models.fit_spec(P(("data", "fsdp")), shape, dict(mesh.shape))
    return NamedSharding(mesh, spec)


def constrain_batch(mesh: Mesh | None, tree):
    """Inside jit: every leaf's leading axis on the batch axes (nothing without a mesh)."""
    if mesh is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape)), tree
    )
