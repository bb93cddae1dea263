"""The pilots of issue 16 (validation only): every method, one seed, 150 steps, on one profile.

    python -m experiments.compare --config=experiments/configs/rivals_pilot.py:graded \\
        --workdir=runs/rivals_graded --results=results/rivals_pilot_graded
    python -m experiments.compare --config=experiments/configs/rivals_pilot.py:cliff \\
        --workdir=runs/rivals_cliff --results=results/rivals_pilot_cliff

Every method of `controllers.METHODS` (GRPO first, the baseline) from the profile's warm start:
`cliff` is the study's (`study.py`: `tiny_cpu.py` from the 260-step `pretrain_tiny.py`, a pool of
960), `graded` is `graded.py` from `pretrain_graded.py` (a pool of 480 = 150 steps x 16 prompts
/ 5). Each run also saves its policy after steps 50 and 100, and is evaluated there and at the
end on the validation split, at equal sampled rollouts (R = 128 a step for every method;
dynamic sampling's steps are rounds). The test split is not touched: these runs fix the graded
profile's settings for the declared study (issue 17).
"""

import ml_collections

from experiments.configs import graded, pretrain_graded, study
from gdro_jax import controllers

PROFILES = ("cliff", "graded")
METHODS = tuple(controllers.METHODS)  # grpo first


def get_config(profile: str = "graded") -> ml_collections.ConfigDict:
    if profile not in PROFILES:
        raise ValueError(f"the profile must be one of {PROFILES}, got {profile!r}")
    config = study.get_config()
    if profile == "graded":
        config.pretrain = pretrain_graded.get_config()
        config.train = graded.get_config()
        config.train.steps = 150
        config.train.tensorboard = False
        config.train.checkpoint.every_steps = 50
    config.arms = ml_collections.ConfigDict({m: f"method={m}" for m in METHODS})
    config.run = ",".join(METHODS)
    config.baseline = "grpo"
    config.seeds = 1
    config.train.checkpoint.snapshot_steps = (50, 100)
    config.eval.split = "validation"
    return config
