"""A memory plan: what one training step holds per device, worked out before anything is allocated.

    persistent   parameters (float32 masters), AdamW mu and nu, the KL reference   jax.eval_shape
    rollout      the KV cache of one rollout micro-batch                           by hand
                 the rollout's other buffers (prefill, gathered weights, logits)   compiled
    update       activations, gradients, optimizer temporaries, the rollouts       compiled
    peak         persistent + the larger of the two phases (they never overlap)

The persistent lines are exact shapes x dtype bytes / shards; the compiled lines are
`memory_analysis()` of the step's rollout phase and update (`gdro_jax.step`), lowered on the run's
mesh with `jax.ShapeDtypeStruct` arguments at full depth (`_planner.py`) and compiled by the
backend of the mesh's devices: the run's own backend in `build_run`; XLA:CPU with fake devices
when planning on a CPU (`experiments/plan.py`), which computes bfloat16 ops in float32 and so
over-states a GPU's temporaries for `compute_dtype="bfloat16"`.

`check_memory_plan` is what `build_run` calls when `config.device_memory_gib` is set: a plan over
the budget raises a ValueError with the table and the knob to turn before any parameter exists.
`memory_plan(..., suggest=True)` also searches the largest micro-batch sizes that fit, turning on
`model.remat` for the update when no micro-batch fits without it (with `model.remat_policy`
"nothing": a block that keeps its projections' outputs, "dots", holds more), and says when the
update that fits has room for "dots" too (`MemoryPlan.dots_update`).

One module over 400 lines, on purpose: the plan's record, its table and its advice to the
user are one thing read together; the compiling lives in `_planner.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from gdro_jax import configs, models, step, tasks
from gdro_jax.planner._planner import Planner, bytes_per_device

GIB = 1024**3
FSDP, ROLLOUT, UPDATE = "mesh.fsdp", "rollout.micro_batch_slots", "grpo.micro_batch_slots"
_TURN = {FSDP: "raise", ROLLOUT: "lower", UPDATE: "lower"}  # which way each knob saves memory


class MemoryPlan(NamedTuple):
    """Bytes per device of one training step; `table()` prints it.

    The knob of each line: `mesh.fsdp` shards the persistent state, `rollout.micro_batch_slots`
    bounds the rollout phase, `grpo.micro_batch_slots` the update phase.
    """

    mesh_shape: tuple[int, int, int]  # data, fsdp, tensor
    platform: str  # the backend the phases were compiled for ("cpu": fake devices)
    parameters: int  # float32 master parameters
    optimizer: int  # AdamW mu and nu (and its step count)
    reference: int  # the frozen KL reference; 0 when kl_coef is 0
    kv_cache: int  # keys and values of one rollout micro-batch, in the compute dtype
    rollout_other: int  # the rollout's other buffers: prefill, gathered weights, logits, outputs
    update: int  # the update's temporaries, its rollouts input and unaliased outputs
    rollout_slots: int  # slots decoded at once (rollout.micro_batch_slots, or R)
    update_slots: int  # slots per forward/backward pass (grpo.micro_batch_slots, or a mini-batch)
    budget: int | None  # config.device_memory_gib in bytes; None: no limit
    labels: dict[str, str]  # line name -> its description in the table
    notes: tuple[str, ...]  # how the numbers were obtained
    fitting_rollout_slots: int | None = None  # the largest rollout micro-batch that fits
    fitting_update_slots: int | None = None  # the largest update micro-batch that fits
    # That update micro-batch fits only with model.remat=True and model.remat_policy="nothing".
    fitting_needs_remat: bool = False
    compiled: bool = True  # False: the persistent state and KV cache alone exceeded the budget
    remat: bool = False  # whether the update recomputes block activations (model.remat)
    remat_policy: str = "nothing"  # what a rematerialised block keeps (model.remat_policy)
    # The update's bytes at the fitting micro-batch with model.remat_policy="dots", where the
    # config keeps nothing and that fits too (the search's offer); None otherwise.
    dots_update: int | None = None
    searched: bool = False  # whether the micro-batches that fit were searched for

    @property
    def persistent(self) -> int:
        """Parameters, optimizer state and reference: held for the whole run."""
        return self.parameters + self.optimizer + self.reference

    @property
    def rollout_phase(self) -> int:
        """What the rollout adds to the persistent state while it runs."""
        return self.kv_cache + self.rollout_other

    @property
    def total(self) -> int:
        """The peak: the persistent state plus the larger phase."""
        return self.persistent + max(self.rollout_phase, self.update)

    @property
    def fits(self) -> bool:
        """True without a budget or when the peak is within it."""
        return self.budget is None or self.total <= self.budget

    def knobs(self) -> tuple[str, ...]:
        """The config fields to turn for the plan to fit, the biggest line's first.

        Lines are grouped by their knob (the persistent state, the rollout phase, the update
        phase). `mesh.fsdp` alone when the persistent state fills the budget (no micro-batch
        helps then); else a micro-batch knob when its phase does not fit beside the persistent
        state, and `mesh.fsdp` too when the persistent state is bigger than those phases.
        """
        if self.fits:
            return ()
        phases = {ROLLOUT: self.rollout_phase, UPDATE: self.update}
        over = {knob: size for knob, size in phases.items() if self.persistent + size > self.budget}
        if self.persistent >= self.budget:
            return (FSDP,)
        if self.persistent > max(over.values()):
            over[FSDP] = self.persistent
        return tuple(sorted(over, key=over.get, reverse=True))

    def table(self) -> str:
        """The plan as a table per device, each line with its knob, then the total and budget."""
        data, fsdp, tensor = self.mesh_shape
        devices = data * fsdp * tensor
        where = "fake CPU devices" if self.platform == "cpu" and devices > 1 else self.platform
        rows = [
            ("parameters", self.parameters, FSDP),
            ("optimizer", self.optimizer, FSDP),
            ("reference", self.reference, FSDP),
            ("kv_cache", self.kv_cache, ROLLOUT),
            ("rollout_other", self.rollout_other, ROLLOUT),
            ("update", self.update, UPDATE),
        ]
        width = max(len(label) for label in self.labels.values()) + 2

        def line(label: str, size: int | None, comment: str = "") -> str:
            amount = "none" if size is None else format_size(size)
            return f"  {label:<{width}}{amount:>14}   {comment}".rstrip()

        lines = [
            f"memory plan per device: mesh data={data} x fsdp={fsdp} x tensor={tensor} "
            f"({devices} device{'s' if devices > 1 else ''}, compiled on {where})"
        ]
        for name, size, knob in rows:
            if name not in self.labels:
                continue
            if not self.compiled and name in ("rollout_other", "update"):
                lines.append(f"  {self.labels[name]:<{width}}{'not compiled':>14}   {knob}")
            else:
                lines.append(line(self.labels[name], size, knob))
        total = "total (persistent + the larger phase)" if self.compiled else "total (at least)"
        lines.append(line(total, self.total))
        verdict = ""
        if self.budget is not None:
            verdict = "fits" if self.fits else f"does not fit: {self._advice(prefix='')}"
        lines.append(line("budget (device_memory_gib)", self.budget, verdict))
        if self.searched:
            lines.append(self._suggestion())
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def _fitting(self) -> dict[str, int | None]:
        return {ROLLOUT: self.fitting_rollout_slots, UPDATE: self.fitting_update_slots}

    def _suggestion(self) -> str:
        if self.persistent >= self.budget:
            return f"  no micro-batch size fits beside the persistent state: raise {FSDP}"
        rollout, update = self.fitting_rollout_slots, self.fitting_update_slots
        remat = "".join(f"--config.{flag} " for flag in self._full_remat_flags())
        parts = [
            f"--config.{ROLLOUT}={rollout}" if rollout else f"(no {ROLLOUT} fits)",
            f"{remat}--config.{UPDATE}={update}"
            if update
            else f"(no {UPDATE} fits, even with model.remat=True and remat_policy=nothing)",
        ]
        line = "  largest micro-batches that fit: " + " ".join(parts)
        if self.dots_update is not None:
            line += (
                f"\n  that update also fits with --config.model.remat_policy=dots "
                f"({format_size(self.dots_update)}): its blocks keep their projections' outputs, "
                "so the backward pass does not redo those matmuls"
            )
        return line

    def _full_remat_flags(self) -> list[str]:
        """The settings the fitting update micro-batch needs beyond the config's: the full
        remat (nothing kept)."""
        if not self.fitting_needs_remat:
            return []
        return [
            setting
            for setting, already in (
                ("model.remat=True", self.remat),
                ("model.remat_policy=nothing", self.remat_policy == "nothing"),
            )
            if not already
        ]

    def _advice(self, prefix: str = "config.") -> str:
        steps = [f"{_TURN[knob]} {prefix}{knob}" for knob in self.knobs()]
        if UPDATE in self.knobs() and not (self.remat and self.remat_policy == "nothing"):
            where = self.knobs().index(UPDATE)
            setting = "remat_policy=nothing" if self.remat else "remat=True"
            steps[where] += f" or set {prefix}model.{setting}"
        return ", then ".join(steps)

    def error(self) -> str:
        """One line: the peak, the budget and the knobs to turn (with the sizes that fit)."""
        advice = self._advice()
        if self.searched:
            sizes = [
                f"{knob}={slots}"
                for knob, slots in self._fitting().items()
                if slots and knob in self.knobs()
            ]
            if self.fitting_update_slots and UPDATE in self.knobs():
                sizes.extend(self._full_remat_flags())
            if sizes:
                advice += " (largest that fit: " + ", ".join(sizes) + ")"
        return (
            f"the memory plan needs {format_size(self.total)} per device, over "
            f"config.device_memory_gib={self.budget / GIB:.4g}; {advice}"
        )


def format_size(size: int) -> str:
    """Bytes in the unit that fits them, three significant digits: `812 B`, `3.02 MiB`,
    `1.25 GiB` (each line of a plan in its own unit, so a small buffer beside a large one does
    not print as 0.00)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {unit}"


