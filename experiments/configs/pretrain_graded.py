"""The warm start of the `graded` chain-task profile (issue 16): a frontier after graded levels.

`pretrain_tiny.py` with the graded task (`chain_setup.task(profile="graded")`: 10 levels) and
a shorter warm start on a flatter mix: 230 supervised steps (the cliff's: 260) on level shares
1.6^-level (the cliff's: 1.9^-level). The cliff's warm start learns levels 1-7 and almost none
of level 8; this one learns the short chains, is still learning the middle ones and has barely
begun the longest, so success falls level by level and varies from problem to problem.

Measured (validation split, 32 problems per level, 8 samples at T=1, eval seed 0; 202 s of
training on 2 cores): pass@1 0.957 / 0.938 / 0.879 / 0.785 / 0.672 / 0.680 / 0.629 / 0.398 /
0.137 / 0.039 on levels 1-10; level 10's pass@8 0.156 and its pass@1 bootstrap interval
[0.008, 0.078]. It meets SPEC 11's frontier and has six levels with pass@1 in [0.05, 0.8].

Other warm starts tried on the same split (8 levels, seed 0 unless said): 160 steps on
1.3^-level gave level 1 0.602 down to level 8 0.016; 200 steps on 1.4^-level 0.695 down to
0.039 (with seed 1 instead: 0.836 down to 0.152); 260 steps on 1.5^-level learnt level 8 (0.676);
230 steps on 1.6^-level gave 0.906 down to 0.332 with 8 levels, which is why the graded
profile has 10. The frontier still moves with the step count and the seed (as in SPEC 11):
re-check it after any change to the model, the trainer or this file.
"""

import ml_collections

from experiments.configs import chain_setup, pretrain_tiny


def get_config() -> ml_collections.ConfigDict:
    config = pretrain_tiny.get_config()
    config.task = chain_setup.task(profile="graded")  # the same task block as graded.py
    config.train.update(steps=230, tail_base=1.6)
    return config
