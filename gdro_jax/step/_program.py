"""`StepProgram`: one training step, wired once from typed parts, for the run and the memory plan.

    parts      graphdef, optimizer, the method's composed decisions (group filter included),
               GRPOConfig, the rollout settings (engine kind, greedy, TIS cap), the mesh
    state      `init_state(model)` for a run; `abstract_state(params)` of ShapeDtypeStructs
    phases     `plan`, `rollout(...)`, `rescore`, `update(state_like)`: each jitted here with its
               shardings (an external engine's `generate` is the one call outside jit)

`train.build_run` feeds the program arrays; `planner` lowers and compiles the very same object on
`jax.ShapeDtypeStruct`s (its micro-batch and remat variants through `replace`), so a memory plan
is the plan of the function that runs. Nothing else in the library jits a phase of the step.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax import models
from gdro_jax.controllers import MultiAdversary
from gdro_jax.sampling import completion_logprobs, packed_completion_logprobs
from gdro_jax.step._engines import (
    KVCacheEngine,
    RolloutConfig,
    RolloutEngine,
    Rollouts,
    WeightSync,
)
from gdro_jax.step._grpo import GRPOConfig
from gdro_jax.step._state import TrainState, init_train_state, optimizer_shardings
from gdro_jax.step._update import make_update


def rollout_groups(
    num_prompts: int, n_mean: int, prompt_width: int, max_new_tokens: int
) -> Rollouts:
    """The shapes of one round's rollouts as N groups of `n_mean` (`jax.ShapeDtypeStruct`
    leaves `[N, n_mean, ...]`): what a group filter's buffer holds."""
    group = (num_prompts, n_mean)
    return Rollouts(
        prompt_tokens=jax.ShapeDtypeStruct((*group, prompt_width), jnp.int32),
        prompt_lengths=jax.ShapeDtypeStruct(group, jnp.int32),
        tokens=jax.ShapeDtypeStruct((*group, max_new_tokens), jnp.int32),
        lengths=jax.ShapeDtypeStruct(group, jnp.int32),
        logprobs=jax.ShapeDtypeStruct((*group, max_new_tokens), jnp.float32),
        rewards=jax.ShapeDtypeStruct(group, jnp.float32),
        correct=jax.ShapeDtypeStruct(group, jnp.bool_),
        engine_logprobs=jax.ShapeDtypeStruct((*group, max_new_tokens), jnp.float32),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class StepProgram:
    """The step of one run: its parts, its state's shapes and its jitted phases.

    Attributes:
      graphdef: the policy's static graph (equal for an abstract and a loaded policy).
      tx: the optimizer.
      decisions: the method's composed decisions (`controllers.multi_adversary`; its
        `group_filter` gives the state its buffer).
      grpo: the update's hyperparameters.
      num_prompts: N, prompts per step.
      prompt_width: P, the pool's padded prompt length.
      max_new_tokens: M.
      eos_ids: the task's stop ids.
      rollout: how the step samples (`RolloutConfig`): the engine, the slots the built-in
        engine decodes at once (`micro_batch_slots`, None: all R), its batching and decode
        window, greedy decoding, where the behaviour log-probs come from and the TIS cap.
      external_engine: an engine other than the built-in one samples (vLLM, or one passed to
        `build_run`): the trainer rescoring its samples (`rescore`) and the update logging, or
        correcting, the gap between the two policies' log-probs.
      mesh: the run's mesh; None on one device.
      seed: the run's PRNG seed.
    """

    graphdef: nnx.GraphDef
    tx: optax.GradientTransformation
    decisions: MultiAdversary
    grpo: GRPOConfig
    num_prompts: int
    prompt_width: int
    max_new_tokens: int
    eos_ids: tuple[int, ...]
    rollout: RolloutConfig = RolloutConfig()
    external_engine: bool = False
    mesh: Mesh | None = None
    seed: int = 0

    def __post_init__(self):
        if self.rollout.logprobs_from == "engine" and not self.external_engine:
            raise ValueError(
                "config.rollout.logprobs_from='engine' corrects for another engine's log-probs; "
                "the kv_cache engine samples with the trainer's own policy: use "
                "logprobs_from='trainer'"
            )
        _ = self.update_function  # built now: parts that do not fit fail here, not at a step

    def replace(self, **changes) -> StepProgram:
        """A copy with `changes` (e.g. the planner's micro-batch and remat variants)."""
        return dataclasses.replace(self, **changes)

    @property
    def num_slots(self) -> int:
        """R = N * n_mean rollout slots."""
        return self.num_prompts * self.decisions.n_mean

    @property
    def with_reference(self) -> bool:
        """Whether the state holds a frozen KL reference (kl_coef > 0)."""
        return self.grpo.kl_coef > 0

    @property
    def replicated(self) -> jax.sharding.Sharding:
        """Where the controllers' states, the key and the counters live."""
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return NamedSharding(self.mesh, P())

    def example_groups(self) -> Rollouts:
        """One round's rollouts as N groups of n_mean (ShapeDtypeStructs): a group filter's
        buffer holds these."""
        return rollout_groups(
            self.num_prompts, self.decisions.n_mean, self.prompt_width, self.max_new_tokens
        )

    # --- the state ----------------------------------------------------------------------------

    def init_state(self, model) -> TrainState:
        """The run's first `TrainState` around `model`'s parameters (placed on their shards)."""
        graphdef, state = init_train_state(
            model,
            self.tx,
            self.decisions,
            seed=self.seed,
            with_reference=self.with_reference,
            example_groups=self.example_groups(),
        )
        if graphdef != self.graphdef:
            raise ValueError("the policy's graph differs from the one this step was built for")
        return state

    def abstract_state(self, params: nnx.State) -> TrainState:
        """The `TrainState` as ShapeDtypeStructs placed as a run's would be, around `params`
        (ShapeDtypeStructs with their shardings); no array is made."""
        replicated = self.replicated

        def placed(tree, sharding=replicated):
            return jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), tree
            )

        opt_state = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            jax.eval_shape(self.tx.init, params),
            optimizer_shardings(self.tx, params, replicated),
        )
        int32 = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        return TrainState(
            params=params,
            opt_state=opt_state,
            gdro=placed(jax.eval_shape(self.decisions.init, self.example_groups())),
            key=placed(jax.eval_shape(lambda: jax.random.key(0))),
            step=int32,
            ref_params=params if self.with_reference else None,
            skipped_steps=int32,
            consecutive_skips=int32,
        )

    # --- the phases ---------------------------------------------------------------------------

    @functools.cached_property
    def plan(self) -> Callable:
        """Jitted `(gdro_state, prompt_ids_N, key) -> Plan`, replicated."""
        out = None if self.mesh is None else self.replicated
        return jax.jit(self.decisions.plan, out_shardings=out)

    @functools.cached_property
    def update_function(self) -> Callable:
        """The unjitted update `(state, plan, prompt_ids_N, rollouts) -> (state, metrics)`."""
        return make_update(
            self.graphdef,
            self.tx,
            self.decisions,
            self.grpo,
            num_prompts=self.num_prompts,
            mismatch_cap=self.rollout.tis_cap if self.external_engine else None,
            correct_mismatch=self.rollout.logprobs_from == "engine",
        )

    def update(self, state_like: TrainState) -> Callable:
        """The update jitted with the state donated and its outputs placed like `state_like`
        (a `TrainState` of arrays or of ShapeDtypeStructs): `(state, plan, prompt_ids_N,
        rollouts) -> (state, metrics)`."""
        out = None if self.mesh is None else self.replicated
        shardings = jax.tree.map(lambda leaf: leaf.sharding, state_like)
        return jax.jit(self.update_function, donate_argnums=0, out_shardings=(shardings, out))

    @functools.cached_property
    def rescore(self) -> Callable:
        """Jitted `(params, rollouts) -> rollouts` whose `logprobs` are the trainer's of an
        external engine's samples (a forward pass at the sampling temperature, on packed rows
        with `grpo.pack_sequences`);
        `engine_logprobs` keep the engine's. The slots stay on the batch axes."""

        @jax.jit
        def rescore(params, rollouts: Rollouts) -> Rollouts:
            arguments = (
                nnx.merge(self.graphdef, params),
                jnp.asarray(rollouts.prompt_tokens),
                jnp.asarray(rollouts.prompt_lengths),
                jnp.asarray(rollouts.tokens),
                jnp.asarray(rollouts.lengths),
            )
            options = dict(
                temperature=self.grpo.temperature, chunk_size=self.grpo.logprob_chunk_tokens
            )
            if self.grpo.pack_sequences:
                rows_per_pass = self.grpo.packed_rows_per_pass(self.num_slots)
                logprobs = packed_completion_logprobs(
                    *arguments, rows_per_pass=rows_per_pass, **options
                )
            else:
                logprobs = completion_logprobs(*arguments, **options)
            return models.constrain_batch(self.mesh, rollouts._replace(logprobs=logprobs))

        return rescore

    def kv_cache_engine(self) -> KVCacheEngine:
        """The built-in engine with this step's settings."""
        return KVCacheEngine(
            self.graphdef,
            max_new_tokens=self.max_new_tokens,
            temperature=0.0 if self.rollout.greedy else self.grpo.temperature,
            eos_ids=self.eos_ids,
            micro_batch_slots=self.rollout.micro_batch_slots,
            batching=self.rollout.batching,
            decode_window=self.rollout.decode_window,
            lane_halvings=self.rollout.lane_halvings,
            stop_check_every=self.rollout.stop_check_every,
            skip_dead_blocks=self.rollout.skip_dead_blocks,
        )

    def rollout_function(
        self, prompt_tokens_DP: Any, prompt_lengths_D: Any, engine: RolloutEngine | None = None
    ) -> Callable:
        """`(params, plan, prompt_ids_N, key) -> Rollouts` over the pool's D right-padded
        prompts (host or device arrays), rewards 0 until the reward phase scores them: the
        built-in engine fused with the prompts' lookup into one jit; or, with `external_engine`,
        `engine` (or a `WeightSync` around it) called eagerly after a weight sync when the
        parameters changed, its samples placed on the batch axes and rescored (`rescore`)."""
        prompt_tokens = jnp.asarray(prompt_tokens_DP)
        prompt_lengths = jnp.asarray(prompt_lengths_D)
        if not self.external_engine:
            if engine is not None:
                raise ValueError("an engine was given to a step built for the kv_cache engine")
            built_in = self.kv_cache_engine()

            @jax.jit
            def rollout(params, plan, prompt_ids, key):
                result = built_in.generate(
                    params, plan, prompt_tokens[prompt_ids], prompt_lengths[prompt_ids], key
                )
                return models.constrain_batch(self.mesh, result)

            return rollout
        if engine is None:
            raise ValueError("this step samples with an external engine: pass it as engine=")
        sync = engine if isinstance(engine, WeightSync) else WeightSync(engine)

        def external_rollout(params, plan, prompt_ids, key):
            sync(params)
            result = sync.engine.generate(
                params, plan, prompt_tokens[prompt_ids], prompt_lengths[prompt_ids], key
            )
            result = jax.tree.map(
                lambda x: jax.device_put(x, models.batch_sharding(self.mesh, x.shape)), result
            )
            return self.rescore(params, result)

        return external_rollout

    def abstract_rollouts(self) -> Rollouts:
        """The R slots' rollouts as ShapeDtypeStructs on the batch axes (what an external
        engine hands the rescoring and the update; on one device, that device)."""

        def flat(leaf):
            shape = (leaf.shape[0] * leaf.shape[1], *leaf.shape[2:])
            sharding = models.batch_sharding(self.mesh, shape) or self.replicated
            return jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=sharding)

        return jax.tree.map(flat, self.example_groups())
