"""The rollout phase: `R = N * n_mean` completions of the planned slots, with log pi_old per token.

The controllers' plan maps the R slots to the N prompts (`plan.prompt_of_slot`); the KV-cache
sampler prefills each distinct prompt once and decodes every slot. Rewards are scored afterwards
by the run's reward phase, on the device or on the host.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from gdro_jax.controllers import Plan
from gdro_jax.sampling import generate


class Rollouts(NamedTuple):
    """The R sampled completions of one step, their sampling log-probs and rewards."""

    prompt_tokens: jax.Array  # [R, P] int32 each slot's prompt, left-padded
    prompt_lengths: jax.Array  # [R] int32
    tokens: jax.Array  # [R, M] int32 completion tokens (stop token included)
    lengths: jax.Array  # [R] int32 completion lengths
    logprobs: jax.Array  # [R, M] float32 log pi_old of each completion token
    rewards: jax.Array  # [R] float32
    correct: jax.Array  # [R] bool


def sample_rollouts(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    plan: Plan,
    prompt_tokens_NP: jax.Array,
    prompt_lengths_N: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float,
    eos_ids: tuple[int, ...],
) -> Rollouts:
    """Samples `R = len(plan.prompt_of_slot)` completions; rewards are scored afterwards.

    Args:
      graphdef: the policy's static graph.
      params: the policy's parameters.
      plan: the controllers' plan (its `prompt_of_slot` maps slots to the N prompts).
      prompt_tokens_NP: the N prompts, right-padded.
      prompt_lengths_N: their lengths.
      key: sampling key.
      max_new_tokens: M.
      temperature: sampling temperature.
      eos_ids: stop ids.

    Returns:
      The `Rollouts` with rewards 0 and correct False: the run's reward phase fills them in
      (`Rollouts._replace`), on the device or on the host.
    """
    model = nnx.merge(graphdef, params)
    result = generate(
        model,
        prompt_tokens_NP,
        prompt_lengths=prompt_lengths_N,
        prompt_of_slot=plan.prompt_of_slot,
        key=key,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_ids=eos_ids,
    )
    num_slots = result.lengths.shape[0]
    return Rollouts(
        prompt_tokens=result.prompt_tokens,
        prompt_lengths=result.prompt_lengths,
        tokens=result.tokens,
        lengths=result.lengths,
        logprobs=result.logprobs,
        rewards=jnp.zeros((num_slots,), jnp.float32),
        correct=jnp.zeros((num_slots,), bool),
    )
