"""gdro-jax: Multi-Adversary Group DRO on top of GRPO, in JAX/Flax.

Subpackages, one job each, from the bottom layer up (docs/architecture.md; each imports only
packages of lower layers, and this module imports none of them):
  controllers: the pass@k classifier, Prompt-GDRO, Rollout-GDRO and the methods' records (pure
               JAX: jax, chex and numpy only).
  losses:      GRPO advantages, segment means, the clipped surrogate, KL, aggregations.
  models:      the Qwen3-architecture policy in flax.nnx, HF folders in and out, sharding.
  data:        math datasets, prompt formatting and encoding, the grain pipeline.
  rewards:     answer extraction and the math-verify grader pool.
  sampling:    the jitted KV-cache sampler and per-token log-probs.
  tasks:       the CPU-sized chain task, and the prompt pool + reward the trainer consumes.
  runtime:     several processes (start-up, who writes, collectives) and the mesh convention.
  step:        one training step on arrays: TrainState, rollout and reward phases, the update.
  configs:     every read of a run's config: one schema, RunSettings, the parts built from it.
  checkpoint:  orbax checkpoints over any pytree; a run's policy alone (restore_policy).
  planner:     the memory plan of a step, per device, before anything is allocated.
  train:       the loop: build_run, run_step, train (resume, logs, preemption).
  eval:        pass@k estimators and the evaluation harnesses.
  sim:         a controller-dynamics simulator written entirely in JAX.
  warmstart:   the supervised warm start of the chain-task policy.
  study:       the studies comparing the methods (make demo, make study).
"""

__version__ = "0.1.0"