def _settings(config: Mapping[str, Any] | configs.RunSettings, shape) -> configs.RunSettings:
    """The run's settings, read for a mesh of `shape` (refused when `config.mesh` differs)."""
    if isinstance(config, configs.RunSettings):
        configured = config.mesh
    else:
        configured = configs.mesh_shape_of(configs.complete(config, configs.run_schema()))
    if tuple(shape) != tuple(configured):
        raise ValueError(
            f"config.mesh is {dict(zip(models.MESH_AXES, configured, strict=True))} but the mesh "
            f"to plan on is {dict(zip(models.MESH_AXES, shape, strict=True))}"
        )
    if isinstance(config, configs.RunSettings):
        return config
    # Shapes only: a math run's width is its `max_prompt_tokens`, no tokenizer is read.
    return configs.read_run_config(config, num_devices=int(np.prod(shape)), needs_tokenizer=False)


def _budget_bytes(settings: configs.RunSettings) -> int | None:
    """`config.device_memory_gib` in bytes; None: no limit."""
    gib = settings.device_memory_gib
    return None if gib is None else round(gib * GIB)


def _largest_fitting(candidates: list[int], fits, known: int | None = None) -> int | None:
    """The largest of the descending `candidates` that `fits` (monotone in size), by bisection.

    `known`: a candidate whose fit the plan has computed already (its own micro-batch): the search
    then runs on the side of it that holds the answer, and tries the next larger candidate first,
    so a config whose own size is the largest that fits costs one compile more, not several.
    """
    if known in candidates:
        index = candidates.index(known)
        if fits(known):
            if index == 0 or not fits(candidates[index - 1]):
                return known
            low, high = 0, index - 1  # candidates[high] fits
        else:
            low, high = index + 1, len(candidates) - 1
            if low > high or not fits(candidates[high]):
                return None
    else:
        low, high = 0, len(candidates) - 1
        if fits(candidates[low]):  # the whole batch at once
            return candidates[low]
        if not fits(candidates[high]):
            return None
    while low < high:
        middle = (low + high) // 2
        if fits(candidates[middle]):
            high = middle
        else:
            low = middle + 1
    return candidates[low]


