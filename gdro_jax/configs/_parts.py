"""The parts a run is built from, read off its config: the controllers, the optimizer, the policy's
architecture and the mesh. One copy each: `build_run`, the memory planner, the evaluation of a
checkpoint and the warm start all call these.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import optax
from flax import nnx

from gdro_jax import controllers, models, step
from gdro_jax.configs._schema import RUN_LEVEL_ARGUMENTS


def _named(block: str, factory, *args, **kwargs):
    """Calls a controller factory; its ValueError names the parameter under `config.<block>`."""
    try:
        return factory(*args, **kwargs)
    except ValueError as error:
        raise ValueError(f"config.{block}.{error}") from None


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """The controllers of a run, read off its config: `config.method`'s record, the classifier's
    block and the block of each part the method names (what `build_controllers` builds from).

    Attributes:
      method: the method's record (`controllers.METHODS`).
      classifier: `passk_classifier`'s keyword arguments (`config.classifier` but `bins_from`).
      bins_from: where a prompt's bin comes from (`multi_adversary`'s argument).
      parts: each part's name -> its block's keyword arguments.
      n_mean: rollouts per prompt on average.
      num_prompts: N, prompts per step (a group filter's groups).
      reward_values: (wrong, correct) rewards (the Bernoulli proxies scale with their range).
    """

    method: controllers.Method
    classifier: Mapping[str, Any]
    bins_from: str
    parts: Mapping[str, Mapping[str, Any]]
    n_mean: int
    num_prompts: int
    reward_values: tuple[float, float]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ControllerSettings:
        """The controller blocks of a (completed) run config; a ValueError names `config.method`."""
        try:
            method = controllers.get_method(config["method"])
        except ValueError as error:
            raise ValueError(f"config.{error}") from None
        classifier = _block(config["classifier"])
        return cls(
            method=method,
            classifier=classifier,
            bins_from=classifier.pop("bins_from", "prompt"),
            parts={name: _block(config[name]) for name in method.parts().values()},
            n_mean=config["n_mean"],
            num_prompts=config["num_prompts"],
            reward_values=tuple(config["reward_values"]),
        )


def _block(block) -> dict[str, Any]:
    return block.to_dict() if hasattr(block, "to_dict") else dict(block)


def _part(
    decision: str,
    name: str,
    settings: ControllerSettings,
    num_bins: int,
    num_dataset_prompts: int,
    prompt_features,
):
    """A method's part from its block, with the run-level arguments its factory takes
    (`num_prompts`: the dataset's prompts a part keeps a history of; `num_bins`; `n_mean`;
    `reward_values`: the Bernoulli proxies scale with the reward's range; `num_groups`: a group
    filter's, the step's N; `prompt_features`: the task's features of its prompts)."""
    factory = controllers.PARTS[decision][name]
    run_level = {
        "num_prompts": num_dataset_prompts,
        "num_bins": num_bins,
        "n_mean": settings.n_mean,
        "reward_values": settings.reward_values,
        "num_groups": settings.num_prompts,
        "prompt_features": prompt_features,
    }
    assert tuple(run_level) == RUN_LEVEL_ARGUMENTS  # the schema leaves these out of the blocks
    accepted = inspect.signature(factory).parameters
    given = {k: v for k, v in run_level.items() if k in accepted}
    return _named(name, factory, **given, **settings.parts[name])


def takes_prompt_features(method: controllers.Method) -> bool:
    """Whether a part of `method` predicts from the task's features of its prompts (VIP)."""
    for decision, name in method.parts().items():
        factory = controllers.PARTS[decision][name]
        if "prompt_features" in inspect.signature(factory).parameters:
            return True
    return False


def build_controllers(
    settings: ControllerSettings | Mapping[str, Any],
    num_dataset_prompts: int,
    prompt_features=None,
) -> controllers.MultiAdversary:
    """The classifier and the parts `config.method`'s record names, composed.

    Each decision the method hands to a part is built from the part's config block by its factory
    in `controllers.PARTS` (nothing here names a part), then `controllers.multi_adversary`
    composes them through their protocols.

    Args:
      settings: the run's `ControllerSettings` (`RunSettings.controllers`), or a run config
        (`method`, `n_mean`, `num_prompts`, `reward_values`, `classifier` and each part's block).
      num_dataset_prompts: D, the prompts the classifier tracks.
      prompt_features: float[D, F] the task's features of its prompts
        (`tasks.prompt_features`), for a part that predicts from them (VIP); None: none.

    Returns:
      The composed decisions (`MultiAdversary`): its `prompt_adversary` is the part whose
      distribution the step metrics log, its `group_filter` the one whose buffer the train state
      carries (None where the method has none).

    Raises:
      ValueError: naming `config.method`, or the controller field (`config.classifier.edges`,
        `config.rollout_gdro.n_min`, ...) whose value the factory refuses.
    """
    if not isinstance(settings, ControllerSettings):
        settings = ControllerSettings.from_config(settings)
    classifier = _named(
        "classifier", controllers.passk_classifier, num_dataset_prompts, **settings.classifier
    )
    parts = {
        decision: _part(
            decision, name, settings, classifier.num_bins, num_dataset_prompts, prompt_features
        )
        for decision, name in settings.method.parts().items()
    }
    try:
        return controllers.multi_adversary(
            classifier,
            parts.get("prompt_adversary"),
            parts.get("rollout_allocation"),
            sampler=parts.get("prompt_sampler"),
            group_filter=parts.get("group_filter"),
            n_mean=settings.n_mean,
            bins_from=settings.bins_from,
            num_prompts=settings.num_prompts,
        )
    except ValueError as error:
        if str(error).startswith("bins_from"):  # the one field it reads from config.classifier
            raise ValueError(f"config.classifier.{error}") from None
        raise ValueError(f"config.method={settings.method.name!r}: {error}") from None


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping and a linear warmup (a run config's `optimizer` block, or
    the warm start's `train` block, which adds `end_lr_fraction` for its cosine decay)."""

    learning_rate: float
    warmup_steps: int = 0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    end_lr_fraction: float = 0.0

    @classmethod
    def from_block(cls, block: Mapping[str, Any]) -> OptimizerConfig:
        """The optimizer fields of a config block (other fields of the block are ignored)."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in block.items() if name in names})


def make_optimizer(
    optimizer: OptimizerConfig, *, decay_steps: int | None = None
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping and linear warmup; cosine decay when `decay_steps` is set.

    The RL runs (SPEC 2: AdamW, lr 1e-6) keep the rate constant after the warmup; the warm start
    passes `decay_steps=train.steps`, which decays to `end_lr_fraction` of the rate.

    Args:
      optimizer: the settings (`weight_decay` 0: plain Adam; `grad_clip` 0: no clipping).
      decay_steps: the schedule's length for cosine decay; None keeps the rate constant.

    Returns:
      `optax.chain(clip, adamw)` (or `chain(adamw)` without clipping).

    Raises:
      ValueError: naming `learning_rate`, `warmup_steps` or `end_lr_fraction`.

    References:
      Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019 (AdamW);
      "SGDR: Stochastic Gradient Descent with Warm Restarts", 2017 (cosine decay).
    """
    rate, warmup = optimizer.learning_rate, optimizer.warmup_steps
    if not rate > 0:
        raise ValueError(f"learning_rate must be > 0, got learning_rate={rate!r}")
    if decay_steps is None:
        if warmup < 0:
            raise ValueError(f"warmup_steps must be >= 0, got warmup_steps={warmup!r}")
        schedule = rate
        if warmup > 0:
            schedule = optax.linear_schedule(0.0, rate, warmup)
    else:
        if not 0 <= warmup < decay_steps:
            raise ValueError(
                f"warmup_steps must be in [0, steps={decay_steps}), got warmup_steps={warmup!r}"
            )
        end = optimizer.end_lr_fraction
        if not 0 <= end <= 1:
            raise ValueError(f"end_lr_fraction must be in [0, 1], got end_lr_fraction={end!r}")
        schedule = optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=rate,
            warmup_steps=warmup,
            decay_steps=decay_steps,
            end_value=rate * end,
        )
    parts = []
    if optimizer.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(optimizer.grad_clip))
    parts.append(
        optax.adamw(
            schedule,
            b1=optimizer.b1,
            b2=optimizer.b2,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        )
    )
    return optax.chain(*parts)


def policy_overrides(config: Mapping[str, Any]) -> dict[str, Any]:
    """How a run's policy runs, whatever its checkpoint stores: float32 master parameters (the
    optimizer's), and the run config's `model.compute_dtype`, `remat`, `remat_policy`,
    `scan_layers` and `attention`."""
    model = config["model"]
    return dict(
        param_dtype="float32",
        compute_dtype=model.get("compute_dtype", "float32"),
        remat=bool(model.get("remat", False)),
        remat_policy=model.get("remat_policy", "nothing"),
        scan_layers=bool(model.get("scan_layers", True)),
        attention=model.get("attention", "auto"),
    )


def policy_config(config: Mapping[str, Any]) -> models.DecoderConfig:
    """A run's policy architecture, as `build_run` creates it, without reading a weight: its
    `init_from` folder's `config.json` with `policy_overrides`, or its `model` block.

    Args:
      config: a run config (a ConfigDict, or the dict a checkpoint stores).
    """
    if config.get("init_from"):
        hf_config = models.read_hf_config(config["init_from"])
        return models.DecoderConfig.from_hf_config(hf_config, **policy_overrides(config))
    model = config["model"]
    return models.DecoderConfig.from_dict(model.to_dict() if hasattr(model, "to_dict") else model)


def run_mesh(settings):
    """The run's `data` x `fsdp` x `tensor` mesh; None for one device."""
    return models.run_mesh(*settings.mesh)


def step_program(
    settings,
    mesh,
    *,
    prompt_width: int,
    num_dataset_prompts: int,
    eos_ids: tuple[int, ...],
    external_engine: bool = False,
    prompt_features=None,
) -> step.StepProgram:
    """The run's step (`step.StepProgram`) from its settings: what `train.build_run` runs and
    `planner` plans, built by this one function for both.

    Args:
      settings: the run's `RunSettings`.
      mesh: the run's mesh (`run_mesh`), or None.
      prompt_width: P, the pool's padded prompt length.
      num_dataset_prompts: D, the prompts the controllers keep a history of: the settings'
        decisions, built when the config was read, serve when their pool is this one (the chain
        task's); else (a math pool, known once read) they are built here.
      eos_ids: the task's stop ids.
      external_engine: an engine passed to `build_run` samples (also set when
        `config.rollout.engine` is not the built-in kv_cache).
      prompt_features: the task's features of its D prompts (`tasks.prompt_features`): the
        decisions are built here with them when a part of the method predicts from them.
    """
    graphdef = nnx.split(models.abstract_decoder(settings.policy, mesh=mesh), nnx.Param)[0]
    decisions = settings.decisions
    with_features = prompt_features is not None and takes_prompt_features(settings.method)
    if decisions is None or settings.pool_size != num_dataset_prompts or with_features:
        decisions = build_controllers(settings.controllers, num_dataset_prompts, prompt_features)
    return step.StepProgram(
        graphdef=graphdef,
        tx=make_optimizer(settings.optimizer),
        decisions=decisions,
        grpo=settings.grpo,
        num_prompts=settings.num_prompts,
        prompt_width=prompt_width,
        max_new_tokens=settings.max_new_tokens,
        eos_ids=tuple(eos_ids),
        rollout=settings.rollout,
        external_engine=external_engine or settings.rollout.engine != "kv_cache",
        mesh=mesh,
        seed=settings.seed,
    )
