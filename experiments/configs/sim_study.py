"""The simulator beside the real study (`experiments/simulate_study.py`, issue 13 item 6).

The study's shape (8 levels with shares 1.5^-level, a pool of 960 prompts, 150 steps of 32
prompts x 4 rollouts), 32 seeds per method. Not set here but fitted by the experiment, from the
validation split only: the warm-start skill logits (from the warm start's pass@1 per level in
`reference`) and the learning rate (GRPO's pass@1 gain there, `reference_arm`). The reference
is the study's own warm start and GRPO runs, evaluated on the validation split:

    python -m experiments.compare --config=experiments/configs/study.py --workdir=runs/study \\
        --config.eval.split=validation --config.run=grpo --results=results/study_validation

    python -m experiments.simulate_study --config=experiments/configs/sim_study.py \\
        --workdir=runs/sim_study

`sim_study.py:graded` is the same beside the declared study's graded profile (issue 17): 10
levels, a pool of 480, 16 prompts x 8 rollouts, the classifier's `mean_accuracy` statistic, the
profile's test counts, fitted to its warm start and GRPO runs on the validation split:

    python -m experiments.compare --config=experiments/configs/rivals_study.py:graded \\
        --workdir=runs/study_graded --config.eval.split=validation --config.run=grpo \\
        --results=results/study_graded_validation --nostore
    python -m experiments.simulate_study --config=experiments/configs/sim_study.py:graded \\
        --workdir=runs/sim_study_graded

`sim_study.py:cliff_declared` is the first profile (the runs have the same shape) beside the
declared study's cliff profile, fitted to that study's own warm start and GRPO runs on the
validation split:

    python -m experiments.compare --config=experiments/configs/rivals_study.py:cliff \\
        --workdir=runs/study_cliff --config.eval.split=validation --config.run=grpo \\
        --results=results/study_cliff_validation --nostore
    python -m experiments.simulate_study --config=experiments/configs/sim_study.py:cliff_declared \\
        --workdir=runs/sim_study_cliff
"""

import ml_collections

from experiments.configs import rivals_study, sim_default, study
from gdro_jax import tasks

PROFILES = ("cliff", "graded", "cliff_declared")


def get_config(profile: str = "cliff") -> ml_collections.ConfigDict:
    if profile not in PROFILES:
        raise ValueError(f"the profile must be one of {PROFILES}, got {profile!r}")
    config = sim_default.get_config()
    config.steps = 150
    config.num_prompts = 32
    config.n_mean = 4
    config.pool_size = 960
    config.seeds = 32
    # What the simulator is fitted to and compared with (paths from the repository root).
    # The study's warm start and its GRPO runs evaluated on the validation split (RESULTS.md).
    config.reference = "results/study_validation/study.json"
    config.reference_arm = "grpo"
    config.study = "results/study.json"  # the real study's results (compared when present)
    config.lr_candidates = "0.02,0.05,0.1,0.2,0.5,1.0"  # SGD step sizes tried for calibration
    config.calibration_seeds = 8
    run = study.get_config().train
    if profile == "graded":
        run = rivals_study.get_config("graded").train
        config.num_levels = run.task.num_levels
        config.tail_base = run.task.tail_base
        config.num_prompts = run.num_prompts
        config.n_mean = run.n_mean
        config.pool_size = run.task.pool_size
        config.classifier.statistic = run.classifier.statistic
        config.reference = "results/study_graded_validation/study.json"
        config.study = "results/study_graded/study.json"
    if profile == "cliff_declared":
        run = rivals_study.get_config("cliff").train
        config.reference = "results/study_cliff_validation/study.json"
        config.study = "results/study_cliff/study.json"
    # The study's test problems per level: the frontier's predicted figure weighs levels by them.
    test_split = tasks.ChainTaskConfig(**run.task.to_dict())
    config.test_problems = tuple(
        test_split.test_count(level) for level in range(1, config.num_levels + 1)
    )
    return config
