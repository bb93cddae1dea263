"""The update padded against packed (`grpo.pack_sequences`): real-token throughput, peak memory
and compile count, measured in one run.

Three parts (`--parts`, all by default):

- `dapo`: a DAPO-shaped length workload, a tiny Qwen3 in float32: R = 128 slots as one mini-batch,
  P = 128, M = 512; prompt lengths uniform over [P/10, P]; completion lengths exponential with
  mean M / (4 ln 2) (median M/4), rounded up and capped at M (about 6 % at the cap). One
  `step.minibatch_step` (loss, gradient, AdamW), padded in micro-batches of 16 slots and packed
  in passes of 16 rows, on the same batch; then packed on two more length draws, to count its
  compiles.
- `graded`: whole steps of the graded profile (`experiments/configs/graded.py`) from its stored
  warm start (`results/study_graded/runs/warm_start/model`), padded and packed from the same
  seed: the update's median time over the steps after the first, and the largest relative gap
  between the two runs' first-step metrics (same plan and rollouts).
- `paper`: the paper configs on paper: each update's FLOPs per step (`6 * params * tokens` plus
  attention within each row) padded and packed, under the `dapo` length distribution scaled to
  P = 1024, M = 4096, the rows from packing each mini-batch's 512 slots of sampled lengths with
  the library's packer, in passes of `grpo.micro_batch_slots` rows. (Their memory: a packed pass
  has the activation shapes of a padded micro-batch of as many slots; `python -m
  experiments.plan` prints both plans.)

Run:  python -m benchmarks.packed_update [--parts=dapo,graded,paper] [--repeats=3]
"""

from __future__ import annotations

import argparse
import functools
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.configs import graded, paper_qwen3_1p7b, paper_qwen3_4b, paper_qwen3_8b
from gdro_jax import configs, models, sampling, step, train
from gdro_jax.step import GRPOConfig, Rollouts

REPO = pathlib.Path(__file__).resolve().parent.parent
WARM_START = REPO / "results" / "study_graded" / "runs" / "warm_start" / "model"
SLOTS, WIDTH, MAX_NEW, VOCAB, PASS_ROWS = 128, 128, 512, 1024, 16


