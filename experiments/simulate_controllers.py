"""Controller-dynamics simulation: every method over many seeds; arrays, plots and a table.

    python -m experiments.simulate_controllers --config=experiments/configs/sim_default.py \
        --workdir=runs/sim_demo [--config.steps=300 --config.prompt_gdro.eta=1.0 ...]
"""

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax.sim import run_experiment

_CONFIG = config_flags.DEFINE_config_file("config", None, "Simulation config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for arrays, plots and the summary.")
OUTPUTS = {
    "summary.txt": "the table above",
    "controller_signals.png": "what each controller saw and decided, per step",
    "q_heatmap.png": "Prompt-GDRO's distribution over bins, per step",
    "arrays.npz": "every method's per-step trace, for notebooks",
}


def main(argv):
    del argv
    run_experiment(_CONFIG.value, _WORKDIR.value)
    print(_cli.wrote(_WORKDIR.value, OUTPUTS))


if __name__ == "__main__":
    _cli.run(main, required=("config", "workdir"), schemas=_cli.SIM_SCHEMAS)
