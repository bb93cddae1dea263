"""Warm start: supervised training of the policy on the chain task's worked solutions.

    python -m experiments.pretrain --config=experiments/configs/pretrain_tiny.py \
        --workdir=runs/warm_start [--config.train.steps=400 --config.seed=0 ...]

Writes `WORKDIR/model` (an HF folder), `WORKDIR/tokenizer` and `WORKDIR/frontier.json`, prints the
per-level validation table, and reuses the folder when the config is unchanged.
"""

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax import configs
from gdro_jax.warmstart import pretrain

_CONFIG = config_flags.DEFINE_config_file("config", None, "Warm-start config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for the model, tokenizer and metrics.")


def main(argv):
    del argv
    pretrain(_CONFIG.value, _WORKDIR.value)
    files = {
        "model": "the warm start, an HF folder with its tokenizer (--config.init_from=...)",
        "frontier.json": "its validation figures per level and the frontier check",
    }
    print(_cli.wrote(_WORKDIR.value, files))


if __name__ == "__main__":
    _cli.run(main, required=("config", "workdir"), schemas={"": configs.pretrain_schema})
