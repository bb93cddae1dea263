"""The three GDRO controllers as reusable pure JAX functions (optax style).

Each factory validates its hyperparameters and returns a NamedTuple of pure functions over a
NamedTuple state with fixed shapes and dtypes, so states can be `lax.scan` carries, `vmap`-ed,
and replicated leaves of a sharded train state.

- `passk_classifier`: the online difficulty classifier (prompts into pass@k bins).
- `prompt_gdro`: the data adversary (exponential weights over bins, advantage multipliers).
- `rollout_gdro`: the compute adversary (rollouts per prompt under a fixed total).
- `multi_adversary`: threads all three through one plan/update pair; `METHODS` names the four
  combinations (GRPO, Prompt-GDRO, Rollout-GDRO, both).

Observations are keyword-only everywhere (`num_correct=`, `num_rollouts=`, `losses=`), typed
by the `...Update` Protocols, as optax types `GradientTransformation`.
"""

from gdro_jax.controllers._allocation import (
    arms_allocation,
    continuous_allocation,
    integer_allocation,
)
from gdro_jax.controllers._compose import (
    BINS_FROM,
    METHODS,
    AdversaryUpdate,
    GDROState,
    MultiAdversary,
    Plan,
    method_adversaries,
    multi_adversary,
    slots_from_counts,
)
from gdro_jax.controllers._passk import (
    DEFAULT_EDGES,
    STATISTICS,
    ClassifierUpdate,
    PassKClassifier,
    PassKState,
    passk_classifier,
    per_visit_statistic,
)
from gdro_jax.controllers._prompt_gdro import (
    PromptGDRO,
    PromptGDROState,
    PromptGDROUpdate,
    PromptGDROWeights,
    prompt_gdro,
)
from gdro_jax.controllers._rollout_gdro import (
    AllocationInfo,
    RolloutGDRO,
    RolloutGDROState,
    RolloutGDROUpdate,
    rollout_gdro,
)

__all__ = [
    "BINS_FROM",
    "DEFAULT_EDGES",
    "METHODS",
    "STATISTICS",
    "AdversaryUpdate",
    "AllocationInfo",
    "ClassifierUpdate",
    "GDROState",
    "MultiAdversary",
    "PassKClassifier",
    "PassKState",
    "Plan",
    "PromptGDRO",
    "PromptGDROState",
    "PromptGDROUpdate",
    "PromptGDROWeights",
    "RolloutGDRO",
    "RolloutGDROState",
    "RolloutGDROUpdate",
    "arms_allocation",
    "continuous_allocation",
    "integer_allocation",
    "method_adversaries",
    "multi_adversary",
    "passk_classifier",
    "per_visit_statistic",
    "prompt_gdro",
    "rollout_gdro",
    "slots_from_counts",
]
