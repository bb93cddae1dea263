"""Default controller-dynamics simulation (what `make sim` runs; about 20 s on 2 cores).

Eight levels with shares proportional to 1.5^-level, a pool of 2048 prompts visited ~9 times
each over 300 steps of 64 prompts x 4 rollouts, 32 seeds per method. The warm start puts the
frontier where SPEC 11 asks: level 1 pass@1 ~0.95, level 8 ~0.03 with pass@8 ~0.13. `make sim`
runs the four GDRO methods; the rivals' blocks are here for `--config.methods=...,knapsack`.
"""

import ml_collections

from gdro_jax import configs


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Experiment.
    config.methods = "grpo,prompt_gdro,rollout_gdro,gdro_both"
    config.seeds = 32
    config.seed = 0
    config.progress = True
    config.fast_compile = False  # True: ~3x faster compilation, ~3x slower steps
    # Run shape: every method draws R = num_prompts * n_mean rollouts per step.
    config.steps = 300
    config.num_prompts = 64
    config.n_mean = 4
    # Task: the skill-chain learner's heavy-tailed prompt pool and held-out split.
    config.num_levels = 8
    config.tail_base = 1.5
    config.pool_size = 2048
    config.heldout_per_level = 256
    config.offset_std = 1.0
    config.init_logit_first = 3.5
    config.init_logit_slope = 0.8
    # Learner and GRPO.
    config.optimizer = "sgd"
    config.learning_rate = 0.2
    config.reward_correct = 1.0
    config.reward_wrong = -1.0
    config.scale_by_std = True
    config.advantage_estimator = "sample"  # the released code's N-1 std, as the trainer
    config.loss_signal = "failure_rate"
    config.eval_k = 8
    # Controllers (paper defaults; the simulator sets num_prompts, num_bins and n_mean).
    config.classifier = ml_collections.ConfigDict(
        dict(window=8, statistic="pass_at_k", k=8, hysteresis=0.0, unseen="hardest")
    )
    config.prompt_gdro = ml_collections.ConfigDict(
        dict(eta=0.65, gamma=0.01, ema=0.12, share_normalize=True, max_weight=15.0)
    )
    config.rollout_gdro = ml_collections.ConfigDict(
        dict(n_min=2, n_max=12, proxy="bernoulli", ema=0.12, mode="sqrt")
    )
    # The rivals (`--config.methods=grpo,knapsack,mopps,dynamic_sampling,pilot_commit`): the run
    # schema's blocks, read off the same factories as the trainer's; the simulator sets
    # num_prompts (the pool's D), n_mean, num_groups (N) and reward_values.
    run = configs.run_config()
    for block in ("knapsack", "vip", "mopps", "dynamic_sampling", "pilot_commit"):
        config[block] = run[block]
    return config
