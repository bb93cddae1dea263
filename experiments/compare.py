"""The comparison study: arms x seeds from one warm start, held-out evaluation, paired gains.

    python -m experiments.compare --config=experiments/configs/study.py --workdir=runs/study \
        --results=results --results_md=RESULTS.md

Trains the warm start (or reuses it), then every run (`config.jobs` processes at a time, each
`python -m experiments.compare ... --config.only=<arm>/seed_<s>`, sharing one compilation
cache), then writes `study.json`, `tables.md` and the figures to `--results` and the tables into
`--results_md`'s marked block. Finished runs are never rerun and interrupted ones resume, so the
same command continues a study. `--config.only=<arm>/seed_<s>` runs one run alone and prints its
held-out figures (delete its folder first to redo it).
"""

import os
import pathlib
import subprocess
import sys
import time

from absl import flags
from ml_collections import config_flags

from experiments import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Study config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for the warm start and every run.")
_RESULTS = flags.DEFINE_string(
    "results", None, "Folder for study.json, tables.md and the figures (default: workdir)."
)
_RESULTS_MD = flags.DEFINE_string(
    "results_md", None, "A markdown file whose marked results block is replaced by the tables."
)
flags.mark_flags_as_required(["config", "workdir"])


def _child_command(spec) -> list[str]:
    own = [a for a in sys.argv[1:] if not a.startswith(("--results", "--config.only"))]
    return [sys.executable, "-m", "experiments.compare", *own, f"--config.only={spec.name}"]


def _run_children(config, workdir: pathlib.Path, specs) -> list[str]:
    """Runs each spec in its own process, `config.jobs` at a time; returns the failures."""
    from tqdm import tqdm  # noqa: PLC0415

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
                    _child_command(spec), env=env, stdout=log, stderr=subprocess.STDOUT
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


def main(argv):
    del argv
    from gdro_jax import study  # noqa: PLC0415 (jax loads after the flags are checked)

    config, workdir = _CONFIG.value, pathlib.Path(_WORKDIR.value)
    workdir.mkdir(parents=True, exist_ok=True)
    specs = study.run_specs(config)  # checks the arms, seeds and `only` first
    if config.only:
        (spec,) = specs
        study.prepare_warm_start(config, workdir)
        if spec in study.pending(config, workdir):
            study.run_one(config, workdir, spec)
        print(study.run_figures(config, workdir, spec))
        return
    study.prepare_warm_start(config, workdir)
    todo = study.pending(config, workdir)
    print(f"{len(specs) - len(todo)} of {len(specs)} runs finished; running {len(todo)}")
    if config.jobs > 1 and len(todo) > 1:
        failures = _run_children(config, workdir, todo)
        if failures:
            for failure in failures:
                print(f"run failed: {failure}", file=sys.stderr)
            sys.exit(1)
    else:
        for spec in todo:
            study.run_one(config, workdir, spec)
            print(study.run_figures(config, workdir, spec))
    summary = study.write_results(
        config, workdir, _RESULTS.value or workdir, _RESULTS_MD.value or None
    )
    print(study.format_tables(summary))


if __name__ == "__main__":
    _cli.run(main)
