"""The horizon study of issue 48: does each leader's gain over GRPO grow, hold or close when the
graded study runs 4x longer?

    make horizon        # resumes from what results/horizon_graded holds
    python -m experiments.compare --config=experiments/configs/horizon_study.py \\
        --workdir=runs/horizon_graded --results=results/horizon_graded --results_md=RESULTS.md

Declared here and in RESULTS.md ("The horizon study") before the first full run; not edited
after seeing results.

- The graded profile of `rivals_study.py:graded`, from the very warm start its runs started from
  (restored from that study's store, `warm_start_store`, so no warm start is trained again), with
  the same pool (480 prompts: 600 steps visit each 20 times, SPEC 11's pool <= steps x prompts / 5
  holds), the same test split and the same held-out evaluation settings.
- Arms: GRPO (the baseline), Prompt-GDRO, gdro_both and Knapsack-RL, each with the defaults of its
  config block, as in the 150-step study.
- Seeds 0-4; 600 steps of R = 128 sampled rollouts (76,800 sampled rollouts an arm, 4x the
  study's 19,200).
- Held out: the test split, 8 samples at T = 1, eval seed 1, after 150, 300 and 450 steps
  (`checkpoint.snapshot_steps`) and at the end (600).
- Engine settings, the same for every arm and stamped in each run's config: the packed update
  (`grpo.pack_sequences=True`) and continuous batching (`rollout.batching=continuous`). Both
  change the floating-point order of the update and which rollout slot decodes which sequence,
  so these runs are not bit-comparable with the 150-step study's (padded, static chunks); their
  first 150 steps are the same method on the same prompts, not the same numbers.
- Primary (`along_primary`): the relative frontier pass@8 gain over GRPO at each of the four
  points, paired by seed and problem, paired bootstrap 95 % interval (10,000 resamples).
- Secondaries: pooled pass@1 (its gain at each point); the rollouts each arm takes to reach GRPO's
  final (600-step) frontier pass@1; the fraction of groups with a non-zero gradient in each
  150-step segment of the run.
"""

import ml_collections

from experiments.configs import rivals_study

ARMS = ("grpo", "prompt_gdro", "gdro_both", "knapsack")
STEPS = 600
SNAPSHOT_STEPS = (150, 300, 450)  # with the end: the four points
STUDY_STORE = "results/study_graded"  # the 150-step study: its warm start and its points


def get_config() -> ml_collections.ConfigDict:
    config = rivals_study.get_config("graded")
    config.name = "horizon"  # names the RESULTS.md block this study writes
    config.arms = ml_collections.ConfigDict({arm: rivals_study.ARMS[arm] for arm in ARMS})
    config.run = ",".join(ARMS)  # GRPO first
    config.train.steps = STEPS
    config.train.checkpoint.every_steps = 50
    config.train.checkpoint.snapshot_steps = SNAPSHOT_STEPS
    config.train.grpo.pack_sequences = True
    config.train.rollout.batching = "continuous"
    config.jobs = 1  # one run at a time: the machine's other core stays with other work
    # The store whose warm start these runs start from (restored when this study's store has
    # none), and whose runs' points the horizon figure marks.
    config.warm_start_store = STUDY_STORE
    config.along_primary = True  # the primary's gain at every point, with its full interval
    return config
