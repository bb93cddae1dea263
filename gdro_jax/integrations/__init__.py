"""The controllers inside other trainers.

- `HostControllers`: a method's composed decisions behind numpy calls, one per decision per step
  (select prompts, allocate rollouts, multipliers, observe each rollout's prompt id and reward),
  with its state and settings to and from bytes, for trainers outside JAX (verl, TRL, OpenRLHF).
  `HostControllers.for_method(name, ..., trainer_can=...)` builds a method of
  `controllers.METHODS` from its config blocks and refuses one the trainer cannot express
  (`TRAINER_ABILITIES`). docs/integrations.md shows where each call goes.
- `gdro_jax.integrations.tunix` (the `tunix` extra, imported on its own): Tunix's GRPO learner
  with the classifier and Prompt-GDRO inside, and a prompt source for its data iterator.
- `gdro_jax.integrations.trl` (the `trl` extra, imported on its own): TRL's `GRPOTrainer` with
  the classifier and Prompt-GDRO or MoPPS inside, and a sampler for a method that draws.
- `gdro_jax.integrations.verl` (the `verl` extra, imported on its own): an advantage estimator
  in verl's registry, a drawing sampler, and verl's `RayPPOTrainer` binding rows to prompt ids.

This package imports `gdro_jax.controllers` and msgpack only: it runs in the light install
(`pip install gdro-jax`: jax, chex, numpy and msgpack), without flax or the trainer.
"""

from gdro_jax.integrations._host import FORMAT, TRAINER_ABILITIES, HostControllers

__all__ = ["FORMAT", "TRAINER_ABILITIES", "HostControllers"]
