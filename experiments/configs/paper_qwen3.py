"""The paper's training and evaluation settings (Panaganti et al., 2026; SPEC 2-5, 9), by size.

`paper_qwen3_1p7b.py`, `paper_qwen3_4b.py` and `paper_qwen3_8b.py` call `paper_config` with
their size. They train Qwen3-Base on DAPO-Math (`dapo_math_en`, 14,048 English problems) for
1000 steps of 256 prompts x 4 rollouts (R = 1024 completions of up to 4096 tokens), AdamW at
lr 1e-6, rewards +-1, two optimizer mini-batches of 128 prompts per step, clip-higher
(0.2 / 0.28), the KL term at 0.001, no dynamic sampling and no overlong shaping; the
controllers use the paper's defaults (10 pass@k bins; Prompt-GDRO eta 0.65, gamma 0.01, EMA
0.12, share normalisation, weight cap 15; Rollout-GDRO n in [2, 12] by the square-root rule).
Evaluation (`python -m experiments.evaluate`, whose defaults are the paper's): 8 samples at
T=0.6, top-p 0.8, top-k 20 on the six benchmarks.

They are meant for GPU/TPU meshes: point `init_from` at the HF folder of the base model (with
its tokenizer) and set the mesh to the devices, e.g.

    python -m experiments.train --config=experiments/configs/paper_qwen3_1p7b.py \
        --workdir=runs/qwen3_1p7b_gdro_both --config.method=gdro_both \
        --config.init_from=/models/Qwen3-1.7B-Base --config.mesh.fsdp=8

Settings the paper does not state are marked "not in the paper" and follow common GRPO
practice.
"""

import ml_collections

from gdro_jax import configs, models

SIZES = {"1p7b": "qwen3_1p7b", "4b": "qwen3_4b", "8b": "qwen3_8b"}


def paper_config(size: str) -> ml_collections.ConfigDict:
    """The paper's settings for Qwen3-Base of `size` (`"1p7b"`, `"4b"` or `"8b"`)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got size={size!r}")
    config = configs.run_config()  # every field; the controllers' defaults are the paper's
    config.method = "grpo"  # one of gdro_jax.controllers.METHODS (grpo, gdro_both, knapsack, ...)
    config.steps = 1000
    config.num_prompts = 256
    config.n_mean = 4
    config.max_new_tokens = 4096
    # Not in the paper: R = 1024 slots decoded 128 at a time, so the decode cache holds 128 x
    # (1024 + 4096) slots, 11.3 GiB per device for Qwen3-8B in bfloat16 on 1x8x1 instead of 90
    # GiB for all 1024 (models.memory_footprint, fsdp=8, batch=128 or 1024, seq_len=5120), next to
    # 4.5 GiB for the 256 prompts' shared prefill. Per-slot keys make the completions the same
    # for any value (up to the matmuls' rounding at another batch size): resumable.
    config.rollout.micro_batch_slots = 128
    # Continuous batching (the library's default): 128 lanes take the 1024 requests from a queue.
    # It fits every preset (Qwen3-8B on fsdp=8: "rollout, other buffers" 45.3 GiB, 71.9 in all,
    # experiments.plan), and a decode step skips the ring's blocks no live request has written
    # into. --config.rollout.batching=static takes chunks of 128 slots instead (44.7 GiB, 71.9).
    config.rollout.batching = "continuous"
    # No halving of the lanes after the queue: each halving is one more decode loop to compile
    # (the Qwen3-8B plan took 5:10 with four against 1:18-1:34 with none, and with one its other
    # rollout buffers grew to 50.0 GiB), and on a chip a step's cost follows the weights read
    # more than the lanes.
    config.rollout.lane_halvings = 0
    config.task_kind = "math"
    config.math.update(
        preset="dapo_math_en",
        data_dir="",  # empty: $GDRO_DATA_DIR, else ../shared/data
        limit=0,  # 0: every row; N: the first N (smoke tests)
        chat_template=True,  # the problem + the authors' suffix as one user message
        max_prompt_tokens=1024,  # not in the paper
        on_long_prompt="skip",  # skip and count longer prompts ("raise" to fail instead)
        grader_workers=16,  # not in the paper: one per host core is plenty
        grader_timeout_s=5.0,  # not in the paper
    )
    # The policy: the base model's HF folder (required for a real run; its tokenizer is used).
    config.init_from = ""
    config.tokenizer = ""  # empty: the tokenizer in init_from
    preset = getattr(models.DecoderConfig, SIZES[size])()
    config.model.update(preset.to_dict())
    # Mixed precision: float32 master weights and Adam moments, bfloat16 matmuls and KV cache;
    # norms, softmax, log-probs and the loss stay float32. Not in the paper: remat (each block's
    # activations recomputed in the backward pass), without which no update micro-batch of the
    # 8B model fits 80 GiB devices (python -m experiments.plan).
    config.model.update(param_dtype="float32", compute_dtype="bfloat16", remat=True)
    config.mesh.update(data=1, fsdp=8, tensor=1)
    # Checkpoints every 25 steps, the newest 3 kept (each holds params, both Adam moments and
    # the reference).
    config.checkpoint.update(enabled=True, every_steps=25, keep=3)
    config.optimizer.update(
        learning_rate=1e-6,
        weight_decay=0.01,  # not in the paper
        grad_clip=1.0,  # not in the paper
    )
    config.grpo.update(
        num_minibatches=2,  # 256 prompts in mini-batches of 128
        eps_low=0.2,
        eps_high=0.28,
        kl_coef=0.001,
        loss_signal="surrogate",  # the released code's; "surrogate_kl" is the written one
        # Not in the paper: gradient accumulation over micro-batches of 16 of the 512 slots of
        # a mini-batch, 2 per device on the 8 batch shards (data x fsdp), so the update holds
        # the activations of 2 x (1024 + 4096) tokens per device instead of 64 x that. The
        # same update up to float rounding (resumable).
        micro_batch_slots=16,
        # Not in the paper: the output projection 1024 positions at a time (recomputed in the
        # backward pass), so the float32 logits of a pass hold 1024 of the 5120 positions
        # (2 slots x 1024 x 151,936 x 4 bytes = 1.2 GiB per device instead of 5.8).
        logprob_chunk_tokens=1024,
        # Not in the paper: each mini-batch's sequences packed into rows of 1024 + 4096 tokens,
        # in passes of micro_batch_slots rows over only the rows in use (the library's default,
        # stated here): the update costs what its tokens cost, not 512 x 5120 positions.
        pack_sequences=True,
    )
    return config
