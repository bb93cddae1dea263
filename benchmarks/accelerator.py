"""One accelerator chip: the update step's MFU, the sampler's decode throughput against the HBM
roofline, and the prefill-sharing speed-up, on a Qwen3-1.7B-shaped policy with random weights;
decode ms per step against the live length; the built-in engine's two batchings on uneven work,
the packed update on DAPO-shaped lengths and cuDNN against XLA attention (Qwen3-0.6B and 1.7B
shapes).

Run on a machine with one GPU or TPU chip with at least 80 GB of memory and jax with CUDA or TPU
support (the first three sections ran on an H200 in about 4 minutes, BENCHMARKS.md; with the
others, estimated 8-10 minutes, a guess never timed; `--sections=decode,live` runs some):

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.accelerator --out=accelerator.json

(on a GPU jax takes 75 % of the memory by default, 60 GB of an 80 GB part: too little for the
update). `--out` is rewritten after every section (`complete` false until the last), so a run
stopped part-way keeps the figures of the sections it finished; `--budget-s=480` begins no
section 8 minutes after the first began (for a call with a time limit: the rest are reported as
skipped, naming the budget). A section that fails is printed with its traceback and reported as
failed, the others still run, and the run exits 1. On a chip missing from the peak table below,
give its peaks (dense bf16, HBM; here an H100 PCIe):

    python -m benchmarks.accelerator --peak-tflops=756 --peak-hbm-gbs=2000 --out=accelerator.json

CPU smoke run (the same code on a tiny model and tiny shapes, about 30 s of CPU time, mostly
compilation; MFU and the roofline are n/a unless the peaks are given):

    python -m benchmarks.accelerator --shape=tiny [--peak-tflops=1 --peak-hbm-gbs=20]

Without `--shape=tiny` it refuses to run on CPU (one line, exit status 2).

The policy is `experiments/configs/paper_qwen3_1p7b.py`'s: float32 master parameters and AdamW
moments, bfloat16 matmuls and KV cache, the paper's optimizer and GRPO settings (KL 0.001, so the
update also runs the reference policy's forward pass), scanned layers; plus remat, without which
an 80 GB chip would hold about one 1024-token slot per mini-batch (about 12.6 GiB of activations
each, next to some 62 GiB of state, gradients and the update's new state).

  update   the trainer's jitted update (`step.make_update`, state donated) on synthetic
           rollouts: 8 prompts x 4 rollouts = 32 slots of 256 prompt + 768 completion tokens,
           4 optimizer mini-batches of 8 slots (8,192 tokens each).
           MFU = model FLOPs / (median seconds x peak dense bf16 FLOP/s), with
             model FLOPs = (3 + r) x [2 x W x R x T + 4 x L x N x H x T^2 x R]
           where W counts the weights that take part in a matmul per token (q, k, v, o, gate, up,
           down of every layer and the output projection, V x D; norms, biases and the embedding
           lookup are left out), R slots of T = P + M tokens (every position goes through the
           output projection), L layers, N query heads of width H. The bracket is one forward
           pass (2 FLOPs per multiply-add; QK^T and AV over the full T x T score matrix, as the
           model computes it, not halved for the causal mask, as in PaLM's appendix B), the
           backward pass is twice that, and r = 1 adds the reference policy's forward pass when
           the KL coefficient is positive (r = 0 otherwise: 6 x W x tokens + 12 x L x N x H x T^2
           per sequence). Remat's second forward pass of the blocks is not model FLOPs.
  decode   `sampling.generate` on a GRPO batch with its slot map (`prompt_of_slot`): 64 prompts
           x 4 rollouts = 256 slots decoded together, 256-token prompts (prefill shared), 512 new
           tokens each, temperature 1, no stop id. Tokens/s = completion tokens / median wall
           time of the whole call (the shared prefill of 64 x 256 prompt tokens included).
           Roofline fraction = least bytes / peak HBM bandwidth / median seconds, with least
           bytes = sum over the M - 1 decode steps of (every parameter in the compute dtype + the
           keys and values of the P + t cached positions of every slot, 2 x L x K x H elements
           per position), a bound no sampler can beat. Ours moves more: every step reads the
           whole P + M cache (masked) and casts the float32 masters to bfloat16.
  sharing  `generate(..., share_prefill=True)` against `share_prefill=False` on the same 64 x 4
           slots with 512-token prompts and 32 new tokens, where prefill dominates: the ratio of
           median wall times (per-slot / shared).
  live     decode's 256 slots with static batching and decode windows of 128 tokens, no stop id,
           at caps M = 128, 256 and 512: between two caps, the difference of the median wall
           times over the difference of the steps is the cost of one step in that range, at its
           middle live length (the first range carries the prefill); and at M = 512 with one
           window (every step reads the whole P + M cache) against the windows, and with the
           decode loop's stop condition checked once per 8 steps (`stop_check_every=8`: a
           GPU's while loop copies its condition to the host and waits, each iteration).
  engines  Qwen3-0.6B shape, bfloat16, 32 prompts x 8 rollouts: static batching (all 256 slots
           until the longest stops) against continuous batching (64 lanes), completion tokens/s,
           on `benchmarks/rollout_engines.py`'s uneven (64-token prompts, up to 256 new) and long
           tail (up to 1,024) workloads, where a set of stop ids that the near-uniform random
           policy draws with a fixed chance a token makes the lengths geometric, and on one where
           every request runs to its cap of 256; on the first two also continuous batching with
           every ring block read and no per-block conds (`skip_dead_blocks=False`).
  packed   Qwen3-0.6B shape, bfloat16, remat: one optimizer step (`step.minibatch_step`) padded
           against packed, passes of 16 slots or rows, on 128 slots of 256 + 2,048 positions with
           DAPO-shaped lengths (`benchmarks/packed_update.py`), real tokens/s; the packed program
           must compile once over three length draws.
  attention  cuDNN's fused attention against XLA's (GPUs only) on the 1.7B shape in bfloat16:
           the loss, logits and gradients of four left-padded rows of 1,024 tokens, and a packed
           row of two segments finite; the wall time of a forward and backward pass of one
           8,192-token sequence each; and the kernel alone on that sequence, the causal mask
           only against the mask with `is_causal=True` (what the model passes: the kernel skips
           the tiles above the diagonal).
  update_candidates  not in the default run (`--sections=update,update_candidates`, the update
           first as their baseline; about 2-3 minutes more): the update section's work again
           for each of `UPDATE_CANDIDATES`, a policy of its own with some run-config fields
           changed: `model.remat_policy="dots"` (remat keeps the projections' outputs, so the
           backward pass does not redo them) and `grpo.logprob_chunk_tokens=256` (the output
           projection and log-softmax 256 positions at a time, no [B, T, V] float32 logits),
           each with its MFU and the update section's median over its own.

Every call is made once first (compilation; the table's compile seconds are that call's time minus
the median), then `--repeats` times (the two prefill variants alternately), each waited for with
`jax.block_until_ready`; the table gives medians. Memory, from XLA's buffer assignment of the
same programs compiled for CPU: about 73 GiB for the update, at most 42 GiB for the sampler. A
section that runs out of device memory is reported as skipped and the others still run. Peaks
(dense bf16 FLOP/s, HBM bytes/s) by `jax.devices()[0].device_kind`: H100 SXM 989e12 / 3.35e12,
H200 989e12 / 4.8e12, A100 312e12 / 2.0e12 (80 GB), TPU v4 275e12 / 1.2e12, v5e 197e12 /
0.82e12, v5p 459e12 / 2.76e12, v6e 918e12 / 1.64e12; `--peak-tflops` / `--peak-hbm-gbs` replace
them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx

from benchmarks import packed_update
from benchmarks._timing import timed
from experiments.configs import paper_qwen3
from gdro_jax import configs, models, sampling, step
from gdro_jax.sampling import generate

_SHAPE = flags.DEFINE_enum(
    "shape", "qwen3_1p7b", ["qwen3_1p7b", "tiny"], "Model and work sizes (tiny: CPU smoke run)."
)
_OUT = flags.DEFINE_string("out", None, "Also write the figures to this JSON file.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per measurement (medians reported).")
_PEAK_TFLOPS = flags.DEFINE_float(
    "peak-tflops", None, "The chip's peak dense bf16 TFLOP/s (default: the table by device kind)."
)
_PEAK_HBM_GBS = flags.DEFINE_float(
    "peak-hbm-gbs", None, "The chip's peak HBM bandwidth in GB/s (default: the table)."
)
_SECTIONS = flags.DEFINE_list(
    "sections",
    None,
    "The measurements to run, in this order (default: all but update_candidates): decode, "
    "prefill_sharing, live, engines, packed, attention, update, update_candidates.",
)
_BUDGET_S = flags.DEFINE_float(
    "budget-s",
    None,
    "Begin no section this many seconds after the first began (default: no limit); the rest "
    "are reported as skipped. --out is rewritten after every section.",
)

DATASET_PROMPTS = 14048  # the classifier tracks a DAPO-Math-sized pool (dapo_math_en)
_MATMUL_WEIGHTS = ("q", "k", "v", "o", "gate", "up", "down")

# device_kind fragments (lower case, all must appear) -> (peak dense bf16 FLOP/s, HBM bytes/s);
# the first match wins. None: not in the table, give the flag.
_CHIP_PEAKS = (
    (("h200",), 989e12, 4.8e12),
    (("h100", "pcie"), None, None),  # not the SXM part
    (("h100", "nvl"), None, None),
    (("h100",), 989e12, 3.35e12),  # SXM: "NVIDIA H100 80GB HBM3"
    (("a100", "80gb"), 312e12, 2.0e12),
    (("a100",), 312e12, None),  # 40 GB parts: bandwidth not in the table
    (("tpu v5 lite",), 197e12, 0.82e12),  # v5e
    (("tpu v5e",), 197e12, 0.82e12),
    (("tpu v5",), 459e12, 2.76e12),  # v5p reports "TPU v5"
    (("tpu v6 lite",), 918e12, 1.64e12),  # v6e
    (("tpu v6e",), 918e12, 1.64e12),
    (("tpu v4",), 275e12, 1.2e12),
)


class Work(NamedTuple):
    """One GRPO-shaped batch: `prompts x rollouts` slots, full-length prompts and completions."""

    prompts: int  # N distinct prompts
    rollouts: int  # slots per prompt (the group size)
    prompt_len: int  # P
    new_tokens: int  # M


class Engines(NamedTuple):
    """The built-in engine's two batchings on GRPO-shaped requests whose lengths vary."""

    model: models.DecoderConfig  # bfloat16 parameters and compute
    prompts: int
    rollouts: int
    lanes: int  # continuous batching's decode slots (static: all slots at once)
    # name -> (prompt tokens, new tokens, per-token stop probability of a near-uniform policy)
    workloads: dict[str, tuple[int, int, float]]


