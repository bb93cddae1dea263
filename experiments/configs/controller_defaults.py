"""The controllers' paper defaults (SPEC 3-5) and the step guards, shared by the RL configs."""

import ml_collections


def controllers() -> dict[str, ml_collections.ConfigDict]:
    """`classifier`, `prompt_gdro` and `rollout_gdro` blocks with the paper's settings."""
    return dict(
        classifier=ml_collections.ConfigDict(
            dict(window=8, statistic="pass_at_k", k=8, hysteresis=0.0, unseen="hardest")
        ),
        prompt_gdro=ml_collections.ConfigDict(
            dict(
                eta=0.65,
                gamma=0.01,
                ema=0.12,
                share_normalize=True,
                max_weight=15.0,
                # "reweight" (paper: advantages times q) or "resample" (the batch's prompts
                # drawn from q, the adversary's losses importance-weighted by 1/q)
                realisation="reweight",
            )
        ),
        rollout_gdro=ml_collections.ConfigDict(
            dict(n_min=2, n_max=12, proxy="bernoulli", ema=0.12, mode="sqrt")
        ),
    )


def guards() -> ml_collections.ConfigDict:
    """Steps with a non-finite loss or gradient are skipped; this many in a row stop the run."""
    return ml_collections.ConfigDict(dict(max_consecutive_skips=3))
