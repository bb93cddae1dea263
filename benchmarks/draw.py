"""The token draw on its own: `sampling.sample_logits` against `jax.random.categorical`.

A decode step draws one token per slot from [slots, V] logits. On a small model this is a
visible share of the step (V = 4,096 here against D = 256), and at Qwen3's V = 151,936 it reads
0.6 MB of float32 logits per slot for every pass over the vocabulary. Each shape is timed for:

  ours        `sample_logits` at temperature 1 with one key per row (the sampler's form): one
              pass for the maximum, one for the block sums, then the chosen block only
  top-p 0.9   the same with the nucleus filter (a full sort of each row first)
  categorical `jax.random.categorical` with one key per row (Gumbel noise over all of V), the
              library's draw, measured in the same run as the reference

Each is compiled once, then timed alternately; the median of the repeats, in ms per draw.

Run:  python -m benchmarks.draw [--repeats=10] [--out=draw.json]
"""

from __future__ import annotations

import argparse
import functools
import json

import jax

from benchmarks._timing import timed
from gdro_jax.sampling import sample_logits

SHAPES = ((256, 4096), (64, 151_936))


def _draws(shape: tuple[int, int]) -> dict:
    rows, _ = shape
    logits = jax.random.normal(jax.random.key(0), shape) * 3
    keys = jax.random.split(jax.random.key(1), rows)
    return {
        "ours": jax.jit(lambda x, k: sample_logits(x, k, temperature=1.0)),
        "top-p 0.9": jax.jit(
            lambda x, k: sample_logits(x, k, temperature=1.0, top_p=0.9, use_top_p=True)
        ),
        "categorical": jax.jit(jax.vmap(lambda x, k: jax.random.categorical(k, x))),
    }, (logits, keys)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {}
    for shape in SHAPES:
        calls, inputs = _draws(shape)
        timing = timed({n: functools.partial(c, *inputs) for n, c in calls.items()}, args.repeats)
        ms = {name: 1e3 * entry["median_s"] for name, entry in timing.items()}
        results[f"{shape[0]}x{shape[1]}"] = ms
        print(
            f"{shape[0]} rows x V={shape[1]:,}: "
            + ", ".join(f"{name} {value:.2f} ms" for name, value in ms.items())
            + f"; categorical / ours {ms['categorical'] / ms['ours']:.2f}x"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"jax": jax.__version__, "shapes": results}, f, indent=1)


if __name__ == "__main__":
    main()
