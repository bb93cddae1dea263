"""The simulator beside a real study: fitted to its warm start and GRPO gain on the validation
split, then run for every method; its predicted gains over GRPO are set beside the measured ones.

1. The warm-start skill logits are fitted to the real warm start's pass@1 per level on the
   validation split (`config.reference`'s `warm_start` figures; `fit_skill_logits`).
2. The SGD learning rate is calibrated so that simulated GRPO raises pass@1 (levels weighted
   equally) as much as the real GRPO did on the validation split (`config.reference_arm`).
3. Every method runs over `config.seeds` seeds (`run_experiment`: arrays, plots and the table in
   the workdir).
4. Each method's predicted relative gain over GRPO, as the study measures it (frontier pass@8,
   pooled and frontier pass@1; frontier levels weighted by `config.test_problems`, the study's
   test problems per level), goes to `comparison.json` and is set beside the real study's
   (`config.study`) when that file exists.
"""

import copy
import dataclasses
import json
import os
import pathlib

import ml_collections

from gdro_jax.runtime import environment
from gdro_jax.sim._calibrate import (
    calibrate_learning_rate,
    expected_pass_at_1,
    fit_skill_logits,
    predicted_gains,
)
from gdro_jax.sim._config import SimConfig
from gdro_jax.sim._experiment import EXPERIMENT_KEYS, run_experiment
from gdro_jax.sim._simulate import SimOutput, simulate

# The config's keys that are not `run_experiment`'s.
_STUDY_KEYS = (
    "reference",
    "reference_arm",
    "study",
    "lr_candidates",
    "calibration_seeds",
    "test_problems",
)


def _read(path: str, what: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    return json.loads(pathlib.Path(path).read_text())


def _real_gains(study: dict, method: str, metrics: list[str]) -> dict[str, list[float]]:
    """`{metric: [gain, low, high]}` of one method in a study.json (primary and secondary)."""
    out = {}
    primary = study["primary"].get(method)
    if primary:
        out[f"frontier {study['primary_declaration']['metric']}"] = [
            primary["gain"],
            primary["low"],
            primary["high"],
        ]
    for metric in metrics:
        entry = study["secondary"].get(method, {}).get(metric)
        if entry:
            out[metric] = [entry["gain"], entry["low"], entry["high"]]
    return out


def _table(predicted: dict, real: dict | None) -> str:
    metrics = list(next(iter(predicted.values())))
    header = "| method | " + " | ".join(
        f"{m}: simulated | {m}: real [95 %]" if real else f"{m}: simulated" for m in metrics
    )
    lines = [header + " |", "|---" * (1 + len(metrics) * (2 if real else 1)) + "|"]
    for method, gains in predicted.items():
        cells = []
        for metric in metrics:
            cells.append(f"{gains[metric]:+.1%}")
            if real:
                value = real.get(method, {}).get(metric)
                cells.append(
                    f"{value[0]:+.1%} [{value[1]:+.1%}, {value[2]:+.1%}]" if value else "-"
                )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def simulate_study(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Fits, calibrates and runs the simulator (module docstring); returns comparison.json's
    record, with the real study's gains under "real" (None when `config.study` is missing)."""
    reference = _read(config.reference, "config.reference")
    if config.reference_arm not in reference["mean"]:
        raise ValueError(
            f"config.reference_arm={config.reference_arm!r} is not an arm of {config.reference} "
            f"(arms: {sorted(reference['mean'])})"
        )
    warm = reference["warm_start"]
    levels = range(1, config.num_levels + 1)
    pass1_L = [warm[f"L{level} pass@1"] for level in levels]
    target = reference["mean"][config.reference_arm]["pooled pass@1"] - warm["pooled pass@1"]
    frontier = reference["frontier_levels"]
    if len(config.test_problems) != config.num_levels:
        raise ValueError(
            f"config.test_problems must give one count per level ({config.num_levels}), got "
            f"{tuple(config.test_problems)!r}"
        )

    sim_settings = ml_collections.ConfigDict(copy.deepcopy(config.to_dict()))
    for key in _STUDY_KEYS:
        del sim_settings[key]
    sim_settings.init_logits = tuple(float(x) for x in fit_skill_logits(pass1_L, config.offset_std))
    base = SimConfig.from_mapping(sim_settings, ignore=EXPERIMENT_KEYS)

    def run_grpo(lr: float) -> SimOutput:
        calibration = dataclasses.replace(base, learning_rate=lr)
        outputs = simulate(
            calibration,
            ("grpo",),
            num_seeds=config.calibration_seeds,
            seed=config.seed,
            fast_compile=config.fast_compile,
        )
        return outputs["grpo"]

    candidates = [float(x) for x in config.lr_candidates.split(",") if x.strip()]
    lr, calibration = calibrate_learning_rate(run_grpo, target, candidates)
    sim_settings.learning_rate = lr
    print(
        f"fitted to {config.reference}: warm-start pass@1 per level "
        f"{[round(p, 3) for p in pass1_L]} -> skill logits "
        f"{[round(t, 2) for t in sim_settings.init_logits]}; GRPO's pass@1 gain "
        f"{target:+.4f} -> SGD learning rate {lr:.4g}",
        flush=True,
    )
    result = run_experiment(sim_settings, workdir)
    # The real frontier figure is a mean over the test split's problems: weigh levels by them.
    counts = [int(config.test_problems[level - 1]) for level in frontier]
    predicted = predicted_gains(result.outputs, "grpo", frontier, config.eval_k, counts)
    real = None
    if os.path.isfile(config.study):
        study = _read(config.study, "config.study")
        real = {m: _real_gains(study, m, ["pooled pass@1", "frontier pass@1"]) for m in predicted}
    table = _table(predicted, real)
    print(table, flush=True)
    record = {
        "reference": config.reference,
        "reference_arm": config.reference_arm,
        "frontier_levels": frontier,
        "frontier_problems": counts,
        "warm_start_pass1": pass1_L,
        "init_logits": list(sim_settings.init_logits),
        "fitted_pass1": expected_pass_at_1(sim_settings.init_logits, config.offset_std).tolist(),
        "target_pass1_gain": target,
        "calibration": [{"learning_rate": a, "pass1_gain": g} for a, g in calibration],
        "learning_rate": lr,
        "seeds": config.seeds,
        "predicted": predicted,
        "real": real,
        "study": config.study if real else None,
        "environment": environment(),
    }
    pathlib.Path(workdir, "comparison.json").write_text(json.dumps(record, indent=2))
    pathlib.Path(workdir, "comparison.md").write_text(table + "\n")
    return record
