"""`SimConfig`: every knob of one controller-dynamics simulation, validated once.

The experiment's `ml_collections.ConfigDict` (experiments/configs/sim_*.py) holds the same fields
at its top level plus experiment-only ones (`seeds`, `methods`, ...); `SimConfig.from_mapping`
picks the simulation's fields out of it, so `--config.steps=...` and
`--config.prompt_gdro.eta=...` override them from the command line.
"""

import dataclasses
import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

# RUN_LEVEL_ARGUMENTS: set by the simulator from its own fields.
from gdro_jax.controllers import PARTS, RUN_LEVEL_ARGUMENTS, passk_classifier
from gdro_jax.levels import level_counts, level_shares

_OPTIMIZERS = ("adam", "sgd")
# The library's signals (`losses.SIGNALS`) but "surrogate_kl": the learner has no reference
# policy, and without one that signal is "surrogate".
_LOSS_SIGNALS = ("failure_rate", "surrogate")


def _reserved(block: str) -> tuple[str, ...]:
    """The run-level arguments the factory behind `block` takes (none for a block of no part)."""
    factories = {"classifier": passk_classifier}
    factories.update((part, f) for parts in PARTS.values() for part, f in parts.items())
    if block not in factories:
        return ()
    accepted = inspect.signature(factories[block]).parameters
    return tuple(name for name in RUN_LEVEL_ARGUMENTS if name in accepted)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulation: the task, the learner, GRPO, and the controllers' hyperparameters.

    Attributes:
      steps: training steps T.
      num_prompts: prompts per step N.
      n_mean: mean rollouts per prompt; every method draws exactly R = N * n_mean per step.
      num_levels: difficulty levels L (a level-l prompt chains l shared skills).
      tail_base: a level's share of the training pool is proportional to `tail_base ** -level`.
      pool_size: training prompts D; each is visited `steps * num_prompts / pool_size` times on
        average (SPEC 11 asks for at least 5).
      heldout_per_level: held-out prompts per level, disjoint draws from the same generator.
      offset_std: standard deviation of the per-prompt logit offset.
      init_logit_first: warm-start logit of skill 0.
      init_logit_slope: the warm-start logit falls by this much per skill.
      init_logits: when not empty, the L warm-start skill logits themselves (replacing
        `init_logit_first` and `init_logit_slope`), e.g. fitted to a real warm start's pass@1
        per level by `fit_skill_logits`; stored as a tuple.
      optimizer: "sgd" (default) or "adam" on the skill logits. SGD is the default because here
        every skill is its own coordinate: Adam's per-coordinate normalisation would rescale the
        rare late skills' small gradients to full size whatever the data, hiding the allocation
        effects that a network with parameters shared across difficulties does see.
      learning_rate: the optimizer's step size.
      reward_correct: reward of a correct rollout (SPEC 2: +1).
      reward_wrong: reward of a wrong rollout (SPEC 2: -1; 0 for {0, 1} rewards).
      scale_by_std: GRPO advantages (True) or Dr.GRPO's unscaled ones (False).
      advantage_estimator: the group std, "sample" (the released code's N-1, as the trainer) or
        "population" (see `gdro_jax.losses.group_advantages`).
      loss_signal: the adversaries' per-prompt loss, the trainer's `losses.prompt_loss_signal`:
        "failure_rate" (1 - mean correctness) or "surrogate" (minus the prompt's mean advantage,
        the released code's signal at ratio 1; it is zero up to rounding, which is the point of
        offering it: see SPEC 4).
      eval_k: k of the exact held-out pass@k.
      classifier: keyword arguments of `passk_classifier` (not `num_prompts`), and `bins_from`
        (`multi_adversary`'s, as a run config's `classifier.bins_from`).
      prompt_gdro: keyword arguments of `prompt_gdro` (not `num_bins`).
      rollout_gdro: keyword arguments of `rollout_gdro` (not `num_bins`, `n_mean`,
        `reward_values`: those come from the fields above).
      knapsack: keyword arguments of `knapsack` (not `num_prompts`, the pool's D, nor
        `n_mean`); applied by a simulator built with the `knapsack` part.
      vip: keyword arguments of `vip` (not `num_prompts`, `n_mean` nor `prompt_features`, which
        are the pool's levels: each prompt's `level / L`, the learner's problem parameter);
        applied by a simulator built with the `vip` part.
      mopps: keyword arguments of `mopps` (not `num_prompts`, the pool's D); applied by a
        simulator built with the `mopps` part.
      dynamic_sampling: keyword arguments of `dynamic_sampling` (not `num_groups`, which is
        `num_prompts`); applied by a simulator built with the `dynamic_sampling` part.
      pilot_commit: keyword arguments of `pilot_commit` (not `num_groups`, `num_prompts` nor
        `reward_values`: N, the pool's D and the rewards above); applied by a simulator built
        with the `pilot_commit` part.

    Every controller block left empty takes its factory's defaults, which are also the trainer's
    (its config schema reads them off the same factories). A part of `controllers.PARTS` is
    simulated when this class has a block of its name (see `sim.SIMULATED_PARTS`). A rival's
    block is checked by `make_simulator` when its part is compiled in, as the trainer builds its
    method's parts only.
    """

    steps: int = 300
    num_prompts: int = 64
    n_mean: int = 4
    num_levels: int = 8
    tail_base: float = 1.5
    pool_size: int = 2048
    heldout_per_level: int = 256
    offset_std: float = 1.0
    init_logit_first: float = 3.5
    init_logit_slope: float = 0.8
    init_logits: tuple[float, ...] = ()
    optimizer: str = "sgd"
    learning_rate: float = 0.2
    reward_correct: float = 1.0
    reward_wrong: float = -1.0
    scale_by_std: bool = True
    advantage_estimator: str = "sample"
    loss_signal: str = "failure_rate"
    eval_k: int = 8
    classifier: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prompt_gdro: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rollout_gdro: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    knapsack: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    vip: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    mopps: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dynamic_sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pilot_commit: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.advantage_estimator not in ("sample", "population"):
            raise ValueError(
                "advantage_estimator must be 'sample' or 'population', got "
                f"advantage_estimator={self.advantage_estimator!r}"
            )
        for name in ("steps", "num_prompts", "n_mean", "num_levels", "heldout_per_level", "eval_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if not isinstance(self.pool_size, int) or self.pool_size < max(
            self.num_prompts, self.num_levels
        ):
            raise ValueError(
                f"pool_size must be an int >= num_prompts={self.num_prompts} and >= "
                f"num_levels={self.num_levels}, got pool_size={self.pool_size!r}"
            )
        if not (math.isfinite(self.tail_base) and self.tail_base >= 1.0):
            raise ValueError(f"tail_base must be finite and >= 1, got tail_base={self.tail_base!r}")
        if not (math.isfinite(self.offset_std) and self.offset_std >= 0.0):
            raise ValueError(f"offset_std must be >= 0, got offset_std={self.offset_std!r}")
        logits = tuple(float(x) for x in self.init_logits)
        if logits and (len(logits) != self.num_levels or not all(map(math.isfinite, logits))):
            raise ValueError(
                f"init_logits must be empty or {self.num_levels} finite numbers (one per level), "
                f"got init_logits={self.init_logits!r}"
            )
        object.__setattr__(self, "init_logits", logits)
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0.0):
            raise ValueError(
                f"learning_rate must be finite and > 0, got learning_rate={self.learning_rate!r}"
            )
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {self.optimizer!r}")
        if self.loss_signal not in _LOSS_SIGNALS:
            raise ValueError(
                f"loss_signal must be one of {_LOSS_SIGNALS}, got loss_signal={self.loss_signal!r}"
            )
        if self.reward_correct == self.reward_wrong:
            raise ValueError(
                f"reward_correct must differ from reward_wrong, got both {self.reward_correct!r}"
            )
        for field in dataclasses.fields(self):
            if field.default_factory is not dict:  # not a controller's block
                continue
            group, kwargs = field.name, getattr(self, field.name)
            for key in _reserved(group):
                if key in kwargs:
                    raise ValueError(
                        f"{group}.{key} is set by the simulator, got {group}.{key}={kwargs[key]!r}"
                    )

    @property
    def num_slots(self) -> int:
        """R = N * n_mean, the rollouts every method draws per step."""
        return self.num_prompts * self.n_mean

    @property
    def pool_counts(self) -> np.ndarray:
        """int[L] training prompts per level (largest remainders of the heavy-tailed shares)."""
        return level_counts(self.pool_size, self.num_levels, self.tail_base)

    @property
    def pool_shares(self) -> np.ndarray:
        """float[L] the heavy-tailed level shares the pool is built from."""
        return level_shares(self.num_levels, self.tail_base)

    @property
    def visits_per_prompt(self) -> float:
        """Mean visits of a training prompt over the run, `steps * N / D`."""
        return self.steps * self.num_prompts / self.pool_size

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any], ignore: tuple[str, ...] = ()) -> "SimConfig":
        """Builds a `SimConfig` from a mapping (e.g. a `ConfigDict`) with the same field names.

        Args:
          config: field values; nested mappings (a `ConfigDict`) are turned into plain dicts.
          ignore: keys of `config` that belong to something else (e.g. the experiment's
            `seeds`) and are skipped.

        Returns:
          The validated config.

        Raises:
          ValueError: for a key that is neither a field nor in `ignore`, or a bad value.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for key in config.keys():
            if key in ignore:
                continue
            if key not in fields:
                raise ValueError(f"unknown simulation config key {key!r}")
            value = config[key]
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            elif isinstance(value, Mapping):
                value = dict(value)
            values[key] = value
        return cls(**values)
