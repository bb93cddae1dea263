"""The training methods as records: which part fills each of a step's four decisions.

A step of GRPO makes four choices that a method may hand to a part of this package:

    prompt_sampler      which prompts make the batch       (GRPO: uniform batches from the data)
    rollout_allocation  how many rollouts each prompt gets (GRPO: n_mean each)
    prompt_adversary    how much each prompt's advantages weigh (GRPO: equally)
    group_filter        which groups the update keeps      (GRPO: all of them; a filter that
                                                            selects also picks the prompts)

A `Method` names, for each decision, a part from `PARTS` (by its factory name, which is also the
name of its block in a run config) or `None` for GRPO's choice. The trainer builds the named
parts from their config blocks, the simulator applies the same decisions, and the study and the
command line list and check methods from `METHODS`. Adding a method is one record in `METHODS`
(and a part in `PARTS` when it needs a new one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from gdro_jax.controllers._dynamic_sampling import dynamic_sampling
from gdro_jax.controllers._knapsack import knapsack
from gdro_jax.controllers._mopps import mopps
from gdro_jax.controllers._pilot_commit import pilot_commit
from gdro_jax.controllers._prompt_gdro import prompt_gdro
from gdro_jax.controllers._protocols import (
    GroupFilter,
    PromptAdversary,
    PromptSampler,
    RolloutAllocator,
)
from gdro_jax.controllers._rollout_gdro import rollout_gdro
from gdro_jax.controllers._vip import vip

DECISIONS = ("prompt_sampler", "rollout_allocation", "prompt_adversary", "group_filter")

# decision -> the protocol every part registered under it answers (`_protocols.py`).
PROTOCOLS: Mapping[str, type] = {
    "prompt_sampler": PromptSampler,
    "rollout_allocation": RolloutAllocator,
    "prompt_adversary": PromptAdversary,
    "group_filter": GroupFilter,
}


class Method(NamedTuple):
    """A training method: the part of `PARTS` behind each decision of a step (None: GRPO's)."""

    name: str
    summary: str  # one line for listings and help
    prompt_sampler: str | None = None
    rollout_allocation: str | None = None
    prompt_adversary: str | None = None
    group_filter: str | None = None

    def parts(self) -> dict[str, str]:
        """`{decision: part}` of the decisions this method hands to a part."""
        return {d: getattr(self, d) for d in DECISIONS if getattr(self, d) is not None}


# The arguments of a part's factory that the run sets, not the part's config block: D the prompts
# it keeps a history of, B the classifier's bins, n_mean, the (wrong, correct) rewards, a group
# filter's N groups, and the task's features of the D prompts ([D, F], or None: none). The
# trainer's config schema and the simulator's config leave them out.
RUN_LEVEL_ARGUMENTS = (
    "num_prompts",
    "num_bins",
    "n_mean",
    "reward_values",
    "num_groups",
    "prompt_features",
)

# decision -> {part name: factory}. A part's name is its factory's and its config block's; a new
# part is one module with its factory and one line here.
PARTS: Mapping[str, dict[str, Callable]] = {
    "prompt_sampler": {"mopps": mopps},
    "rollout_allocation": {"rollout_gdro": rollout_gdro, "knapsack": knapsack, "vip": vip},
    "prompt_adversary": {"prompt_gdro": prompt_gdro},
    "group_filter": {"dynamic_sampling": dynamic_sampling, "pilot_commit": pilot_commit},
}


def _registry(*methods: Method) -> dict[str, Method]:
    for method in methods:
        for decision, part in method.parts().items():
            if part not in PARTS[decision]:
                raise ValueError(
                    f"method {method.name!r}: {decision}={part!r} is not one of "
                    f"{sorted(PARTS[decision])}"
                )
    return {method.name: method for method in methods}


METHODS: Mapping[str, Method] = _registry(
    Method("grpo", "GRPO: uniform prompts, n_mean rollouts each, equal weights"),
    Method(
        "prompt_gdro",
        "Prompt-GDRO: exponential weights over difficulty bins reweight the advantages",
        prompt_adversary="prompt_gdro",
    ),
    Method(
        "rollout_gdro",
        "Rollout-GDRO: rollouts move between bins under the fixed total (square-root rule)",
        rollout_allocation="rollout_gdro",
    ),
    Method(
        "gdro_both",
        "Prompt-GDRO and Rollout-GDRO together",
        rollout_allocation="rollout_gdro",
        prompt_adversary="prompt_gdro",
    ),
    Method(
        "knapsack",
        "Knapsack-RL: rollouts per prompt by a knapsack over each prompt's success rate",
        rollout_allocation="knapsack",
    ),
    Method(
        "vip",
        "VIP: a Gaussian process predicts each prompt's success; rollouts minimise the variance",
        rollout_allocation="vip",
    ),
    Method(
        "mopps",
        "MoPPS: Thompson samples of each prompt's Beta posterior pick prompts near a target rate",
        prompt_sampler="mopps",
    ),
    Method(
        "dynamic_sampling",
        "DAPO dynamic sampling: rounds of R rollouts; an update once N groups with a signal wait",
        group_filter="dynamic_sampling",
    ),
    Method(
        "pilot_commit",
        "Pilot-Commit: pilot candidates; commit n_mean more rollouts to those with a signal",
        group_filter="pilot_commit",
    ),
)


def get_method(name: str) -> Method:
    """The `Method` called `name`; a ValueError names the known ones."""
    if name not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got method={name!r}")
    return METHODS[name]
