"""What the adapters (`tunix`, `trl`, `verl`) share: the check of the trainer they were tested
against, and the refusal of what a trainer with one `num_generations` cannot express."""

from __future__ import annotations

import importlib.metadata
import warnings

from gdro_jax.controllers import MultiAdversary


def warn_if_untested(module: str, package: str, tested: str, what: str) -> None:
    """Warns (once, at import) when `package`'s installed version is not `tested`, the version
    `module`'s extra pins; `what` names the parts of that trainer the adapter relies on."""
    found = importlib.metadata.version(package)
    if found != tested:
        warnings.warn(
            f"{module} is tested with {package} {tested}; {found} is installed, whose {what} "
            "may differ",
            stacklevel=3,
        )


def check_expressible(
    adversary: MultiAdversary,
    num_generations: int,
    *,
    owner: str,
    trainer: str,
    samples: str,
    filter_note: str = "",
) -> None:
    """Raises one ValueError saying why, when a trainer that draws `num_generations` samples for
    every prompt and generates once per batch cannot realise a decision: a rollout allocation
    (Rollout-GDRO, Knapsack-RL) and a group filter (DAPO's dynamic sampling) have nowhere to
    act, and the controllers' `n_mean` must be its `num_generations`.

    Args:
      adversary: the method's composed decisions.
      num_generations: the trainer's samples per prompt.
      owner: whose trainer, as the messages name it ("TRL", "Tunix").
      trainer: the trainer's name after `owner` ("GRPOTrainer", "GRPO learner").
      samples: what the trainer calls a prompt's samples ("completions", "rollouts").
      filter_note: added to the group filter's reason.
    """
    refused = []
    if adversary.rollout_allocator is not None:
        name = type(adversary.rollout_allocator).__name__
        refused.append(
            f"a rollout allocation ({name}: Rollout-GDRO or Knapsack-RL) decides each prompt's "
            f"number of {samples}, and {owner}'s GRPOConfig.num_generations is one number for "
            "every prompt"
        )
    if adversary.group_filter is not None:
        refused.append(
            "a group filter (DAPO's dynamic sampling) generates in rounds until enough groups "
            f"with a signal wait, and {owner}'s {trainer} generates once per batch{filter_note}"
        )
    if refused:
        raise ValueError(
            f"{owner}'s {trainer} cannot express this method: "
            + "; and ".join(refused)
            + ". Use the classifier with Prompt-GDRO (reweight or resample) or MoPPS here; run "
            "the others in gdro_jax's own trainer (python -m experiments.train)."
        )
    if adversary.n_mean != num_generations:
        raise ValueError(
            f"the controllers were composed with n_mean={adversary.n_mean} {samples} per "
            f"prompt; {owner} draws num_generations={num_generations}: compose them with "
            f"multi_adversary(..., n_mean={num_generations})"
        )
