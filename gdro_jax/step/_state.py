"""`TrainState`: everything a GRPO/GDRO run carries from step to step, as one pytree.

Parameters and optimizer state are sharded like the policy (`fsdp`/`tensor` axes), the controller
states and the RNG key are replicated (SPEC section 7). The model's graph definition is static and
lives outside the state, so the state can be donated, checkpointed and `jax.eval_shape`-d.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax.controllers import GDROState, MultiAdversary
from gdro_jax.models import Decoder
from gdro_jax.runtime import replicate


class TrainState(NamedTuple):
    """One pytree with all the state of a run."""

    params: nnx.State  # the policy's parameters (nnx.Param leaves), sharded on fsdp/tensor
    opt_state: optax.OptState  # sharded like params
    # The controllers' states (classifier, the method's parts, a group filter's buffer), replicated.
    gdro: GDROState
    key: jax.Array  # [] PRNG key, replicated
    step: jax.Array  # [] int32 number of completed RL steps (skipped ones included)
    ref_params: nnx.State | None  # frozen reference policy for the KL term; None when beta = 0
    skipped_steps: jax.Array  # [] int32 steps skipped for a non-finite loss or gradient
    consecutive_skips: jax.Array  # [] int32 skipped steps in a row, up to this one


def init_train_state(
    model: Decoder,
    tx: optax.GradientTransformation,
    gdro: MultiAdversary,
    *,
    seed: int,
    with_reference: bool = False,
    example_groups=None,
) -> tuple[nnx.GraphDef, TrainState]:
    """Splits `model` into its static graph and a `TrainState` around its parameters.

    Args:
      model: the policy (its parameters already placed on their shards).
      tx: the optax optimizer.
      gdro: the composed controllers (`controllers.multi_adversary`).
      seed: seed of the run's PRNG key.
      with_reference: keep a frozen copy of the initial parameters as the KL reference. Off when
        the KL coefficient is 0, so no reference model is built or run (SPEC section 2).
      example_groups: one round's groups (`step.rollout_groups`), which shape a group filter's
        buffer in `state.gdro`; needed when `gdro` has a group filter.

    Returns:
      `(graphdef, state)`; `nnx.merge(graphdef, state.params)` rebuilds the model.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = _init_optimizer(tx, params, model.mesh)
    reference = jax.tree.map(jnp.copy, params) if with_reference else None
    state = TrainState(
        params=params,
        opt_state=opt_state,
        gdro=gdro.init(example_groups),
        key=jax.random.key(seed),
        step=jnp.zeros((), jnp.int32),
        ref_params=reference,
        skipped_steps=jnp.zeros((), jnp.int32),
        consecutive_skips=jnp.zeros((), jnp.int32),
    )
    if model.mesh is None:
        # Commit every leaf to the device, as the update's outputs are: a jitted function sees
        # committed and uncommitted inputs as different signatures and would compile twice.
        state = jax.device_put(state, jax.local_devices()[0])
    else:
        state = state._replace(
            gdro=replicate(state.gdro, model.mesh),
            key=replicate(state.key, model.mesh),
            step=replicate(state.step, model.mesh),
            skipped_steps=replicate(state.skipped_steps, model.mesh),
            consecutive_skips=replicate(state.consecutive_skips, model.mesh),
        )
    return graphdef, state


def optimizer_shardings(
    tx: optax.GradientTransformation, params: nnx.State, replicated: jax.sharding.Sharding
):
    """Where each leaf of `tx.init(params)` goes: each moment like its parameter (AdamW's mu and
    nu are as large as the parameters), the rest (the step count) on `replicated`. `params` may
    be arrays or ShapeDtypeStructs with shardings."""
    return optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        jax.eval_shape(tx.init, params),
        jax.tree.map(lambda leaf: leaf.sharding, params),
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
    )


def _init_optimizer(tx: optax.GradientTransformation, params: nnx.State, mesh: Mesh | None):
    """The optimizer state, created on its shards (`optimizer_shardings`)."""
    if mesh is None:
        return jax.jit(tx.init)(params)
    shardings = optimizer_shardings(tx, params, NamedSharding(mesh, P()))
    return jax.jit(tx.init, out_shardings=shardings)(params)
