"""RL on the `graded` chain-task profile (issue 16), where the adversaries' premise holds.

    python -m experiments.pretrain --config=experiments/configs/pretrain_graded.py \\
        --workdir=runs/graded/warm
    python -m experiments.train --config=experiments/configs/graded.py --workdir=runs/graded/grpo \\
        --config.init_from=runs/graded/warm/model --config.steps=40
    python -m experiments.premise --profiles=graded --warm_starts=runs/graded/warm \\
        --pilots=runs/graded/grpo --out=runs/graded/premise

The cliff profile (`tiny_cpu.py` from `pretrain_tiny.py`'s 260-step warm start, as in
`study.py`) is left as it is. The graded profile differs in four things, chosen on the
validation split only; the pool keeps the cliff's tail (1.5^-level):
- 10 levels and a warm start (`pretrain_graded.py`: 230 steps on 1.6^-level) that has learnt
  levels 1-3, is still learning 4-9 and has barely begun 10;
- 16 prompts x 8 rollouts (R = 128 slots, as the cliff's 32 x 4; a pool of 480 = 30 steps x 16,
  so the first pass ends at step 30 and a 150-step run visits each prompt 5 times);
- the classifier's `mean_accuracy` statistic: a visit's c/8 spreads over 9 bins, where pass@k
  with k >= n is 1[c > 0] and fills only the two end bins.

The premise's criteria (`study.premise_criteria`; 40-step GRPO pilots, seed 0, steps 31-40,
after the first pass over the pool; warm starts on validation):

| criterion (threshold)                  | cliff | graded (this file) |
|----------------------------------------|-------|--------------------|
| largest bin's share (<= 0.6)           | 0.956 | 0.431 (bin 9)      |
| middle bins' share (>= 0.25)           | 0.000 | 0.562              |
| groups with all-equal rewards (<= 0.6) | 0.741 | 0.569              |
| levels with pass@1 in [0.05, 0.8]      | 3     | 6                  |
| hardest level's pass@1, in (0, 0.05)   | 0.012 | 0.039              |
| pool shares fall with the level        | yes   | yes                |

The all-equal share has the thinnest margin: 0.525 with RL seed 1, and 0.484 over steps 41-60
and 0.506 over 61-80 of the same run extended to 80 steps, where the easiest bin grows (0.463,
then 0.566) as RL solves the easy levels; check it again before a longer study. Other
candidates (results/premise/candidates.json): a 200-step warm start on 1.4^-level with 8 levels
met all five with wide margins (largest bin 0.200, middle 0.619, all-equal 0.338, and still
0.356 over steps 61-80), but its level 1 solves 0.695 < 0.8 (SPEC 11's easiest level) and its
pool is mostly hard for it; the rule fixed before this profile's pilot preferred a candidate
that meets SPEC 11 too. Two ablations (largest bin / middle bins / all-equal): the cliff's warm
start under these RL settings 0.525 / 0.463 / 0.600 (the all-equal share at its ceiling), and an
undertrained warm start (160 steps on 1.3^-level) under the cliff's RL settings 0.600 / 0.000 /
0.575: the statistic and the rollouts per prompt make the bins graded, the warm start's graded
levels give the groups their signal.
"""

import ml_collections

from experiments.configs import chain_setup, tiny_cpu


def get_config() -> ml_collections.ConfigDict:
    config = tiny_cpu.get_config()  # lr, checkpoints and the policy shape as the cliff's runs
    config.task = chain_setup.task(profile="graded")  # the same task block as pretrain_graded.py
    config.num_prompts = 16
    config.n_mean = 8  # R = 16 x 8 = 128 rollout slots a step
    config.max_new_tokens = 6 * config.task.num_levels  # the longest solution: 60 tokens
    # c/n per visit; the paper's pass@k stays the library's default (and the cliff's).
    config.classifier.statistic = "mean_accuracy"
    # The declared study's runs were trained padded and sampled in static chunks: pinned, so
    # that they keep reproducing.
    config.grpo.pack_sequences = False
    config.rollout.batching = "static"
    return config
