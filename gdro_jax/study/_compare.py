"""The comparison study (`make study`): arms x seeds from one pinned warm start, evaluated held out.

    warm start (trained once, reused) -> for each arm (a method and its overrides) and seed: an RL
    run from the warm start at equal rollout compute -> held-out evaluation of its final policy
    -> the pre-declared primary metric (relative pass@8 gain over the baseline on the frontier
    levels, paired by seed, paired bootstrap interval), secondary tables, figures.

Layout of the work directory:

    warm_start/                 the pretrain folder (model/, frontier.json) + eval_<split>.json
    <arm>/seed_<s>/             the RL run's folder (metrics.jsonl, checkpoints/, model/, ...)
    <arm>/seed_<s>/eval_<split>.json   its held-out evaluation, its compact log and decisions,
                                the stamp that produced it and the machine that ran it

The store (`<results>/runs/`, committed with the results) has the same layout with the small
files only: each run's evaluation file, and the whole warm start folder (its weights, about 3 MB
for the CPU profiles, with `warm_start.json`, their fingerprint). On CPU another machine may
train other weights from the same config, so a fresh work directory takes the stored warm start
(`restore_warm_start`) rather than training its own. A run whose evaluation file, in the store or
the work directory, carries the same stamp (the run's config, the warm start's config and the
evaluation settings) is finished and never rerun; an interrupted run resumes from its
checkpoints. Every run is deterministic on one CPU type (XLA's CPU code follows the processor's
vector extensions, which the file's `environment` records), so rerunning one alone there
(`--config.only=<arm>/<seed>`) reproduces its figures exactly; another machine type reproduces
them within their intervals (RESULTS.md).

Over 400 lines on purpose: the arms, the stamps that say a run is finished, running one run and
the store of finished runs and the warm start are one protocol, each rule read beside the others
it relies on; the store (`restore_warm_start`, `sync_store`) is the part to split off should it
grow.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import pathlib
import time
from typing import Any, NamedTuple

import ml_collections

from gdro_jax import configs, controllers, models, runtime, tasks
from gdro_jax import eval as evaluation
from gdro_jax.study._decisions import decision_summary
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


def _stamp(
    run: ml_collections.ConfigDict | None,
    eval_config: ml_collections.ConfigDict,
    warm_hash: str | None = None,
) -> str:
    """What decides an evaluation file: the run's config (its fields that differ from the
    schema's defaults, `configs.canonical`, without `progress` and the warm start's path), the
    warm start's config hash `warm_hash` (so that a run's stamp does not depend on where the
    work directory is) and the eval settings."""
    fields: dict[str, Any] = {"eval": eval_config.to_dict()}
    if run is not None:
        canonical = configs.canonical(run, configs.run_schema())
        fields["run"] = {k: v for k, v in canonical.items() if k not in ("progress", "init_from")}
        fields["warm_start"] = warm_hash
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_stamp(config: ml_collections.ConfigDict, spec: RunSpec) -> str:
    """The stamp a finished run's evaluation file carries (`_stamp`)."""
    run = run_config(config, spec, pathlib.Path(BASELINE) / models.MODEL_DIR)
    return _stamp(run, config.eval, config_hash(config.pretrain))


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


def _evaluate(model_dir, config, progress: bool, label: str = "eval") -> evaluation.ChainEvaluation:
    task_config, rows = _split_rows(config)
    policy = models.from_pretrained(model_dir)
    return evaluation.evaluate_chain(
        policy, rows, task_config, config.eval, progress=progress, label=label
    )


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
        label = f"eval {BASELINE} ({config.eval.split})"
        result = _evaluate(model_dir, config, config.progress, label)
        record = {"stamp": stamp, "evaluation": result.to_dict()}
        path.write_text(json.dumps({**record, "environment": runtime.environment()}))
    return model_dir


def run_folder(root: pathlib.Path, spec: RunSpec) -> pathlib.Path:
    return pathlib.Path(root) / spec.arm / f"seed_{spec.seed}"


def finished_file(
    config: ml_collections.ConfigDict,
    spec: RunSpec,
    workdir: pathlib.Path,
    store: pathlib.Path | None = None,
) -> pathlib.Path | None:
    """The evaluation file that makes `spec` finished (its stamp is the run's), in the store
    first, then in the work directory; None when neither holds one."""
    stamp = run_stamp(config, spec)
    for root in (store, workdir):
        if root is not None:
            path = _eval_file(run_folder(root, spec), config.eval.split)
            if _read_done(path, stamp) is not None:
                return path
    return None


def pending(
    config: ml_collections.ConfigDict,
    workdir: pathlib.Path,
    store: pathlib.Path | None = None,
) -> list[RunSpec]:
    """The runs whose evaluation file, in the store or the work directory, is missing or was
    made by another config."""
    return [
        spec
        for spec in run_specs(config)
        if finished_file(config, spec, pathlib.Path(workdir), store) is None
    ]


