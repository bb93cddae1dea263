"""gdro-jax: Multi-Adversary Group DRO on top of GRPO, in JAX/Flax.

Subpackages:
  controllers: the online pass@k classifier, Prompt-GDRO and Rollout-GDRO (pure, jittable).
  sim:         a controller-dynamics simulator written entirely in JAX.
"""

__version__ = "0.1.0"
