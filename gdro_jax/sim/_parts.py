"""Which parts of `controllers.PARTS` a simulator builds, and which of them a method applies.

A method's record (`controllers.METHODS`) names the part behind each of a step's four decisions
(`controllers.DECISIONS`). `MethodFlags` holds, per decision, which part fills it, as a traced
int (0: GRPO's own choice; k: the k-th part of `controllers.PARTS[decision]`), so one compilation
serves every method whose parts it holds, and a decision can never hold two parts at once.

Every part is built from its factory in `controllers.PARTS` and its `SimConfig` block of the
same name, with the run-level arguments its factory takes (`build_part`, as the trainer's
`configs.build_controllers`). The simulator models a part when `SimConfig` holds its block; a
part registered in `controllers.PARTS` without one is refused by name (`method_flags`).

Which parts are built at all is static (`make_simulator(config, parts=...)`): the GDRO parts
always (every method logs what they would play), the others (the rivals) only when asked for, so
the GDRO methods' program does not carry them. `simulate(config, methods)` builds the union of
its methods' parts (`method_parts`); a method whose part a given simulator lacks is refused by
name.
"""

import dataclasses
import inspect
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gdro_jax.controllers import (
    METHODS,
    PARTS,
    RUN_LEVEL_ARGUMENTS,
    check_combination,
    get_method,
)
from gdro_jax.sim._config import SimConfig
from gdro_jax.sim._learner import prompt_levels


class MethodFlags(NamedTuple):
    """The part filling each decision (traced, so methods share one compilation): 0 for GRPO's
    choice, k for the k-th part of `controllers.PARTS[decision]` (`part_index`)."""

    prompt_sampler: jax.Array  # [] int32 which prompts make the batch (0: the epoch order)
    rollout_allocation: jax.Array  # [] int32 rollouts per prompt (0: n_mean each)
    prompt_adversary: jax.Array  # [] int32 advantage multipliers (0: equal weights)
    group_filter: jax.Array  # [] int32 which groups the update keeps (0: all, every step)


# The decision each part of the registry fills.
DECISION_OF_PART = {part: decision for decision, parts in PARTS.items() for part in parts}
# Built into every simulator: all methods run them (a method only decides what is applied).
GDRO_PARTS = ("prompt_gdro", "rollout_gdro")
# The controller blocks of `SimConfig`: the classifier's, and one per part it models.
_BLOCKS = {field.name for field in dataclasses.fields(SimConfig) if field.default_factory is dict}
# The parts of `controllers.PARTS` the simulator models (those with a `SimConfig` block, under a
# decision `MethodFlags` holds), by decision, in the registry's order.
SIMULATED_PARTS = {
    decision: tuple(part for part in PARTS.get(decision, ()) if part in _BLOCKS)
    for decision in MethodFlags._fields
}
# Every part the simulator models: the GDRO parts first, then the others in the registry's order.
ALL_PARTS = (
    *GDRO_PARTS,
    *(p for parts in SIMULATED_PARTS.values() for p in parts if p not in GDRO_PARTS),
)


def part_index(decision: str, part: str | None) -> int:
    """The value of `MethodFlags.<decision>` that applies `part` (0 for None: GRPO's choice)."""
    return 0 if part is None else tuple(PARTS[decision]).index(part) + 1


def build_part(config: SimConfig, part: str, num_bins: int) -> Any:
    """`part` built by its factory in `controllers.PARTS` from its `SimConfig` block, with the
    run-level arguments (`RUN_LEVEL_ARGUMENTS`) its factory takes.

    Raises:
      ValueError: naming the block's field (`knapsack.n_max`, ...) whose value the factory refuses.
    """
    factory = PARTS[DECISION_OF_PART[part]][part]
    run_level = {
        # The parts that keep a history per prompt (Knapsack-RL, MoPPS) keep it over the pool's D.
        "num_prompts": config.pool_size,
        # A group filter's round is the step's N groups.
        "num_groups": config.num_prompts,
        "num_bins": num_bins,
        "n_mean": config.n_mean,
        # The Bernoulli proxies scale with the reward's range, as in the trainer.
        "reward_values": (config.reward_wrong, config.reward_correct),
        # What a prompt of the pool is known by before any rollout: its level (its offset is
        # the hidden part of its difficulty), as the chain task's features lead with the level.
        "prompt_features": prompt_levels(config.pool_counts)[:, None] / config.num_levels,
    }
    assert set(run_level) == set(RUN_LEVEL_ARGUMENTS)
    accepted = inspect.signature(factory).parameters
    given = {name: value for name, value in run_level.items() if name in accepted}
    return call_named(part, factory, **given, **getattr(config, part))


