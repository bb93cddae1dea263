"""The policy model against transformers (PyTorch, CPU) on the same tiny Qwen3 weights.

One run measures, on one random Qwen3-shaped model (D=256, 4 layers, 4/2 heads of 64, F=768,
V=4096, tied embeddings) built with transformers and loaded into gdro_jax from its HF folder
(with `scan_layers=False`, the faster setting on CPU):
  (a) sampling: new tokens/s of `gdro_jax.sampling.generate` vs `transformers` `generate`
      (batch 64, 32-token prompts, 128 new tokens, temperature 1, no top-k/top-p, no stop id);
  (b) training: tokens/s of one forward + backward + AdamW step on 16 x 256 tokens (next-token
      cross-entropy), nnx vs PyTorch;
  (c) GRPO-style sampling: 256 completions (32 new tokens) of 32 distinct 256-token prompts,
      8 slots per prompt, with and without prefill sharing.
Each side is called once (compilation for gdro_jax), then the two sides are timed alternately so
that load from other processes hits both alike; the table gives the best time (and the ratio of
medians). Compile time is estimated as the first call's time minus the best time.

Run:  python -m benchmarks.policy [--repeats 3]
One core each (robust to other load on the machine):
      XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
      python -m benchmarks.policy --torch-threads 1
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx

from gdro_jax.models import from_pretrained
from gdro_jax.sampling import generate

SHAPE = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    bos_token_id=None,
    eos_token_id=None,
)


def _interleaved(fns: dict, repeats: int) -> dict:
    """Times each of `fns` `repeats` times, alternating between them so that load from other
    processes hits all of them alike. Returns name -> (first call s, best s, median s)."""
    first = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {n: (first[n], min(t), float(np.median(t))) for n, t in times.items()}


def _block(tree):
    return jax.block_until_ready(tree)


def bench_sampling(hf_model, model, repeats, batch=64, prompt_len=32, new_tokens=128):
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, SHAPE["vocab_size"], (batch, prompt_len))
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def ours():
        key = jax.random.key(int(rng.integers(1 << 30)))
        _block(
            generate(
                model,
                prompts,
                prompt_lengths=np.full(batch, prompt_len),
                key=key,
                max_new_tokens=new_tokens,
                temperature=1.0,
            )
        )

    def theirs():
        with torch.no_grad():
            hf_model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=0,
            )

    return _interleaved(dict(ours=ours, theirs=theirs), repeats), batch * new_tokens


def bench_training(hf_model, model, repeats, batch=16, seq_len=256):
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, SHAPE["vocab_size"], (batch, seq_len))
    ids = jnp.asarray(tokens, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(seq_len), (batch, seq_len))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, ids, positions):
        def loss_fn(model):
            logits = model(ids[:, :-1], positions[:, :-1])
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    hf_model.train()
    torch_optimizer = torch.optim.AdamW(hf_model.parameters(), lr=1e-4)
    torch_ids = torch.tensor(tokens)

    def theirs():
        loss = hf_model(input_ids=torch_ids, labels=torch_ids).loss
        loss.backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()

    def ours():
        _block(step(model, optimizer, ids, positions))

    timings = _interleaved(dict(ours=ours, theirs=theirs), repeats)
    hf_model.eval()
    return timings, batch * (seq_len - 1)


def bench_prefill_sharing(model, repeats, prompts=32, per_prompt=8, prompt_len=256, new=32):
    rng = np.random.default_rng(2)
    tokens = rng.integers(1, SHAPE["vocab_size"], (prompts, prompt_len))
    slots = np.repeat(np.arange(prompts), per_prompt)

    def run(share):
        _block(
            generate(
                model,
                tokens,
                prompt_lengths=np.full(prompts, prompt_len),
                key=jax.random.key(0),
                max_new_tokens=new,
                prompt_of_slot=slots,
                share_prefill=share,
            )
        )

    return _interleaved(dict(shared=lambda: run(True), per_slot=lambda: run(False)), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="PyTorch intra-op threads (0: its default). For a one-core comparison also run XLA "
        "on one thread: XLA_FLAGS='--xla_cpu_multi_thread_eigen=false "
        "intra_op_parallelism_threads=1'",
    )
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3Config(**SHAPE)
    ).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf_model.save_pretrained(folder)
        model = from_pretrained(folder, scan_layers=False)  # unrolled blocks: faster on CPU

    sampling, sampled_tokens = bench_sampling(hf_model, model, args.repeats)
    sharing = bench_prefill_sharing(model, args.repeats)
    training, trained_tokens = bench_training(hf_model, model, 2 * args.repeats)

    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; "
        f"jax {jax.__version__} (CPU), torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}. Best (median) of interleaved repeats.\n"
    )
    print("| measurement | gdro_jax | transformers (PyTorch) | ratio, best (median) | compile |")
    print("|---|---|---|---|---|")
    for label, timings, count in (
        ("(a) sampling, batch 64 x 128 new tokens", sampling, sampled_tokens),
        ("(b) train step fwd+bwd+AdamW, 16 x 255 tokens", training, trained_tokens),
    ):
        (ours_first, ours_best, ours_median) = timings["ours"]
        (_, theirs_best, theirs_median) = timings["theirs"]
        print(
            f"| {label} | {count / ours_best:,.0f} tok/s ({ours_best:.2f} s) "
            f"| {count / theirs_best:,.0f} tok/s ({theirs_best:.2f} s) "
            f"| {theirs_best / ours_best:.2f}x ({theirs_median / ours_median:.2f}x) "
            f"| {ours_first - ours_best:.1f} s |"
        )
    (shared_first, shared_best, shared_median) = sharing["shared"]
    (slot_first, slot_best, slot_median) = sharing["per_slot"]
    print(
        f"| (c) 256 completions (32 new) of 32 distinct 256-token prompts | prefill shared "
        f"{shared_best:.2f} s | prefill per slot {slot_best:.2f} s (both gdro_jax) "
        f"| {slot_best / shared_best:.2f}x ({slot_median / shared_median:.2f}x) "
        f"| {shared_first - shared_best:.1f} s / {slot_first - slot_best:.1f} s |"
    )


if __name__ == "__main__":
    main()
