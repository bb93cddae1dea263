"""The parts a run is built from, read off its config: controllers, optimizer, mesh.

Each is one small function so that `validate_config` can build the controllers (their factories
check their own hyperparameters) before anything is written, and the warm start can share the
optimizer and the mesh with the RL runs.
"""

from __future__ import annotations

import ml_collections
import optax

from gdro_jax import controllers, models


def _named(block: str, factory, *args, **kwargs):
    """Calls a controller factory; its ValueError names the parameter under `config.<block>`."""
    try:
        return factory(*args, **kwargs)
    except ValueError as error:
        raise ValueError(f"config.{block}.{error}") from None


def build_controllers(
    config: ml_collections.ConfigDict, num_dataset_prompts: int
) -> tuple[controllers.MultiAdversary, controllers.PromptGDRO | None]:
    """The classifier and the adversaries that `config.method` switches on.

    Args:
      config: a run config (`method`, `n_mean`, `classifier`, `prompt_gdro`, `rollout_gdro`).
      num_dataset_prompts: D, the prompts the classifier tracks.

    Returns:
      `(gdro, prompt_adversary)`: the composed controllers and the Prompt-GDRO adversary inside
      them (None when off), whose distribution the step metrics log.

    Raises:
      ValueError: naming `config.method`, or the controller field (`config.classifier.edges`,
        `config.rollout_gdro.n_min`, ...) whose value the factory refuses.
    """
    try:
        prompt_on, rollout_on = controllers.method_adversaries(config.method)
    except ValueError as error:
        raise ValueError(f"config.{error}") from None
    # `classifier.bins_from` (absent by default: "prompt") is read by `multi_adversary`.
    classifier_kwargs = config.classifier.to_dict()
    bins_from = classifier_kwargs.pop("bins_from", "prompt")
    classifier = _named(
        "classifier", controllers.passk_classifier, num_dataset_prompts, **classifier_kwargs
    )
    prompt = rollout = None
    if prompt_on:
        prompt = _named(
            "prompt_gdro",
            controllers.prompt_gdro,
            classifier.num_bins,
            **config.prompt_gdro.to_dict(),
        )
    if rollout_on:
        rollout = _named(
            "rollout_gdro",
            controllers.rollout_gdro,
            classifier.num_bins,
            **{
                "n_mean": config.n_mean,
                # The Bernoulli proxies scale with the reward's range (x4 for -1/+1, x1 for 0/1).
                "reward_values": tuple(config.reward_values),
                **config.rollout_gdro.to_dict(),
            },
        )
    try:
        gdro = controllers.multi_adversary(
            classifier,
            prompt,
            rollout,
            n_mean=config.n_mean,
            bins_from=bins_from,
            num_prompts=config.num_prompts,
        )
    except ValueError as error:
        if str(error).startswith("bins_from"):  # the one field it reads from config.classifier
            raise ValueError(f"config.classifier.{error}") from None
        raise
    return gdro, prompt


def make_optimizer(
    block: ml_collections.ConfigDict, *, decay_steps: int | None = None
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping and linear warmup; cosine decay when `decay_steps` is set.

    The RL runs (SPEC 2: AdamW, lr 1e-6) use `config.optimizer` with a constant rate after the
    warmup; the warm start passes `config.train` and `decay_steps=train.steps`, which decays to
    `end_lr_fraction` of the rate.

    Args:
      block: `learning_rate`, `warmup_steps`, `b1`, `b2`, `eps`, `weight_decay` (0: plain Adam),
        `grad_clip` (0 disables it), and `end_lr_fraction` when `decay_steps` is given.
      decay_steps: the schedule's length for cosine decay; None keeps the rate constant.

    Returns:
      `optax.chain(clip, adamw)` (or `chain(adamw)` without clipping).

    Raises:
      ValueError: naming `learning_rate`, `warmup_steps` or `end_lr_fraction`.

    References:
      Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019 (AdamW);
      "SGDR: Stochastic Gradient Descent with Warm Restarts", 2017 (cosine decay).
    """
    if not block.learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got learning_rate={block.learning_rate!r}")
    if decay_steps is None:
        if block.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got warmup_steps={block.warmup_steps!r}")
        schedule = block.learning_rate
        if block.warmup_steps > 0:
            schedule = optax.linear_schedule(0.0, block.learning_rate, block.warmup_steps)
    else:
        if not 0 <= block.warmup_steps < decay_steps:
            raise ValueError(
                f"warmup_steps must be in [0, steps={decay_steps}), "
                f"got warmup_steps={block.warmup_steps!r}"
            )
        if not 0 <= block.end_lr_fraction <= 1:
            raise ValueError(
                f"end_lr_fraction must be in [0, 1], got end_lr_fraction={block.end_lr_fraction!r}"
            )
        schedule = optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=block.learning_rate,
            warmup_steps=block.warmup_steps,
            decay_steps=decay_steps,
            end_value=block.learning_rate * block.end_lr_fraction,
        )
    parts = []
    if block.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(block.grad_clip))
    parts.append(
        optax.adamw(
            schedule, b1=block.b1, b2=block.b2, eps=block.eps, weight_decay=block.weight_decay
        )
    )
    return optax.chain(*parts)


def mesh_from_config(config: ml_collections.ConfigDict):
    """The `data` x `fsdp` x `tensor` mesh of `config.mesh`; None for 1 x 1 x 1 (one device)."""
    shape = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    return None if shape == (1, 1, 1) else models.make_mesh(*shape)


def num_bins(config: ml_collections.ConfigDict) -> int:
    """Number of classifier bins implied by the config's edges."""
    edges = config.classifier.get("edges", controllers.DEFAULT_EDGES)
    return len(edges) + 1