class Packed(NamedTuple):
    """The update packed against padded on DAPO-shaped lengths."""

    model: models.DecoderConfig  # bfloat16 parameters and compute, remat
    slots: int
    prompt_len: int  # P: prompts uniform over [P / 10, P]
    new_tokens: int  # M: completions exponential with median M / 4, capped at M
    pass_rows: int  # rows (packed) or slots (padded) per forward-backward pass


class Attention(NamedTuple):
    """cuDNN's fused attention against XLA's on the shape's model (GPUs only)."""

    agree_len: int  # T of the agreement check (left padding, then packed segments)
    time_len: int  # T of the timed forward and backward pass (one sequence)


class Shape(NamedTuple):
    model: models.DecoderConfig  # architecture; the dtypes come from the paper config
    update: Work
    minibatches: int  # optimizer mini-batches per update
    decode: Work
    sharing: Work
    live_caps: tuple[int, ...]  # decode caps M of the live-length section, on decode's slots
    engines: Engines
    packed: Packed
    attention: Attention


# The engines benchmark's workloads (benchmarks/rollout_engines.py) and one where every request
# runs to the cap.
_UNEVEN = 1 - 0.05 ** (1 / 256)  # about 5 % of the completions reach 256 tokens
_LONG_TAIL = 1 - 0.5 ** (1 / 128)  # median about 128 of 1,024
_BF16 = dict(param_dtype="bfloat16", compute_dtype="bfloat16")


