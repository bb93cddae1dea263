"""Figures of training runs from their step metrics (the rows of `metrics.jsonl`).

`plot_run(workdir)` draws one run into `workdir/plots/`:

    training.png      reward and accuracy per step (raw, and a trailing moving average)
    curriculum.png    the batch's share of prompts per bin, Prompt-GDRO's q (methods with a
                      prompt adversary) and the rollouts each prompt got, per bin, over steps
    shadow_price.png  Rollout-GDRO's shadow price mu per step (methods with one only)

The figure functions take `{label: rows}` (a label is usually a method's name), so the demo
draws its methods side by side with the same functions and colours.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gdro_jax.plots._figure import figure
from gdro_jax.plots._style import colors_for, shows_mu, shows_q

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: commands start faster
    from matplotlib.figure import Figure

Rows = Sequence[Mapping[str, Any]]  # a run's step metrics, one dict a step, each with "step"
PLOTS_DIR = "plots"
TRAINING_FIGURE = "training.png"
CURRICULUM_FIGURE = "curriculum.png"
SHADOW_PRICE_FIGURE = "shadow_price.png"
# Labels of the curves (metric name -> axis label).
CURVES = {"reward": "mean reward", "accuracy": "training accuracy"}


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _column(rows: Rows, name: str) -> np.ndarray:
    """`name` over the steps, float64 ([T] or [T, B]; the log writes NaN and inf as strings)."""
    return np.asarray([row[name] for row in rows], np.float64)


def moving_average(values_T: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` values at each step (fewer at the start), NaNs left
    out; the same length as `values_T`."""
    finite = np.isfinite(values_T)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values_T, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    ends = np.arange(1, len(values_T) + 1)
    starts = np.maximum(ends - window, 0)
    count = counts[ends] - counts[starts]
    return np.where(count > 0, (sums[ends] - sums[starts]) / np.maximum(count, 1), np.nan)


