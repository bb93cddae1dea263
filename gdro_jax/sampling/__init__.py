"""The jitted KV-cache sampler and the matching per-token log-probabilities."""

from gdro_jax.sampling._generate import FinishReason, GenerationResult, generate, sample_logits
from gdro_jax.sampling._logprobs import completion_logprobs, sequence_logprobs

__all__ = [
    "FinishReason",
    "GenerationResult",
    "completion_logprobs",
    "generate",
    "sample_logits",
    "sequence_logprobs",
]
