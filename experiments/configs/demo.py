"""`make demo`: warm start, then GRPO and the GDRO variants at equal compute, on a 2-core CPU.

Each method runs `train.steps` RL steps of 32 prompts x 4 rollouts (R = 128 slots, 48 new
tokens) from the same warm start, then all are evaluated on the same held-out test split.
"""

import ml_collections

from experiments.configs import pretrain_tiny, tiny_cpu


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.methods = "grpo,prompt_gdro,rollout_gdro,gdro_both"
    config.progress = True
    config.pretrain = pretrain_tiny.get_config()
    config.train = tiny_cpu.get_config()
    config.train.steps = 30
    config.eval = ml_collections.ConfigDict(
        dict(seed=1, num_samples=8, temperature=1.0, top_p=1.0, top_k=0, batch_size=64)
    )
    return config
