"""gdro-jax: Multi-Adversary Group DRO on top of GRPO, in JAX/Flax.

Subpackages, one job each:
  controllers: the online pass@k classifier, Prompt-GDRO and Rollout-GDRO (pure, jittable).
  losses:      GRPO advantages, segment means, the clipped surrogate, KL, aggregations.
  models:      the Qwen3-architecture policy in flax.nnx, HF folders in and out, sharding.
  sampling:    the jitted KV-cache sampler and per-token log-probs.
  tasks:       the CPU-sized chain task, and the prompt pool + reward the trainer consumes.
  data:        math datasets, prompt formatting and encoding, the grain pipeline.
  rewards:     answer extraction and the math-verify grader pool.
  train:       the RL core: TrainState, the step, the loop, checkpoints, guards, metrics.
  warmstart:   the supervised warm start of the chain-task policy.
  eval:        pass@k estimators and the evaluation harnesses.
  study:       the miniature study comparing the methods (make demo).
  sim:         a controller-dynamics simulator written entirely in JAX.
"""

__version__ = "0.1.0"
