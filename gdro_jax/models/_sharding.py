"""Where the decoder's parameters and activations live on a `data` x `fsdp` x `tensor` mesh.

Placement is declared once, as PartitionSpecs named by einsum letters (`emb_vd` is the [V, D]
embedding table, `act_btd` a [B, T, D] activation). Letters: B batch, T query time, S key time
(cache slots), D model width, V vocabulary, N query heads, K key/value heads, H head width,
F MLP width, L layers. Batch dimensions go on (`data`, `fsdp`); parameters on `fsdp` and `tensor`.
The mesh itself, its axes and the fitting of a spec to a shape are the mesh convention's
(`_mesh.py`).
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdro_jax.models._mesh import BATCH_AXES, named_sharding


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
