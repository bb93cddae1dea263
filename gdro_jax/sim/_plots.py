"""Figures of a simulation: what the controllers did and what the learner learnt.

Each function takes `{method: SimOutput}` (seed axis first, as `simulate` returns) and returns a
matplotlib `Figure` with one panel per method; curves are means over seeds. The caller saves or
shows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from gdro_jax.controllers import METHODS
from gdro_jax.plots import colors_for, shows_mu
from gdro_jax.sim._report import Interval
from gdro_jax.sim._simulate import SimOutput

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: commands start faster
    from matplotlib.figure import Figure


def _panels(num_methods: int, height: float = 3.2) -> tuple[Figure, np.ndarray]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, num_methods, figsize=(4.2 * num_methods, height), squeeze=False, constrained_layout=True
    )
    return fig, axes[0]


def _role(label: str, decision: str, applied: str, not_applied: str) -> str:
    """ " (applied)" or " (observed)" for a method that hands `decision` to a part or not; ""
    for other labels."""
    if label not in METHODS:
        return ""
    return f" ({applied if getattr(METHODS[label], decision) else not_applied})"


def _smooth(values_T: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over steps (window 1: unchanged), same length."""
    if window <= 1:
        return values_T
    kernel = np.ones(window) / window
    padded = np.concatenate([np.repeat(values_T[:1], window - 1, axis=0), values_T], axis=0)
    return np.apply_along_axis(lambda v: np.convolve(v, kernel, mode="valid"), 0, padded)


def plot_q_heatmap(outputs: Mapping[str, SimOutput]) -> Figure:
    """Heatmap of Prompt-GDRO's distribution q over step x bin, mean over seeds, per method.

    Methods that do not apply Prompt-GDRO still show the q it would play on their data
    ("observed"). Bin 0 is the hardest. Keys that are not method names (e.g. sweep labels) are
    used as panel titles as they are.
    """
    fig, axes = _panels(len(outputs))
    for ax, (method, output) in zip(axes, outputs.items(), strict=True):
        q_TB = np.asarray(output.trace.q).mean(axis=0)
        image = ax.imshow(
            q_TB.T, aspect="auto", origin="lower", cmap="magma", vmin=0.0, interpolation="nearest"
        )
        ax.set_title(f"{method}: q{_role(method, 'prompt_adversary', 'applied', 'observed')}")
        ax.set_xlabel("step")
        ax.set_ylabel("bin (0 = hardest)")
        fig.colorbar(image, ax=ax, fraction=0.05)
    return fig


def plot_rollouts_per_bin(outputs: Mapping[str, SimOutput], smooth: int = 5) -> Figure:
    """Stacked rollouts per bin over steps (they sum to R every step), mean over seeds."""
    import matplotlib.pyplot as plt

    fig, axes = _panels(len(outputs))
    for ax, (method, output) in zip(axes, outputs.items(), strict=True):
        rollouts_TB = _smooth(np.asarray(output.trace.rollouts_per_bin).mean(axis=0), smooth)
        num_bins = rollouts_TB.shape[1]
        colors = plt.get_cmap("viridis")(np.linspace(0.0, 1.0, num_bins))
        ax.stackplot(
            np.arange(rollouts_TB.shape[0]),
            rollouts_TB.T,
            colors=colors,
            labels=[f"bin {b}" for b in range(num_bins)],
        )
        role = _role(method, "rollout_allocation", "allocated", "uniform")
        ax.set_title(f"{method}: rollouts per bin{role}")
        ax.set_xlabel("step")
        ax.set_ylabel("rollouts (sum = R)")
        ax.margins(x=0, y=0)
    axes[-1].legend(
        loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", title="0 = hard"
    )
    return fig


