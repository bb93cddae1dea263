"""Figures of a finished comparison study (`collect`'s summary and the runs' logs).

The figures show why a method does or does not help, from the metrics every run logs per step
(SPEC 10), averaged over seeds (bands: min-max over seeds):

    zero_advantage.png     groups whose rewards are all equal (zero advantage: wasted rollouts),
                           over steps, and per bin
    allocation.png         each bin's share of rollouts against its share of prompts
    prompt_adversary.png   Prompt-GDRO's q over step x bin, the mean bin it favours, its entropy
    lead_lag.png           the lead-lag gap (weight mass's mean bin minus the batch's)
    standard_error.png     the weighted standard error against a uniform allocation of the slots
    tokens.png             training accuracy against cumulative sampled tokens (token-matched)
    heldout.png            held-out pass@k per level, and the primary gains with intervals
    along.png              held-out pass@1 along the runs (runs evaluated along the way)
    horizon.png            the primary gain with its interval against the sampled rollouts, with
                           the points of the study a horizon study continues (`along_primary`)

The tables of the same summary are `_tables.format_tables`.
"""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

import numpy as np

from gdro_jax.plots import colors_for, figure, shows_q

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: commands start faster
    from matplotlib.figure import Figure

FIGURES = (
    "zero_advantage.png",
    "allocation.png",
    "prompt_adversary.png",
    "lead_lag.png",
    "standard_error.png",
    "tokens.png",
    "heldout.png",
)
ALONG_FIGURE = "along.png"  # drawn when the runs were evaluated along the way
HORIZON_FIGURE = "horizon.png"  # drawn when the study declares its primary along the run


def load_logs(
    workdir: str | pathlib.Path, arms: list[str], seeds: list[int], split: str = "test"
) -> dict[str, dict]:
    """Per arm, the step metrics of every seed stacked: name -> float array [seeds, steps(, bins)],
    read from each run's evaluation file on `split` (its compact log, `compact_log`), so a study's
    store of small files is enough. Runs of unequal length are cut to the shortest."""
    workdir = pathlib.Path(workdir)
    logs: dict[str, dict] = {}
    for arm in arms:
        runs = []
        for seed in seeds:
            path = workdir / arm / f"seed_{seed}" / f"eval_{split}.json"
            record = json.loads(path.read_text())
            if "log" not in record:
                raise ValueError(
                    f"{path}: no 'log' (an evaluation file from before runs kept their compact "
                    "log): rerun the study to rebuild it"
                )
            runs.append(record["log"])
        steps = min(len(log["step"]) for log in runs)
        logs[arm] = {
            # (non-finite values are logged as the strings "nan" and "inf")
            name: np.asarray([log[name][:steps] for log in runs], np.float64)
            for name in runs[0]
        }
    return logs


def _band(ax, x, values_SX, label, color=None):
    mean = values_SX.mean(axis=0)
    (line,) = ax.plot(x, mean, label=label, color=color)
    if len(values_SX) > 1:
        ax.fill_between(
            x, values_SX.min(axis=0), values_SX.max(axis=0), alpha=0.15, color=line.get_color()
        )


