"""The controller-dynamics experiment: simulate every method over seeds, save, plot, tabulate.

`run_experiment` is what `experiments/simulate_controllers.py` calls with its parsed config. It
writes into `workdir`:

  arrays.npz           every `SimOutput` field as `<method>/<field>` (seed axis first; trace
                       fields `<method>/trace/<field>` are [S, T, ...], the training pool
                       `<method>/pool/level_P` and `offset_P` [S, D]), plus `pool_shares` and
                       `pool_counts`;
  config.json          the config that produced them;
  summary.txt          the printed table;
  q_heatmap.png        Prompt-GDRO's q over step x bin, per method;
  rollouts_per_bin.png rollouts per bin over steps (stacked, sum R), per method;
  pass_rate_per_level.png   exact held-out pass@1 per level over steps, per method;
  final_pass_at_<k>.png final pass@k per level and pooled, methods side by side;
  controller_signals.png    mu, lead-lag gap, informative groups, reward, the batch's mean
                       success probability and the optimizer steps taken, over steps.

Any subset of `controllers.METHODS` runs; the simulator compiles the parts they need.
"""

import json
import os
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from gdro_jax.controllers import METHODS
from gdro_jax.sim._config import SimConfig
from gdro_jax.sim._parts import method_flags
from gdro_jax.sim._plots import (
    plot_controller_signals,
    plot_final_by_level,
    plot_pass_rate_per_level,
    plot_q_heatmap,
    plot_rollouts_per_bin,
)
from gdro_jax.sim._report import Interval, format_table, paired_gain, summarize
from gdro_jax.sim._simulate import SimOutput, simulate

# Keys of the experiment config that are not `SimConfig` fields.
EXPERIMENT_KEYS = ("seeds", "seed", "methods", "progress", "fast_compile")


class ExperimentResult(NamedTuple):
    """What `run_experiment` computed (also written to its workdir)."""

    outputs: dict[str, SimOutput]  # numpy arrays with a leading seed axis
    summary: dict[str, dict[str, Interval]]  # from `summarize`
    table: str  # the printed table
    seconds: float  # wall time of the simulation (compilation included)


def _flatten(outputs: Mapping[str, SimOutput]) -> dict[str, np.ndarray]:
    arrays = {}
    for method, output in outputs.items():
        for field, value in output._asdict().items():
            if hasattr(value, "_asdict"):  # the trace, the pool
                for inner_field, inner_value in value._asdict().items():
                    arrays[f"{method}/{field}/{inner_field}"] = np.asarray(inner_value)
            elif value is not None:
                arrays[f"{method}/{field}"] = np.asarray(value)
    return arrays


def run_experiment(config: Mapping[str, Any], workdir: str) -> ExperimentResult:
    """Runs the methods of `config` over its seeds and writes arrays, plots and the table.

    Args:
      config: a mapping (an `ml_collections.ConfigDict`) with the `SimConfig` fields plus
        `seeds` (number of seeds), `seed` (root seed), `methods` (names, or a comma-separated
        string), `progress` (show a tqdm bar) and `fast_compile` (see `make_simulator`).
      workdir: output folder, created if missing.

    Returns:
      The `ExperimentResult`; the table is also printed.
    """
    sim_config = SimConfig.from_mapping(config, ignore=EXPERIMENT_KEYS)
    methods = config["methods"]
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    # An unknown or missing method is refused before the workdir exists.
    unknown = [method for method in methods if method not in METHODS]
    if unknown or not methods:
        raise ValueError(
            f"methods must be names from {tuple(METHODS)}, got methods={config['methods']!r}"
        )
    for method in methods:
        method_flags(method)  # a method with a part the simulator does not model
    num_seeds = int(config["seeds"])
    if num_seeds < 1:
        raise ValueError(f"seeds must be >= 1, got seeds={num_seeds}")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"workdir={workdir!r} is a file; pass a folder")
    os.makedirs(workdir, exist_ok=True)

    start = time.perf_counter()
    outputs = simulate(
        sim_config,
        tuple(methods),
        num_seeds=num_seeds,
        seed=int(config.get("seed", 0)),
        progress=bool(config.get("progress", False)),
        fast_compile=bool(config.get("fast_compile", False)),
    )
    seconds = time.perf_counter() - start

    shares_L = sim_config.pool_shares
    summary = summarize(outputs, shares_L, eval_k=sim_config.eval_k)
    gains = paired_gain(outputs, shares_L)
    header = (
        f"{len(methods)} methods x {num_seeds} seeds x {sim_config.steps} steps, "
        f"N={sim_config.num_prompts} prompts x n_mean={sim_config.n_mean} "
        f"(R={sim_config.num_slots} rollouts/step for every method), pool {sim_config.pool_size} "
        f"({sim_config.visits_per_prompt:.1f} visits/prompt), {seconds:.1f} s\n"
    )
    # Dynamic sampling's steps are rounds of R rollouts: it takes an optimizer step on some only.
    updates = {m: float(np.mean(np.sum(o.trace.updated, axis=-1))) for m, o in outputs.items()}
    fewer = {m: u for m, u in updates.items() if u < sim_config.steps}
    if fewer:
        header += (
            f"optimizer steps of the {sim_config.steps} steps (rounds), mean over seeds: "
            + ", ".join(f"{m} {u:.1f}" for m, u in fewer.items())
            + "\n"
        )
    table = header + format_table(
        summary, num_seeds=num_seeds, gains=gains, gains_metric=f"pass@{sim_config.eval_k}"
    )
    print(table, flush=True)

    np.savez_compressed(
        os.path.join(workdir, "arrays.npz"),
        pool_shares=shares_L,
        pool_counts=sim_config.pool_counts,
        **_flatten(outputs),
    )
    with open(os.path.join(workdir, "config.json"), "w") as f:
        to_json = getattr(config, "to_json_best_effort", None)
        f.write(to_json(indent=2) if to_json else json.dumps(dict(config), indent=2, default=str))
    with open(os.path.join(workdir, "summary.txt"), "w") as f:
        f.write(table)

    figures = {
        "q_heatmap.png": plot_q_heatmap(outputs),
        "rollouts_per_bin.png": plot_rollouts_per_bin(outputs),
        "pass_rate_per_level.png": plot_pass_rate_per_level(outputs),
        f"final_pass_at_{sim_config.eval_k}.png": plot_final_by_level(
            summary, f"pass@{sim_config.eval_k}"
        ),
        "controller_signals.png": plot_controller_signals(outputs),
    }
    import matplotlib.pyplot as plt  # here, not at the top: commands start faster

    for name, figure in figures.items():
        figure.savefig(os.path.join(workdir, name), dpi=110)
        plt.close(figure)
    return ExperimentResult(outputs=outputs, summary=summary, table=table, seconds=seconds)
