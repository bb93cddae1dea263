"""The rollout phase: `R = N * n_mean` completions of the planned slots, with log pi_old per token.

The controllers' plan maps the R slots to the N prompts (`plan.prompt_of_slot`); the KV-cache
sampler prefills each distinct prompt once and decodes every slot, `micro_batch_slots` slots at a
time when set. Rewards are scored afterwards by the run's reward phase, on the device or on the
host.

The trainer samples through a `RolloutEngine`: `KVCacheEngine` (the built-in sampler) by default,
or any object with the same two methods passed to `build_run(config, rollout_engine=...)`, e.g.
a client of an inference server that keeps its own copy of the weights. `rollout_phase` turns an
engine and the prompt pool's arrays into the step's rollout function: the built-in engine fused
into one jit, another engine called eagerly after its weights are synced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from gdro_jax import runtime
from gdro_jax.controllers import Plan
from gdro_jax.sampling import generate


class Rollouts(NamedTuple):
    """The R sampled completions of one step, their sampling log-probs and rewards."""

    prompt_tokens: jax.Array  # [R, P] int32 each slot's prompt, left-padded
    prompt_lengths: jax.Array  # [R] int32
    tokens: jax.Array  # [R, M] int32 completion tokens (stop token included)
    lengths: jax.Array  # [R] int32 completion lengths
    logprobs: jax.Array  # [R, M] float32 log pi_old of each completion token
    rewards: jax.Array  # [R] float32
    correct: jax.Array  # [R] bool


def sample_rollouts(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    plan: Plan,
    prompt_tokens_NP: jax.Array,
    prompt_lengths_N: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float,
    eos_ids: tuple[int, ...],
    micro_batch_slots: int | None = None,
) -> Rollouts:
    """Samples `R = len(plan.prompt_of_slot)` completions; rewards are scored afterwards.

    Args:
      graphdef: the policy's static graph.
      params: the policy's parameters.
      plan: the controllers' plan (its `prompt_of_slot` maps slots to the N prompts).
      prompt_tokens_NP: the N prompts, right-padded.
      prompt_lengths_N: their lengths.
      key: sampling key.
      max_new_tokens: M.
      temperature: sampling temperature.
      eos_ids: stop ids.
      micro_batch_slots: decode the slots this many at a time (the KV cache then holds
        micro_batch_slots x (P + M) slots); None or 0: all R at once. Same completions either
        way, up to float rounding (see `gdro_jax.sampling.generate`).

    Returns:
      The `Rollouts` with rewards 0 and correct False: the run's reward phase fills them in
      (`Rollouts._replace`), on the device or on the host.
    """
    model = nnx.merge(graphdef, params)
    result = generate(
        model,
        prompt_tokens_NP,
        prompt_lengths=prompt_lengths_N,
        prompt_of_slot=plan.prompt_of_slot,
        key=key,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_ids=eos_ids,
        micro_batch_slots=micro_batch_slots,
    )
    num_slots = result.lengths.shape[0]
    return Rollouts(
        prompt_tokens=result.prompt_tokens,
        prompt_lengths=result.prompt_lengths,
        tokens=result.tokens,
        lengths=result.lengths,
        logprobs=result.logprobs,
        rewards=jnp.zeros((num_slots,), jnp.float32),
        correct=jnp.zeros((num_slots,), bool),
    )


class RolloutEngine(Protocol):
    """What the trainer calls to sample a step's rollouts (`build_run(..., rollout_engine=)`).

    `generate` returns the `Rollouts` of the plan's R slots (rewards 0: the run's reward phase
    scores them) with `logprobs` = log pi_old of each completion token under the sampling
    temperature, which the clipped ratio divides by. `sync_weights` receives the trainer's
    parameters after every update (and before the first rollout, or after a resume), for an
    engine that keeps its own copy of the weights (an inference server); an engine that reads
    `params` at every `generate` call has nothing to do there.

    The built-in `KVCacheEngine` is fused into the trainer's jitted rollout phase; an engine
    passed to `build_run` is called outside jit, with device arrays, and its outputs are placed
    on the mesh's batch axes.
    """

    def generate(
        self,
        params: nnx.State,
        plan: Plan,
        prompt_tokens_NP: jax.Array,
        prompt_lengths_N: jax.Array,
        key: jax.Array,
    ) -> Rollouts:
        """Completions of the R slots `plan.prompt_of_slot` of the N right-padded prompts."""
        ...

    def sync_weights(self, params: nnx.State) -> None:
        """Takes the trainer's new parameters (the policy the next `generate` must sample)."""
        ...