SHAPES = {
    "qwen3_1p7b": Shape(
        model=models.DecoderConfig.qwen3_1p7b(remat=True),
        update=Work(prompts=8, rollouts=4, prompt_len=256, new_tokens=768),
        minibatches=4,
        decode=Work(prompts=64, rollouts=4, prompt_len=256, new_tokens=512),
        sharing=Work(prompts=64, rollouts=4, prompt_len=512, new_tokens=32),
        live_caps=(128, 256, 512),
        engines=Engines(
            model=models.DecoderConfig.qwen3_0p6b(**_BF16),
            prompts=32,
            rollouts=8,
            lanes=64,
            workloads=dict(
                uneven=(64, 256, _UNEVEN), long_tail=(64, 1024, _LONG_TAIL), at_cap=(64, 256, 0.0)
            ),
        ),
        packed=Packed(
            model=models.DecoderConfig.qwen3_0p6b(remat=True, **_BF16),
            slots=128,
            prompt_len=256,
            new_tokens=2048,
            pass_rows=16,
        ),
        attention=Attention(agree_len=1024, time_len=8192),
    ),
    "tiny": Shape(
        model=models.DecoderConfig.tiny(remat=True),
        update=Work(prompts=4, rollouts=4, prompt_len=16, new_tokens=16),
        minibatches=2,
        decode=Work(prompts=8, rollouts=4, prompt_len=16, new_tokens=32),
        sharing=Work(prompts=8, rollouts=4, prompt_len=64, new_tokens=4),
        live_caps=(8, 16, 32),
        engines=Engines(
            model=models.DecoderConfig.tiny(**_BF16),
            prompts=4,
            rollouts=4,
            lanes=8,
            workloads=dict(
                uneven=(8, 32, 1 - 0.05 ** (1 / 32)),
                long_tail=(8, 64, 1 - 0.5 ** (1 / 16)),
                at_cap=(8, 32, 0.0),
            ),
        ),
        packed=Packed(
            model=models.DecoderConfig.tiny(remat=True, **_BF16),
            slots=16,
            prompt_len=16,
            new_tokens=64,
            pass_rows=4,
        ),
        attention=Attention(agree_len=32, time_len=64),
    ),
}
SECTIONS = ("decode", "prefill_sharing", "live", "engines", "packed", "attention", "update")
# The update's MFU candidates (issue 46): the `update` section again, each with some run-config
# fields changed. Asked for by name (`--sections=update,update_candidates`): with the default
# sections it would pass the 8 minutes one chip's run should take.
UPDATE_CANDIDATES = {
    "remat_dots": {"model.remat_policy": "dots"},  # keep the projections' outputs
    "logits_chunk_256": {"grpo.logprob_chunk_tokens": 256},  # [B, 256, V] logits at a time
}
ALL_SECTIONS = (*SECTIONS, "update_candidates")
# The engines section's workloads also timed with continuous batching reading every ring block,
# no per-block `lax.cond` (`skip_dead_blocks=False`): on a GPU each cond's predicate is copied to
# the host and waited for, one per block and layer a step, unless XLA's command buffers take it.
ALL_BLOCKS_WORKLOADS = ("uneven", "long_tail")
# The live section's largest cap again with the decode loop's stop condition checked once per
# this many steps (issue 46: on a GPU a while loop's condition is copied to the host and waited
# for at every iteration).
LIVE_STOP_CHECK_EVERY = 8


def chip_peaks(device_kind: str) -> tuple[float | None, float | None]:
    """(peak dense bf16 FLOP/s, peak HBM bytes/s) of a `device_kind`; None where unknown."""
    kind = device_kind.lower()
    for fragments, flops, hbm in _CHIP_PEAKS:
        if all(fragment in kind for fragment in fragments):
            return flops, hbm
    return None, None


def run_config(shape: Shape) -> ml_collections.ConfigDict:
    """The paper's 1.7B run config with this shape's architecture and update batch."""
    config = paper_qwen3.paper_config("1p7b")
    dtypes = dict(param_dtype=config.model.param_dtype, compute_dtype=config.model.compute_dtype)
    config.model = ml_collections.ConfigDict(dataclasses.asdict(shape.model.replace(**dtypes)))
    config.num_prompts = shape.update.prompts
    config.n_mean = shape.update.rollouts
    config.max_new_tokens = shape.update.new_tokens
    config.grpo.num_minibatches = shape.minibatches
    config.mesh.update(data=1, fsdp=1, tensor=1)  # one chip
    config.task_kind = "chain"  # synthetic rollouts stand in for the math task's (no tokenizer)
    return config


def matmul_weight_count(model: models.Decoder) -> int:
    """W: weights used in a matmul per token (layer projections and the output projection)."""
    layers = sum(getattr(model.layers, name)[...].size for name in _MATMUL_WEIGHTS)
    head = model.embed if model.config.tie_embeddings else model.lm_head
    return int(layers + head[...].size)


def update_model_flops(
    config: models.DecoderConfig, matmul_weights: int, *, slots: int, seq_len: int, reference: bool
) -> int:
    """Model FLOPs of one update over `slots` sequences of `seq_len` tokens (module docstring)."""
    c = config
    forward = 2 * matmul_weights * slots * seq_len
    forward += 4 * c.num_layers * c.num_heads * c.head_dim * seq_len**2 * slots
    return (3 + int(reference)) * forward


def decode_least_bytes(
    config: models.DecoderConfig, param_count: int, *, slots: int, prompt_len: int, new_tokens: int
) -> int:
    """Least HBM bytes read by the M - 1 decode steps of one `generate` call (module docstring)."""
    c = config
    itemsize = np.dtype(c.compute_dtype).itemsize
    steps = new_tokens - 1
    positions = steps * prompt_len + steps * (steps + 1) // 2  # sum of P + t over t = 1 .. M - 1
    per_position = 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize
    return steps * param_count * itemsize + slots * positions * per_position