def dapo_lengths(rng, num_slots: int, width: int, max_new: int):
    """Prompt lengths uniform over [P/10, P]; completions exponential, median M/4, capped at M."""
    prompt = rng.integers(max(1, width // 10), width + 1, num_slots)
    mean = max_new / (4 * math.log(2))
    completion = np.minimum(max_new, np.ceil(rng.exponential(mean, num_slots))).astype(int)
    return prompt, np.maximum(completion, 1)


def dapo_batch(rng, prompt_lengths, lengths, width, max_new, vocab) -> Rollouts:
    """Rollouts of these lengths: random left-padded prompts and completions, old log-probs
    about -6 (a random policy's), zero rewards."""
    num_slots = len(lengths)
    prompts = rng.integers(1, vocab, (num_slots, width))
    prompts[np.arange(width)[None] < (width - prompt_lengths)[:, None]] = 0
    live = np.arange(max_new)[None] < lengths[:, None]
    tokens = np.where(live, rng.integers(1, vocab, (num_slots, max_new)), 0)
    old = np.where(live, rng.normal(-6.0, 1.0, (num_slots, max_new)), 0.0)
    return Rollouts(
        prompt_tokens=jnp.asarray(prompts, jnp.int32),
        prompt_lengths=jnp.asarray(prompt_lengths, jnp.int32),
        tokens=jnp.asarray(tokens, jnp.int32),
        lengths=jnp.asarray(lengths, jnp.int32),
        logprobs=jnp.asarray(old, jnp.float32),
        rewards=jnp.zeros((num_slots,), jnp.float32),
        correct=jnp.zeros((num_slots,), bool),
        engine_logprobs=jnp.zeros((num_slots, max_new), jnp.float32),
    )


def _seconds(fn, args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def dapo(repeats: int) -> None:
    config = models.DecoderConfig.tiny(
        vocab_size=VOCAB, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=384
    )
    model = models.init_decoder(config, seed=0)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-5)
    opt_state = tx.init(params)
    rng = np.random.default_rng(0)
    prompt_lengths, lengths = dapo_lengths(rng, SLOTS, WIDTH, MAX_NEW)
    batch = dapo_batch(rng, prompt_lengths, lengths, WIDTH, MAX_NEW, VOCAB)
    mask = jnp.arange(MAX_NEW)[None] < batch.lengths[:, None]
    adv = jnp.asarray(rng.normal(size=SLOTS), jnp.float32)
    idx = jnp.arange(SLOTS)
    real = int(np.sum(prompt_lengths + lengths))
    at_cap = float(np.mean(lengths == MAX_NEW))
    print(
        f"dapo: R={SLOTS}, P={WIDTH}, M={MAX_NEW}; prompt median {np.median(prompt_lengths):.0f}, "
        f"completion median {np.median(lengths):.0f}, {100 * at_cap:.1f} % at the cap; "
        f"{real} real tokens of {SLOTS * (WIDTH + MAX_NEW)} padded"
    )
    rows = sampling.pack_completions(
        batch.prompt_tokens, batch.prompt_lengths, batch.tokens, batch.lengths
    ).num_rows_used
    print(f"packed: {int(rows)} rows of {WIDTH + MAX_NEW} in use, passes of {PASS_ROWS} rows")
    print("| update | compile s | s per update | real tokens/s | temp memory MiB | compiles |")
    print("|---|---:|---:|---:|---:|---:|")
    results = {}
    for pack in (False, True):
        grpo = GRPOConfig(num_minibatches=1, micro_batch_slots=PASS_ROWS, pack_sequences=pack)
        update = jax.jit(
            functools.partial(
                step.minibatch_step, graphdef, tx, grpo, weighted_adv_R=adv, ref_params=None
            )
        )

        def call(rollouts, update=update):
            live = jnp.arange(MAX_NEW)[None] < rollouts.lengths[:, None]
            return update((params, opt_state), idx, rollouts=rollouts, mask_RM=live)

        start = time.perf_counter()
        lowered = update.lower((params, opt_state), idx, rollouts=batch, mask_RM=mask)
        compiled = lowered.compile()
        compile_s = time.perf_counter() - start
        temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
        jax.block_until_ready(call(batch))  # the jit's own compile
        seconds = _seconds(call, (batch,), repeats)
        compiles = "1"
        if pack:
            for seed in (1, 2):  # other lengths, the same program
                other = np.random.default_rng(seed)
                jax.block_until_ready(
                    call(
                        dapo_batch(
                            other,
                            *dapo_lengths(other, SLOTS, WIDTH, MAX_NEW),
                            WIDTH,
                            MAX_NEW,
                            VOCAB,
                        )
                    )  # fmt: skip
                )
            compiles = f"{update._cache_size()} over 3 length draws"
        results[pack] = seconds
        name = "packed" if pack else "padded"
        print(
            f"| {name} | {compile_s:.1f} | {seconds:.2f} | {real / seconds:,.0f} | {temp:,.0f} "
            f"| {compiles} |"
        )
    print(f"packed / padded real-token throughput: {results[False] / results[True]:.2f}x")


def graded_profile(steps: int) -> None:
    if not WARM_START.is_dir():
        print(f"graded: skipped, no warm start at {WARM_START.relative_to(REPO)}")
        return
    print(f"graded: {steps} steps of GRPO per layout from {WARM_START.relative_to(REPO)}")
    print("| update | first step s | update s (median after the first) | rollout s |")
    print("|---|---:|---:|---:|")
    firsts, medians = {}, {}
    for pack in (False, True):
        config = graded.get_config()
        config.update(init_from=str(WARM_START), progress=False, tensorboard=False)
        config.grpo.pack_sequences = pack
        run = train.build_run(config)
        state, rows = run.state, []
        for i in range(steps):
            state, metrics, times = train.run_step(run, state, next(run.prompt_batches))
            if i == 0:
                firsts[pack] = {k: np.asarray(v) for k, v in metrics.items()}
            rows.append(times)
        medians[pack] = {k: float(np.median([r[k] for r in rows[1:]])) for k in rows[0]}
        name = "packed" if pack else "padded"
        print(
            f"| {name} | {sum(rows[0].values()):.1f} | {medians[pack]['update']:.3f} | "
            f"{medians[pack]['rollout']:.3f} |"
        )
    gap = max(
        float(np.max(np.abs(firsts[True][k] - v) / np.maximum(np.abs(v), 1e-6)))
        for k, v in firsts[False].items()
        if np.issubdtype(v.dtype, np.floating)
    )
    speedup = medians[False]["update"] / medians[True]["update"]
    print(
        f"update padded / packed: {speedup:.2f}x; "
        f"first-step metrics' largest relative gap {gap:.1e}"
    )


def _update_flops(config: models.DecoderConfig, rows: int, row_tokens: int, tokens: int) -> float:
    """Forward + backward FLOPs: 6 x (non-embedding params + output projection) per token, plus
    the attention scores and weighted sums over whole rows (every key of a row is computed)."""
    c = config
    per_layer = c.d_model * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    per_layer += c.num_heads * c.head_dim * c.d_model + 3 * c.d_model * c.mlp_dim
    dense = c.num_layers * per_layer + c.d_model * c.vocab_size
    attention = c.num_layers * rows * 2 * 2 * row_tokens**2 * c.num_heads * c.head_dim
    return 3 * (2 * dense * tokens + attention)


def paper() -> None:
    print("paper configs, on paper: one update's FLOPs per step (forward + backward)")
    print("| config | R | P + M | padded TFLOP | packed rows | packed TFLOP | padded / packed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for module in (paper_qwen3_1p7b, paper_qwen3_4b, paper_qwen3_8b):
        config = module.get_config()
        architecture = configs.policy_config(config)
        num_slots = config.num_prompts * config.n_mean
        width, max_new = config.math.max_prompt_tokens, config.max_new_tokens
        row = width + max_new
        rng = np.random.default_rng(0)
        prompt, completion = dapo_lengths(rng, num_slots, width, max_new)
        per_minibatch = num_slots // config.grpo.num_minibatches
        grpo = GRPOConfig(micro_batch_slots=config.grpo.micro_batch_slots)
        rows_per_pass = grpo.packed_rows_per_pass(per_minibatch)
        padded = packed = used_rows = 0.0
        for b in range(config.grpo.num_minibatches):
            part = slice(b * per_minibatch, (b + 1) * per_minibatch)
            lengths = jnp.asarray(prompt[part] + completion[part])
            _, _, rows = sampling.pack_layout(lengths, row_length=row, num_rows=per_minibatch)
            passes = -(-int(rows) // rows_per_pass)
            used_rows += passes * rows_per_pass
            padded += _update_flops(architecture, per_minibatch, row, per_minibatch * row)
            packed += _update_flops(
                architecture, passes * rows_per_pass, row, passes * rows_per_pass * row
            )
        print(
            f"| {module.__name__.rsplit('.', 1)[1]} | {num_slots} | {row} | {padded / 1e12:,.0f} | "
            f"{used_rows:.0f} of {num_slots} | {packed / 1e12:,.0f} | {padded / packed:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="dapo,graded,paper")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="graded: steps per layout")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform} x {jax.device_count()}")
    parts = args.parts.split(",")
    if "dapo" in parts:
        dapo(args.repeats)
    if "graded" in parts:
        graded_profile(args.steps)
    if "paper" in parts:
        paper()


if __name__ == "__main__":
    main()
