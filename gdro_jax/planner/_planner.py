"""The planner behind `memory_plan`: one run's `step.StepProgram` (the object `build_run` runs)
lowered with `jax.ShapeDtypeStruct` arguments and compiled, each phase at most once per size.

Persistent state is exact shapes x dtype bytes / shards: `models.memory_footprint` for the
parameters and the KV cache, the program's `abstract_state` for the optimizer's moments. The
phases' other buffers are `memory_analysis()` of the program's own jitted phases (its rollout:
the built-in engine, or the rescoring of another engine's samples; its update with the state
donated), compiled by the backend of the mesh's devices. The micro-batch and remat variants a
search tries are the same program through `StepProgram.replace`.

Both phases are compiled at full depth: on 2 CPU cores with 8 fake devices the 36-layer Qwen3-8B
rollout takes about 40 s of CPU time to compile, its update (a scan over the layers) about the
same. Compiling a 2- and a 3-layer model and extrapolating linearly in depth is not faster for
the rollout and under-stated its bytes by 38 % for Qwen3-8B (XLA's buffer reuse is not linear in
depth), so it is not done.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gdro_jax import configs, models, step, tasks

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
    """Abstract state and compiled phases of one run's `step.StepProgram` on its mesh, each
    compiled at most once per size.

    Args:
      settings: the run's settings.
      mesh: the run's mesh (None: one device).
      task: the run's task, when built (its prompt width, pool size and stop ids).
      program: the run's step, as `train.build_run` built it; default: the one
        `configs.step_program` builds for `settings` (the KV-cache engine unless
        `config.rollout.engine` names another).
    """

    def __init__(
        self,
        settings: configs.RunSettings,
        mesh,
        task: tasks.RLTask | None = None,
        program: step.StepProgram | None = None,
    ):
        self.settings, self.mesh = settings, mesh
        self.model_config = settings.policy
        self.num_prompts = settings.num_prompts
        self.num_slots = settings.num_slots
        self.grpo_config = settings.grpo
        self.minibatch_slots = self.num_slots // self.grpo_config.num_minibatches
        data, fsdp, tensor = models.mesh_shape(mesh)
        self.batch_shards = data * fsdp
        pool = _pool(settings, task)
        if program is None:
            program = configs.step_program(settings, mesh, **pool)
        self.program = program
        self.num_dataset_prompts = pool["num_dataset_prompts"]
        self.prompt_width = program.prompt_width
        self.seq_len = self.prompt_width + settings.max_new_tokens
        self.replicated = program.replicated
        self.parameter_bytes = models.memory_footprint(
            self.model_config, data=data, fsdp=fsdp, tensor=tensor
        ).param_bytes_per_device
        state = program.abstract_state(self._policy()[1])
        self.opt_state, self.gdro_state, self.key = state.opt_state, state.gdro, state.key
        self.prompt_ids = jax.ShapeDtypeStruct(
            (self.num_prompts,), jnp.int32, sharding=self.replicated
        )
        self.plan = _abstract(
            jax.eval_shape(program.decisions.plan, self.gdro_state, self.prompt_ids, self.key),
            self.replicated,
        )
        self._rollout_cache: dict = {}
        self._update_cache: dict = {}
        # The update's abstract input: an external engine's samples, or the first compiled
        # rollout's outputs.
        self.rollouts = program.abstract_rollouts() if program.external_engine else None

    def _remat(self, remat: tuple[bool, str] | None) -> tuple[bool, str]:
        """(model.remat, model.remat_policy) to plan with: `remat`, or the config's (None)."""
        c = self.model_config
        return (c.remat, c.remat_policy) if remat is None else remat

    def _policy(self, remat: tuple[bool, str] | None = None):
        """(graphdef, abstract float32 parameters placed on the mesh), with `remat` (see
        `_remat`): one per (remat, remat_policy), however it is asked for."""
        return self._policy_with(*self._remat(remat))

    @functools.cache  # noqa: B019 (one planner per plan: it lives as long as its cache)
    def _policy_with(self, remat: bool, remat_policy: str):
        model_config = self.model_config.replace(remat=remat, remat_policy=remat_policy)
        abstract = models.abstract_decoder(model_config, mesh=self.mesh)
        graphdef, params = nnx.split(abstract, nnx.Param)
        return graphdef, _abstract(params, models.parameter_shardings(abstract, self.mesh))

    @property
    def reference(self) -> bool:
        return self.program.with_reference

    @property
    def external_engine(self) -> bool:
        """Another engine samples: its KV cache is its own, the trainer only rescores."""
        return self.program.external_engine

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
        """Keys and values of `slots` sequences of P + M cache slots, per device (by hand); 0
        when another engine samples."""
        if self.external_engine:
            return 0
        data, fsdp, tensor = models.mesh_shape(self.mesh)
        return models.memory_footprint(
            self.model_config,
            data=data,
            fsdp=fsdp,
            tensor=tensor,
            batch=slots,
            seq_len=self.seq_len,
        ).kv_cache_bytes_per_device

    def lower_rollout(self, slots: int | None = None):
        """The rollout phase lowered on abstract arguments: the built-in engine decoding `slots`
        at a time (default: the run's), or the trainer's rescoring of another engine's samples."""
        graphdef, params = self._policy()
        program = self.program.replace(graphdef=graphdef)
        if self.external_engine:
            return program.rescore.lower(params, self.rollouts)
        if slots is not None:
            rollout = dataclasses.replace(
                program.rollout, micro_batch_slots=_or_none(slots, self.num_slots)
            )
            program = program.replace(rollout=rollout)
        # The prompts' content does not change any buffer: D placeholder rows of the real width.
        with jax.default_device(self.device):  # the prompt table goes where the mesh is
            rollout = program.rollout_function(
                np.zeros((self.num_dataset_prompts, self.prompt_width), np.int32),
                np.ones((self.num_dataset_prompts,), np.int32),
            )
        return rollout.lower(params, self.plan, self.prompt_ids, self.key)

    def _compile_rollout(self, slots: int) -> int:
        lowered = self.lower_rollout(slots)
        compiled = self._compile(lowered)
        if self.rollouts is None:
            self.rollouts = _abstract(lowered.out_info, compiled.output_shardings)
        arguments, outputs, _, temporaries = _compiled_bytes(compiled)
        # Beyond the parameters: the prompts (or an external engine's samples, which the
        # rescoring reads), the outputs and the temporaries.
        return temporaries + outputs + arguments - bytes_per_device(self._policy()[1])

    def rollout_bytes(self, slots: int) -> int:
        """The rollout phase beyond the persistent state (KV cache included), per device."""
        if slots not in self._rollout_cache:
            self._rollout_cache[slots] = self._compile_rollout(slots)
        return self._rollout_cache[slots]

    def lower_update(self, slots: int | None = None, remat: tuple[bool, str] | None = None):
        """The update lowered on the abstract state: micro-batches of `slots` (default: the
        run's), with `remat`, a (model.remat, model.remat_policy) pair (default: the config's).
        Returns `(lowered, abstract state)`."""
        if self.rollouts is None:
            self.rollout_bytes(self.num_slots)
        graphdef, params = self._policy(remat)
        grpo = self.grpo_config
        if slots is not None:  # as the update reads it (`GRPOConfig.for_minibatch`)
            grpo = dataclasses.replace(grpo, micro_batch_slots=slots)
            grpo = grpo.for_minibatch(self.minibatch_slots)
        program = self.program.replace(graphdef=graphdef, grpo=grpo)
        state = program.abstract_state(params)
        lowered = program.update(state).lower(state, self.plan, self.prompt_ids, self.rollouts)
        return lowered, state

    def _compile_update(self, slots: int, remat: tuple[bool, str] | None) -> int:
        lowered, state = self.lower_update(slots, remat)
        compiled = self._compile(lowered)
        arguments, outputs, aliased, temporaries = _compiled_bytes(compiled)
        persistent = bytes_per_device((state.params, state.opt_state, state.ref_params))
        return temporaries + max(0, arguments - persistent) + max(0, outputs - aliased)

    def update_bytes(self, slots: int, remat: tuple[bool, str] | None = None) -> int:
        """The update phase beyond the persistent state, per device, with `remat` (a
        (model.remat, model.remat_policy) pair; default: the config's)."""
        key = (slots, *self._remat(remat))
        if key not in self._update_cache:
            self._update_cache[key] = self._compile_update(slots, key[1:])
        return self._update_cache[key]

    def candidates(self, total: int) -> list[int]:
        """Micro-batch sizes to try, largest first: `total`, then batch-shards x 2^k dividing it."""
        sizes = {total}
        size = self.batch_shards
        while size < total:
            if total % size == 0:
                sizes.add(size)
            size *= 2
        return sorted(sizes, reverse=True)