def plot_curves(
    runs: Mapping[str, Rows], names: Sequence[str] = tuple(CURVES), window: int | None = None
) -> Figure:
    """One panel per metric of `names`, one line per run in its method's colour: the trailing
    moving average over `window` steps (default: an eighth of the run), over the raw values
    (faint) when there is one run.

    Args:
      runs: `{label: rows}`.
      names: scalar metrics of the rows (`reward`, `accuracy`, `response_length`, ...).
      window: steps per moving average; 1 draws the raw values only.
    """
    colors = colors_for(runs)
    fig = figure(figsize=(4.6 * len(names), 3.4), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    longest = max(len(rows) for rows in runs.values())
    window = window or max(1, longest // 8)
    for ax, name in zip(axes, names, strict=True):
        for label, rows in runs.items():
            steps, values = _column(rows, "step"), _column(rows, name)
            marker = "o" if len(rows) <= 20 else None
            if len(runs) == 1 and window > 1:
                ax.plot(steps, values, color=colors[label], alpha=0.25, lw=0.8)
            smooth = moving_average(values, window)
            ax.plot(steps, smooth, color=colors[label], label=label, marker=marker, ms=3)
        averaged = f"moving average of {window} steps" if window > 1 else "per step"
        ax.set(xlabel="RL step", ylabel=averaged, title=CURVES.get(name, name))
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.grid(alpha=0.3)
    if len(runs) > 1:
        axes[-1].legend(fontsize=8)
    else:
        label = next(iter(runs))
        faint = " (faint: each step)" if window > 1 else ""
        fig.suptitle(f"{label}{faint}", color=colors[label], fontweight="bold")
    return fig


def _heatmap(ax, steps: np.ndarray, values_TB: np.ndarray, *, cmap: str, vmax: float):
    """`values_TB` as an image over step x bin (bin 0 at the bottom), each step one column; NaN
    cells are left blank (grey)."""
    ax.set_facecolor("0.8")
    ax.xaxis.set_major_locator(_integer_ticks())
    return ax.imshow(
        values_TB.T,
        aspect="auto",
        origin="lower",
        cmap=cmap,
        vmin=0.0,
        vmax=vmax,
        interpolation="nearest",
        extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, values_TB.shape[1] - 0.5),
    )


def plot_curriculum(runs: Mapping[str, Rows]) -> Figure:
    """The curriculum over steps x bins (bin 0 the hardest), a column per run: the share of the
    batch's prompts in each bin, Prompt-GDRO's q (for runs whose method has a prompt adversary;
    the row is left out when none has) and the rollouts each prompt of a bin got (blank where
    the batch had none of the bin's prompts: grey). A row shares one colour scale and colour bar.

    Args:
      runs: `{label: rows}`; the rows hold `bin/prompts`, `bin/q`, `bin/rollouts_per_prompt`.
    """
    labels = list(runs)
    series = {}
    for label, rows in runs.items():
        prompts_TB = _column(rows, "bin/prompts")
        series[label] = {
            "steps": _column(rows, "step"),
            "share": prompts_TB / np.maximum(prompts_TB.sum(axis=1, keepdims=True), 1.0),
            "q": _column(rows, "bin/q"),
            # A bin without prompts got no rollouts to share out: blank, not 0.
            "rollouts": np.where(prompts_TB > 0, _column(rows, "bin/rollouts_per_prompt"), np.nan),
        }
    panel_rows = [("share", "share of the batch's\nprompts in the bin", "viridis")]
    if any(shows_q(label) for label in labels):
        panel_rows.append(("q", "Prompt-GDRO's q(bin)", "viridis"))
    panel_rows.append(("rollouts", "rollouts per prompt\nin the bin", "magma"))
    colors = colors_for(labels)
    width = 3.3 * len(labels) + 1.4 if len(labels) > 1 else 6.4
    fig = figure(figsize=(width, 2.2 * len(panel_rows) + 0.5), layout="constrained")
    axes = fig.subplots(len(panel_rows), len(labels), squeeze=False)
    for j, label in enumerate(labels):  # a column per run, headed by its name in its colour
        axes[0, j].set_title(label, color=colors[label], fontweight="bold")
        axes[-1, j].set_xlabel("RL step")
    for i, (key, title, cmap) in enumerate(panel_rows):
        shown = [label for label in labels if key != "q" or shows_q(label)]
        vmax = max(float(np.nanmax(series[label][key], initial=0.0)) for label in shown) or 1.0
        image = None
        for j, label in enumerate(labels):
            ax = axes[i, j]
            if label not in shown:
                ax.set_xticks([])
                ax.set_yticks([])
                note = "no prompt adversary:\nq is not a decision"
                ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
                continue
            image = _heatmap(ax, series[label]["steps"], series[label][key], cmap=cmap, vmax=vmax)
            if j == 0:
                ax.set_ylabel("bin (0 hardest)")
        # One scale a row, so the runs' panels compare.
        fig.colorbar(image, ax=axes[i, :].tolist(), fraction=0.05, label=title)
    return fig


def plot_shadow_price(runs: Mapping[str, Rows]) -> Figure:
    """Rollout-GDRO's shadow price mu per step, one line per run whose method has one."""
    shown = {label: rows for label, rows in runs.items() if shows_mu(label)}
    if not shown:
        raise ValueError(f"no run among {list(runs)} has a shadow price (Rollout-GDRO's mu)")
    colors = colors_for(shown)
    fig = figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.subplots()
    for label, rows in shown.items():
        marker = "o" if len(rows) <= 20 else None
        steps, mu = _column(rows, "step"), _column(rows, "mu")
        ax.plot(steps, mu, color=colors[label], label=label, marker=marker, ms=3)
    ax.set(xlabel="RL step", ylabel="mu", title="Rollout-GDRO's shadow price mu")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def read_rows(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl` file (one JSON object a line)."""
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def plot_run(workdir: str | pathlib.Path, dpi: int = 100) -> list[pathlib.Path]:
    """Draws one training run's figures (the module docstring) into `workdir/plots/`.

    Args:
      workdir: a run's folder: `metrics.jsonl` and `config.json` (its method), as
        `train.train` writes them; a run still going is drawn up to its last finished step.
      dpi: resolution of the PNG files.

    Returns:
      The paths written.

    Raises:
      FileNotFoundError: `workdir` holds no `metrics.jsonl` or `config.json`.
      ValueError: `metrics.jsonl` holds no step yet.
    """
    workdir = pathlib.Path(workdir)
    for name in ("metrics.jsonl", "config.json"):
        if not (workdir / name).is_file():
            raise FileNotFoundError(
                f"{workdir / name} does not exist: give the folder of a training run "
                "(python -m experiments.train --workdir=...) whose first step has finished"
            )
    rows = read_rows(workdir / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{workdir / 'metrics.jsonl'} holds no step yet: plot after the first")
    method = json.loads((workdir / "config.json").read_text(encoding="utf-8"))["method"]
    runs = {method: rows}
    figures = {TRAINING_FIGURE: plot_curves(runs), CURRICULUM_FIGURE: plot_curriculum(runs)}
    if shows_mu(method):
        figures[SHADOW_PRICE_FIGURE] = plot_shadow_price(runs)
    out = workdir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=dpi)
        paths.append(out / name)
    return paths
