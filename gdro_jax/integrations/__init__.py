"""The controllers inside other trainers.

- `HostControllers`: a method's composed decisions behind numpy calls, one per decision per step
  (select prompts, allocate rollouts, multipliers, observe each rollout's prompt id and reward),
  with its state and settings to and from bytes, for trainers outside JAX (verl, TRL, OpenRLHF).
  `HostControllers.for_method(name, ..., trainer_can=...)` builds a method of
  `controllers.METHODS` from its config blocks and refuses one the trainer cannot express
  (`TRAINER_ABILITIES`). docs/integrations.md shows where each call goes.
- `gdro_jax.integrations.tunix` (the `tunix` extra, imported on its own): Tunix's GRPO learner
  with the classifier and Prompt-GDRO inside, and a prompt source for its data iterator.

This package imports `gdro_jax.controllers` only (and flax's msgpack serialization).
"""

from gdro_jax.integrations._host import FORMAT, TRAINER_ABILITIES, HostControllers

__all__ = ["FORMAT", "TRAINER_ABILITIES", "HostControllers"]
