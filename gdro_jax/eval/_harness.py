"""What the chain-task and the math evaluations share: the sampling settings, with each task's
defaults, and one batch of problems x k samples through the KV-cache sampler (slot r continues
problem r // k; the last batch padded with the first problems, so one shape compiles).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

REPORT_JSON = "report.json"
REPORT_MARKDOWN = "report.md"
TASK_DEFAULTS = {  # each task's sampling defaults, over `EvalSettings`'s (the math benchmarks')
    "chain": dict(temperature=1.0, top_p=1.0, top_k=0, batch_size=64),
    "math": {},
}
CHAIN_FIELDS = ("num_samples", "temperature", "top_p", "top_k", "batch_size", "seed")
# The settings `experiments/evaluate.py` takes as flags: name -> (absl flag kind, help), the help
# giving the default as (chain task; math).
SAMPLING_FLAGS = {
    "num_samples": ("integer", "Samples per problem k (8; 8)."),
    "temperature": ("float", "Sampling temperature, 0: greedy (1.0; 0.6)."),
    "top_p": ("float", "Nucleus filter, 1: off (1.0; 0.8)."),
    "top_k": ("integer", "Top-k filter, 0: off (0; 20)."),
    "max_new_tokens": ("integer", "Math only: most tokens per completion (4096)."),
    "max_prompt_tokens": ("integer", "Math only: longer prompts: --long_prompts (2048)."),
    "batch_size": ("integer", "Problems per sampler call (64; 8)."),
    "seed": ("integer", "Sampling seed (0; 0)."),
}


def check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """What decides the samples (a resumed math evaluation must use the same values): the math
    benchmarks' defaults (the paper's), or with `EvalSettings.of("chain")` the chain task's (SPEC
    11: T = 1 without truncation), whose evaluation reads `CHAIN_FIELDS` only.

    Attributes:
      num_samples: k, completions per problem; pass@j is reported for j = 1..k.
      temperature: sampling temperature (0: greedy).
      top_p: nucleus filter in (0, 1] (1: off).
      top_k: keep the k most likely tokens (0: off).
      max_new_tokens: math: the most tokens per completion.
      max_prompt_tokens: math: longer prompts are skipped or raise (never truncated).
      batch_size: problems per sampler call (`batch_size * num_samples` sequences).
      seed: PRNG seed of the samples.
      prompt_bucket: math: the padded prompt length is a multiple of this.
    """

    num_samples: int = 8
    temperature: float = 0.6
    top_p: float = 0.8
    top_k: int = 20
    max_new_tokens: int = 4096
    max_prompt_tokens: int = 2048
    batch_size: int = 8
    seed: int = 0
    prompt_bucket: int = 64

    def __post_init__(self):
        for name in ("num_samples", "max_new_tokens", "max_prompt_tokens", "batch_size"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("top_k", self.top_k, minimum=0)
        check_int("seed", self.seed, minimum=0)
        check_int("prompt_bucket", self.prompt_bucket, minimum=1)
        if not (isinstance(self.temperature, int | float) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got temperature={self.temperature!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be a float in (0, 1], got top_p={self.top_p!r}")

    @classmethod
    def of(cls, task_kind: str, **changes: Any) -> EvalSettings:
        """The settings of a task kind ("chain" or "math") with `changes` over its defaults."""
        return cls(**{**TASK_DEFAULTS[task_kind], **changes})


def batch_rows(first: int, batch_size: int, num_problems: int) -> np.ndarray:
    """int[batch_size]: the problems of the batch starting at `first`, wrapping around to the
    first problems past the end (the padding that keeps one compiled shape)."""
    return np.arange(first, first + batch_size) % num_problems


def sample_batch(
    model,
    sampler: Callable[..., Any],
    prompt_tokens_BP: np.ndarray,
    prompt_lengths_B: np.ndarray,
    *,
    settings: Any,
    key: jax.Array,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
):
    """One sampler call: `settings.num_samples` completions of each of the B prompts (slot r
    continues prompt r // num_samples) with `settings`' temperature, top-p and top-k.

    `settings` is an `EvalSettings` or anything with those attributes (the `eval` block of a
    warm-start or study config); `sampler` is called like `sampling.generate`.
    """
    prompt_of_slot_R = np.repeat(
        np.arange(len(prompt_lengths_B), dtype=np.int32), settings.num_samples
    )
    return sampler(
        model,
        prompt_tokens_BP,
        prompt_lengths=prompt_lengths_B,
        prompt_of_slot=prompt_of_slot_R,
        key=key,
        max_new_tokens=max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        eos_ids=eos_ids,
        pad_id=pad_id,
    )
