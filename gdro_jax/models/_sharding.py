"""Where the decoder's parameters and activations live on a `data` x `fsdp` x `tensor` mesh.

Placement is declared once, as PartitionSpecs named by einsum letters (`emb_vd` is the [V, D]
embedding table, `act_btd` a [B, T, D] activation). Letters: B batch, T query time, S key time
(cache slots), D model width, V vocabulary, N query heads, K key/value heads, H head width,
F MLP width, L layers. Batch dimensions go on (`data`, `fsdp`); parameters on `fsdp` and `tensor`.

A spec is fitted to a concrete shape before use: a mesh axis that does not divide its dimension is
dropped (that dimension is replicated instead), so tiny test shapes and batch-1 calls still run on
any mesh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the axes the batch (and the sampler's slots) are split over


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    """PartitionSpecs of every parameter and of the activations the decoder constrains.

    Per-layer parameter specs are written for one layer; the stacked [L, ...] parameters get a
    leading unsharded layer axis.
    """

    # Parameters.
    emb_vd: P = P("tensor", "fsdp")
    unemb_dv: P = P("fsdp", "tensor")
    norm_d: P = P(None)
    head_norm_h: P = P(None)
    q_dnh: P = P("fsdp", "tensor", None)
    kv_dkh: P = P("fsdp", "tensor", None)
    o_nhd: P = P("tensor", None, "fsdp")
    q_bias_nh: P = P("tensor", None)
    kv_bias_kh: P = P("tensor", None)
    bias_d: P = P(None)
    mlp_in_df: P = P("fsdp", "tensor")
    mlp_out_fd: P = P("tensor", "fsdp")
    mlp_bias_f: P = P("tensor")
    # Activations.
    # The table as the token lookup reads it: gathered over fsdp first, so the lookup is a
    # vocabulary-parallel gather (otherwise XLA replicates the whole table in the backward pass).
    emb_lookup_vd: P = P("tensor", None)
    act_btd: P = P(BATCH_AXES, None, None)
    act_btnh: P = P(BATCH_AXES, None, "tensor", None)
    act_btkh: P = P(BATCH_AXES, None, "tensor", None)
    act_btf: P = P(BATCH_AXES, None, "tensor")
    logits_btv: P = P(BATCH_AXES, None, "tensor")
    cache_bkhs: P = P(BATCH_AXES, "tensor", None, None)
    cache_bksh: P = P(BATCH_AXES, "tensor", None, None)
    tokens_bt: P = P(BATCH_AXES, None)


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


def constrain(x: jax.Array, spec: P, mesh: Mesh | None) -> jax.Array:
    """`with_sharding_constraint` to the fitted `spec`; the identity when there is no mesh."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, spec, x.shape))


def state_shardings(specs, abstract_state, mesh: Mesh | None):
    """Shardings for a state pytree, given its PartitionSpec tree (from nnx.get_partition_spec).

    With no mesh every leaf goes to this process's first device.
    """
    if mesh is None:
        single = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda _: single, abstract_state)
    return jax.tree.map(
        lambda spec, leaf: named_sharding(mesh, spec, leaf.shape),
        specs,
        abstract_state,
        is_leaf=lambda x: isinstance(x, P),
    )
