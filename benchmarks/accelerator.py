"""One accelerator chip: the update step's MFU, the sampler's decode throughput against the HBM
roofline, and the prefill-sharing speed-up, on a Qwen3-1.7B-shaped policy with random weights.

Run on a machine with one GPU or TPU chip with at least 80 GB of memory and jax with CUDA or TPU
support (estimated 3-5 minutes, compilation included; not yet run on a chip):

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.accelerator --out=accelerator.json

(on a GPU jax takes 75 % of the memory by default, 60 GB of an 80 GB part: too little for the
update). On a chip missing from the peak table below, give its peaks (dense bf16, HBM; here an
H100 PCIe):

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
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags, logging
from flax import nnx

from experiments.configs import paper_qwen3
from gdro_jax import configs, models, step
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


class Shape(NamedTuple):
    model: models.DecoderConfig  # architecture; the dtypes come from the paper config
    update: Work
    minibatches: int  # optimizer mini-batches per update
    decode: Work
    sharing: Work


SHAPES = {
    "qwen3_1p7b": Shape(
        model=models.DecoderConfig.qwen3_1p7b(remat=True),
        update=Work(prompts=8, rollouts=4, prompt_len=256, new_tokens=768),
        minibatches=4,
        decode=Work(prompts=64, rollouts=4, prompt_len=256, new_tokens=512),
        sharing=Work(prompts=64, rollouts=4, prompt_len=512, new_tokens=32),
    ),
    "tiny": Shape(
        model=models.DecoderConfig.tiny(remat=True),
        update=Work(prompts=4, rollouts=4, prompt_len=16, new_tokens=16),
        minibatches=2,
        decode=Work(prompts=8, rollouts=4, prompt_len=16, new_tokens=32),
        sharing=Work(prompts=8, rollouts=4, prompt_len=64, new_tokens=4),
    ),
}


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


def _timed(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict]:
    """Each call once (compilation), then `repeats` times, alternating between the calls."""
    first, times = {}, {name: [] for name in calls}
    for name, call in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(call())
        first[name] = time.perf_counter() - start
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    result = {}
    for name, seconds in times.items():
        median = float(np.median(seconds))
        result[name] = dict(
            compile_s=max(first[name] - median, 0.0), median_s=median, times_s=seconds
        )
    return result


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

    timing = _timed({"update": update_step}, repeats)["update"]
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
        model_flops=flops,
        flops_per_s=flops_per_s,
        mfu=None if peak_flops is None else flops_per_s / peak_flops,
    )


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

    timing = _timed({"decode": call}, repeats)["decode"]
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

    timing = _timed(dict(shared=lambda: call(True), per_slot=lambda: call(False)), repeats)
    return dict(
        slots=int(slot_map_R.shape[0]),
        prompts=work.prompts,
        prompt_len=work.prompt_len,
        new_tokens=work.new_tokens,
        shared=timing["shared"],
        per_slot=timing["per_slot"],
        speedup=timing["per_slot"]["median_s"] / timing["shared"]["median_s"],
    )


def _section(name: str, bench: Callable[[], dict]) -> dict:
    """Runs one measurement; out of device memory, it is reported as skipped."""
    print(f"{name}: compiling, then {_REPEATS.value} timed calls", file=sys.stderr, flush=True)
    try:
        return bench()
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return dict(skipped=f"out of memory: {str(error).splitlines()[0][:300]}")


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
    report["decode"] = _section(
        "decode",
        lambda: bench_decode(
            model, shape.decode, param_count=param_count, repeats=repeats, peak_hbm=peak_hbm
        ),
    )
    report["prefill_sharing"] = _section(
        "prefill sharing", lambda: bench_prefill_sharing(model, shape.sharing, repeats=repeats)
    )
    # Last: the update donates the parameters it shares with `model`.
    report["update"] = _section(
        "update",
        lambda: bench_update(
            config,
            model,
            shape,
            matmul_weights=matmul_weights,
            repeats=repeats,
            peak_flops=peak_flops,
        ),
    )
    print_table(report)
    if out:
        with open(out, "w") as file:
            json.dump(report, file, indent=2)
        print(f"figures written to {out}")


if __name__ == "__main__":
    app.run(main)
