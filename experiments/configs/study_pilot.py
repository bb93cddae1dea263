"""The pilots that chose the study's run length and learning rate, on the validation split only.

    python -m experiments.compare --config=experiments/configs/study_pilot.py \
        --workdir=runs/study --results=results/pilot_150 --config.train.steps=150
    python -m experiments.compare --config=experiments/configs/study_pilot.py \
        --workdir=runs/study --results=results/pilot_300 --config.train.steps=300

GRPO and gdro_both at two learning rates, one seed, from the study's warm start (the same
`--workdir` as the study, so the warm start is shared); the second command extends the same runs
from step 150 to 300 (the pool stays 960 prompts: 5 and 10 visits per prompt). Every figure is
on the validation split (32 problems per level); the test split is not touched.
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