def plot_pass_rate_per_level(outputs: Mapping[str, SimOutput], metric: str = "pass1") -> Figure:
    """Exact held-out pass rate per level over steps, mean over seeds, one line per level.

    Args:
      outputs: `{method: SimOutput}`.
      metric: "pass1" or "pass_k" (the trace field).
    """
    import matplotlib.pyplot as plt

    fig, axes = _panels(len(outputs))
    for ax, (method, output) in zip(axes, outputs.items(), strict=True):
        rate_TL = np.asarray(getattr(output.trace, metric)).mean(axis=0)
        num_levels = rate_TL.shape[1]
        colors = plt.get_cmap("plasma")(np.linspace(0.0, 0.85, num_levels))
        for level in range(num_levels):
            ax.plot(rate_TL[:, level], color=colors[level], label=f"L{level + 1}")
        ax.set_title(f"{method}: held-out {'pass@1' if metric == 'pass1' else 'pass@k'}")
        ax.set_xlabel("step")
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("exact pass rate")
    axes[-1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", title="level")
    return fig


def plot_final_by_level(
    summary: Mapping[str, Mapping[str, Interval]], metric: str = "pass@8"
) -> Figure:
    """Final metric per level and pooled, methods side by side, with their seed intervals.

    Args:
      summary: from `summarize`.
      metric: a key of `summary` ("pass@1" or "pass@8").
    """
    import matplotlib.pyplot as plt

    per_method = summary[metric]
    methods = list(per_method)
    colors = colors_for(methods)
    num_columns = next(iter(per_method.values())).mean.shape[0]
    labels = [f"L{level}" for level in range(1, num_columns - 1)] + ["pooled", "natural"]
    fig, ax = plt.subplots(figsize=(1.0 * num_columns + 2.0, 3.4), constrained_layout=True)
    width = 0.8 / len(methods)
    x = np.arange(num_columns)
    for index, method in enumerate(methods):
        interval = per_method[method]
        error = np.stack([interval.mean - interval.lower, interval.upper - interval.mean])
        ax.bar(
            x + (index - (len(methods) - 1) / 2) * width,
            interval.mean,
            width,
            yerr=error,
            capsize=2,
            label=method,
            color=colors[method],
        )
    ax.set_xticks(x, labels)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("level (pooled: mean over levels; natural: weighted by the pool's level shares)")
    ax.set_ylabel(f"final held-out {metric}")
    ax.set_title(f"Final held-out {metric} per level, mean over seeds with 95% intervals")
    ax.legend(fontsize="small", ncols=len(methods), loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_controller_signals(outputs: Mapping[str, SimOutput], smooth: int = 5) -> Figure:
    """Six panels over steps, methods overlaid: mu, lead-lag gap, informative groups, reward, the
    batch's mean true success probability (what MoPPS steers) and the optimizer steps taken so
    far (fewer than the steps under dynamic sampling, whose steps are rounds). The shadow price
    mu is drawn for the methods that have one (`plots.shows_mu`): every method's trace holds the
    mu Rollout-GDRO would set, but only those whose rollouts it allocates pay it."""
    import matplotlib.pyplot as plt

    fields = (
        ("mu", "Rollout-GDRO shadow price mu", "mu"),
        ("lead_lag_gap", "lead-lag gap sum_b b (q - share)", "gap (bins)"),
        ("informative_fraction", "groups with non-zero advantage", "fraction of groups"),
        ("mean_reward", "mean reward", "reward"),
        ("success_prob", "batch's mean true success probability", "p"),
        ("updated", "optimizer steps taken", "steps so far"),
    )
    colors = colors_for(outputs)
    fig, axes = plt.subplots(2, 3, figsize=(12.6, 6.4), squeeze=False, constrained_layout=True)
    axes = axes.ravel()
    for ax, (field, title, ylabel) in zip(axes, fields, strict=True):
        for method, output in outputs.items():
            if field == "mu" and not shows_mu(method):
                continue
            values = np.asarray(getattr(output.trace, field), np.float64)
            values_T = values.reshape(*values.shape[:2], -1).mean(axis=(0, 2))  # seeds, prompts
            if field == "updated":
                values_T = np.cumsum(values_T)
            else:
                values_T = _smooth(values_T, smooth)
            ax.plot(values_T, label=method, color=colors[method])
        if field == "mu" and not ax.lines:
            ax.text(0.5, 0.5, "no method here has one", ha="center", va="center")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Means over seeds, smoothed over {smooth} steps (the optimizer steps: cumulative)",
        fontsize="medium",
    )
    # One legend for every panel: the methods are the same lines in each (the reward panel
    # has them all; the shadow price's only those with one).
    handles, labels = axes[3].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize="small")
    return fig