# The per-step metrics a run's evaluation file keeps (`compact_log`): what the study's figures
# and the premise's criteria read, not the per-prompt columns (about 300 KB a run).
LOG_FIELDS = (
    "step",
    "accuracy",
    "tokens",
    "nonzero_advantage_fraction",
    "bin/prompts",
    "bin/rollouts",
    "bin/q",
    "bin/zero_advantage_fraction",
    "q_mean_bin",
    "q_entropy",
    "lead_lag_gap",
    "weighted_standard_error",
    "uniform_standard_error",
)
LOG_DIGITS = 5  # significant digits kept


def compact_log(rows: list[dict[str, Any]]) -> dict[str, list]:
    """A run's `LOG_FIELDS` over its steps, name -> per-step values (lists for per-bin fields),
    floats rounded to `LOG_DIGITS` significant digits (a figure's resolution, a fifth the size).
    Non-finite values stay the strings the metrics file holds ("nan", "inf")."""

    def short(value):
        if isinstance(value, list):
            return [short(v) for v in value]
        if isinstance(value, float):
            return float(f"{value:.{LOG_DIGITS}g}")
        return value

    if not rows:
        return {}
    return {name: [short(row[name]) for row in rows] for name in LOG_FIELDS if name in rows[0]}


def log_rows(log: dict[str, list]) -> list[dict[str, Any]]:
    """`compact_log`'s columns back into per-step rows (what `read_metrics` gives)."""
    steps = len(log.get("step", ()))
    return [{name: values[i] for name, values in log.items()} for i in range(steps)]


def write_record(path: pathlib.Path, record: dict[str, Any]) -> None:
    """A JSON object with one top-level key per line, so that `git diff` of a rerun shows the
    lines that changed (the wall-clock `seconds`) and nothing else."""
    lines = [f"{json.dumps(key)}: {json.dumps(value)}" for key, value in record.items()]
    _write_atomic(path, "{\n" + ",\n".join(lines) + "\n}\n")


def _write_atomic(path: pathlib.Path, text: str) -> None:
    _write_atomic_bytes(path, text.encode())


def _write_atomic_bytes(path: pathlib.Path, data: bytes) -> None:
    """Writes through a temporary file of this process, so that a reader (another run's process)
    never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def run_one(
    config: ml_collections.ConfigDict,
    workdir: pathlib.Path,
    spec: RunSpec,
    store: pathlib.Path | None = None,
) -> None:
    """Trains one run (resuming it if interrupted; at once if its training is complete) and
    writes its held-out evaluation, compact log and decisions with the stamp that makes it
    finished, in the work directory and (given) the store."""
    warm = workdir / BASELINE / models.MODEL_DIR
    run = run_config(config, spec, warm)
    folder = run_folder(workdir, spec)
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
    first_pass = run.task.pool_size // run.num_prompts  # steps until every prompt was drawn
    record = {
        "stamp": run_stamp(config, spec),
        "arm": spec.arm,
        "seed": spec.seed,
        "split": config.eval.split,
        "sampled_tokens": float(sum(r["tokens"] for r in rows)),
        "evaluation": result.to_dict(),
    }
    if along:  # the held-out figures along the run, then at its end
        record["along"] = [*along, _point(config, run, rows, run.steps, None, result)]
    record["decisions"] = decision_summary(rows, after_step=min(first_pass, len(rows) - 1))
    record["decisions"]["after_step"] = min(first_pass, len(rows) - 1)
    record["log"] = compact_log(rows)
    # The machine-dependent lines last: a rerun's `git diff` shows them and nothing else.
    record["environment"] = runtime.environment()
    record["seconds"] = {"train": train_seconds, "eval": time.perf_counter() - start}
    path = _eval_file(folder, config.eval.split)
    write_record(path, record)
    if store is not None:
        write_record(_eval_file(run_folder(store, spec), config.eval.split), record)


STORE = "runs"  # the store's folder under a study's results folder
# The store's record of the warm start the runs started from.
WARM_START_FILE = "warm_start.json"


def weights_fingerprint(model_dir: str | pathlib.Path) -> str:
    """sha256 of a saved policy's weights file (the same bytes: the same model)."""
    digest = hashlib.sha256()
    with open(pathlib.Path(model_dir) / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _warm_start_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The warm start folder's files, relative (its model and tokenizer, `pretrain.json`,
    `frontier.json`, its evaluations): about 3 MB for the CPU profiles' policies."""
    return sorted(
        p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and ".tmp" not in p.name
    )


