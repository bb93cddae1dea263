"""The parts a run is built from, read off its config: the controllers, the optimizer, the policy's
architecture and the mesh. One copy each: `build_run`, the memory planner, the evaluation of a
checkpoint and the warm start all call these.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import ml_collections
import optax

from gdro_jax import controllers, models


def _named(block: str, factory, *args, **kwargs):
    """Calls a controller factory; its ValueError names the parameter under `config.<block>`."""
    try:
        return factory(*args, **kwargs)
    except ValueError as error:
        raise ValueError(f"config.{block}.{error}") from None


def _part(
    name: str, factory, config: ml_collections.ConfigDict, num_bins: int, num_dataset_prompts: int
):
    """A method's part from its config block, with the run-level arguments its factory takes
    (`num_prompts`: the dataset's prompts a part keeps a history of; `num_bins`; `n_mean`;
    `reward_values`: the Bernoulli proxies scale with the reward's range)."""
    run_level = {
        "num_prompts": num_dataset_prompts,
        "num_bins": num_bins,
        "n_mean": config.n_mean,
        "reward_values": tuple(config.reward_values),
    }
    accepted = inspect.signature(factory).parameters
    given = {k: v for k, v in run_level.items() if k in accepted}
    return _named(name, factory, **given, **config[name].to_dict())


def build_controllers(
    config: ml_collections.ConfigDict, num_dataset_prompts: int
) -> tuple[controllers.MultiAdversary, controllers.PromptGDRO | None]:
    """The classifier and the parts `config.method`'s record names, composed.

    Args:
      config: a run config (`method`, `n_mean`, `num_prompts`, `reward_values`, `classifier` and
        each part's block).
      num_dataset_prompts: D, the prompts the classifier tracks.

    Returns:
      `(gdro, prompt_adversary)`: the composed controllers and the prompt adversary inside them
      (None when the method has none), whose distribution the step metrics log.

    Raises:
      ValueError: naming `config.method`, or the controller field (`config.classifier.edges`,
        `config.rollout_gdro.n_min`, ...) whose value the factory refuses.
    """
    try:
        method = controllers.get_method(config.method)
    except ValueError as error:
        raise ValueError(f"config.{error}") from None
    if method.group_filter and (method.rollout_allocation or method.prompt_adversary):
        raise ValueError(
            f"config.method={method.name!r}: a group filter trains on groups of n_mean "
            "rollouts from earlier rounds, so it does not combine with a rollout allocation or "
            "a prompt adversary"
        )
    classifier_kwargs = config.classifier.to_dict()
    bins_from = classifier_kwargs.pop("bins_from", "prompt")  # read by `multi_adversary`
    classifier = _named(
        "classifier", controllers.passk_classifier, num_dataset_prompts, **classifier_kwargs
    )
    prompt = rollout = sampler = None
    if method.prompt_sampler:
        factory = controllers.PARTS["prompt_sampler"][method.prompt_sampler]
        sampler = _part(
            method.prompt_sampler, factory, config, classifier.num_bins, num_dataset_prompts
        )
    if method.prompt_adversary:
        factory = controllers.PARTS["prompt_adversary"][method.prompt_adversary]
        prompt = _part(
            method.prompt_adversary, factory, config, classifier.num_bins, num_dataset_prompts
        )
    if method.rollout_allocation:
        factory = controllers.PARTS["rollout_allocation"][method.rollout_allocation]
        rollout = _part(
            method.rollout_allocation, factory, config, classifier.num_bins, num_dataset_prompts
        )
    try:
        gdro = controllers.multi_adversary(
            classifier,
            prompt,
            rollout,
            sampler=sampler,
            n_mean=config.n_mean,
            bins_from=bins_from,
            num_prompts=config.num_prompts,
        )
    except ValueError as error:
        if str(error).startswith("bins_from"):  # the one field it reads from config.classifier
            raise ValueError(f"config.classifier.{error}") from None
        raise
    return gdro, prompt


def build_group_filter(config: ml_collections.ConfigDict) -> controllers.DynamicSampling | None:
    """The group filter `config.method`'s record names (None: the update keeps every group),
    over rounds of `config.num_prompts` groups.

    Raises:
      ValueError: naming the field of the filter's block (`config.dynamic_sampling.max_rounds`).
    """
    method = controllers.get_method(config.method)
    if method.group_filter is None:
        return None
    factory = controllers.PARTS["group_filter"][method.group_filter]
    return _named(
        method.group_filter, factory, config.num_prompts, **config[method.group_filter].to_dict()
    )


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
    optimizer's), and the run config's `model.compute_dtype`, `remat` and `scan_layers`."""
    model = config["model"]
    return dict(
        param_dtype="float32",
        compute_dtype=model.get("compute_dtype", "float32"),
        remat=bool(model.get("remat", False)),
        scan_layers=bool(model.get("scan_layers", True)),
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
