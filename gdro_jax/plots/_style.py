"""How a method looks in every figure: one colour per method, and which decisions it has to show.

The demo's, the study's, the simulator's and one run's figures all colour a method from
`METHOD_COLORS`, so `gdro_both` is the same red in each. Labels that are not methods (the warm
start, a study's variant arms, a simulator sweep's settings) get colours no method uses
(`colors_for`). A figure shows Prompt-GDRO's q only for methods with a prompt adversary and the
shadow price mu only for methods whose rollouts Rollout-GDRO allocates (`shows_q`, `shows_mu`):
the step logs both for every method (uniform q, mu 0), which would read as decisions.
"""

from __future__ import annotations

from collections.abc import Iterable

from gdro_jax.controllers import METHODS

# matplotlib's tab10, in the registry's order, so figures of the GDRO methods keep the colours
# the default cycle gave them.
METHOD_COLORS = {
    "grpo": "#1f77b4",
    "prompt_gdro": "#ff7f0e",
    "rollout_gdro": "#2ca02c",
    "gdro_both": "#d62728",
    "knapsack": "#9467bd",
    "vip": "#e7ba52",
    "mopps": "#8c564b",
    "dynamic_sampling": "#e377c2",
    "pilot_commit": "#6b6ecf",
}
BASELINE_COLOR = "#7f7f7f"  # the warm start: grey, the policy before any RL
# For other labels, in order of appearance: colours no method (nor the warm start) uses.
OTHER_COLORS = ("#bcbd22", "#17becf", "#393b79", "#8c6d31", "#637939", "#843c39", "#7b4173")
BASELINE_LABELS = ("warm_start",)
# The parts of `controllers.PARTS` that price rollouts with a shadow price (`Plan.mu`).
SHADOW_PRICE_PARTS = ("rollout_gdro",)


def colors_for(labels: Iterable[str]) -> dict[str, str]:
    """`{label: colour}`: a method's own colour, grey for the warm start, and for any other
    label the next colour of `OTHER_COLORS` (cycling when there are more such labels)."""
    colors, others = {}, 0
    for label in labels:
        if label in colors:
            continue
        if label in METHOD_COLORS:
            colors[label] = METHOD_COLORS[label]
        elif label in BASELINE_LABELS:
            colors[label] = BASELINE_COLOR
        else:
            colors[label] = OTHER_COLORS[others % len(OTHER_COLORS)]
            others += 1
    return colors


def shows_q(label: str) -> bool:
    """Whether a figure shows Prompt-GDRO's q for `label`: a method with a prompt adversary, or
    a label that is not a method's name (a sweep's setting, drawn as the caller gives it)."""
    return label not in METHODS or METHODS[label].prompt_adversary is not None


def shows_mu(label: str) -> bool:
    """Whether a figure shows the shadow price mu for `label`: a method whose rollouts a part of
    `SHADOW_PRICE_PARTS` allocates, or a label that is not a method's name."""
    return label not in METHODS or METHODS[label].rollout_allocation in SHADOW_PRICE_PARTS