def _stored_identity(store: pathlib.Path) -> dict[str, Any] | None:
    path = store / BASELINE / WARM_START_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _refuse_other_weights(fingerprint: str, stored: dict[str, Any], where, store) -> None:
    if stored.get("fingerprint") != fingerprint:
        raise ValueError(
            f"{where}: this warm start's weights (sha256 {fingerprint[:12]}) are not those the "
            f"runs in {store} started from ({stored.get('fingerprint', '?')[:12]}), though its "
            "config is the same: it was trained on another machine or package versions. New "
            "runs would not pair with the stored ones: delete this warm start (the stored one "
            "is then used) or give another --results folder to run the study afresh"
        )


def restore_warm_start(
    config: ml_collections.ConfigDict, workdir: pathlib.Path, store: pathlib.Path
) -> bool:
    """Copies the store's warm start (weights included) into a work directory that has none, so
    that a fresh machine starts its runs from the very weights the stored runs started from
    (on CPU another machine may train other weights from the same config). Returns whether it
    copied anything.

    Raises:
      ValueError: the work directory's warm start has the stored config but other weights.
    """
    workdir, store = pathlib.Path(workdir), pathlib.Path(store)
    stored = _stored_identity(store)
    if stored is None or stored.get("config_hash") != config_hash(config.pretrain):
        return False
    warm, kept = workdir / BASELINE, store / BASELINE
    model = warm / models.MODEL_DIR
    if (model / "model.safetensors").exists():
        _refuse_other_weights(weights_fingerprint(model), stored, model, store)
        return False
    if not (kept / models.MODEL_DIR / "model.safetensors").exists():
        return False  # a store from before warm starts were kept: train it here
    for relative in _warm_start_files(kept):
        if relative.name != WARM_START_FILE:
            (warm / relative).parent.mkdir(parents=True, exist_ok=True)
            _write_atomic_bytes(warm / relative, (kept / relative).read_bytes())
    return True


def restore_other_warm_start(
    config: ml_collections.ConfigDict, workdir: pathlib.Path, other: pathlib.Path
) -> None:
    """Gives a study that continues another's (`config.warm_start_store`) the warm start whose
    weights that study's runs started from, `other` being its store: copied into a work
    directory that has none, checked against one that has.

    Raises:
      ValueError: `other` holds no warm start of this study's pretrain config (a new one would
        not pair with the runs it continues), or the work directory's has other weights.
    """
    workdir, other = pathlib.Path(workdir), pathlib.Path(other)
    stored = _stored_identity(other)
    if stored is None or stored.get("config_hash") != config_hash(config.pretrain):
        raise ValueError(
            f"warm_start_store: {other} holds no warm start of this study's pretrain config "
            f"(hash {config_hash(config.pretrain)}, stored "
            f"{None if stored is None else stored.get('config_hash')}); the runs would not start "
            "from the weights of the study they continue. Restore that store, or clear "
            "warm_start_store to train a warm start here"
        )
    if not restore_warm_start(config, workdir, other):  # present already: the same weights?
        model = workdir / BASELINE / models.MODEL_DIR
        if not (model / "model.safetensors").exists():
            raise ValueError(f"warm_start_store: {other} keeps its warm start's identity only")
        _refuse_other_weights(weights_fingerprint(model), stored, model, other)


def sync_store(config: ml_collections.ConfigDict, workdir: pathlib.Path, store: pathlib.Path):
    """Brings the store up to date with the work directory's warm start (trained, reused or
    restored by `prepare_warm_start`: its whole folder, weights included, and its fingerprint)
    and finished runs.

    Raises:
      ValueError: the store's runs started from a warm start of the same config whose weights
        differ from this one's (another machine or package versions trained another model):
        its runs would not pair with new ones. Nothing is written.
    """
    workdir, store = pathlib.Path(workdir), pathlib.Path(store)
    warm, kept = workdir / BASELINE, store / BASELINE
    identity = {
        "config_hash": config_hash(config.pretrain),
        "fingerprint": weights_fingerprint(warm / models.MODEL_DIR),
    }
    stored = _stored_identity(store)
    if stored is not None and stored.get("config_hash") == identity["config_hash"]:
        _refuse_other_weights(identity["fingerprint"], stored, warm / models.MODEL_DIR, store)
    for relative in _warm_start_files(warm):
        data = (warm / relative).read_bytes()
        target = kept / relative
        if not target.exists() or target.read_bytes() != data:
            _write_atomic_bytes(target, data)
    _write_atomic(kept / WARM_START_FILE, json.dumps(identity, indent=1) + "\n")
    for spec in run_specs(config):
        path = finished_file(config, spec, workdir)
        if path is not None and finished_file(config, spec, store) is None:
            _write_atomic(_eval_file(run_folder(store, spec), config.eval.split), path.read_text())


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
