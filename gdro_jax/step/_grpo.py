"""`GRPOConfig`: the hyperparameters of the GRPO update (SPEC section 2) and of the adversaries'
loss signal, checked when made (the run config's `grpo` block reads its fields and defaults)."""

from __future__ import annotations

import dataclasses

from gdro_jax import losses


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyperparameters of the GRPO update (SPEC section 2) and of the adversaries' loss signal.

    Attributes:
      num_minibatches: optimizer steps per rollout batch (paper: 256 prompts in two of 128).
      eps_low: the clipped ratio's lower bound is 1 - eps_low.
      eps_high: the clipped ratio's upper bound is 1 + eps_high (clip-higher).
      aggregation: how token losses become the loss (`gdro_jax.losses.AGGREGATIONS`).
      kl_coef: beta of the k3 KL to the initial policy; 0 builds and runs no reference model.
      normalize_std: divide advantages by the group's std (False: Dr.GRPO advantages).
      advantage_estimator: the group std: "sample" (N-1) or "population" (N). "sample" is the
        released code's and verl's (a group of one keeps its reward); with "population" a group
        of one gets 0.
      advantage_clip: clip advantages to this magnitude; None: no clip (the released code).
        SPEC 2's 5 never binds for binary rewards with n_i <= 12, where |A| <= 3.2.
      loss_signal: Prompt-GDRO's per-prompt signal (`gdro_jax.losses.SIGNALS`).
      temperature: the sampling temperature; log-probs are taken under it.
      micro_batch_slots: slots per forward/backward pass (gradient accumulation). It divides a
        mini-batch (None or at least a mini-batch: one pass) and changes float rounding only.
      logprob_chunk_tokens: positions per output-projection chunk (None: all at once). Each
        chunk is recomputed in the backward pass, so the [slots, P + M, vocab] logits never
        exist at once.
      pack_sequences: pack the sequences into rows and run only the rows in use. The update's
        forward and backward passes (and the rescoring of another engine's samples) then run on
        the slots' sequences packed into rows of P + M tokens (`sampling.pack_completions`), in
        passes of `packed_rows_per_pass` rows over only the rows in use: the cost follows the
        real tokens, not `R * (P + M)`. Equal to the padded update up to float rounding. False:
        every slot padded to P + M.
    """

    num_minibatches: int = 2
    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: str = "token_mean"
    kl_coef: float = 0.0
    normalize_std: bool = True
    advantage_estimator: str = "sample"
    advantage_clip: float | None = 5.0
    loss_signal: str = "failure_rate"
    temperature: float = 1.0
    micro_batch_slots: int | None = None
    logprob_chunk_tokens: int | None = None
    pack_sequences: bool = True

    def packed_rows_per_pass(self, num_slots: int) -> int:
        """Packed rows per forward/backward pass over `num_slots` sequences:
        `micro_batch_slots` (a row of P + M tokens holds at most what a padded slot does, so a
        pass needs no more memory than a padded micro-batch), else an eighth of the slots (at
        least 1), so that short sequences save passes."""
        if self.micro_batch_slots is not None:
            return min(self.micro_batch_slots, num_slots)
        return max(1, num_slots // 8)

    def for_minibatch(self, slots_per_minibatch: int) -> GRPOConfig:
        """This config as the update runs it on mini-batches of `slots_per_minibatch` slots: a
        `micro_batch_slots` of at least that many is one pass (padded: None; packed: passes of a
        whole mini-batch's rows). The update and the memory plan both read it."""
        if self.micro_batch_slots is None or self.micro_batch_slots < slots_per_minibatch:
            return self
        whole = slots_per_minibatch if self.pack_sequences else None
        return dataclasses.replace(self, micro_batch_slots=whole)

    def __post_init__(self):
        if not isinstance(self.num_minibatches, int) or self.num_minibatches < 1:
            raise ValueError(
                "num_minibatches must be a positive int, got "
                f"num_minibatches={self.num_minibatches!r}"
            )
        if self.aggregation not in losses.AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {losses.AGGREGATIONS}, got "
                f"aggregation={self.aggregation!r}"
            )
        if self.advantage_estimator not in losses.ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {losses.ADVANTAGE_ESTIMATORS}, got "
                f"advantage_estimator={self.advantage_estimator!r}"
            )
        if self.loss_signal not in losses.SIGNALS:
            raise ValueError(
                f"loss_signal must be one of {losses.SIGNALS}, got loss_signal={self.loss_signal!r}"
            )
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got kl_coef={self.kl_coef!r}")
        if not isinstance(self.pack_sequences, bool):
            raise ValueError(
                f"pack_sequences must be True or False, got pack_sequences={self.pack_sequences!r}"
            )
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got temperature={self.temperature!r}")
        for name in ("micro_batch_slots", "logprob_chunk_tokens"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"{name} must be None or a positive int, got {name}={value!r}")