def _smooth(values_SX: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or values_SX.shape[-1] < window:
        return values_SX
    kernel = np.ones(window) / window
    return np.apply_along_axis(lambda v: np.convolve(v, kernel, mode="valid"), -1, values_SX)


def _steps_axis(logs_arm: dict, window: int) -> np.ndarray:
    steps = logs_arm["step"][0]
    return steps[window - 1 :] if window > 1 and len(steps) >= window else steps


def plot_zero_advantage(logs: dict, window: int = 5) -> Figure:
    fig = figure(figsize=(10, 3.6))
    left, right = fig.subplots(1, 2)
    colors = colors_for(logs)
    for arm, log in logs.items():
        wasted = _smooth(1.0 - log["nonzero_advantage_fraction"], window)
        _band(left, _steps_axis(log, window), wasted, arm, colors[arm])
    left.set(
        xlabel="RL step",
        ylabel=f"groups with zero advantage (avg of {window})",
        title="Wasted groups (all rewards equal)",
    )
    left.legend(fontsize=7)
    arms = list(logs)
    width = 0.8 / len(arms)
    for i, (arm, log) in enumerate(logs.items()):
        per_bin = log["bin/zero_advantage_fraction"]  # [S, T, B]
        groups = log["bin/prompts"] > 0
        total = np.where(groups, per_bin, 0).sum(axis=(0, 1))
        mean = total / np.maximum(groups.sum(axis=(0, 1)), 1)
        x = np.arange(per_bin.shape[-1]) + (i - (len(arms) - 1) / 2) * width
        right.bar(x, mean, width, label=arm, color=colors[arm])
    right.set(
        xlabel="bin (0 hardest)",
        ylabel="zero-advantage fraction",
        title="Per bin, over the steps it appears",
    )
    fig.tight_layout()
    return fig


def plot_allocation(logs: dict) -> Figure:
    arms = list(logs)
    fig = figure(figsize=(3.2 * len(arms), 3.4))
    axes = fig.subplots(1, len(arms), squeeze=False)
    for ax, arm in zip(axes[0], arms, strict=True):
        log = logs[arm]
        prompts = log["bin/prompts"].sum(axis=(0, 1))
        rollouts = log["bin/rollouts"].sum(axis=(0, 1))
        x = np.arange(len(prompts))
        ax.bar(x - 0.2, prompts / prompts.sum(), 0.4, label="prompts")
        ax.bar(x + 0.2, rollouts / rollouts.sum(), 0.4, label="rollouts")
        ax.set(title=arm, xlabel="bin (0 hardest)")
    axes[0, 0].set_ylabel("share over all steps and seeds")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_prompt_adversary(logs: dict, window: int = 5) -> Figure:
    arms = list(logs)
    fig = figure(figsize=(3.2 * len(arms), 6))
    axes = fig.subplots(2, len(arms), squeeze=False)
    for j, arm in enumerate(arms):
        log = logs[arm]
        q_BT = log["bin/q"].mean(axis=0).T
        image = dict(aspect="auto", origin="lower", cmap="viridis", vmin=0)
        axes[0, j].imshow(q_BT, interpolation="nearest", **image)
        # Without a prompt adversary the step logs a uniform q over the batch's bins.
        title = f"{arm}: q(bin)" if shows_q(arm) else f"{arm}: uniform q (no adversary)"
        axes[0, j].set(title=title, xlabel="RL step", ylabel="bin (0 hardest)")
        x = _steps_axis(log, window)
        _band(axes[1, j], x, _smooth(log["q_mean_bin"], window), "mean bin under q")
        _band(axes[1, j], x, _smooth(log["q_entropy"], window), "entropy of q (nats)")
        axes[1, j].set(xlabel="RL step")
        axes[1, j].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _per_step_plot(logs, series, window, *, reference, ylabel, title) -> Figure:
    """One curve per arm of `series(log)` [seeds, steps] over steps, a line at `reference`."""
    fig = figure(figsize=(6, 3.5))
    ax = fig.subplots()
    colors = colors_for(logs)
    for arm, log in logs.items():
        _band(ax, _steps_axis(log, window), _smooth(series(log), window), arm, colors[arm])
    ax.axhline(reference, color="grey", lw=0.5)
    ax.set(xlabel="RL step", ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_lead_lag(logs: dict, window: int = 5) -> Figure:
    return _per_step_plot(
        logs,
        lambda log: log["lead_lag_gap"],
        window,
        reference=0.0,
        ylabel="bins (negative: toward harder)",
        title="Lead-lag gap: weight mass's mean bin - batch's",
    )


def plot_standard_error(logs: dict, window: int = 5) -> Figure:
    return _per_step_plot(
        logs,
        lambda log: (
            log["weighted_standard_error"] / np.maximum(log["uniform_standard_error"], 1e-12)
        ),
        window,
        reference=1.0,
        ylabel="weighted SE / uniform-allocation SE",
        title="Gradient-noise proxy against a uniform allocation",
    )


def plot_tokens(logs: dict, window: int = 10) -> Figure:
    fig = figure(figsize=(6, 3.5))
    ax = fig.subplots()
    colors = colors_for(logs)
    for arm, log in logs.items():
        tokens = np.cumsum(log["tokens"], axis=1).mean(axis=0)
        accuracy = _smooth(log["accuracy"], window).mean(axis=0)
        ax.plot(tokens[len(tokens) - len(accuracy) :], accuracy, label=arm, color=colors[arm])
    ax.set(
        xlabel="sampled tokens (cumulative, mean over seeds)",
        ylabel=f"training accuracy (avg of {window})",
        title="Learning against token cost",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_heldout(summary: dict) -> Figure:
    k = summary["frontier_k"]
    arms = summary["arms"]
    levels = sorted(
        int(name.split()[0][1:])
        for name in summary["warm_start"]
        if name.endswith(f" pass@{k}") and name.startswith("L")
    )
    rows = ["warm_start", *arms]
    # One colour per arm in both panels (the right one lists only the arms with a gain).
    colors = colors_for(rows)
    legend_columns = min(len(rows), 8)
    legend_rows = -(-len(rows) // legend_columns)
    # Constrained layout keeps the legend below both panels, however many arms there are.
    fig = figure(figsize=(11, 3.6 + 0.25 * legend_rows), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(2, 1))
    width = 0.8 / len(rows)
    labels = [f"L{lv}" for lv in levels] + ["pooled", "frontier"]
    names = [f"L{lv} pass@{k}" for lv in levels] + [f"pooled pass@{k}", f"frontier pass@{k}"]
    for i, arm in enumerate(rows):
        if arm == "warm_start":
            values = np.asarray([summary["warm_start"][n] for n in names])
            low = high = values
        else:
            seeds = summary["per_seed"][arm].values()
            per_seed = np.asarray([[s[n] for n in names] for s in seeds])
            values, low, high = per_seed.mean(0), per_seed.min(0), per_seed.max(0)
        x = np.arange(len(labels)) + (i - (len(rows) - 1) / 2) * width
        left.bar(
            x, values, width, label=arm, yerr=[values - low, high - values], capsize=2,
            color=colors[arm],
        )  # fmt: skip
    left.set_xticks(np.arange(len(labels)), labels)
    left.set(
        ylim=(0, 1.05),
        ylabel=f"held-out pass@{k}",
        title="Per level (bars: mean over seeds, whiskers: min-max)",
    )
    fig.legend(
        *left.get_legend_handles_labels(),
        loc="outside lower center",
        fontsize=7,
        ncol=legend_columns,
    )
    primary = {arm: g for arm, g in summary["primary"].items() if g is not None}
    for y, (arm, g) in enumerate(primary.items()):
        right.errorbar(
            100 * g["gain"],
            y,
            xerr=[[100 * (g["gain"] - g["low"])], [100 * (g["high"] - g["gain"])]],
            fmt="o",
            capsize=3,
            color=colors[arm],
        )
    right.axvline(0, color="grey", lw=0.5)
    right.set_yticks(range(len(primary)), list(primary))
    metric = summary["primary_declaration"]["metric"]
    right.set(
        xlabel=f"relative gain over {summary['baseline']} (%)",
        title=f"Primary: frontier {metric}, 95% CI",
    )
    return fig


def plot_along(summary: dict) -> Figure:
    """Frontier and pooled held-out pass@1 against the rollouts sampled so far, per arm (mean
    over seeds), with the baseline's final frontier figure as a line."""
    along = summary["along"]
    rollouts = along["sampled_rollouts"]
    fig = figure(figsize=(10, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    colors = colors_for(along["arms"])
    for ax, name in zip(axes, ("frontier pass@1", "pooled pass@1"), strict=True):
        for arm, curve in along["arms"].items():
            ax.plot(rollouts, curve[name], marker="o", label=arm, color=colors[arm])
        ax.set(xlabel="sampled rollouts", ylabel=f"held-out {name}", title=name)
    target = along["arms"][summary["baseline"]]["frontier pass@1"][-1]
    axes[0].axhline(target, color="grey", lw=0.5, ls="--")
    axes[0].legend(fontsize=7)
    return fig


def plot_horizon(summary: dict) -> Figure:
    """The primary gain over the baseline (left) and the pooled pass@1 gain (right) against the
    rollouts sampled so far, per arm: the mean over seeds with its paired interval as an error
    bar; hollow markers, the same gains along the runs of the study this one continues."""
    along, base = summary["along"], summary["baseline"]
    reference = summary.get("along_reference", {"arms": {}})
    fig = figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    colors = colors_for(along["arms"])
    panels = (("primary gain", along["primary_name"]), ("pooled pass@1 gain", "pooled pass@1"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for arm in along["arms"]:
            if arm == base:
                continue
            for source, style, label in (
                (along, dict(marker="o", ls="-"), arm),
                (reference, dict(marker="o", ls=":", mfc="none"), f"{arm} (150-step study)"),
            ):
                points = source["arms"].get(arm, {}).get(key)
                if points is None:
                    continue
                pairs = zip(source["sampled_rollouts"], points, strict=True)
                kept = [(r, g) for r, g in pairs if g]
                if not kept:
                    continue
                x = np.asarray([r for r, _ in kept], np.float64)
                gain = np.asarray([100 * g["gain"] for _, g in kept])
                errors = np.asarray(
                    [[100 * (g["gain"] - g["low"]), 100 * (g["high"] - g["gain"])] for _, g in kept]
                ).T
                ax.errorbar(
                    x, gain, yerr=errors, capsize=3, color=colors[arm], label=label, **style
                )
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(
            xlabel="sampled rollouts",
            ylabel=f"relative gain over {base} (%)",
            title=f"{title}: gain over {base}, 95% CI",
        )
    axes[0].legend(fontsize=7)
    return fig


def draw_figures(summary: dict, workdir: str | pathlib.Path, out: str | pathlib.Path) -> list:
    """Draws every figure of the module docstring into `out` (PNG); returns their paths."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    logs = load_logs(workdir, summary["arms"], summary["seeds"], summary["split"])
    figures = [
        plot_zero_advantage(logs),
        plot_allocation(logs),
        plot_prompt_adversary(logs),
        plot_lead_lag(logs),
        plot_standard_error(logs),
        plot_tokens(logs),
        plot_heldout(summary),
    ]
    paths = []
    names = list(FIGURES)
    if "along" in summary:
        figures.append(plot_along(summary))
        names.append(ALONG_FIGURE)
        if "steps" in summary["along"]:
            figures.append(plot_horizon(summary))
            names.append(HORIZON_FIGURE)
    for name, fig in zip(names, figures, strict=True):
        fig.savefig(out / name, dpi=120)
        paths.append(out / name)
    return paths
