"""Figures shared by every layer that draws: one colour per method, and a run's figures.

- `METHOD_COLORS`, `colors_for(labels)`: a method's colour, the same in the demo's, the study's,
  the simulator's and one run's figures; other labels (the warm start, sweep settings) get
  colours no method uses. `shows_q`, `shows_mu`: whether a figure shows Prompt-GDRO's q or
  Rollout-GDRO's shadow price for a label (only for methods that have them).
- `figure(**kwargs)`: a matplotlib `Figure`, matplotlib imported on the first call (commands
  that draw nothing start sooner).
- `plot_run(workdir)`: one training run's figures from its `metrics.jsonl` into
  `workdir/plots/` (`python -m experiments.plot_run`); `plot_curves`, `plot_curriculum` and
  `plot_shadow_price` draw them for several runs side by side (the demo's figures).
"""

from gdro_jax.plots._figure import figure
from gdro_jax.plots._run import (
    CURRICULUM_FIGURE,
    PLOTS_DIR,
    SHADOW_PRICE_FIGURE,
    TRAINING_FIGURE,
    moving_average,
    plot_curriculum,
    plot_curves,
    plot_run,
    plot_shadow_price,
    read_rows,
)
from gdro_jax.plots._style import (
    BASELINE_COLOR,
    METHOD_COLORS,
    OTHER_COLORS,
    colors_for,
    shows_mu,
    shows_q,
)

__all__ = [
    "BASELINE_COLOR",
    "CURRICULUM_FIGURE",
    "METHOD_COLORS",
    "OTHER_COLORS",
    "PLOTS_DIR",
    "SHADOW_PRICE_FIGURE",
    "TRAINING_FIGURE",
    "colors_for",
    "figure",
    "moving_average",
    "plot_curriculum",
    "plot_curves",
    "plot_run",
    "plot_shadow_price",
    "read_rows",
    "shows_mu",
    "shows_q",
]
