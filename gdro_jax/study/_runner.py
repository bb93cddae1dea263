"""Running a comparison study: the warm start, then every unfinished run, `config.jobs` processes
at a time (one per core, sharing one compilation cache), then the results.

A run is a process of the same command with `--config.only=<arm>/seed_<s>` added, so each run
has a process (and its memory) to itself and a study survives one run failing; with one job,
or one run left, runs go in this process. Finished runs (their evaluation file carries the
run's stamp) are never rerun and interrupted ones resume, so the same command continues a study.

With a results folder, each finished run's evaluation file is also kept in its store,
`<results>/runs/` (committed with the results, `_compare.sync_store`), with the warm start the
runs started from: on a fresh machine the same command restores that warm start and trains only
the runs the store lacks, and with nothing to train it collects the tables from the store alone.
A study that continues another's (`config.warm_start_store`, e.g. the horizon study) restores
that store's warm start when its own store has none, so its runs start from the same weights.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import ml_collections
from tqdm.auto import tqdm

from gdro_jax.study._collect import run_figures, write_results
from gdro_jax.study._compare import (
    STORE,
    RunSpec,
    pending,
    prepare_warm_start,
    restore_other_warm_start,
    restore_warm_start,
    run_one,
    run_specs,
    sync_store,
)
from gdro_jax.study._tables import format_tables


def _child_command(command: Sequence[str], spec: RunSpec) -> list[str]:
    own = [a for a in command if not a.startswith(("--results_md", "--config.only"))]
    return [*own, f"--config.only={spec.name}"]


def _run_children(config, workdir: pathlib.Path, specs, command) -> list[str]:
    """Runs each spec in its own process, `config.jobs` at a time; returns the failures."""
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(workdir / ".jax_cache"))
    queue, running, failures = list(specs), [], []
    with tqdm(total=len(specs), desc="runs", disable=not config.progress) as bar:
        while queue or running:
            while queue and len(running) < max(1, config.jobs):
                spec = queue.pop(0)
                log_path = workdir / spec.arm / f"seed_{spec.seed}.log"
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path, "w")  # noqa: SIM115 (closed when the process ends)
                process = subprocess.Popen(
                    _child_command(command, spec), env=env, stdout=log, stderr=subprocess.STDOUT
                )
                running.append((spec, process, log, log_path))
            time.sleep(0.5)
            for entry in list(running):
                spec, process, log, log_path = entry
                if process.poll() is None:
                    continue
                running.remove(entry)
                log.close()
                bar.update(1)
                if process.returncode != 0:
                    tail = log_path.read_text()[-2000:]
                    failures.append(f"{spec.name} (exit {process.returncode}, {log_path}):\n{tail}")
                    bar.write(f"{spec.name} failed: see {log_path}")
                else:
                    bar.write(log_path.read_text().strip().splitlines()[-1])
    return failures


def run_study(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    *,
    results: str | pathlib.Path | None = None,
    results_md: str | pathlib.Path | None = None,
    command: Sequence[str] | None = None,
    store: bool = True,
) -> dict[str, Any] | None:
    """Runs a study (or, with `config.only`, one run of it) and writes its results.

    Args:
      config: the study's config (`experiments/configs/study.py`).
      workdir: the warm start's and every run's folder.
      results: where `study.json`, `tables.md` and the figures go (default: `workdir`).
      results_md: a Markdown file whose marked results block is replaced by the tables.
      command: the command that runs this study (`python -m experiments.compare ...`); each
        child process runs it with `--config.only=<arm>/seed_<s>` added. Default: this
        process's own command line.
      store: with `results`, keep each finished run's evaluation file and the warm start in
        `<results>/runs/` (to commit), resume from there, and collect from there. False: the
        results folder gets the summary, tables and figures only (e.g. a validation reference
        of runs whose store is another study's).

    Returns:
      The collected summary (`collect`), or None for one run (`config.only`), whose held-out
      figures are printed.

    Raises:
      ValueError: a bad arm, seed count or `only` (before anything runs).
      RuntimeError: some runs failed (each named with its log's tail).
    """
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    specs = run_specs(config)  # checks the arms, seeds and `only` first
    store = pathlib.Path(results) / STORE if results is not None and store else None
    todo = pending(config, workdir, store)
    unstored = store is not None and bool(pending(config, store))  # finished here, not stored
    if todo or unstored or store is None or config.only:
        if store is not None:
            restore_warm_start(config, workdir, store)  # the stored weights, not retrained
        if config.get("warm_start_store"):  # another study's runs' warm start (same config)
            restore_other_warm_start(config, workdir, pathlib.Path(config.warm_start_store) / STORE)
        prepare_warm_start(config, workdir)
        if store is not None:
            sync_store(config, workdir, store)  # refuses a warm start unlike the stored runs'
    source = store if store is not None else workdir  # where the finished runs are read
    if config.only:
        (spec,) = specs
        if spec in todo:
            run_one(config, workdir, spec, store)
        print(run_figures(config, source, spec))
        return None
    print(f"{len(specs) - len(todo)} of {len(specs)} runs finished; running {len(todo)}")
    if config.jobs > 1 and len(todo) > 1:
        command = command or [sys.executable, "-m", "experiments.compare", *sys.argv[1:]]
        failures = _run_children(config, workdir, todo, command)
        if failures:
            raise RuntimeError("runs failed:\n" + "\n".join(failures))
    else:
        for spec in todo:
            run_one(config, workdir, spec, store)
            print(run_figures(config, source, spec))
    summary = write_results(config, source, results or workdir, results_md)
    print(format_tables(summary))
    return summary
