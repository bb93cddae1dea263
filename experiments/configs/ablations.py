"""The study's ablations (issue 13, item 5): `study.py` with other arms, 3 seeds each.

    python -m experiments.compare --config=experiments/configs/ablations.py:GROUP \
        --workdir=runs/ablations --results=results/ablations

GROUP is one of the keys of `GROUPS` (default: all of them, one study). Every group keeps GRPO
as the baseline and `prompt_gdro` / `rollout_gdro` / `gdro_both` at the study's settings as the
reference arm, so each row reads "this change against the paper's setting". Runs of the same
arm and seed are shared between groups when their workdir is shared, and with the main study's
(`grpo` and the four methods' seeds 0-2) when it is the study's workdir: their configs are the
study's (a run's stamp holds the fields that differ from the library's defaults, so an arm that
sets a field changes only its own runs).

    python -m experiments.compare --config=experiments/configs/ablations.py \
        --workdir=runs/study --results=results/ablations
"""

import ml_collections

from experiments.configs import study

PG = "method=prompt_gdro"
RG = "method=rollout_gdro"
GROUPS = {
    # Prompt-GDRO's loss signal (SPEC 4): the default failure rate against the surrogates.
    "loss_signal": {
        "prompt_gdro": PG,
        "pg_surrogate": f"{PG} grpo.loss_signal=surrogate",
        "pg_surrogate_kl": f"{PG} grpo.loss_signal=surrogate_kl grpo.kl_coef=0.01",
    },
    "share_normalize": {
        "prompt_gdro": PG,
        "pg_no_share_normalize": f"{PG} prompt_gdro.share_normalize=False",
    },
    # reweight (paper) against resample (share normalisation off: the draw already follows q).
    "realisation": {
        "prompt_gdro": PG,
        "pg_resample": f"{PG} prompt_gdro.realisation=resample prompt_gdro.share_normalize=False",
    },
    # Rollout-GDRO's variance proxy, and the released code's `arms` mode.
    "rollout_proxy": {
        "rollout_gdro": RG,
        "rg_empirical": f"{RG} rollout_gdro.proxy=empirical",
        "rg_signal": f"{RG} rollout_gdro.proxy=signal",
        "rg_arms": f"{RG} rollout_gdro.mode=arms",
    },
    # The number of difficulty bins (10 by default), for both adversaries.
    "bins": {
        "gdro_both": "method=gdro_both",
        "both_3_bins": "method=gdro_both classifier.edges=(0.33,0.67)",
        "both_6_bins": "method=gdro_both classifier.edges=(0.17,0.33,0.5,0.67,0.83)",
    },
    # The released code's Prompt-GDRO: no score clip, a negligible share floor; and its lagged
    # bins (each position takes the bin of the previous batch's prompt there) against ours.
    "released": {
        "prompt_gdro": PG,
        "pg_released": f"{PG} prompt_gdro.clip=None prompt_gdro.share_floor=1e-6",
        "pg_lagged": f"{PG} classifier.bins_from=previous_batch",
    },
}


def get_config(group: str = "") -> ml_collections.ConfigDict:
    config = study.get_config()
    if group and group not in GROUPS:
        raise ValueError(f"unknown ablation group {group!r}; the groups are {sorted(GROUPS)}")
    arms = {"grpo": "method=grpo"}
    for name in [group] if group else GROUPS:
        arms.update(GROUPS[name])
    config.arms = ml_collections.ConfigDict(arms)
    config.run = ",".join(arms)
    config.seeds = 3
    return config