def memory_plan(
    config: Mapping[str, Any] | configs.RunSettings,
    mesh=None,
    *,
    task: tasks.RLTask | None = None,
    program: step.StepProgram | None = None,
    suggest: bool = False,
    early_exit: bool = False,
) -> MemoryPlan:
    """The per-device memory of `config`'s training step on `mesh`; nothing is allocated.

    Args:
      config: a run config (`experiments/configs/*.py`) or its `RunSettings`;
        `device_memory_gib` is the budget.
      mesh: the run's `data` x `fsdp` x `tensor` mesh (`configs.run_mesh`; `planning_mesh` on
        fake CPU devices), or None for one device.
      task: the run's task, when built (its prompt width, pool size and stop ids); default: the
        chain task's from `config.task`, or `config.math.max_prompt_tokens` for math (an upper
        bound: the real width is the longest kept prompt).
      program: the run's step as `train.build_run` built it (so the plan is of the function
        that runs, an external engine's included); default: `configs.step_program`'s for the
        config (its `rollout.engine`).
      suggest: with a budget, also search the largest `rollout.micro_batch_slots` and
        `grpo.micro_batch_slots` that fit (batch shards x powers of two dividing R or a
        mini-batch; one compile per size tried, by bisection).
      early_exit: compile nothing when the persistent state and the KV cache alone exceed the
        budget (the plan is then a lower bound, `compiled=False`).

    Returns:
      The `MemoryPlan`.

    Raises:
      ValueError: naming `config.mesh` when it differs from `mesh`, or any field
        `configs.read_run_config` refuses.
    """
    shape = models.mesh_shape(mesh)
    settings = _settings(config, shape)
    budget = _budget_bytes(settings)
    planner = Planner(settings, mesh, task, program)
    rollout_slots = min(settings.rollout.micro_batch_slots or planner.num_slots, planner.num_slots)
    grpo = planner.grpo_config
    if grpo.pack_sequences:
        update_slots = grpo.packed_rows_per_pass(planner.minibatch_slots)
    else:
        update_slots = grpo.micro_batch_slots or planner.minibatch_slots
    kv_cache = planner.kv_cache_bytes(rollout_slots)
    optimizer = bytes_per_device(planner.opt_state)
    parameters = planner.parameter_bytes
    reference = parameters if planner.reference else 0
    compiled = not (
        early_exit and budget is not None and parameters + optimizer + reference + kv_cache > budget
    )
    c = planner.model_config
    labels = {
        "parameters": f"parameters ({c.param_dtype} masters)",
        "optimizer": "optimizer state (AdamW mu, nu)",
        "kv_cache": (
            f"rollout KV cache ({c.compute_dtype}, {rollout_slots} slots x "
            f"{planner.seq_len} positions)"
        ),
        "rollout_other": "rollout, other buffers (compiled)"
        if not planner.external_engine
        else "rollout: the trainer's rescoring of the engine's samples (compiled)",
        "update": f"update temporaries (compiled, {update_slots} slots per pass)",
    }
    row_tokens = planner.prompt_width + settings.max_new_tokens
    if grpo.pack_sequences:
        labels["update"] = (
            f"update temporaries (compiled, {update_slots} packed "
            f"row{'s' if update_slots > 1 else ''} of {row_tokens} tokens per pass)"
        )
    if planner.external_engine:
        labels["kv_cache"] = "rollout KV cache (the external engine's own, not counted)"
    if planner.reference:
        labels["reference"] = f"reference model (kl_coef={planner.grpo_config.kl_coef:g})"
    notes = [
        f"R = {planner.num_slots} slots of P + M = {planner.prompt_width} + "
        f"{settings.max_new_tokens} tokens; mini-batches of {planner.minibatch_slots} slots",
    ]
    if grpo.pack_sequences:
        notes.append(
            f"grpo.pack_sequences: each mini-batch's sequences packed into rows of {row_tokens} "
            f"tokens, {update_slots} rows a pass, over the rows in use only (a pass holds what a "
            f"padded micro-batch of {update_slots} slots does; set grpo.micro_batch_slots)"
        )
    if planner.device.platform == "cpu" and c.compute_dtype != "float32":
        # Seen in its buffer assignment (the MLP's [tokens, F] activations as float32), and
        # the Qwen3-8B rollout's other buffers are 89 GiB computing in float32, 100 in bfloat16.
        notes.append(
            f"compiled lines are XLA:CPU's, which keeps many {c.compute_dtype} intermediates in "
            "float32: a GPU's are likely smaller"
        )
    plan = MemoryPlan(
        mesh_shape=shape,
        platform=planner.device.platform,
        parameters=parameters,
        optimizer=optimizer,
        reference=reference,
        kv_cache=kv_cache,
        rollout_other=max(0, planner.rollout_bytes(rollout_slots) - kv_cache) if compiled else 0,
        update=planner.update_bytes(update_slots) if compiled else 0,
        rollout_slots=rollout_slots,
        update_slots=update_slots,
        budget=budget,
        labels=labels,
        notes=tuple(notes),
        compiled=compiled,
        remat=c.remat,
        remat_policy=c.remat_policy,
    )
    if not suggest or budget is None or not compiled:
        return plan
    room = budget - plan.persistent
    if room <= 0:
        return plan._replace(searched=True)
    rollout = _largest_fitting(
        planner.candidates(planner.num_slots),
        lambda slots: planner.rollout_bytes(slots) <= room,
        known=rollout_slots,
    )
    minibatch = planner.candidates(planner.minibatch_slots)
    update = _largest_fitting(
        minibatch, lambda slots: planner.update_bytes(slots) <= room, known=update_slots
    )
    full_remat = c.remat and c.remat_policy == "nothing"  # the least an update can hold
    needs_remat = False
    if update is None and not full_remat:
        # Without remat every layer's activations (attention probabilities included) stay
        # alive for the backward pass: one long sequence alone can exceed a device. With
        # "dots" every projection's output does.
        update = _largest_fitting(
            minibatch, lambda slots: planner.update_bytes(slots, (True, "nothing")) <= room
        )
        needs_remat = update is not None
    dots_update = None
    if update is not None and (needs_remat or full_remat):
        # Where memory allows, a block may keep its projections' outputs: fewer FLOPs.
        dots = planner.update_bytes(update, (True, "dots"))
        dots_update = dots if dots <= room else None
    return plan._replace(
        searched=True,
        fitting_rollout_slots=rollout,
        fitting_update_slots=update,
        fitting_needs_remat=needs_remat,
        dots_update=dots_update,
    )


