"""Figures of one training run, from its metrics.jsonl, into the run's plots/ folder.

    python -m experiments.plot_run --workdir=runs/grpo

Draws training.png (reward and accuracy per step), curriculum.png (the batch's prompts per bin,
Prompt-GDRO's q for a method with a prompt adversary, rollouts per prompt in each bin) and, for a
method whose rollouts Rollout-GDRO allocates, shadow_price.png (its shadow price mu). A run still
training is drawn up to its last finished step; run it again to redraw.
"""

from absl import flags

from experiments import _cli
from gdro_jax import plots

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "A training run's folder (its metrics.jsonl and config.json)."
)
WHAT = {
    plots.TRAINING_FIGURE: "reward and accuracy per step",
    plots.CURRICULUM_FIGURE: "the batch's bins and the rollouts they got, over steps",
    plots.SHADOW_PRICE_FIGURE: "Rollout-GDRO's shadow price mu per step",
}


def main(argv):
    del argv
    paths = plots.plot_run(_WORKDIR.value)
    print(_cli.wrote(paths[0].parent, {path.name: WHAT[path.name] for path in paths}))


if __name__ == "__main__":
    _cli.run(main, required=("workdir",))