def _prompts(work: Work, vocab_size: int, seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Random full-length prompts [N, P], their lengths [N] and the slot map [R] on the device."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, (work.prompts, work.prompt_len), dtype=np.int32)
    lengths = np.full(work.prompts, work.prompt_len, np.int32)
    slots = np.repeat(np.arange(work.prompts, dtype=np.int32), work.rollouts)
    return jax.device_put((tokens, lengths, slots), jax.devices()[0])


def bench_update(
    config: ml_collections.ConfigDict,
    model: models.Decoder,
    shape: Shape,
    *,
    matmul_weights: int,
    repeats: int,
    peak_flops: float | None,
) -> dict:
    """The trainer's jitted update on synthetic rollouts. Donates (deletes) `model`'s parameters."""
    work, c = shape.update, model.config
    settings = configs.read_run_config(config, num_devices=1)
    grpo = settings.grpo
    tx = configs.make_optimizer(settings.optimizer)
    gdro = configs.build_controllers(settings.config, DATASET_PROMPTS)
    reference = grpo.kl_coef > 0
    graphdef, state = step.init_train_state(model, tx, gdro, seed=0, with_reference=reference)
    update_fn = step.make_update(
        graphdef,
        tx,
        gdro,
        grpo,
        num_prompts=work.prompts,
    )
    update = jax.jit(update_fn, donate_argnums=0)  # as build_run jits it, without a mesh
    prompts_NP, lengths_N, _ = _prompts(work, c.vocab_size, seed=0)
    prompt_ids_N = jnp.arange(work.prompts, dtype=jnp.int32)
    plan = jax.jit(gdro.plan)(state.gdro, prompt_ids_N, jax.random.key(1))
    slots = int(plan.prompt_of_slot.shape[0])
    rng = np.random.default_rng(1)
    rewards_R = rng.choice(np.array([-1.0, 1.0], np.float32), slots)
    rollouts = step.Rollouts(
        prompt_tokens=prompts_NP[plan.prompt_of_slot],
        prompt_lengths=lengths_N[plan.prompt_of_slot],
        tokens=rng.integers(1, c.vocab_size, (slots, work.new_tokens), dtype=np.int32),
        lengths=np.full(slots, work.new_tokens, np.int32),
        # About a random policy's log-prob of a token, so the importance ratios stay near 1.
        logprobs=np.full((slots, work.new_tokens), -math.log(c.vocab_size), np.float32),
        rewards=rewards_R,
        correct=rewards_R > 0,
        engine_logprobs=np.full((slots, work.new_tokens), -math.log(c.vocab_size), np.float32),
    )
    rollouts = jax.device_put(rollouts, jax.devices()[0])
    carry = [state]

    def update_step():
        carry[0], metrics = update(carry[0], plan, prompt_ids_N, rollouts)
        return carry[0], metrics

    timing = timed({"update": update_step}, repeats)["update"]
    seq_len = work.prompt_len + work.new_tokens
    flops = update_model_flops(c, matmul_weights, slots=slots, seq_len=seq_len, reference=reference)
    flops_per_s = flops / timing["median_s"]
    return dict(
        timing,
        slots=slots,
        minibatches=shape.minibatches,
        prompt_len=work.prompt_len,
        new_tokens=work.new_tokens,
        tokens=slots * seq_len,
        reference_forward=reference,
        remat_policy=c.remat_policy if c.remat else None,
        logprob_chunk_tokens=grpo.logprob_chunk_tokens,
        model_flops=flops,
        flops_per_s=flops_per_s,
        mfu=None if peak_flops is None else flops_per_s / peak_flops,
    )


def bench_update_candidates(
    config: ml_collections.ConfigDict,
    shape: Shape,
    *,
    repeats: int,
    peak_flops: float | None,
) -> dict:
    """`bench_update` once per `UPDATE_CANDIDATES` entry, on a policy of its own (the same seed),
    the run config's fields changed as the entry says; one out of device memory is reported as
    skipped, one that fails as failed (and the section with it), and the others still run."""
    results = {}
    for name, overrides in UPDATE_CANDIDATES.items():
        candidate = config.copy_and_resolve_references()
        candidate.update_from_flattened_dict(overrides)

        def run(candidate=candidate):
            model = models.init_decoder(
                models.DecoderConfig.from_dict(candidate.model.to_dict()), seed=candidate.seed
            )
            return bench_update(
                candidate,
                model,
                shape,
                matmul_weights=matmul_weight_count(model),
                repeats=repeats,
                peak_flops=peak_flops,
            )

        print(f"update_candidates: {name}: compiling, then {repeats} timed calls", file=sys.stderr)
        results[name] = dict(_section(run), overrides=overrides)
    failed = any(row.get("failed") for row in results.values())
    return dict(candidates=results, failed=True) if failed else dict(candidates=results)


def bench_decode(
    model: models.Decoder,
    work: Work,
    *,
    param_count: int,
    repeats: int,
    peak_hbm: float | None,
) -> dict:
    """Completion tokens/s of `generate` on a GRPO batch, and its fraction of the HBM roofline."""
    tokens_NP, lengths_N, slot_map_R = _prompts(work, model.config.vocab_size, seed=2)
    key = jax.random.key(0)
    last = []

    def call():
        result = generate(
            model,
            tokens_NP,
            prompt_lengths=lengths_N,
            prompt_of_slot=slot_map_R,
            key=key,
            max_new_tokens=work.new_tokens,
            temperature=1.0,
        )
        last[:] = [result.lengths]
        return result

    timing = timed({"decode": call}, repeats)["decode"]
    generated = int(jnp.sum(last[0]))  # no stop id: every slot runs to M tokens
    slots = int(slot_map_R.shape[0])
    least_bytes = decode_least_bytes(
        model.config,
        param_count,
        slots=slots,
        prompt_len=work.prompt_len,
        new_tokens=work.new_tokens,
    )
    fraction = None
    if peak_hbm is not None:
        fraction = least_bytes / peak_hbm / timing["median_s"]
    return dict(
        timing,
        slots=slots,
        prompt_len=work.prompt_len,
        new_tokens=work.new_tokens,
        tokens=generated,
        tokens_per_s=generated / timing["median_s"],
        least_bytes=least_bytes,
        roofline_fraction=fraction,
    )


def bench_prefill_sharing(model: models.Decoder, work: Work, *, repeats: int) -> dict:
    """Wall time of `generate` with the prefill shared per prompt against prefilled per slot."""
    tokens_NP, lengths_N, slot_map_R = _prompts(work, model.config.vocab_size, seed=3)
    key = jax.random.key(0)

    def call(share: bool):
        return generate(
            model,
            tokens_NP,
            prompt_lengths=lengths_N,
            prompt_of_slot=slot_map_R,
            key=key,
            max_new_tokens=work.new_tokens,
            share_prefill=share,
        )

    timing = timed(dict(shared=lambda: call(True), per_slot=lambda: call(False)), repeats)
    return dict(
        slots=int(slot_map_R.shape[0]),
        prompts=work.prompts,
        prompt_len=work.prompt_len,
        new_tokens=work.new_tokens,
        shared=timing["shared"],
        per_slot=timing["per_slot"],
        speedup=timing["per_slot"]["median_s"] / timing["shared"]["median_s"],
    )


def bench_live(model: models.Decoder, work: Work, caps: tuple[int, ...], *, repeats: int) -> dict:
    """Decode ms per step against the live length: static batching with decode windows of
    `caps[0]` tokens (`sampling.window_ends`), no stop id, at each cap of `caps`. Between two
    caps the wall times' difference over the steps' difference is the cost of a step in that
    range (the prefill and the program's fixed cost cancel), at the range's middle live length.
    The largest cap also runs with one window (every step reads the whole P + M cache), the
    sampler before windows, and with the loop's stop condition checked once per
    `LIVE_STOP_CHECK_EVERY` steps instead of every step (`generate`'s `stop_check_every`)."""
    tokens_NP, lengths_N, slot_map_R = _prompts(work, model.config.vocab_size, seed=4)
    key = jax.random.key(0)

    def call(cap: int, window: int = 0, stop_check_every: int = 1):
        return lambda: generate(
            model,
            tokens_NP,
            prompt_lengths=lengths_N,
            prompt_of_slot=slot_map_R,
            key=key,
            max_new_tokens=cap,
            batching="static",
            decode_window=window,
            stop_check_every=stop_check_every,
        )

    calls = {f"cap_{cap}": call(cap, window=caps[0]) for cap in caps}
    calls["one_window"] = call(caps[-1], window=caps[-1])
    checks = f"checks_every_{LIVE_STOP_CHECK_EVERY}"
    calls[checks] = call(caps[-1], window=caps[0], stop_check_every=LIVE_STOP_CHECK_EVERY)
    timing = timed(calls, repeats)
    ranges = []
    for low, high in zip((0, *caps), caps, strict=False):
        seconds = timing[f"cap_{high}"]["median_s"] - (
            timing[f"cap_{low}"]["median_s"] if low else 0
        )
        ranges.append(
            dict(
                steps=(low, high),
                live_len=work.prompt_len + (low + high) / 2,
                ms_per_step=1e3 * seconds / (high - low),  # the first range includes the prefill
            )
        )
    full, windowed = timing["one_window"]["median_s"], timing[f"cap_{caps[-1]}"]["median_s"]
    return dict(
        slots=int(slot_map_R.shape[0]),
        prompt_len=work.prompt_len,
        caps=list(caps),
        windows=list(sampling.window_ends(caps[-1], caps[0])),
        timing=timing,
        ranges=ranges,
        one_window_over_windows=full / windowed,
        stop_check_every=LIVE_STOP_CHECK_EVERY,
        checks_speedup=windowed / timing[checks]["median_s"],
    )


def _stop_ids(probability: float, vocab_size: int) -> tuple[int, ...]:
    """Stop ids that a near-uniform random policy draws with about `probability` per token."""
    return tuple(range(1, 1 + round(probability * vocab_size)))


def bench_engines(engines: Engines, *, repeats: int) -> dict:
    """Completion tokens/s of static batching (all slots until the longest stops) against
    continuous batching (`lanes` decode slots taking the requests from a queue) per workload;
    on `ALL_BLOCKS_WORKLOADS` also continuous batching reading every ring block, with no
    per-block conds (`skip_dead_blocks=False`)."""
    model = models.init_decoder(engines.model, seed=0)
    vocab = engines.model.vocab_size
    results = {}
    for name, (prompt_len, new_tokens, stop) in engines.workloads.items():
        work = Work(engines.prompts, engines.rollouts, prompt_len, new_tokens)
        tokens_NP, lengths_N, slot_map_R = _prompts(work, vocab, seed=5)
        key, last = jax.random.key(0), {}

        def call(form, batching, lanes, skip=True, new_tokens=new_tokens, stop=stop, **prompts):
            def run():
                result = generate(
                    model,
                    **prompts,
                    key=key,
                    max_new_tokens=new_tokens,
                    temperature=1.0,
                    eos_ids=_stop_ids(stop, vocab),
                    batching=batching,
                    micro_batch_slots=lanes,
                    skip_dead_blocks=skip,
                )
                last[form] = result.lengths
                return result

            return run

        prompts = dict(prompt_tokens=tokens_NP, prompt_lengths=lengths_N, prompt_of_slot=slot_map_R)
        calls = dict(
            static=call("static", "static", None, **prompts),
            continuous=call("continuous", "continuous", engines.lanes, **prompts),
        )
        if name in ALL_BLOCKS_WORKLOADS:
            calls["continuous_all_blocks"] = call(
                "continuous_all_blocks", "continuous", engines.lanes, skip=False, **prompts
            )
        timing = timed(calls, repeats)
        row = dict(prompt_len=prompt_len, new_tokens=new_tokens, stop_probability=stop)
        for form, seconds in timing.items():
            lengths = np.asarray(last[form])
            row[form] = dict(
                seconds,
                tokens=int(lengths.sum()),
                median_length=float(np.median(lengths)),
                at_cap_fraction=float(np.mean(lengths == new_tokens)),
                tokens_per_s=float(lengths.sum()) / seconds["median_s"],
            )
        row["continuous_over_static"] = (
            row["continuous"]["tokens_per_s"] / row["static"]["tokens_per_s"]
        )
        if "continuous_all_blocks" in row:
            row["all_blocks_over_skipping"] = (
                row["continuous_all_blocks"]["tokens_per_s"] / row["continuous"]["tokens_per_s"]
            )
        results[name] = row
    return dict(
        slots=engines.prompts * engines.rollouts,
        prompts=engines.prompts,
        lanes=engines.lanes,
        workloads=results,
    )


def bench_packed(packed: Packed, *, repeats: int) -> dict:
    """Real tokens/s of one optimizer step (`step.minibatch_step`) packed against padded, on one
    batch of DAPO-shaped lengths (`benchmarks.packed_update.dapo_lengths`); the packed program
    is checked to compile once over two other length draws."""
    model = models.init_decoder(packed.model, seed=0)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-6)
    opt_state = tx.init(params)
    rng = np.random.default_rng(6)
    P, M, V = packed.prompt_len, packed.new_tokens, packed.model.vocab_size
    prompt_lengths, lengths = packed_update.dapo_lengths(rng, packed.slots, P, M)
    batch = jax.device_put(packed_update.dapo_batch(rng, prompt_lengths, lengths, P, M, V))
    advantages = jnp.asarray(rng.normal(size=packed.slots), jnp.float32)
    slot_index = jnp.arange(packed.slots)
    real = int(np.sum(prompt_lengths + lengths))
    updates, compiles = {}, {}
    for form in ("padded", "packed"):
        grpo = step.GRPOConfig(
            num_minibatches=1, micro_batch_slots=packed.pass_rows, pack_sequences=form == "packed"
        )
        update = jax.jit(
            functools.partial(
                step.minibatch_step, graphdef, tx, grpo, weighted_adv_R=advantages, ref_params=None
            )
        )
        updates[form] = update

    def call(form: str, rollouts=batch):
        mask = jnp.arange(M)[None] < rollouts.lengths[:, None]
        return updates[form]((params, opt_state), slot_index, rollouts=rollouts, mask_RM=mask)

    timing = timed(dict(padded=lambda: call("padded"), packed=lambda: call("packed")), repeats)
    for seed in (7, 8):  # other lengths, the same packed program
        other = np.random.default_rng(seed)
        draw = packed_update.dapo_lengths(other, packed.slots, P, M)
        jax.block_until_ready(call("packed", packed_update.dapo_batch(other, *draw, P, M, V)))
    compiles = updates["packed"]._cache_size()
    rows = sampling.pack_completions(
        batch.prompt_tokens, batch.prompt_lengths, batch.tokens, batch.lengths
    ).num_rows_used
    result = dict(
        slots=packed.slots,
        prompt_len=P,
        new_tokens=M,
        pass_rows=packed.pass_rows,
        real_tokens=real,
        padded_tokens=packed.slots * (P + M),
        packed_rows=int(rows),
        packed_compiles=int(compiles),
    )
    for form, seconds in timing.items():
        result[form] = dict(seconds, real_tokens_per_s=real / seconds["median_s"])
    result["speedup"] = timing["padded"]["median_s"] / timing["packed"]["median_s"]
    return result


