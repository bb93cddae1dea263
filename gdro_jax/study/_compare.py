"""The comparison study (`make study`): arms x seeds from one pinned warm start, evaluated held out.

    warm start (trained once, reused) -> for each arm (a method and its overrides) and seed: an RL
    run from the warm start at equal rollout compute -> held-out evaluation of its final policy
    -> the pre-declared primary metric (relative pass@8 gain over the baseline on the frontier
    levels, paired by seed, paired bootstrap interval), secondary tables, figures.

Layout of the work directory:

    warm_start/                 the pretrain folder (model/, frontier.json) + eval_<split>.json
    <arm>/seed_<s>/             the RL run's folder (metrics.jsonl, checkpoints/, model/, ...)
    <arm>/seed_<s>/eval_<split>.json   its held-out evaluation and the stamp that produced it

A run whose evaluation file carries the same stamp (the run's config and the evaluation
settings) is finished and never rerun; an interrupted run resumes from its checkpoints. Every run
is deterministic on CPU, so rerunning one alone (`--config.only=<arm>/<seed>`) reproduces its
figures exactly.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import pathlib
import time
from typing import Any, NamedTuple

import ml_collections

from gdro_jax import configs, controllers, models, tasks
from gdro_jax import eval as evaluation
from gdro_jax.eval import evaluate_with
from gdro_jax.study._demo import BASELINE
from gdro_jax.train import read_metrics, snapshot_path, train
from gdro_jax.warmstart import CONFIG_FILE, config_hash, pretrain

SPLITS = ("validation", "test")


class RunSpec(NamedTuple):
    """One RL run of a study: an arm (a method plus overrides) and a seed."""

    arm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}/seed_{self.seed}"


def parse_overrides(text: str, *, where: str) -> dict[str, Any]:
    """Parses `"method=prompt_gdro grpo.loss_signal=surrogate"` into a dict of dotted fields.

    Values are Python literals (`1e-5`, `None`, `True`, `(3, 6)`); anything else is a string. A
    field written `+prompt_gdro.clip=None` is one the config leaves out (a library default) and
    the arm adds; its key keeps the `+` (see `apply_overrides`).

    Raises:
      ValueError: an item without `=`, naming `where` (e.g. `arms.grpo`).
    """
    overrides: dict[str, Any] = {}
    for item in text.split():
        field, sep, raw = item.partition("=")
        if not sep or not field:
            raise ValueError(f"{where}: {item!r} is not field=value")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        overrides[field] = value
    return overrides


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: dict[str, Any], *, where: str
) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted `field=value` overrides applied (types checked by the
    ConfigDict). A `+field` adds a field the config does not have (its parent must exist), so
    an arm can set a library default that the other arms leave out, and their configs (and the
    stamps that decide which runs are done) stay those of the study. Raises a ValueError naming
    `where` and the field for an unknown field, a `+field` that already exists, or a value of
    the wrong type."""
    config = copy.deepcopy(config)
    for key, value in overrides.items():
        adding = key.startswith("+")
        path = key.removeprefix("+")
        node = config
        parts = path.split(".")
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if adding and last and isinstance(node, ml_collections.ConfigDict):
                if part in node:
                    raise ValueError(f"{where}: +{path}: the field exists; drop the '+'")
                break
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                is_node = isinstance(node, ml_collections.ConfigDict)
                known = ", ".join(sorted(node)) if is_node else ""
                raise ValueError(
                    f"{where}: unknown field {'.'.join(parts[: depth + 1])!r}"
                    + (f" (known here: {known})" if known else "")
                )
            if depth < len(parts) - 1:
                node = node[part]
        try:
            if adding:  # a config from `--config` is locked against new fields
                with node.unlocked():
                    node[parts[-1]] = value
            else:
                node[parts[-1]] = value
        except TypeError as error:
            raise ValueError(f"{where}: {path}={value!r}: {error}") from error
    return config


