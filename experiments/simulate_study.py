"""The simulator beside the real study: does it predict the sign and size of each method's gain?

    python -m experiments.simulate_study --config=experiments/configs/sim_study.py \
        --workdir=runs/sim_study

Fits the simulator to the study's warm start and GRPO gain on the validation split, runs every
method and sets its predicted gains over GRPO beside the measured ones (`sim.simulate_study`).
"""

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax.sim import simulate_study

_CONFIG = config_flags.DEFINE_config_file("config", None, "Simulation config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for the fit, arrays, plots and tables.")

OUTPUTS = {
    "comparison.md": "the simulator's predicted gains beside the measured ones",
    "comparison.json": "the same, with the fit",
}


def main(argv):
    del argv
    simulate_study(_CONFIG.value, _WORKDIR.value)
    print(_cli.wrote(_WORKDIR.value, OUTPUTS))


if __name__ == "__main__":
    _cli.run(main, required=("config", "workdir"), schemas=_cli.SIM_SCHEMAS)
