"""The declared study of issue 17: eight arms x 5 seeds on each profile, at equal rollout compute;
with issue 45's arms 9 and 10 (VIP, Pilot-Commit), ten arms as `<profile>_10`, and as
`<profile>` once a profile's ten arms are all stored (`TEN_ARMS_STORED`: both profiles now).

    make study PROFILE=graded     # or PROFILE=cliff; resumes from what results/ holds
    python -m experiments.compare --config=experiments/configs/rivals_study.py:graded \\
        --workdir=runs/study_graded --results=results/study_graded --results_md=RESULTS.md
    python -m experiments.compare --config=experiments/configs/rivals_study.py:graded_10 \\
        --workdir=runs/study_graded --results=results/study_graded --results_md=RESULTS.md

Declared here and in RESULTS.md before the first full run; not edited after seeing results.

- Arms (`ARMS`): GRPO (the baseline), Prompt-GDRO, Rollout-GDRO, both, Prompt-GDRO's `resample`
  realisation (issue 13's one ablation that changed what is learned), DAPO dynamic sampling,
  Knapsack-RL and MoPPS, each with the defaults of its config block (chosen in issue 16's
  pilots, `rivals_pilot.py`).
- Seeds 0-4 per arm; 150 steps of R = 128 sampled rollouts (dynamic sampling's steps are
  rounds), so every arm samples 19,200 rollouts.
- `cliff`: `study.py`'s setup (`tiny_cpu.py` from the 260-step `pretrain_tiny.py`, a pool of
  960, 32 prompts x 4), its test split (100 problems on levels 1-7, 1,000 on level 8).
  `graded`: `graded.py` from `pretrain_graded.py` (a pool of 480, 16 prompts x 8), its test
  split 100 problems on levels 1-5 and 300 on each of levels 6-10, the frontier of the warm
  start trained for this study (validation pass@8 0.906 / 0.938 / 0.906 / 0.500 / 0.156; the
  pilots' warm start, trained in another session, had levels 8-10).
- Held out: the test split, 8 samples at T = 1, eval seed 1, after 50 and 100 steps (1/3 and
  2/3 of the budget, `checkpoint.snapshot_steps`) and at the end.
- The frontier: the levels where the warm start's validation pass@8 is below 0.95 (`collect`).
- Primary (`primary`): the relative frontier pass@8 gain over GRPO, paired by seed and problem,
  paired bootstrap 95 % interval (10,000 resamples), issue 13's metric.
- Secondaries: pooled and frontier pass@1; the fraction of groups with a non-zero gradient;
  sampled tokens; frontier pass@1 after 1/3 and 2/3 of the rollouts and the rollouts each arm
  takes to reach GRPO's final frontier pass@1.

Every finished run's evaluation (with its compact log) is copied to `<results>/runs/`, which is
committed: the same command on a fresh machine trains nothing that is there.
"""

import ml_collections

from experiments.configs import chain_setup, graded, pretrain_graded, study

PROFILES = ("cliff", "graded")
PG = "method=prompt_gdro"
ARMS = {
    "grpo": "method=grpo",
    "prompt_gdro": PG,
    "rollout_gdro": "method=rollout_gdro",
    "gdro_both": "method=gdro_both",
    "pg_resample": f"{PG} prompt_gdro.realisation=resample prompt_gdro.share_normalize=False",
    "dynamic_sampling": "method=dynamic_sampling",
    "knapsack": "method=knapsack",
    "mopps": "method=mopps",
}
# Issue 45: arms 9 and 10, declared (RESULTS.md) before their first full run, each with the
# defaults of its config block, as the eight arms above. `<profile>_10` is the ten-arm study;
# its runs go into the same store as the eight arms' (none of those is rerun).
ARMS_2026 = {
    "vip": "method=vip",
    "pilot_commit": "method=pilot_commit",
}
# The profiles whose ten arms' runs are all stored: there, `<profile>` is the ten-arm study (as
# `<profile>_10`) and its RESULTS.md block has ten arms; elsewhere it is still the eight.
TEN_ARMS_STORED = ("cliff", "graded")
SNAPSHOT_STEPS = (50, 100)  # 1/3 and 2/3 of the 150 steps
GRADED_TEST_PER_LEVEL = (100,) * 5 + (300,) * 5  # levels 1-5, then the frontier 6-10


def get_config(profile: str = "cliff") -> ml_collections.ConfigDict:
    """The declared study on `profile` (ten arms where `TEN_ARMS_STORED` has it, else eight),
    or `<profile>_10` (the ten arms)."""
    profile, ten = (profile[:-3], True) if profile.endswith("_10") else (profile, False)
    ten = ten or profile in TEN_ARMS_STORED
    if profile not in PROFILES:
        names = (*PROFILES, *(f"{p}_10" for p in PROFILES))
        raise ValueError(f"the profile must be one of {names}, got {profile!r}")
    config = study.get_config()  # the cliff: issue 13's setup, test split and primary metric
    config.name = profile  # names the RESULTS.md block this study writes
    if profile == "graded":
        config.pretrain = pretrain_graded.get_config()
        config.pretrain.task = chain_setup.task(
            profile="graded", test_per_level=GRADED_TEST_PER_LEVEL
        )
        config.train = graded.get_config()
        config.train.task = chain_setup.task(profile="graded", test_per_level=GRADED_TEST_PER_LEVEL)
        config.train.steps = 150
        config.train.tensorboard = False
        config.train.checkpoint.every_steps = 50
    arms = {**ARMS, **ARMS_2026} if ten else ARMS
    config.arms = ml_collections.ConfigDict(arms)
    config.run = ",".join(arms)  # GRPO first
    config.baseline = "grpo"
    config.seeds = 5
    config.train.checkpoint.snapshot_steps = SNAPSHOT_STEPS
    return config
