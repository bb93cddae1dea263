"""Per-call cost of the host API (`integrations.HostControllers`) against the jitted functions
it wraps.

One step at N prompts from a pool of D (default the DAPO-Math size, 14.1k, N = 256, n_mean 4):
`select_prompts`, `allocate`, `multipliers` (one id per rollout, as an advantage estimator asks)
and `observe` (one prompt id and one reward per rollout), then `to_bytes` and `load_bytes`. The
reference, timed in the same run over the same steps, is the composed decisions' `plan` and
`update` jitted and called directly on device arrays, waited for (`block_until_ready`): what the
host API adds is the numpy conversions, its checks and the copy back to the host.

Run:  python -m benchmarks.host_api [--steps 200] [--pool 14100] [--batch 256]
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from gdro_jax import controllers, runtime
from gdro_jax.integrations import HostControllers

N_MEAN = 4
CALLS = ("select_prompts", "allocate", "multipliers", "observe")


def methods(pool: int) -> dict[str, controllers.MultiAdversary]:
    classifier = controllers.passk_classifier(pool)
    return {
        "prompt_gdro": controllers.multi_adversary(
            classifier, controllers.prompt_gdro(), n_mean=N_MEAN
        ),
        "gdro_both": controllers.multi_adversary(
            classifier,
            controllers.prompt_gdro(),
            controllers.rollout_gdro(n_mean=N_MEAN, reward_values=(0.0, 1.0)),
        ),
        "mopps": controllers.multi_adversary(
            classifier, sampler=controllers.mopps(pool), n_mean=N_MEAN
        ),
    }


def _rewards(rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
    return (rng.random(int(counts.sum())) < 0.4).astype(np.float64)


def time_host(adversary, pool, batch, steps, seed=0) -> dict[str, float]:
    """Median microseconds of each host call over `steps` steps (after 3 warm-up steps)."""
    host = HostControllers(adversary, seed=seed)
    rng = np.random.default_rng(seed)
    times = {name: [] for name in (*CALLS, "to_bytes", "load_bytes")}
    for step in range(steps + 3):
        candidates = rng.choice(pool, batch, replace=False)
        start = time.perf_counter()
        ids = host.select_prompts(candidates)
        t1 = time.perf_counter()
        counts = host.allocate(ids)
        t2 = time.perf_counter()
        host.multipliers(np.repeat(ids, counts))
        t3 = time.perf_counter()
        rows = np.repeat(ids, counts)  # one prompt id per reward, the batch's order
        rewards = _rewards(rng, counts)
        t4 = time.perf_counter()
        host.observe(rows, rewards)
        jax.block_until_ready(host.state)
        t5 = time.perf_counter()
        data = host.to_bytes()
        t6 = time.perf_counter()
        host.load_bytes(data)
        t7 = time.perf_counter()
        if step >= 3:
            for name, seconds in zip(
                times,
                (t1 - start, t2 - t1, t3 - t2, t5 - t4, t6 - t5, t7 - t6),
                strict=True,
            ):
                times[name].append(seconds)
    return {name: 1e6 * float(np.median(values)) for name, values in times.items()}


def time_pure(adversary, pool, batch, steps, seed=0) -> dict[str, float]:
    """Median microseconds of the jitted `plan` and `update` on device arrays."""
    plan_fn, update_fn = jax.jit(adversary.plan), jax.jit(adversary.update)
    state = adversary.init()
    rng = np.random.default_rng(seed)
    base = jax.random.key(seed)
    times = {"plan": [], "update": []}
    for step in range(steps + 3):
        candidates = jnp.asarray(rng.choice(pool, batch, replace=False), jnp.int32)
        key = jax.random.fold_in(base, step)
        jax.block_until_ready((candidates, key))
        start = time.perf_counter()
        plan = jax.block_until_ready(plan_fn(state, candidates, key))
        t1 = time.perf_counter()
        num_correct = jnp.asarray(rng.integers(0, N_MEAN + 1, batch), jnp.int32)
        losses = 1.0 - num_correct / N_MEAN
        jax.block_until_ready((num_correct, losses))
        t2 = time.perf_counter()
        state = jax.block_until_ready(
            update_fn(state, plan, plan.prompt_ids, num_correct=num_correct, losses=losses)
        )
        t3 = time.perf_counter()
        if step >= 3:
            times["plan"].append(t1 - start)
            times["update"].append(t3 - t2)
    return {name: 1e6 * float(np.median(values)) for name, values in times.items()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per method")
    parser.add_argument("--pool", type=int, default=14100, help="D, the prompts tracked")
    parser.add_argument("--batch", type=int, default=256, help="N, the prompts per step")
    args = parser.parse_args(argv)
    print(
        f"jax {jax.__version__}, {platform.machine()}, {jax.devices()[0].platform}; "
        f"D={args.pool}, N={args.batch}, n_mean={N_MEAN}, {args.steps} steps, medians in us"
    )
    print(runtime.environment())
    header = (
        "| method | select_prompts | allocate | multipliers | observe | to_bytes | load_bytes "
        "| jitted plan | jitted update | (select + observe) / (plan + update) |"
    )
    print(header)
    print("|---|" + "---:|" * 9)
    rows = []
    for name, adversary in methods(args.pool).items():
        host = time_host(adversary, args.pool, args.batch, args.steps)
        pure = time_pure(adversary, args.pool, args.batch, args.steps)
        ratio = (host["select_prompts"] + host["observe"]) / (pure["plan"] + pure["update"])
        cells = [host[c] for c in (*CALLS, "to_bytes", "load_bytes")] + [
            pure["plan"],
            pure["update"],
        ]
        print(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {ratio:.2f} |")
        rows.append(dict(method=name, host=host, pure=pure, ratio=ratio))
    return rows


if __name__ == "__main__":
    main()
