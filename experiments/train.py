"""RL post-training on the chain task: GRPO, Prompt-GDRO, Rollout-GDRO, or both.

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=runs/grpo \
        --config.method=gdro_both --config.steps=60 --config.seed=0 \
        [--config.init_from=runs/warm_start/model]

Writes `metrics.jsonl` (one JSON object per step), TensorBoard events (`tb/`), `config.json` and
`summary.json` to the work directory.
"""

from absl import app, flags
from ml_collections import config_flags

from gdro_jax import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for metrics, TensorBoard and summaries.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    train.train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
