"""The three GDRO controllers as reusable pure JAX functions (optax style).

Each factory validates its hyperparameters and returns a NamedTuple of pure functions over a
NamedTuple state with fixed shapes and dtypes, so states can be `lax.scan` carries, `vmap`-ed,
and replicated leaves of a sharded train state.

- `passk_classifier`: the online difficulty classifier (prompts into pass@k bins).
- `prompt_gdro`: the data adversary (exponential weights over bins, advantage multipliers).
- `rollout_gdro`: the compute adversary (rollouts per prompt under a fixed total).
- `multi_adversary`: threads the classifier and a method's parts through one plan/update pair;
  each part is reached through its decision's `typing.Protocol` (`PromptSampler`,
  `RolloutAllocator`, `PromptAdversary`, `GroupFilter`; `PROTOCOLS` maps decisions to them).
- The field's rivals at equal compute: `knapsack` (Knapsack-RL's rollouts per prompt), `vip`
  (VIP's rollouts where they cut the gradient's variance most, from a GP's predictions), `mopps`
  (MoPPS's Thompson-sampled prompts), `dynamic_sampling` (DAPO's buffer of groups with a
  signal) and `pilot_commit` (Pilot-Commit's pilots, replay buffer and commits).
- `METHODS`: the training methods as `Method` records (GRPO, the adversaries, the rivals),
  each naming the part behind each decision of a step; the trainer, the simulator, the study and
  the command line read them.

This package imports jax, chex and numpy only (no other gdro_jax package), so the controllers
can be reused in any JAX training loop, as optax's transformations are.

Observations are keyword-only everywhere (`num_correct=`, `num_rollouts=`, `losses=`), typed by
the decisions' Protocols (and the classifier's `ClassifierUpdate`, the composition's
`AdversaryUpdate`), as optax types `GradientTransformation`.
"""

from gdro_jax.controllers._allocation import (
    arms_allocation,
    continuous_allocation,
    integer_allocation,
)
from gdro_jax.controllers._compose import (
    BINS_FROM,
    AdversaryUpdate,
    Filtered,
    GDROState,
    MultiAdversary,
    Plan,
    PlanKeys,
    check_combination,
    multi_adversary,
    slots_from_counts,
)
from gdro_jax.controllers._dynamic_sampling import (
    DynamicSampling,
    DynamicSamplingInfo,
    DynamicSamplingSelection,
    DynamicSamplingState,
    dynamic_sampling,
)
from gdro_jax.controllers._knapsack import (
    Knapsack,
    KnapsackInfo,
    KnapsackState,
    knapsack,
    knapsack_value,
)
from gdro_jax.controllers._methods import (
    DECISIONS,
    METHODS,
    PARTS,
    PROTOCOLS,
    RUN_LEVEL_ARGUMENTS,
    Method,
    get_method,
)
from gdro_jax.controllers._mopps import MoPPS, MoPPSDraw, MoPPSState, mopps
from gdro_jax.controllers._passk import (
    DEFAULT_EDGES,
    STATISTICS,
    ClassifierUpdate,
    PassKClassifier,
    PassKState,
    passk_classifier,
    per_visit_statistic,
)
from gdro_jax.controllers._pilot_commit import (
    PilotCommit,
    PilotCommitInfo,
    PilotCommitSelection,
    PilotCommitState,
    pilot_commit,
)
from gdro_jax.controllers._prompt_gdro import (
    PromptGDRO,
    PromptGDROState,
    prompt_gdro,
)
from gdro_jax.controllers._protocols import (
    Allocation,
    GroupFilter,
    PromptAdversary,
    PromptSampler,
    RolloutAllocator,
    SamplerDraw,
)
from gdro_jax.controllers._rollout_gdro import (
    AllocationInfo,
    RolloutGDRO,
    RolloutGDROState,
    rollout_gdro,
)
from gdro_jax.controllers._vip import VIP, VIPInfo, VIPState, vip, vip_allocation, vip_objective

__all__ = [
    "Allocation",
    "GroupFilter",
    "PromptAdversary",
    "PromptSampler",
    "RolloutAllocator",
    "SamplerDraw",
    "BINS_FROM",
    "DECISIONS",
    "DEFAULT_EDGES",
    "METHODS",
    "PARTS",
    "PROTOCOLS",
    "RUN_LEVEL_ARGUMENTS",
    "STATISTICS",
    "AdversaryUpdate",
    "AllocationInfo",
    "ClassifierUpdate",
    "DynamicSampling",
    "DynamicSamplingInfo",
    "DynamicSamplingSelection",
    "DynamicSamplingState",
    "Filtered",
    "GDROState",
    "Knapsack",
    "KnapsackInfo",
    "KnapsackState",
    "Method",
    "MoPPS",
    "MoPPSDraw",
    "MoPPSState",
    "MultiAdversary",
    "PassKClassifier",
    "PassKState",
    "PilotCommit",
    "PilotCommitInfo",
    "PilotCommitSelection",
    "PilotCommitState",
    "Plan",
    "PlanKeys",
    "PromptGDRO",
    "PromptGDROState",
    "RolloutGDRO",
    "RolloutGDROState",
    "arms_allocation",
    "check_combination",
    "continuous_allocation",
    "dynamic_sampling",
    "get_method",
    "integer_allocation",
    "knapsack",
    "knapsack_value",
    "mopps",
    "multi_adversary",
    "passk_classifier",
    "pilot_commit",
    "per_visit_statistic",
    "prompt_gdro",
    "rollout_gdro",
    "slots_from_counts",
    "VIP",
    "VIPInfo",
    "VIPState",
    "vip",
    "vip_allocation",
    "vip_objective",
]
