"""The three GDRO controllers as reusable pure JAX functions (optax style).

Each factory validates its hyperparameters and returns a NamedTuple of pure functions over a
NamedTuple state with fixed shapes and dtypes, so states can be `lax.scan` carries, `vmap`-ed,
and replicated leaves of a sharded train state.

- `passk_classifier`: the online difficulty classifier (prompts into pass@k bins).
- `prompt_gdro`: the data adversary (exponential weights over bins, advantage multipliers).
- `rollout_gdro`: the compute adversary (rollouts per prompt under a fixed total).
- `multi_adversary`: threads all three through one plan/update pair.
"""

from gdro_jax.controllers._compose import (
    GDROState,
    MultiAdversary,
    Plan,
    multi_adversary,
    slots_from_counts,
)
from gdro_jax.controllers._passk import (
    DEFAULT_EDGES,
    STATISTICS,
    PassKClassifier,
    PassKState,
    passk_classifier,
    per_visit_statistic,
)
from gdro_jax.controllers._prompt_gdro import PromptGDRO, PromptGDROState, prompt_gdro
from gdro_jax.controllers._rollout_gdro import (
    AllocationInfo,
    RolloutGDRO,
    RolloutGDROState,
    arms_allocation,
    continuous_allocation,
    integer_allocation,
    rollout_gdro,
)
from gdro_jax.controllers._segments import segment_mean

__all__ = [
    "DEFAULT_EDGES",
    "STATISTICS",
    "AllocationInfo",
    "GDROState",
    "MultiAdversary",
    "PassKClassifier",
    "PassKState",
    "Plan",
    "PromptGDRO",
    "PromptGDROState",
    "RolloutGDRO",
    "RolloutGDROState",
    "arms_allocation",
    "continuous_allocation",
    "integer_allocation",
    "multi_adversary",
    "passk_classifier",
    "per_visit_statistic",
    "prompt_gdro",
    "rollout_gdro",
    "segment_mean",
    "slots_from_counts",
]
