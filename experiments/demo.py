"""The miniature study (`make demo`): warm start, RL per method at equal compute, table, plots.

    python -m experiments.demo --config=experiments/configs/demo.py --workdir=runs/demo \
        [--config.methods=grpo,gdro_both --config.train.steps=60]
"""

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax.study import run_demo

_CONFIG = config_flags.DEFINE_config_file("config", None, "Demo config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for every run, the table and the plots.")


def main(argv):
    del argv
    run_demo(_CONFIG.value, _WORKDIR.value)
    files = {
        "table.txt": "the held-out table above",
        "curriculum.png": "what each method's controllers did",
        "results.json": "every figure",
    }
    print(_cli.wrote(_WORKDIR.value, files))


if __name__ == "__main__":
    _cli.run(main, required=("config", "workdir"), schemas=_cli.STUDY_SCHEMAS)
