# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The curriculum the adversaries build
#
# This notebook reads a finished comparison study (`make study`, or
# `python -m experiments.compare --config=... --workdir=WORKDIR --results=RESULTS`) and draws
# what each method did, from the metrics every run logged per step. Point it at a study with
# `GDRO_STUDY` (the `--workdir`, default `runs/study`) and `GDRO_STUDY_RESULTS` (the
# `--results` folder holding `study.json`, default `results`).
#
# Bins are the online classifier's pass@k difficulty bins, bin 0 the hardest. Curves are means
# over seeds with min-max bands.

# %%
# %matplotlib inline
import json
import os
import pathlib

import numpy as np

from gdro_jax import study

STUDY = pathlib.Path(os.environ.get("GDRO_STUDY", "runs/study"))
RESULTS = pathlib.Path(os.environ.get("GDRO_STUDY_RESULTS", "results"))
summary = json.loads((RESULTS / "study.json").read_text())
logs = study.load_logs(STUDY, summary["arms"], summary["seeds"])
print(study.format_tables(summary))

# %% [markdown]
# ## Held out: per level, and the primary metric
#
# The frontier levels are where the warm start's validation pass@8 is below 0.95; the pooled
# figure is mostly easy levels at their ceiling.

# %%
study.plot_heldout(summary)

# %% [markdown]
# ## GRPO's wasted groups
#
# A group whose rollouts all earn the same reward has zero advantage everywhere: its rollouts
# teach nothing. Uniform sampling spends most of them on easy prompts the policy always solves.

# %%
study.plot_zero_advantage(logs)

# %% [markdown]
# ## Where the rollouts went
#
# Each bin's share of rollouts against its share of prompts. Under GRPO the two are equal by
# construction; Rollout-GDRO moves rollouts toward bins whose outcomes vary most.

# %%
study.plot_allocation(logs)

# %% [markdown]
# ## Prompt-GDRO's distribution over bins
#
# `q(b)` over steps (top), and the mean bin it favours and its entropy (bottom). Without
# Prompt-GDRO `q` is uniform over the bins present in the batch.

# %%
study.plot_prompt_adversary(logs)

# %% [markdown]
# ## Lead-lag gap and the gradient-noise proxy
#
# The lead-lag gap is the mean bin under the advantage-weight mass minus the batch's mean bin:
# negative when the update leans toward harder bins than the batch holds. The standard-error
# ratio compares the weighted standard error of the step with the same slots spread uniformly.

# %%
study.plot_lead_lag(logs)

# %%
study.plot_standard_error(logs)

# %% [markdown]
# ## Learning against token cost
#
# Rollout-GDRO gives hard prompts (long solutions) more rollouts, so it samples more tokens at
# equal rollout count: training accuracy against cumulative sampled tokens is the token-matched
# reading.

# %%
study.plot_tokens(logs)

# %% [markdown]
# ## Per-seed spread of the primary figure

# %%
metric = f"frontier {summary['primary_declaration']['metric']}"
for arm in summary["arms"]:
    values = np.array([summary["per_seed"][arm][str(s)][metric] for s in summary["seeds"]])
    print(f"{arm:>14}: {metric} per seed {np.round(values, 4).tolist()}")