def arms_of(config: ml_collections.ConfigDict) -> dict[str, dict[str, Any]]:
    """The study's arms in order, name -> overrides: those `config.run` names (comma-separated),
    or all of `config.arms`. An arm's `method` must be one of `controllers.METHODS`."""
    arms = {name: parse_overrides(text, where=f"arms.{name}") for name, text in config.arms.items()}
    for name, overrides in arms.items():
        if "method" in overrides:
            try:
                controllers.get_method(overrides["method"])
            except ValueError as error:
                raise ValueError(f"arms.{name}: {error}") from None
    if config.baseline not in arms:
        raise ValueError(f"baseline {config.baseline!r} is not one of the arms {sorted(arms)}")
    chosen = [name for name in config.run.split(",") if name]
    unknown = [name for name in chosen if name not in arms]
    if unknown:
        raise ValueError(f"run: unknown arms {unknown}; the arms are {sorted(arms)}")
    # A ConfigDict keeps its keys sorted: without `run`, the baseline first, then the rest.
    order = chosen or [config.baseline, *sorted(set(arms) - {config.baseline})]
    return {name: arms[name] for name in order}


def seeds_of(config: ml_collections.ConfigDict) -> list[int]:
    if isinstance(config.seeds, bool) or not isinstance(config.seeds, int) or config.seeds < 1:
        raise ValueError(f"seeds must be an int >= 1 (runs seed 0..seeds-1), got {config.seeds!r}")
    return list(range(config.seeds))


def run_specs(config: ml_collections.ConfigDict) -> list[RunSpec]:
    """Every run of the study in order (seed-major, so early results cover every arm), or the
    one named by `config.only` (`<arm>/<seed>`)."""
    arms, seeds = arms_of(config), seeds_of(config)
    specs = [RunSpec(arm, seed) for seed in seeds for arm in arms]
    if config.only:
        arm, _, seed = config.only.partition("/")
        spec = RunSpec(arm, int(seed.removeprefix("seed_"))) if seed else None
        if spec not in specs:
            raise ValueError(f"only={config.only!r} is not one of the runs (<arm>/<seed>)")
        return [spec]
    return specs


def run_config(
    config: ml_collections.ConfigDict, spec: RunSpec, warm_start: pathlib.Path
) -> ml_collections.ConfigDict:
    """The RL config of one run: `config.train`, the arm's overrides, the seed, the warm start."""
    if spec.arm not in config.arms:
        raise ValueError(f"{spec.arm!r} is not one of the arms {sorted(config.arms)}")
    overrides = parse_overrides(config.arms[spec.arm], where=f"arms.{spec.arm}")
    run = apply_overrides(config.train, overrides, where=f"arms.{spec.arm}")
    run.seed = spec.seed
    run.init_from = str(warm_start)
    run.progress = False
    return run


def _stamp(run: ml_collections.ConfigDict | None, eval_config: ml_collections.ConfigDict) -> str:
    """What decides an evaluation file: the run's config (its fields that differ from the
    schema's defaults, `configs.canonical`, without `progress`) and the eval settings."""
    fields: dict[str, Any] = {"eval": eval_config.to_dict()}
    if run is not None:
        canonical = configs.canonical(run, configs.run_schema())
        fields["run"] = {k: v for k, v in canonical.items() if k != "progress"}
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _eval_file(folder: pathlib.Path, split: str) -> pathlib.Path:
    return folder / f"eval_{split}.json"


