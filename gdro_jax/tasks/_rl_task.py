"""A task as the trainer consumes it: a tokenised prompt pool and a reward.

Two tasks plug into `build_run`:

- `chain` (default): the CPU-sized chain task of `gdro_jax.tasks`; its reward (exact match of the
  whole worked solution) is jittable and runs on the device.
- `math`: a math dataset preset of `gdro_jax.data` (DAPO-Math for training), prompts in the
  policy tokenizer's chat template, rewards from `gdro_jax.rewards.MathGrader`: completions are
  decoded on the host and graded by math-verify in worker processes with a hard per-item
  timeout, so a pathological answer costs at most the timeout and scores as wrong.

Both map correctness to the run's `reward_values` (SPEC 2: -1 / +1). Neither reads a run config:
the config layer (`gdro_jax.configs`) turns its `task` or `math` block into a `ChainTaskConfig`
or a `MathTaskConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from gdro_jax import data, rewards
from gdro_jax.tasks._arrays import encode_rows
from gdro_jax.tasks._chains import ChainTaskConfig, build_splits
from gdro_jax.tasks._reward import solution_correct
from gdro_jax.tasks._tokenizer import EOS_ID, VOCAB_SIZE, hf_tokenizer

# (prompt_ids_N, completion_tokens_RM, completion_lengths_R, prompt_of_slot_R) -> (rewards_R,
# correct_R): jittable on device arrays (chain) or plain numpy on the host (math).
RewardFn = Callable[[Any, Any, Any, Any], tuple[Any, Any]]

TASK_KINDS = ("chain", "math")
ON_LONG_PROMPT = ("skip", "raise")


@dataclasses.dataclass(frozen=True)
class MathTaskConfig:
    """A math training set and its grader (a run config's `math` block).

    Attributes:
      preset: a `gdro_jax.data` preset (DAPO-Math's English rows: "dapo_math_en").
      data_dir: the data files' folder; empty: `$GDRO_DATA_DIR`, else `../shared/data`.
      limit: train on the first `limit` rows only (smoke tests); 0: every row.
      chat_template: wrap each prompt in the tokenizer's chat template as one user message.
      max_prompt_tokens: longer prompts are skipped and counted (or raise, below).
      on_long_prompt: "skip" (counted in `skipped_prompts`) or "raise".
      eos_tokens: the tokens that end a completion (those the tokenizer knows).
      grader_workers: math-verify worker processes.
      grader_timeout_s: seconds per graded answer before it scores wrong.
    """

    preset: str = "dapo_math_en"
    data_dir: str = ""
    limit: int = 0
    chat_template: bool = True
    max_prompt_tokens: int = 2048
    on_long_prompt: str = "skip"
    eos_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
    grader_workers: int = 2
    grader_timeout_s: float = 5.0

    def __post_init__(self):
        if self.preset not in data.PRESETS:
            raise ValueError(
                f"preset must be one of {sorted(data.PRESETS)}, got preset={self.preset!r}"
            )
        if self.on_long_prompt not in ON_LONG_PROMPT:
            raise ValueError(
                f"on_long_prompt must be one of {ON_LONG_PROMPT}, "
                f"got on_long_prompt={self.on_long_prompt!r}"
            )
        for name in ("limit", "max_prompt_tokens", "grader_workers"):
            value = getattr(self, name)
            smallest = 0 if name == "limit" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
                raise ValueError(f"{name} must be an int >= {smallest}, got {name}={value!r}")
        if not self.grader_timeout_s > 0:
            raise ValueError(
                f"grader_timeout_s must be > 0, got grader_timeout_s={self.grader_timeout_s!r}"
            )
        object.__setattr__(self, "eos_tokens", tuple(self.eos_tokens))


@dataclasses.dataclass
class RLTask:
    """A training prompt pool and its reward, as the trainer consumes them.

    Attributes:
      kind: `"chain"` or `"math"`.
      prompt_tokens: int32[D, P] the pool's prompts, right-padded with 0.
      prompt_lengths: int32[D] their lengths.
      eos_ids: token ids that end a completion.
      vocab_size: the tokenizer's vocabulary size (the policy must match).
      device_reward: the jittable reward, or None when the reward runs on the host.
      host_reward: the host reward, or None when it runs on the device.
      tokenizer: a transformers tokenizer saved with the final policy.
      rows: the pool's dataset rows (`id`, `prompt`, `answer`, ...); a row's position is its
        prompt index.
      skipped_prompts: pool rows dropped because their prompt exceeded `max_prompt_tokens`.
      grader: the math grader (closed by `close`), or None.
    """

    kind: str
    prompt_tokens: np.ndarray
    prompt_lengths: np.ndarray
    eos_ids: tuple[int, ...]
    vocab_size: int
    device_reward: RewardFn | None
    host_reward: RewardFn | None
    tokenizer: Any
    rows: list[dict]
    skipped_prompts: int = 0
    grader: rewards.MathGrader | None = None

    @property
    def num_prompts(self) -> int:
        """D, the number of prompts in the pool (the classifier's dataset size)."""
        return int(self.prompt_tokens.shape[0])

    def close(self) -> None:
        """Stops the grader's worker processes (nothing to do for device rewards)."""
        if self.grader is not None:
            self.grader.close()

    def grader_counts(self) -> dict[str, int]:
        """Cumulative grader counts (timeouts, crashes, ...); empty for device rewards."""
        if self.grader is None:
            return {}
        return {f"grader/{name}": int(value) for name, value in self.grader.stats._asdict().items()}


def chain_task(
    task_config: ChainTaskConfig, *, reward_values: tuple[float, float] = (-1.0, 1.0)
) -> RLTask:
    """The chain task's training pool with its on-device exact-match reward.

    Args:
      task_config: the task's levels, pool and splits.
      reward_values: `(wrong, correct)` rewards.
    """
    splits = build_splits(task_config)
    pool = encode_rows(splits.train, task_config)
    solution_tokens = jnp.asarray(pool.solution_tokens)
    low, high = (float(v) for v in reward_values)

    def exact_match_reward(ids_N, tokens_RM, lengths_R, prompt_of_slot_R):
        gold_RS = solution_tokens[ids_N[prompt_of_slot_R]]
        correct = solution_correct(tokens_RM, gold_RS, completion_lengths=lengths_R)
        return jnp.where(correct, high, low), correct

    return RLTask(
        kind="chain",
        prompt_tokens=np.asarray(pool.prompt_tokens, np.int32),
        prompt_lengths=np.asarray(pool.prompt_lengths, np.int32),
        eos_ids=(EOS_ID,),
        vocab_size=VOCAB_SIZE,
        device_reward=exact_match_reward,
        host_reward=None,
        tokenizer=hf_tokenizer(),
        rows=list(splits.train),
    )


def math_task(
    math: MathTaskConfig, tokenizer, *, reward_values: tuple[float, float] = (-1.0, 1.0)
) -> RLTask:
    """A math dataset preset graded by math-verify in worker processes.

    Args:
      math: the data set, prompt handling and grader.
      tokenizer: the policy's transformers tokenizer (`models.load_tokenizer(folder)`).
      reward_values: `(wrong, correct)` rewards.

    Returns:
      The `RLTask`; call its `close()` to stop the grader.
    """
    rows = data.load_preset(
        math.preset,
        math.data_dir or None,
        tokenizer=tokenizer if math.chat_template else None,
    )
    if math.limit:
        rows = rows[: math.limit]
    tokens, lengths, rows, skipped = data.encode_prompts(
        tokenizer, rows, math.max_prompt_tokens, on_long_prompt=math.on_long_prompt
    )
    golds = [row["answer"] for row in rows]
    eos_ids = data.stop_token_ids(tokenizer, tuple(math.eos_tokens))
    grader = rewards.MathGrader(num_workers=math.grader_workers, timeout_s=math.grader_timeout_s)
    low, high = (float(v) for v in reward_values)
    stop = set(eos_ids)

    def graded_reward(ids_N, tokens_RM, lengths_R, prompt_of_slot_R):
        ids_N, tokens_RM = np.asarray(ids_N), np.asarray(tokens_RM)
        lengths_R, prompt_of_slot_R = np.asarray(lengths_R), np.asarray(prompt_of_slot_R)
        texts = []
        for tokens, length in zip(tokens_RM, lengths_R, strict=True):
            completion = [int(t) for t in tokens[:length] if int(t) not in stop]
            texts.append(tokenizer.decode(completion, skip_special_tokens=True))
        slot_golds = [golds[int(ids_N[p])] for p in prompt_of_slot_R]
        scores = np.asarray(grader.grade(texts, slot_golds, progress=False), np.float32)
        correct = scores > 0.5
        return np.where(correct, high, low).astype(np.float32), correct

    return RLTask(
        kind="math",
        prompt_tokens=tokens,
        prompt_lengths=lengths,
        eos_ids=eos_ids,
        vocab_size=len(tokenizer),
        device_reward=None,
        host_reward=graded_reward,
        tokenizer=tokenizer,
        rows=rows,
        skipped_prompts=skipped,
        grader=grader,
    )


def check_vocab(task: RLTask, vocab_size: int) -> None:
    """Raises when the policy's embedding table cannot hold every token of the task."""
    if vocab_size < task.vocab_size:
        raise ValueError(
            f"the policy's vocab_size={vocab_size} is smaller than the {task.kind} task's "
            f"tokenizer ({task.vocab_size} tokens)"
        )


def prompt_features(task: RLTask) -> np.ndarray:
    """float32[D, F] what is known of each pool prompt before any rollout, for an allocation that
    predicts a prompt's success rate from its neighbours (`controllers.vip`).

    - Chain task: the problem's parameters, `[level / L, share of +, share of -, share of *]`
      among its operations (`L` the pool's highest level). The level sets most of a chain's
      difficulty; the operations' mix tells chains of one level apart.
    - Math: `[log(prompt tokens) / log(the pool's longest prompt)]`. The math pools carry no
      difficulty label that every source has (DAPO-Math has none), and an embedding model is not
      among our dependencies; the prompt's length exists for every row before training, and
      longer statements tend to be harder problems.
    """
    if task.kind == "chain":
        levels = np.asarray([row["level"] for row in task.rows], np.float32)
        shares = []
        for row in task.rows:
            operations = [c for c in row["prompt"][1:] if c in "+-*"]
            shares.append([operations.count(op) / max(len(operations), 1) for op in "+-*"])
        return np.column_stack([levels / levels.max(), np.asarray(shares, np.float32)])
    lengths = np.log(np.maximum(np.asarray(task.prompt_lengths, np.float32), 1.0))
    return (lengths / max(float(lengths.max()), 1e-6))[:, None].astype(np.float32)