def _pool(settings: configs.RunSettings, task: tasks.RLTask | None) -> dict:
    """The prompt width, pool size, stop ids and prompt features a step is built for: the
    task's when built, else the chain task's from the config, or the math task's longest kept
    prompt (whose features, a constant of the step, change no buffer: none)."""
    if task is not None:
        return dict(
            prompt_width=int(task.prompt_tokens.shape[1]),
            num_dataset_prompts=task.num_prompts,
            eos_ids=tuple(task.eos_ids),
            prompt_features=tasks.prompt_features(task),
        )
    if settings.chain is not None:
        features = None
        if configs.takes_prompt_features(settings.method):
            features = tasks.prompt_features(tasks.chain_task(settings.chain))
        return dict(
            prompt_width=settings.chain.max_prompt_length,
            num_dataset_prompts=settings.chain.pool_size,
            eos_ids=(0,),
            prompt_features=features,
        )
    # The longest prompt kept; the pool's size only sizes the classifier's few floats.
    return dict(
        prompt_width=settings.math.max_prompt_tokens,
        num_dataset_prompts=settings.num_prompts,
        eos_ids=(0,) * len(settings.math.eos_tokens),
    )


def _or_none(slots: int, whole: int) -> int | None:
    """A micro-batch size as the config spells it: None for the whole batch."""
    return None if slots >= whole else slots
