"""`make demo`: warm start, then GRPO and the GDRO variants at equal compute, on a 2-core CPU.

Each method runs `train.steps` RL steps of 32 prompts x 4 rollouts (R = 128 slots, 48 new
tokens) from the same warm start, then all are evaluated on the same held-out test split with
the chain task's evaluation defaults (8 samples at T=1, seed 0, as `experiments.evaluate`). The
learning rate (1e-5, from tiny_cpu.py) was chosen on the validation split: 30 steps of GRPO and
of gdro_both from the pinned warm start at 1e-5 / 3e-5 / 1e-4 gave validation pass@1 (pooled)
0.694 / 0.681 / 0.653 (GRPO) and 0.683 / 0.668 / 0.560 (gdro_both); the warm start scored 0.670
(another sampling seed, so differences under ~0.03 are noise).
"""

import ml_collections

from experiments.configs import pretrain_tiny, tiny_cpu
from gdro_jax import eval as evaluation
from gdro_jax import tasks


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.methods = "grpo,prompt_gdro,rollout_gdro,gdro_both"
    config.progress = True
    config.pretrain = pretrain_tiny.get_config()
    config.train = tiny_cpu.get_config()
    config.train.steps = 30
    # SPEC 11's revisits: a pool of steps x prompts / 5 = 192 is visited 5 times on average.
    # Only the RL pool shrinks: held-out splits do not depend on pool_size, so the warm start
    # (trained with the 384-problem task) is still evaluated on the same test problems.
    config.train.task.pool_size = tasks.pool_size_for(config.train.steps, config.train.num_prompts)
    # The chain task's evaluation defaults, those of `experiments.evaluate`: the demo's table
    # and `python -m experiments.evaluate --policy=<workdir>/<method>` give the same figures.
    defaults = evaluation.EvalSettings.of("chain")
    config.eval = ml_collections.ConfigDict(
        {name: getattr(defaults, name) for name in evaluation.CHAIN_FIELDS}
    )
    return config
