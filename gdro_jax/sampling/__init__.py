"""The jitted KV-cache sampler, the matching per-token log-probabilities, and sequences packed
into fixed-length rows for the trainer's forward passes."""

from gdro_jax.sampling._continuous import LANE_HALVINGS
from gdro_jax.sampling._generate import (
    FinishReason,
    GenerationResult,
    sample_logits,
    window_ends,
)
from gdro_jax.sampling._logprobs import completion_logprobs, sequence_logprobs
from gdro_jax.sampling._packing import (
    PackedRows,
    pack_completions,
    pack_layout,
    packed_buffer_rows,
    packed_completion_logprobs,
    packed_passes,
    packed_rows_logprobs,
    unpack_completion_logprobs,
)
from gdro_jax.sampling._sampler import BATCHING, generate

__all__ = [
    "BATCHING",
    "FinishReason",
    "GenerationResult",
    "LANE_HALVINGS",
    "PackedRows",
    "completion_logprobs",
    "generate",
    "pack_completions",
    "pack_layout",
    "packed_buffer_rows",
    "packed_completion_logprobs",
    "packed_passes",
    "packed_rows_logprobs",
    "sample_logits",
    "sequence_logprobs",
    "unpack_completion_logprobs",
    "window_ends",
]
