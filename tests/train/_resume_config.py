"""The tiny run of the resume tests: 4 prompts x 2 rollouts, 8 new tokens, a 1-layer policy.

Loaded by `--config=tests/train/_resume_config.py` in the subprocesses of `test_resume.py` (and
in process by `test_checkpoint.py`): 8 steps, a checkpoint every step with the last two kept,
the KL term on, so `ref_params` is checkpointed too, and the packed update (the default, stated
here: kill and resume stay bit for bit with packing on).
"""

import ml_collections

from tests.train.configs import small_run_config


def get_config() -> ml_collections.ConfigDict:
    return small_run_config(
        "grpo",
        steps=8,
        **{
            "grpo.kl_coef": 0.05,
            "rollout_gdro.n_min": 1,
            "rollout_gdro.n_max": 4,
            "checkpoint.every_steps": 1,
            "checkpoint.keep": 2,
            "grpo.pack_sequences": True,
        },
    )