def call_named(block: str, factory, *args, **kwargs):
    """Calls a controller factory; its ValueError names the field under the config's block."""
    try:
        return factory(*args, **kwargs)
    except ValueError as error:
        raise ValueError(f"{block}.{error}") from None


def _simulated(method) -> bool:
    return all(p in SIMULATED_PARTS.get(d, ()) for d, p in method.parts().items())


# The methods of `controllers.METHODS` whose every part the simulator models (all of them).
SIMULATED_METHODS = tuple(name for name, method in METHODS.items() if _simulated(method))
# The methods a default simulator runs: those with GDRO parts only (`simulate`'s default).
GDRO_METHODS = tuple(
    name
    for name, method in METHODS.items()
    if all(part in GDRO_PARTS for part in method.parts().values())
)


def compiled_parts(parts: Iterable[str]) -> tuple[str, ...]:
    """`parts` with the GDRO parts added, in `ALL_PARTS` order (the key of one compilation).

    Raises:
      ValueError: a name that is not one of `ALL_PARTS`.
    """
    parts = tuple(parts)
    unknown = [part for part in parts if part not in ALL_PARTS]
    if unknown:
        raise ValueError(f"parts must be names from {ALL_PARTS}, got parts={parts!r}")
    return tuple(part for part in ALL_PARTS if part in parts or part in GDRO_PARTS)


def method_parts(methods: Iterable[str]) -> tuple[str, ...]:
    """The parts a simulator needs to run every method of `methods` (`compiled_parts` order)."""
    needed = set()
    for method in methods:
        method_flags(method)  # an unknown method, or a part the simulator does not model
        needed.update(get_method(method).parts().values())
    return compiled_parts(needed)


def method_flags(method: str, parts: Iterable[str] | None = None) -> MethodFlags:
    """The `MethodFlags` of one of `controllers.METHODS` ("grpo", "knapsack", ...), read off its
    record.

    Args:
      method: the method's name.
      parts: when given, the parts of the simulator that will run it (`Simulator.parts`).

    Raises:
      ValueError: an unknown method, one with a part the simulator does not model, or one with a
        part missing from `parts`.
    """
    record = get_method(method)
    applied = record.parts()
    for decision, part in applied.items():
        if part not in SIMULATED_PARTS.get(decision, ()):
            why = (
                f"SimConfig has no block {part!r}"
                if decision in SIMULATED_PARTS
                else f"MethodFlags has no decision {decision!r}"
            )
            raise ValueError(
                f"the simulator does not model {decision}={part!r} (method {method!r}): {why}; "
                f"it models {SIMULATED_PARTS}"
            )
    if parts is not None:
        _check_compiled(set(applied.values()), tuple(parts), f"method {method!r}")
    return MethodFlags(
        **{
            decision: jnp.asarray(part_index(decision, getattr(record, decision)), jnp.int32)
            for decision in MethodFlags._fields
        }
    )


def _check_compiled(applied: set[str], parts: tuple[str, ...], who: str) -> None:
    missing = [part for part in ALL_PARTS if part in applied and part not in parts]
    if missing:
        raise ValueError(
            f"{who} needs the part {', '.join(map(repr, missing))}, which this simulator was not "
            f"compiled with (parts={parts}); build it with make_simulator(config, "
            f"parts=sim.method_parts(methods)), or let simulate(config, methods) build it"
        )


def check_flags(flags: MethodFlags, parts: tuple[str, ...]) -> None:
    """Refuses concrete `flags` that apply a part outside `parts`, or parts that do not combine.

    Traced flags are not checked (their values are unknown until the run).

    Raises:
      ValueError: naming the method the flags belong to (when they are a method's) and the
        missing part; or a decision's value that names no part; or the parts that do not combine
        (a group filter with an allocation or a prompt adversary, which the trainer refuses too).
    """
    if any(isinstance(value, jax.core.Tracer) for value in flags):
        return
    chosen = {}
    for decision, value in flags._asdict().items():
        index = int(np.asarray(value))
        if not 0 <= index <= len(PARTS[decision]):
            raise ValueError(
                f"flags.{decision} must be 0 (GRPO's) or 1..{len(PARTS[decision])} (the parts "
                f"{tuple(PARTS[decision])}), got flags.{decision}={index}"
            )
        if index:
            chosen[decision] = tuple(PARTS[decision])[index - 1]
    named = [name for name, record in METHODS.items() if record.parts() == chosen]
    who = f"method {named[0]!r}" if named else f"flags applying {sorted(chosen.values())}"
    _check_compiled(set(chosen.values()), parts, who)
    try:
        check_combination(**{decision: True for decision in chosen})
    except ValueError as error:
        raise ValueError(f"{who}: {error}") from None
