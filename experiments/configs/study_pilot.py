"""The pilots that chose the study's run length, learning rate and warm start (validation only).

    python -m experiments.compare --config=experiments/configs/study_pilot.py \
        --workdir=runs/pilot240 --results=results/pilot_150 --config.pretrain.train.steps=240
    python -m experiments.compare --config=experiments/configs/study_pilot.py \
        --workdir=runs/pilot260 --results=results/pilot_warm260

GRPO and gdro_both at two learning rates, one seed, 150 steps, from the demo's 240-step warm
start and from the study's 260-step one (a workdir per warm start: `compare` refuses to change a
workdir's warm start under existing runs). Every figure is on the validation split (32 problems
per level); the test split is not touched.
"""

import ml_collections

from experiments.configs import study

ARMS = {
    "pilot_grpo_lr1e-5": "method=grpo optimizer.learning_rate=1e-5",
    "pilot_grpo_lr3e-5": "method=grpo optimizer.learning_rate=3e-5",
    "pilot_both_lr1e-5": "method=gdro_both optimizer.learning_rate=1e-5",
    "pilot_both_lr3e-5": "method=gdro_both optimizer.learning_rate=3e-5",
}


def get_config() -> ml_collections.ConfigDict:
    config = study.get_config()
    config.arms = ml_collections.ConfigDict(ARMS)
    config.run = ",".join(ARMS)
    config.baseline = "pilot_grpo_lr1e-5"
    config.seeds = 1
    config.eval.split = "validation"
    return config
