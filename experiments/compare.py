"""The comparison study: arms x seeds from one warm start, held-out evaluation, paired gains.

    python -m experiments.compare --config=experiments/configs/study.py --workdir=runs/study \
        --results=results --results_md=RESULTS.md

Trains the warm start (or reuses it), then every run (`config.jobs` processes at a time, each
this command with `--config.only=<arm>/seed_<s>`, sharing one compilation cache), then writes
`study.json`, `tables.md` and the figures to `--results` and the tables into `--results_md`'s
marked block (`gdro_jax.study.run_study`). Finished runs are never rerun and interrupted ones
resume, so the same command continues a study; with `--results`, each finished run is also kept
in `<results>/runs/` with the warm start, so the command continues it on another machine too.
`--config.only=<arm>/seed_<s>` runs one run alone and prints its held-out figures (delete its
folder, and its file in the store, first to redo it).
"""

import sys

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax import study

_CONFIG = config_flags.DEFINE_config_file("config", None, "Study config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for the warm start and every run.")
_RESULTS = flags.DEFINE_string(
    "results",
    None,
    "Folder for study.json, tables.md and the figures, and runs/, the store of each finished "
    "run's evaluation file and the warm start (commit it to resume elsewhere; default: workdir, "
    "without a store).",
)
_RESULTS_MD = flags.DEFINE_string(
    "results_md", None, "A markdown file whose marked results block is replaced by the tables."
)
OUTPUTS = {
    "tables.md": "the tables above",
    "heldout.png": "held-out pass@k per level and the primary gains with intervals",
    "study.json": "every figure, per seed",
    "runs": "the store: each finished run's file and the warm start (commit it)",
}
_STORE = flags.DEFINE_bool(
    "store",
    True,
    "With --results: keep each finished run and the warm start in <results>/runs/ and resume "
    "from there (--nostore: the summary, tables and figures only).",
)


def main(argv):
    del argv
    try:
        study.run_study(
            _CONFIG.value,
            _WORKDIR.value,
            results=_RESULTS.value,
            results_md=_RESULTS_MD.value,
            store=_STORE.value,
        )
        if not _CONFIG.value.only:
            print(_cli.wrote(_RESULTS.value or _WORKDIR.value, OUTPUTS))
    except RuntimeError as failed:  # some runs failed: their logs' tails are in the message
        print(failed, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    _cli.run(main, required=("config", "workdir"), schemas=_cli.STUDY_SCHEMAS)