def _attention_inputs(c: models.DecoderConfig, batch: int, seq_len: int, seed: int):
    """Random tokens, left-padded rows (row b has b x T / (2B) pads) and their positions."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, c.vocab_size, (batch, seq_len), dtype=np.int32)
    pads = np.arange(batch) * seq_len // (2 * batch)
    mask = np.arange(seq_len)[None] >= pads[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return jnp.asarray(np.where(mask, tokens, 0)), jnp.asarray(positions), jnp.asarray(mask)


def bench_attention(config: models.DecoderConfig, attention: Attention, *, repeats: int) -> dict:
    """cuDNN's fused attention against XLA's on the same weights: the loss (mean next-token
    log-likelihood of left-padded rows), the logits and the gradients, then a packed row's
    hidden states (two segments) finite; and the wall time of a forward and backward pass of one
    `time_len`-token sequence with each."""
    platform = jax.devices()[0].platform
    if platform != "gpu":
        return dict(skipped=f"cuDNN attention needs a GPU (platform {platform})")
    c = config.replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    pair = {
        name: models.init_decoder(c.replace(attention=name), seed=0) for name in ("xla", "cudnn")
    }
    tokens, positions, mask = _attention_inputs(c, 4, attention.agree_len, seed=9)

    def loss(model, tokens, positions, mask):
        logits = model(tokens, positions, mask)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        real = mask[:, 1:] & mask[:, :-1]
        return -jnp.sum(picked * real) / jnp.sum(real), logits

    grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))
    out = {name: grad(model, tokens, positions, mask) for name, model in pair.items()}
    (loss_x, logits_x), grads_x = out["xla"]
    (loss_c, logits_c), grads_c = out["cudnn"]
    real = np.asarray(mask)
    logits_x, logits_c = np.asarray(logits_x)[real], np.asarray(logits_c)[real]
    grad_rel = max(
        float(jnp.linalg.norm((a - b).astype(jnp.float32)) / jnp.linalg.norm(a.astype(jnp.float32)))
        for a, b in zip(jax.tree.leaves(grads_x), jax.tree.leaves(grads_c), strict=True)
    )
    half = attention.agree_len // 2  # one packed row of two segments
    segments = jnp.asarray(np.repeat([[1, 2]], half, axis=1).reshape(1, -1))
    row_positions = jnp.asarray(np.tile(np.arange(half), 2)[None], jnp.int32)
    packed_finite = bool(
        jnp.all(
            jnp.isfinite(
                nnx.jit(
                    lambda m: m.hidden_states(tokens[:1], row_positions, segment_ids_BT=segments)
                )(pair["cudnn"])
            )
        )
    )
    long_tokens, long_positions, _ = _attention_inputs(c, 1, attention.time_len, seed=10)
    step_fn = nnx.jit(
        nnx.value_and_grad(
            lambda m: jnp.mean(
                m.hidden_states(long_tokens, long_positions).astype(jnp.float32) ** 2
            )
        )
    )
    timing = timed({name: (lambda m=model: step_fn(m)) for name, model in pair.items()}, repeats)
    kernel = _causal_kernel(c, attention.time_len, repeats=repeats)
    return dict(
        agree_len=attention.agree_len,
        time_len=attention.time_len,
        loss_relative=abs(float(loss_c) - float(loss_x)) / abs(float(loss_x)),
        logits_of_max=float(np.max(np.abs(logits_c - logits_x)) / np.max(np.abs(logits_x))),
        gradients_relative=grad_rel,
        finite=bool(np.all(np.isfinite(logits_c))) and packed_finite,
        xla=timing["xla"],
        cudnn=timing["cudnn"],
        speedup=timing["xla"]["median_s"] / timing["cudnn"]["median_s"],
        kernel=kernel,
    )


def _causal_kernel(c: models.DecoderConfig, seq_len: int, *, repeats: int) -> dict:
    """cuDNN's kernel alone (`models.fused_attention`, the model's cuDNN call), forward and
    backward on one `seq_len`-token sequence with the model's heads and a causal mask: the mask
    only against the mask with `is_causal=True` (what the model passes), which lets the kernel
    skip the tiles above the diagonal; and how far apart their outputs are (the same values, up
    to the kernel's rounding)."""
    rng = np.random.default_rng(11)
    dtype = jnp.dtype(c.compute_dtype)
    q, k, v = (
        jnp.asarray(rng.standard_normal((1, seq_len, heads, c.head_dim)), dtype)
        for heads in (c.num_heads, c.num_kv_heads, c.num_kv_heads)
    )
    allowed = jnp.tril(jnp.ones((1, seq_len, seq_len), bool))

    def grad_fn(causal):
        def loss(q, k, v):
            out = models.fused_attention(q, k, v, allowed, causal=causal)
            return jnp.sum(out.astype(jnp.float32) ** 2), out

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

    fns = {"mask_only": grad_fn(False), "mask_and_causal": grad_fn(True)}
    outputs = {name: fn(q, k, v)[0][1].astype(jnp.float32) for name, fn in fns.items()}
    timing = timed({name: (lambda fn=fn: fn(q, k, v)) for name, fn in fns.items()}, repeats)
    gap = jnp.max(jnp.abs(outputs["mask_only"] - outputs["mask_and_causal"]))
    return dict(
        seq_len=seq_len,
        mask_only=timing["mask_only"],
        mask_and_causal=timing["mask_and_causal"],
        speedup=timing["mask_only"]["median_s"] / timing["mask_and_causal"]["median_s"],
        max_abs_difference=float(gap),
    )


def _section(bench: Callable[[], dict]) -> dict:
    """Runs one measurement. Out of device memory, it is reported as skipped; any other error is
    printed with its traceback and reported as failed (`failed` true), so that one section's bug
    costs a chip session that section's figures only."""
    try:
        return bench()
    except Exception as error:  # noqa: BLE001 (reported, and the run exits 1 at its end)
        first_line = (str(error).splitlines() or [""])[0][:300]
        if isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error):
            return dict(skipped=f"out of memory: {first_line}")
        traceback.print_exc()
        return dict(skipped=f"failed: {type(error).__name__}: {first_line}", failed=True)


