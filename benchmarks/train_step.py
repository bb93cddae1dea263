"""Time per RL step on the chain task, split into plan / rollout+reward / update, and the share
of the step spent in the three controllers.

Runs `--steps` steps of each method with `experiments/configs/tiny_cpu.py` (32 prompts x 4
rollouts, 48 new tokens) and reports the median of each phase after the first (compiling) step.
The controllers' share is (plan + the controllers' state transitions) / step: the transitions run
inside the jitted update, so they are timed separately here with the same shapes and jitted alone.

Run:  python -m benchmarks.train_step [--init_from=runs/demo/warm_start/model] [--steps=8]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import tiny_cpu
from gdro_jax import step, train


def _controller_update_seconds(run: train.Run, state: step.TrainState, repeats: int = 50):
    """Median time of the controllers' state transitions alone, jitted, at the run's shapes."""
    num_prompts = run.config.num_prompts
    ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(state.gdro, ids, jax.random.key(0))
    num_correct = jnp.minimum(ids % 3, plan.num_rollouts)
    losses = jnp.linspace(0.0, 1.0, num_prompts)
    update = jax.jit(
        lambda s, p, i, c, ell: run.program.decisions.update(s, p, i, num_correct=c, losses=ell),
        donate_argnums=0,
    )
    gdro_state = jax.tree.map(jnp.copy, state.gdro)
    gdro_state = jax.block_until_ready(update(gdro_state, plan, ids, num_correct, losses))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gdro_state = jax.block_until_ready(update(gdro_state, plan, ids, num_correct, losses))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init_from", default="", help="warm-start HF folder (default: random)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--methods", default="grpo,gdro_both")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, init_from={args.init_from!r}")
    print(
        "| method | compile step s | plan ms | rollout s | reward ms | update s | step s |"
        " controllers ms | controllers share |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for method in args.methods.split(","):
        config = tiny_cpu.get_config()
        config.method = method
        config.init_from = args.init_from
        config.progress = False
        config.tensorboard = False
        run = train.build_run(config)
        state = run.state
        rows = []
        for _ in range(args.steps):
            state, _, times = train.run_step(run, state, next(run.prompt_batches))
            rows.append(times)
        first = sum(rows[0].values())
        median = {name: float(np.median([r[name] for r in rows[1:]])) for name in rows[0]}
        step = sum(median.values())
        controllers = median["plan"] + _controller_update_seconds(run, state)
        print(
            f"| {method} | {first:.1f} | {1e3 * median['plan']:.1f} | "
            f"{median['rollout']:.2f} | {1e3 * median['reward']:.1f} | {median['update']:.2f} | "
            f"{step:.2f} | "
            f"{1e3 * controllers:.2f} | {100 * controllers / step:.2f} % |"
        )


if __name__ == "__main__":
    main()
