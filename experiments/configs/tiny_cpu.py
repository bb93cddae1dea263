"""RL on the chain task on a 2-core CPU: 32 prompts x 4 rollouts per step, a 0.8M-parameter policy.

`init_from` names the warm-start HF folder written by `experiments/pretrain.py` (what `make demo`
does); empty means a randomly initialised `model` (for tests: it earns almost no reward).
The config holds every field of the run schema (`gdro_jax.configs.run_schema`), each at the
library's default unless set below, so any of them can be overridden, e.g.
`--config.method=gdro_both --config.steps=60 --config.model.compute_dtype=bfloat16`.
"""

import ml_collections

from experiments.configs import chain_setup
from gdro_jax import configs


def get_config() -> ml_collections.ConfigDict:
    config = configs.run_config()
    config.method = "grpo"  # one of gdro_jax.controllers.METHODS (grpo, gdro_both, knapsack, ...)
    config.steps = 60
    # Rollouts: N prompts x n_mean rollouts = R slots every step, whatever the allocation.
    config.num_prompts = 32
    config.n_mean = 4
    config.max_new_tokens = 48  # the task's longest solution (8 levels: 6 * 8 tokens)
    # The task and the policy shape: shared with the warm start (see chain_setup.py).
    config.task = chain_setup.task()
    config.init_from = ""  # a warm-start folder, or a random Qwen3-shaped model of this shape
    config.model.update(chain_setup.model())
    # Chosen on validation (see demo.py); 1e-4 destabilised gdro_both.
    config.optimizer.learning_rate = 1e-5
    # Checkpoints every 10 steps, the newest 2 kept; a rerun with the same workdir resumes.
    config.checkpoint.update(enabled=True, every_steps=10, keep=2)
    # The GRPO update (SPEC 2), the classifier and both adversaries (SPEC 3-5) keep the
    # library's defaults, which are the paper's settings: `python -m experiments.train --help`.
    return config