def _read_done(path: pathlib.Path, stamp: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    return stored if stored.get("stamp") == stamp else None


def _split_rows(config: ml_collections.ConfigDict) -> tuple[tasks.ChainTaskConfig, list[dict]]:
    split = config.eval.split
    if split not in SPLITS:
        raise ValueError(f"eval.split must be one of {SPLITS}, got {split!r}")
    task_config = configs.chain_task_config(config.train)
    return task_config, getattr(tasks.build_splits(task_config), split)


def _evaluate(model_dir, config, progress: bool) -> evaluation.TaskEvaluation:
    task_config, rows = _split_rows(config)
    policy = models.from_pretrained(model_dir)
    return evaluate_with(policy, task_config, rows, config.eval, progress)


def prepare_warm_start(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> pathlib.Path:
    """Trains (or reuses) the pinned warm start and evaluates it on the study's split once.

    Raises:
      ValueError: the workdir's warm start was trained from another config and runs were
        trained from it (they would be stale): use another workdir.
    """
    stored = workdir / BASELINE / CONFIG_FILE
    if stored.exists():
        before = json.loads(stored.read_text()).get("config_hash")
        runs = [p for p in workdir.glob("*/seed_*") if p.is_dir()]
        if before != config_hash(config.pretrain) and runs:
            raise ValueError(
                f"{workdir}: its warm start was trained from another pretrain config (hash "
                f"{before}, now {config_hash(config.pretrain)}) and {len(runs)} runs started from "
                "it; use another --workdir"
            )
    pretrain_config = copy.deepcopy(config.pretrain)
    pretrain_config.progress = config.progress  # not part of the warm start's hash
    model_dir = pretrain(pretrain_config, workdir / BASELINE)
    path = _eval_file(workdir / BASELINE, config.eval.split)
    stamp = _stamp(None, config.eval) + "-" + config_hash(config.pretrain)
    if _read_done(path, stamp) is None:
        result = _evaluate(model_dir, config, config.progress)
        path.write_text(json.dumps({"stamp": stamp, "evaluation": result.to_dict()}))
    return model_dir


def pending(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> list[RunSpec]:
    """The runs whose evaluation file is missing or was made by another config."""
    warm = workdir / BASELINE / models.MODEL_DIR
    out = []
    for spec in run_specs(config):
        stamp = _stamp(run_config(config, spec, warm), config.eval)
        path = _eval_file(workdir / spec.arm / f"seed_{spec.seed}", config.eval.split)
        if _read_done(path, stamp) is None:
            out.append(spec)
    return out


def run_one(config: ml_collections.ConfigDict, workdir: pathlib.Path, spec: RunSpec) -> None:
    """Trains one run (resuming it if interrupted; at once if its training is complete) and
    writes its held-out evaluation with the stamp that makes it finished."""
    warm = workdir / BASELINE / models.MODEL_DIR
    run = run_config(config, spec, warm)
    folder = workdir / spec.arm / f"seed_{spec.seed}"
    start = time.perf_counter()
    train(run, folder)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    result = _evaluate(folder / models.MODEL_DIR, config, False)
    rows = read_metrics(folder / "metrics.jsonl")
    along = [
        _point(config, run, rows, step, snapshot_path(folder, step))
        for step in run.checkpoint.get("snapshot_steps", ())
        if step < run.steps
    ]
    record = {
        "stamp": _stamp(run, config.eval),
        "arm": spec.arm,
        "seed": spec.seed,
        "split": config.eval.split,
        "sampled_tokens": float(sum(r["tokens"] for r in rows)),
        "seconds": {"train": train_seconds, "eval": time.perf_counter() - start},
        "evaluation": result.to_dict(),
    }
    if along:  # the held-out figures along the run, then at its end
        record["along"] = [*along, _point(config, run, rows, run.steps, None, result)]
    _eval_file(folder, config.eval.split).write_text(json.dumps(record))


def _point(config, run, rows, step: int, model_dir, result=None) -> dict[str, Any]:
    """One held-out evaluation along a run: after `step` steps, each of R sampled rollouts
    (whatever the method keeps, so methods compare at equal sampled rollouts)."""
    if result is None:
        if not pathlib.Path(model_dir).is_dir():
            raise FileNotFoundError(
                f"{model_dir}: no policy snapshot after step {step} (the run was trained before "
                "checkpoint.snapshot_steps held it); delete the run's folder to train it again"
            )
        result = _evaluate(model_dir, config, False)
    return {
        "step": step,
        "sampled_rollouts": step * run.num_prompts * run.n_mean,
        "sampled_tokens": float(sum(r["tokens"] for r in rows if r["step"] <= step)),
        "evaluation": result.to_dict(),
    }
