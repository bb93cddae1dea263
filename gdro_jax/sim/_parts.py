"""Which controller parts a simulator compiles, and which of them a method applies.

Every part of `controllers.PARTS` has a traced boolean in `MethodFlags`, so one compilation
serves every method whose parts it holds. Which parts are compiled in at all is static
(`make_simulator(config, parts=...)`): the GDRO parts always (every method logs what they would
play), the rivals (Knapsack-RL, MoPPS, dynamic sampling) only when asked for, so the GDRO methods'
program does not carry them. `simulate(config, methods)` compiles the union of its methods'
parts (`method_parts`); a method whose part a given simulator lacks is refused by name.
"""

from collections.abc import Iterable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gdro_jax.controllers import METHODS, PARTS, get_method

# The field of `MethodFlags` that applies each part the simulator models.
FLAG_OF_PART = {
    "prompt_gdro": "reweight",
    "rollout_gdro": "allocate",
    "knapsack": "allocate_knapsack",
    "mopps": "sample_mopps",
    "dynamic_sampling": "filter_groups",
}
ALL_PARTS = tuple(FLAG_OF_PART)
# Compiled into every simulator: all methods run them (a method only decides what is applied).
GDRO_PARTS = ("prompt_gdro", "rollout_gdro")
# The parts of `controllers.METHODS` the simulator models, by decision.
SIMULATED_PARTS = {
    decision: tuple(part for part in parts if part in FLAG_OF_PART)
    for decision, parts in PARTS.items()
}
_ALLOCATIONS = ("rollout_gdro", "knapsack")


class MethodFlags(NamedTuple):
    """Which controller decisions a method applies (traced, so methods share one compilation)."""

    reweight: jax.Array  # [] bool apply Prompt-GDRO's advantage multipliers
    allocate: jax.Array  # [] bool apply Rollout-GDRO's rollout counts
    allocate_knapsack: jax.Array  # [] bool apply Knapsack-RL's rollout counts
    sample_mopps: jax.Array  # [] bool the batch is MoPPS's Thompson draw, not the epoch order's
    filter_groups: jax.Array  # [] bool dynamic sampling: an optimizer step only on a ready buffer


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
    unknown = [part for part in parts if part not in FLAG_OF_PART]
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
            raise ValueError(
                f"the simulator does not model {decision}={part!r} (method {method!r}); it "
                f"models {SIMULATED_PARTS}"
            )
    if parts is not None:
        _check_compiled(set(applied.values()), tuple(parts), f"method {method!r}")
    return MethodFlags(
        **{flag: jnp.asarray(part in applied.values()) for part, flag in FLAG_OF_PART.items()}
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
        missing part; or the parts that do not combine (two rollout allocations; a group filter
        with an allocation or a prompt adversary, which the trainer refuses too).
    """
    values = [getattr(flags, flag) for flag in FLAG_OF_PART.values()]
    if any(isinstance(value, jax.core.Tracer) for value in values):
        return
    applied = {
        part for part, value in zip(ALL_PARTS, values, strict=True) if bool(np.asarray(value))
    }
    named = [name for name, record in METHODS.items() if set(record.parts().values()) == applied]
    who = f"method {named[0]!r}" if named else f"flags applying {sorted(applied)}"
    _check_compiled(applied, parts, who)
    if all(part in applied for part in _ALLOCATIONS):
        raise ValueError(f"{who} applies two rollout allocations, {_ALLOCATIONS}; choose one")
    if "dynamic_sampling" in applied and applied & {"prompt_gdro", *_ALLOCATIONS}:
        raise ValueError(
            f"{who}: a group filter trains on groups of n_mean rollouts from earlier rounds, so "
            "it does not combine with a rollout allocation or a prompt adversary"
        )
