"""RL post-training of a policy with GRPO, the GDRO adversaries or the field's methods.

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=runs/grpo \
        --config.method=gdro_both --config.steps=60 --config.seed=0 \
        [--config.init_from=runs/warm_start/model]

Writes `metrics.jsonl` (one JSON object per step), TensorBoard events (`tb/`), `config.json`,
`checkpoints/` and `summary.json` to the work directory. Running the same command again resumes
from the newest checkpoint in `--workdir` (exactly: same data order, RNG and controller states);
`--config.steps` may be raised to extend a finished run. On SIGTERM or Ctrl-C the step in flight
finishes and is checkpointed, and the process exits with status 128 + the signal number (143 for
SIGTERM, 130 for SIGINT), so a scheduler or a shell `&&` does not take the run for finished.

Several processes (hosts): the same command in every process, plus `--coordinator_address`,
`--num_processes` and `--process_id`, or `--distributed` to let JAX read the cluster; inside a
SLURM job with several tasks nothing needs adding (docs/scaling.md: "Several hosts").
"""

import sys

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax import configs, runtime, train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Folder for metrics, checkpoints, TensorBoard and summaries; resumed if set."
)
_cli.define_process_flags()


def main(argv):
    del argv
    # Before any device is touched: joins a multi-process run (flags, SLURM or a TPU slice).
    _cli.join_processes()
    try:
        result = train.train(_CONFIG.value, _WORKDIR.value)
    except train.TrainingInterrupted as stop:
        if runtime.is_primary():
            print(stop, file=sys.stderr)
            print(f"to resume, run the same command again: {_cli.command_line()}", file=sys.stderr)
        sys.exit(128 + stop.signum)
    if runtime.is_primary():
        print(train.describe_outputs(result, _WORKDIR.value))


if __name__ == "__main__":
    _cli.run(main, required=("config", "workdir"), schemas={"": configs.run_schema})