def write_report(report: dict, out: str) -> None:
    """Writes `report` to `out` as JSON, whole or not at all (a temporary file, then a rename)."""
    partial = f"{out}.partial"
    with open(partial, "w") as file:
        json.dump(report, file, indent=2)
    os.replace(partial, out)


def run_sections(
    runs: dict[str, Callable[[], dict]],
    sections: tuple[str, ...],
    report: dict,
    *,
    repeats: int,
    out: str | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Runs the asked `sections` in `ALL_SECTIONS`' order into `report`; returns those that failed.

    After every section the report so far goes to `out` (`complete` false until the last), so a
    run killed part-way, by a time limit or a crash, leaves the figures of the sections it
    finished. A section is begun only within `budget_s` seconds of the first one's start; the
    others are reported as skipped, naming the budget. `section_seconds` holds each section's
    wall time, compilation included.
    """
    start, failed = clock(), []
    report["complete"] = False
    report["section_seconds"] = {}
    for name in ALL_SECTIONS:
        elapsed = clock() - start
        if name not in sections:
            report[name] = dict(skipped="not asked")
        elif budget_s is not None and elapsed >= budget_s:
            report[name] = dict(
                skipped=f"not begun: {elapsed:.0f} s had passed, --budget-s={budget_s:g}"
            )
        else:
            print(f"{name}: compiling, then {repeats} timed calls", file=sys.stderr, flush=True)
            report[name] = _section(runs[name])
            seconds = report["section_seconds"][name] = clock() - start - elapsed
            print(f"{name}: {seconds:.0f} s", file=sys.stderr, flush=True)
            if report[name].get("failed"):
                failed.append(name)
        if out and name in sections:
            write_report(report, out)
    report["complete"] = True
    if out:
        write_report(report, out)
    return failed


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _peaks(device_kind: str) -> tuple[float | None, float | None, str]:
    """The chip's peaks (the flags where given, else the table) and where each came from."""
    table_flops, table_hbm = chip_peaks(device_kind)
    peaks, sources = [], []
    for holder, table, unit in ((_PEAK_TFLOPS, table_flops, 1e12), (_PEAK_HBM_GBS, table_hbm, 1e9)):
        if holder.value is None:
            peaks.append(table)
            sources.append(f"n/a: give --{holder.name}" if table is None else "table")
        elif not holder.value > 0:
            _fail(f"--{holder.name} must be > 0, got {holder.name}={holder.value}")
        else:
            peaks.append(holder.value * unit)
            sources.append(f"--{holder.name}")
    return peaks[0], peaks[1], " / ".join(sources)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def print_table(report: dict) -> None:
    """The report as a compact markdown table."""
    flops, hbm = report["peak_flops"], report["peak_hbm_bytes_per_s"]
    print(
        f"shape={report['shape']} on {report['device_kind']} ({report['platform']}), jax "
        f"{report['jax_version']}; {report['param_count']:,} parameters "
        f"({report['param_dtype']} masters, {report['compute_dtype']} compute); peaks "
        f"{'n/a' if flops is None else f'{flops / 1e12:.4g} TFLOP/s'} / "
        f"{'n/a' if hbm is None else f'{hbm / 1e9:,.0f} GB/s'} ({report['peaks_from']}); "
        f"medians of {report['repeats']}"
    )
    print("| measurement | work | compile s | median s | throughput | of peak |")
    print("|---|---|---:|---:|---:|---:|")
    update, decode, sharing = (report[k] for k in ("update", "decode", "prefill_sharing"))
    if "skipped" in update:
        print(f"| update | {update['skipped']} | | | | |")
    else:
        print(
            f"| update (GRPO fwd+bwd+AdamW) | {update['slots']} slots x ({update['prompt_len']} + "
            f"{update['new_tokens']}) tokens, {update['minibatches']} mini-batches | "
            f"{update['compile_s']:.1f} | {update['median_s']:.3f} | "
            f"{update['flops_per_s'] / 1e12:.3g} TFLOP/s | MFU {_percent(update['mfu'])} |"
        )
    if "skipped" in decode:
        print(f"| decode | {decode['skipped']} | | | | |")
    else:
        print(
            f"| decode | {decode['slots']} slots, {decode['prompt_len']}-token prompts, "
            f"{decode['new_tokens']} new | {decode['compile_s']:.1f} | {decode['median_s']:.3f} | "
            f"{decode['tokens_per_s']:,.0f} tok/s | HBM roofline "
            f"{_percent(decode['roofline_fraction'])} |"
        )
    if "skipped" in sharing:
        print(f"| prefill sharing | {sharing['skipped']} | | | | |")
    else:
        shared, per_slot = sharing["shared"], sharing["per_slot"]
        print(
            f"| prefill shared / per slot | {sharing['slots']} slots of {sharing['prompts']} "
            f"prompts, {sharing['prompt_len']}-token prompts, {sharing['new_tokens']} new | "
            f"{shared['compile_s']:.1f} / {per_slot['compile_s']:.1f} | "
            f"{shared['median_s']:.3f} / {per_slot['median_s']:.3f} | "
            f"speed-up {sharing['speedup']:.2f}x | - |"
        )


def _print_live(live: dict) -> None:
    print(
        f"\ndecode ms per step against the live length ({live['slots']} slots, P = "
        f"{live['prompt_len']}, static batching, windows ending at {live['windows']} new tokens):"
    )
    print("| steps | live length | ms per step |")
    print("|---|---:|---:|")
    for entry in live["ranges"]:
        low, high = entry["steps"]
        note = " (with the prefill)" if low == 0 else ""
        print(f"| {low}-{high}{note} | {entry['live_len']:.0f} | {entry['ms_per_step']:.2f} |")
    print(
        f"one window (the whole P + {live['caps'][-1]} cache every step) over windows: "
        f"{live['one_window_over_windows']:.2f}x the wall time; the stop checked once per "
        f"{live['stop_check_every']} steps: {live['checks_speedup']:.2f}x the speed of every step"
    )


def _print_engines(engines: dict) -> None:
    print(
        f"\nbuilt-in engine, {engines['slots']} requests of {engines['prompts']} prompts: static "
        f"(all at once) against continuous ({engines['lanes']} lanes):"
    )
    print(
        "| workload | median length / cap | static tok/s | continuous tok/s | ratio | "
        "every block read (no conds) tok/s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in engines["workloads"].items():
        static, continuous = row["static"], row["continuous"]
        every = row.get("continuous_all_blocks")
        every = "-" if every is None else (
            f"{every['tokens_per_s']:,.0f} ({row['all_blocks_over_skipping']:.2f}x)"
        )  # fmt: skip
        print(
            f"| {name} | {static['median_length']:.0f} / {row['new_tokens']} | "
            f"{static['tokens_per_s']:,.0f} | {continuous['tokens_per_s']:,.0f} | "
            f"{row['continuous_over_static']:.2f}x | {every} |"
        )


def _print_packed(packed: dict) -> None:
    print(
        f"\nupdate on DAPO-shaped lengths ({packed['slots']} slots, P = {packed['prompt_len']}, "
        f"M = {packed['new_tokens']}; {packed['real_tokens']:,} real of "
        f"{packed['padded_tokens']:,} padded tokens, {packed['packed_rows']} packed rows, "
        f"{packed['packed_compiles']} compile(s) over 3 length draws): padded "
        f"{packed['padded']['real_tokens_per_s']:,.0f}, packed "
        f"{packed['packed']['real_tokens_per_s']:,.0f} real tokens/s, {packed['speedup']:.2f}x"
    )


def _print_attention(attention: dict) -> None:
    print(
        f"\ncuDNN against XLA attention: loss {attention['loss_relative']:.1e} relative, logits "
        f"{100 * attention['logits_of_max']:.2f} % of their maximum, gradients "
        f"{100 * attention['gradients_relative']:.2f} % (relative norm, worst leaf), finite: "
        f"{attention['finite']} (T = {attention['agree_len']}); forward + backward at T = "
        f"{attention['time_len']}: {attention['xla']['median_s']:.3f} s against "
        f"{attention['cudnn']['median_s']:.3f} s, {attention['speedup']:.2f}x"
    )
    kernel = attention["kernel"]
    print(
        f"cuDNN kernel alone, forward + backward at T = {kernel['seq_len']}: the mask only "
        f"{kernel['mask_only']['median_s'] * 1e3:.2f} ms, with is_causal "
        f"{kernel['mask_and_causal']['median_s'] * 1e3:.2f} ms, {kernel['speedup']:.2f}x "
        f"(outputs within {kernel['max_abs_difference']:.1e})"
    )


def _print_update_candidates(report: dict) -> None:
    base = report["update"]
    print("\nupdate MFU candidates (the update section's work, some run-config fields changed):")
    print("| candidate | changes | median s | MFU | update / candidate |")
    print("|---|---|---:|---:|---:|")
    for name, row in report["update_candidates"]["candidates"].items():
        changes = ", ".join(f"{field}={value}" for field, value in row["overrides"].items())
        if "skipped" in row:
            print(f"| {name} | {changes} | {row['skipped']} | | |")
            continue
        ratio = "n/a" if "skipped" in base else f"{base['median_s'] / row['median_s']:.2f}x"
        print(f"| {name} | {changes} | {row['median_s']:.3f} | {_percent(row['mfu'])} | {ratio} |")


def print_sections(report: dict) -> None:
    """The sections beyond the main table, each where it ran (else its reason)."""
    if "skipped" not in report["update_candidates"]:
        _print_update_candidates(report)
    printers = dict(
        live=_print_live, engines=_print_engines, packed=_print_packed, attention=_print_attention
    )
    for name, printer in printers.items():
        if "skipped" in report[name]:
            print(f"\n{name}: skipped ({report[name]['skipped']})")
        else:
            printer(report[name])


def main(argv: list[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    device = jax.devices()[0]
    if device.platform == "cpu" and _SHAPE.value != "tiny":
        _fail(
            "no GPU or TPU (jax's platform is cpu): run it on a machine with one accelerator "
            f"chip, or pass --shape=tiny for the CPU smoke run; got shape={_SHAPE.value}"
        )
    if _REPEATS.value < 1:
        _fail(f"--repeats must be >= 1, got repeats={_REPEATS.value}")
    if _BUDGET_S.value is not None and not _BUDGET_S.value > 0:
        _fail(f"--budget-s must be > 0, got budget-s={_BUDGET_S.value}")
    sections = SECTIONS if _SECTIONS.value is None else tuple(_SECTIONS.value)
    unknown = [name for name in sections if name not in ALL_SECTIONS]
    if unknown or not sections:
        _fail(
            f"--sections must name some of {', '.join(ALL_SECTIONS)}, "
            f"got sections={_SECTIONS.value}"
        )
    out = _OUT.value
    if out and (os.path.isdir(out) or not os.path.isdir(os.path.dirname(out) or ".")):
        _fail(f"--out must name a file in an existing folder, got out={out}")
    peak_flops, peak_hbm, peaks_from = _peaks(device.device_kind)

    shape = SHAPES[_SHAPE.value]
    config = run_config(shape)
    model = models.init_decoder(
        models.DecoderConfig.from_dict(config.model.to_dict()), seed=config.seed
    )
    param_count = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    matmul_weights = matmul_weight_count(model)
    repeats = _REPEATS.value
    report = dict(
        shape=_SHAPE.value,
        device_kind=device.device_kind,
        platform=device.platform,
        jax_version=jax.__version__,
        repeats=repeats,
        model=dataclasses.asdict(model.config),
        param_count=int(param_count),
        matmul_weights=matmul_weights,
        param_dtype=model.config.param_dtype,
        compute_dtype=model.config.compute_dtype,
        peak_flops=peak_flops,
        peak_hbm_bytes_per_s=peak_hbm,
        peaks_from=peaks_from,
    )
    runs = {
        "decode": lambda: bench_decode(
            model, shape.decode, param_count=param_count, repeats=repeats, peak_hbm=peak_hbm
        ),
        "prefill_sharing": lambda: bench_prefill_sharing(model, shape.sharing, repeats=repeats),
        "live": lambda: bench_live(model, shape.decode, shape.live_caps, repeats=repeats),
        "engines": lambda: bench_engines(shape.engines, repeats=repeats),
        "packed": lambda: bench_packed(shape.packed, repeats=repeats),
        "attention": lambda: bench_attention(model.config, shape.attention, repeats=repeats),
        # Last: the update donates the parameters it shares with `model`.
        "update": lambda: bench_update(
            config,
            model,
            shape,
            matmul_weights=matmul_weights,
            repeats=repeats,
            peak_flops=peak_flops,
        ),
        "update_candidates": lambda: bench_update_candidates(
            config, shape, repeats=repeats, peak_flops=peak_flops
        ),
    }
    failed = run_sections(
        runs, sections, report, repeats=repeats, out=out, budget_s=_BUDGET_S.value
    )
    print_table(report)
    print_sections(report)
    if out:
        print(f"figures written to {out}")
    if failed:
        print(f"error: sections failed: {', '.join(failed)} (tracebacks above)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
