"""A seconds-long simulation for tests: the default config shrunk (few steps, seeds, prompts)."""

import ml_collections

from experiments.configs import sim_default


def get_config() -> ml_collections.ConfigDict:
    config = sim_default.get_config()
    config.seeds = 2
    config.progress = False
    config.fast_compile = True
    config.steps = 24
    config.num_prompts = 8
    config.num_levels = 6
    config.pool_size = 32
    config.heldout_per_level = 16
    config.classifier.window = 4
    config.rollout_gdro.n_max = 8
    return config
