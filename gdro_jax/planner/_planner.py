"""The planner behind `memory_plan`: one config's abstract state on a mesh, and its rollout and
update lowered with `jax.ShapeDtypeStruct` arguments and compiled, each at most once per size.

Persistent state is exact shapes x dtype bytes / shards: `models.memory_footprint` for the
parameters and the KV cache, `jax.eval_shape` of the optimizer's `init` for its moments. The
phases' other buffers are `memory_analysis()` of the same jitted functions `build_run` makes
(`step.rollout_phase` with the `KVCacheEngine`, `step.make_update` jitted with the state
donated), compiled by the backend of the mesh's devices.

Both phases are compiled at full depth: on 2 CPU cores with 8 fake devices the 36-layer Qwen3-8B
rollout takes about 40 s of CPU time to compile, its update (a scan over the layers) about the
same. Compiling a 2- and a 3-layer model and extrapolating linearly in depth is not faster for
the rollout and under-stated its bytes by 38 % for Qwen3-8B (XLA's buffer reuse is not linear in
depth), so it is not done.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax import configs, models, tasks
from gdro_jax.step import (
    KVCacheEngine,
    TrainState,
    make_update,
    rollout_phase,
    state_shardings,
)

_CPU_OPTIONS = {"xla_backend_optimization_level": 0}


def bytes_per_device(tree) -> int:
    """Bytes of the largest shard set one device holds of every array leaf of `tree`."""
    return sum(
        int(np.prod(leaf.sharding.shard_shape(leaf.shape), dtype=np.int64)) * leaf.dtype.itemsize
        for leaf in jax.tree.leaves(tree)
    )


def _abstract(tree, sharding):
    """Every leaf of `tree` as a ShapeDtypeStruct placed with `sharding` (or a matching tree)."""
    if not isinstance(sharding, jax.sharding.Sharding):
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, sharding
        )
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def _compiled_bytes(compiled) -> tuple[int, int, int, int]:
    """(arguments, outputs, aliased outputs, temporaries) of a compiled executable, per device."""
    stats = compiled.memory_analysis()
    return (
        stats.argument_size_in_bytes,
        stats.output_size_in_bytes,
        stats.alias_size_in_bytes,
        stats.temp_size_in_bytes,
    )


class Planner:
    """Abstract state and compiled phases of one config on one mesh, compiled at most once each."""

    def __init__(self, settings: configs.RunSettings, mesh, task: tasks.RLTask | None):
        self.settings, self.mesh = settings, mesh
        self.model_config = configs.policy_config(settings.config)
        self.num_prompts = settings.num_prompts
        self.num_slots = settings.num_slots
        self.grpo_config = settings.grpo
        self.minibatch_slots = self.num_slots // self.grpo_config.num_minibatches
        data, fsdp, tensor = models.mesh_shape(mesh)
        self.batch_shards = data * fsdp
        if task is not None:
            self.prompt_width = int(task.prompt_tokens.shape[1])
            num_dataset_prompts, self.eos_ids = task.num_prompts, tuple(task.eos_ids)
        elif settings.chain is not None:
            chain = settings.chain
            self.prompt_width, num_dataset_prompts, self.eos_ids = (
                chain.max_prompt_length,
                chain.pool_size,
                (0,),
            )
        else:
            # The longest prompt kept; the pool's size only sizes the classifier's few floats.
            self.prompt_width = settings.math.max_prompt_tokens
            num_dataset_prompts, self.eos_ids = (
                settings.num_prompts,
                (0,) * len(settings.math.eos_tokens),
            )
        self.seq_len = self.prompt_width + settings.max_new_tokens
        self.gdro, self.prompt_adversary = configs.build_controllers(
            settings.config, num_dataset_prompts
        )
        self.tx = configs.make_optimizer(settings.optimizer)
        self.replicated = (
            NamedSharding(mesh, P())
            if mesh is not None
            else jax.sharding.SingleDeviceSharding(jax.devices()[0])
        )
        self.parameter_bytes = models.memory_footprint(
            self.model_config, data=data, fsdp=fsdp, tensor=tensor
        ).param_bytes_per_device
        self.opt_state = self._optimizer_state(self._policy()[1])
        replicated = self.replicated
        self.gdro_state = _abstract(jax.eval_shape(self.gdro.init), replicated)
        self.key = _abstract(jax.eval_shape(lambda: jax.random.key(0)), replicated)
        self.prompt_ids = jax.ShapeDtypeStruct((self.num_prompts,), jnp.int32, sharding=replicated)
        self.plan = _abstract(
            jax.eval_shape(self.gdro.plan, self.gdro_state, self.prompt_ids, self.key), replicated
        )
        self._rollout_cache: dict = {}
        self._update_cache: dict = {}
        self.rollouts = None  # the update's abstract input, from the first compiled rollout

    def _policy(self, remat: bool | None = None):
        """(graphdef, abstract float32 parameters placed on the mesh); `remat` overrides."""
        model_config = self.model_config
        if remat is not None:
            model_config = model_config.replace(remat=remat)
        abstract = models.abstract_decoder(model_config, mesh=self.mesh)
        graphdef, params = nnx.split(abstract, nnx.Param)
        return graphdef, _abstract(params, models.parameter_shardings(abstract, self.mesh))

    def _optimizer_state(self, params):
        """The optimizer state's shapes, each moment placed like its parameter (counts
        replicated), as the run's state should hold them."""
        shardings = jax.tree.map(lambda leaf: leaf.sharding, params)
        return optax.tree_map_params(
            self.tx,
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            jax.eval_shape(self.tx.init, params),
            shardings,
            transform_non_params=lambda leaf: _abstract(leaf, self.replicated),
            is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
        )

    @property
    def reference(self) -> bool:
        return self.grpo_config.kl_coef > 0

    @property
    def device(self) -> jax.Device:
        """The first device of the mesh: its backend compiles the phases."""
        return jax.devices()[0] if self.mesh is None else self.mesh.devices.flat[0]

    def _compile(self, lowered):
        """`lowered.compile()`; on a CPU without LLVM's optimizations, which only the machine code
        needs (a third faster; the same buffer sizes for the tiny and the 8B configs)."""
        on_cpu = self.device.platform == "cpu"
        return lowered.compile(compiler_options=_CPU_OPTIONS if on_cpu else None)

    def kv_cache_bytes(self, slots: int) -> int:
        """Keys and values of `slots` sequences of P + M cache slots, per device (by hand)."""
        data, fsdp, tensor = models.mesh_shape(self.mesh)
        return models.memory_footprint(
            self.model_config,
            data=data,
            fsdp=fsdp,
            tensor=tensor,
            batch=slots,
            seq_len=self.seq_len,
        ).kv_cache_bytes_per_device

    def _compile_rollout(self, slots: int) -> int:
        graphdef, params = self._policy()
        engine = KVCacheEngine(
            graphdef,
            max_new_tokens=self.settings.max_new_tokens,
            temperature=self.grpo_config.temperature,
            eos_ids=self.eos_ids,
            micro_batch_slots=_or_none(slots, self.num_slots),
        )
        # The prompts' content does not change any buffer: N placeholder rows of the real width.
        with jax.default_device(self.device):  # the prompt table goes where the mesh is
            rollout = rollout_phase(
                engine,
                np.zeros((self.num_prompts, self.prompt_width), np.int32),
                np.ones((self.num_prompts,), np.int32),
                mesh=self.mesh,
            )
        lowered = rollout.lower(params, self.plan, self.prompt_ids, self.key)
        compiled = self._compile(lowered)
        if self.rollouts is None:
            self.rollouts = _abstract(lowered.out_info, compiled.output_shardings)
        arguments, outputs, _, temporaries = _compiled_bytes(compiled)
        return temporaries + outputs + arguments - bytes_per_device(params)

    def rollout_bytes(self, slots: int) -> int:
        """The rollout phase beyond the persistent state (KV cache included), per device."""
        if slots not in self._rollout_cache:
            self._rollout_cache[slots] = self._compile_rollout(slots)
        return self._rollout_cache[slots]

    def _compile_update(self, slots: int, remat: bool) -> int:
        if self.rollouts is None:
            self.rollout_bytes(self.num_slots)
        grpo = dataclasses.replace(
            self.grpo_config, micro_batch_slots=_or_none(slots, self.minibatch_slots)
        )
        graphdef, params = self._policy(remat)
        opt_state = self._optimizer_state(params)
        int32 = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
        state = TrainState(
            params=params,
            opt_state=opt_state,
            gdro=self.gdro_state,
            key=self.key,
            step=int32,
            ref_params=params if self.reference else None,
            skipped_steps=int32,
            consecutive_skips=int32,
        )
        update = make_update(
            graphdef,
            self.tx,
            self.gdro,
            grpo,
            num_prompts=self.num_prompts,
            num_bins=self.settings.num_bins,
            prompt_adversary=self.prompt_adversary,
        )
        replicated = None if self.mesh is None else self.replicated
        jitted = jax.jit(
            update, donate_argnums=0, out_shardings=(state_shardings(state), replicated)
        )
        compiled = self._compile(jitted.lower(state, self.plan, self.prompt_ids, self.rollouts))
        arguments, outputs, aliased, temporaries = _compiled_bytes(compiled)
        persistent = bytes_per_device((params, opt_state, state.ref_params))
        return temporaries + max(0, arguments - persistent) + max(0, outputs - aliased)

    def update_bytes(self, slots: int, remat: bool | None = None) -> int:
        """The update phase beyond the persistent state, per device (`remat`: the config's)."""
        remat = self.model_config.remat if remat is None else remat
        if (slots, remat) not in self._update_cache:
            self._update_cache[slots, remat] = self._compile_update(slots, remat)
        return self._update_cache[slots, remat]

    def candidates(self, total: int) -> list[int]:
        """Micro-batch sizes to try, largest first: `total`, then batch-shards x 2^k dividing it."""
        sizes = {total}
        size = self.batch_shards
        while size < total:
            if total % size == 0:
                sizes.add(size)
            size *= 2
        return sorted(sizes, reverse=True)


def _or_none(slots: int, whole: int) -> int | None:
    """A micro-batch size as the config spells it: None for the whole batch."""
    return None if slots >= whole else slots
