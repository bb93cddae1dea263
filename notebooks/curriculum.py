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
# # The curriculum the adversaries build, on two task profiles
#
# This notebook reads finished comparison studies (`make study PROFILE=graded` and
# `PROFILE=cliff`, RESULTS.md) from their results folders alone: `study.json` and the store of
# small files under `runs/` that the studies commit, so it runs on a fresh clone. It draws what
# each method did from the metrics every run logged per step. `GDRO_STUDIES` names the studies
# (`name=folder,...`; default: both profiles' folders under `results/`, those that exist).
#
# Bins are the online classifier's difficulty bins, bin 0 the hardest. Curves are means over
# seeds with min-max bands. Beside the adversaries the figures show GRPO and one of the field's
# methods, MoPPS (`RIVAL`), which changes which prompts are drawn rather than how they are
# weighted or how many rollouts they get.

# %%
# %matplotlib inline
# %config InlineBackend.print_figure_kwargs = {"bbox_inches": "tight", "dpi": 70}
import json
import os
import pathlib

import numpy as np

from gdro_jax import study

try:
    from IPython.display import display
except ImportError:  # run as a plain script (`python notebooks/curriculum.py`): no figures shown
    display = print

# Folders are relative to the repository's root: Jupyter starts the kernel in notebooks/.
ROOT = pathlib.Path.cwd().parent if pathlib.Path.cwd().name == "notebooks" else pathlib.Path.cwd()
DEFAULT = "graded=results/study_graded,cliff=results/study_cliff"
GIVEN = dict(
    item.partition("=")[::2] for item in os.environ.get("GDRO_STUDIES", DEFAULT).split(",")
)
STUDIES = {
    name: ROOT / folder for name, folder in GIVEN.items() if (ROOT / folder / "study.json").exists()
}
if not STUDIES:
    raise FileNotFoundError(f"no finished study among {DEFAULT}: run `make study PROFILE=...`")
RIVAL = "mopps"
SHOWN = ("grpo", "prompt_gdro", "rollout_gdro", "gdro_both", RIVAL)
summaries, logs = {}, {}
for name, folder in STUDIES.items():
    summaries[name] = json.loads((folder / "study.json").read_text())
    arms = [arm for arm in summaries[name]["arms"] if arm in SHOWN]
    logs[name] = study.load_logs(
        folder / "runs", arms, summaries[name]["seeds"], summaries[name]["split"]
    )
PROFILE = next(iter(STUDIES))  # the profile the figures below show first
print("studies:", {name: GIVEN[name] for name in STUDIES})
print(study.format_tables(summaries[PROFILE]).split("\n\n")[0])

# %% [markdown]
# ## The two profiles side by side: what GRPO's batches look like
#
# The adversaries' premise is that difficulty is graded: bins spread over the batch and groups
# carry a signal. Per profile, GRPO's largest bin and middle bins' share of the batch, and the
# share of groups whose rewards are all equal, after the first pass over the pool.

# %%
for name, summary in summaries.items():
    if "training" not in summary:
        continue
    grpo = summary["training"][summary["baseline"]]
    print(
        f"{name:>8}: largest bin {grpo['largest_bin_share']['mean']:.3f}, middle bins "
        f"{grpo['middle_bins_share']['mean']:.3f}, all-equal groups "
        f"{grpo['all_equal_share']['mean']:.3f} (steps > {grpo['after_step']})"
    )

# %% [markdown]
# ## Held out: per level, the primary metric, and along the rollouts

# %%
study.plot_heldout(summaries[PROFILE])

# %%
if "along" in summaries[PROFILE]:
    display(study.plot_along(summaries[PROFILE]))

# %% [markdown]
# ## GRPO's wasted groups
#
# A group whose rollouts all earn the same reward has zero advantage everywhere: its rollouts
# teach nothing. Uniform sampling spends many of them on easy prompts the policy always solves.

# %%
for name in STUDIES:
    fig = study.plot_zero_advantage(logs[name])
    fig.suptitle(name)
    display(fig)

# %% [markdown]
# ## Where the rollouts went
#
# Each bin's share of rollouts against its share of prompts. Under GRPO the two are equal by
# construction; Rollout-GDRO moves rollouts toward bins whose outcomes vary most, and MoPPS
# changes the prompts' shares themselves.

# %%
study.plot_allocation(logs[PROFILE])

# %% [markdown]
# ## Prompt-GDRO's distribution over bins
#
# `q(b)` over steps (top), and the mean bin it favours and its entropy (bottom). Without
# Prompt-GDRO `q` is uniform over the bins present in the batch.

# %%
study.plot_prompt_adversary(logs[PROFILE])

# %% [markdown]
# ## Lead-lag gap and the gradient-noise proxy
#
# The lead-lag gap is the mean bin under the advantage-weight mass minus the batch's mean bin:
# negative when the update leans toward harder bins than the batch holds. The standard-error
# ratio compares the weighted standard error of the step with the same slots spread uniformly.

# %%
study.plot_lead_lag(logs[PROFILE])

# %%
study.plot_standard_error(logs[PROFILE])

# %% [markdown]
# ## Learning against token cost
#
# Rollout-GDRO gives hard prompts (long solutions) more rollouts, so it samples more tokens at
# equal rollout count: training accuracy against cumulative sampled tokens is the token-matched
# reading.

# %%
study.plot_tokens(logs[PROFILE])

# %% [markdown]
# ## Per-seed spread of the primary figure

# %%
for name, summary in summaries.items():
    metric = f"frontier {summary['primary_declaration']['metric']}"
    print(name)
    for arm in summary["arms"]:
        values = np.array([summary["per_seed"][arm][str(s)][metric] for s in summary["seeds"]])
        print(f"{arm:>17}: {metric} per seed {np.round(values, 4).tolist()}")