class KVCacheEngine:
    """The built-in `RolloutEngine`: the jitted KV-cache sampler on the trainer's own parameters.

    Args:
      graphdef: the policy's static graph (`build_run`'s `run.graphdef`).
      max_new_tokens: M.
      temperature: sampling temperature.
      eos_ids: stop ids.
      micro_batch_slots: slots decoded at a time (`config.rollout.micro_batch_slots`); None or 0:
        all R at once.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        *,
        max_new_tokens: int,
        temperature: float,
        eos_ids: tuple[int, ...],
        micro_batch_slots: int | None = None,
    ):
        self.graphdef = graphdef
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.eos_ids = tuple(eos_ids)
        self.micro_batch_slots = micro_batch_slots

    def generate(self, params, plan, prompt_tokens_NP, prompt_lengths_N, key) -> Rollouts:
        """`sample_rollouts` with this engine's settings (pure JAX: traceable inside jit)."""
        return sample_rollouts(
            self.graphdef,
            params,
            plan,
            prompt_tokens_NP,
            prompt_lengths_N,
            key,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            eos_ids=self.eos_ids,
            micro_batch_slots=self.micro_batch_slots,
        )

    def sync_weights(self, params: nnx.State) -> None:
        """Nothing to do: `generate` samples with the parameters it is called with."""
        del params


class WeightSync:
    """Calls `engine.sync_weights(params)` when `params` are not the ones it last sent."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self.sent: nnx.State | None = None

    def __call__(self, params: nnx.State) -> None:
        if params is not self.sent:
            self.engine.sync_weights(params)
            self.sent = params

    def after(self, update):
        """`update` (state, ...) -> (state, metrics), then a sync of the new parameters."""

        def update_then_sync(state, *args):
            state, metrics = update(state, *args)
            self(state.params)
            return state, metrics

        return update_then_sync


def rollout_phase(
    engine: KVCacheEngine | WeightSync, prompt_tokens_DP, prompt_lengths_D, *, mesh=None
) -> Callable:
    """The step's rollout function `(params, plan, prompt_ids_N, key) -> Rollouts`.

    Args:
      engine: the built-in `KVCacheEngine`, fused with the prompts' lookup into one jit; or a
        `WeightSync` around another engine, called eagerly after syncing its weights when the
        parameters changed (e.g. a resumed state).
      prompt_tokens_DP: the pool's D prompts, right-padded (host or device arrays).
      prompt_lengths_D: their lengths.
      mesh: the run's mesh: the rollouts' slots go on its batch axes (None: one device).

    Returns:
      The rollout function; its rewards are 0 until the reward phase scores them.
    """
    prompt_tokens = jnp.asarray(prompt_tokens_DP)
    prompt_lengths = jnp.asarray(prompt_lengths_D)
    if isinstance(engine, WeightSync):
        sync = engine

        def external_rollout(params, plan, prompt_ids, key):
            sync(params)
            result = sync.engine.generate(
                params, plan, prompt_tokens[prompt_ids], prompt_lengths[prompt_ids], key
            )
            return jax.tree.map(
                lambda x: jax.device_put(x, runtime.batch_sharding(mesh, x.shape)), result
            )

        return external_rollout

    @jax.jit
    def rollout(params, plan, prompt_ids, key):
        result = engine.generate(
            params, plan, prompt_tokens[prompt_ids], prompt_lengths[prompt_ids], key
        )
        return runtime.constrain_batch(mesh, result)

    return rollout