def check_memory_plan(
    config: Mapping[str, Any] | configs.RunSettings,
    mesh=None,
    *,
    task: tasks.RLTask | None = None,
    program: step.StepProgram | None = None,
) -> MemoryPlan | None:
    """Raises before anything is allocated when the plan exceeds `config.device_memory_gib`.

    Args:
      config: the run config or its `RunSettings`; nothing is checked when
        `device_memory_gib` is None.
      mesh: the run's mesh (None: one device).
      task: the run's task, for its prompt width (see `memory_plan`).
      program: the run's step, which the plan lowers (see `memory_plan`).

    Returns:
      The plan when it fits, None without a budget.

    Raises:
      ValueError: the plan does not fit; the message names the knob to turn
        (`rollout.micro_batch_slots` for the rollout's KV cache, `grpo.micro_batch_slots` for
        the update's temporaries, `mesh.fsdp` for the persistent state) and holds the table.
    """
    settings = _settings(config, models.mesh_shape(mesh))
    if settings.device_memory_gib is None:
        return None
    plan = memory_plan(settings, mesh, task=task, program=program, early_exit=True)
    if not plan.fits:
        raise ValueError(f"{plan.error()}\n{plan.table()}")
    return plan


def planning_mesh(config: Mapping[str, Any]):
    """The mesh of `config.mesh` to plan on, without a run: the default backend's devices when it
    has enough, else CPU devices; None for one device.

    A CPU has as many devices as `XLA_FLAGS=--xla_force_host_platform_device_count=<n>` asks for,
    read when jax starts its backends (not when it is imported): `experiments/plan.py` sets it
    to the mesh's size before touching a device.

    Raises:
      ValueError: naming `config.mesh` when no backend has enough devices.
    """
    shape = configs.mesh_shape_of(configs.complete(config, configs.run_schema()))
    count = int(np.prod(shape))
    if count == 1:
        return None
    for devices in (jax.devices(), jax.devices("cpu")):
        if len(devices) >= count:
            return models.make_mesh(*shape, devices=devices[:count])
    raise ValueError(
        f"config.mesh data x fsdp x tensor = {count} devices, but only {len(jax.devices())} "
        f"are available; on a CPU set XLA_FLAGS=--xla_force_host_platform_device_count={count} "
        "before jax starts (experiments/plan.py does)"
    )
