"""The rollout phase: `R = N * n_mean` completions of the planned slots, with log pi_old per token.

The controllers' plan maps the R slots to the N prompts (`plan.prompt_of_slot`); the KV-cache
sampler prefills each distinct prompt once and decodes every slot, `micro_batch_slots` slots at a
time when set. Rewards are scored afterwards by the run's reward phase, on the device or on the
host.

The trainer samples through a `RolloutEngine`: `KVCacheEngine` (the built-in sampler) by default,
`VLLMEngine` with `config.rollout.engine="vllm"`, or any object with the same two methods passed
to `build_run(config, rollout_engine=...)`, e.g. a client of an inference server that keeps its
own copy of the weights. `StepProgram.rollout_function` turns an engine and the prompt pool's
arrays into the step's rollout function: the built-in engine fused into one jit, another engine
called eagerly after its weights are synced, its log-probs then recomputed by the trainer in one
forward pass (`StepProgram.rescore`), as verl does: the engine's own stay as
`Rollouts.engine_logprobs`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from gdro_jax.controllers import Plan
from gdro_jax.sampling import BATCHING, LANE_HALVINGS, generate

ENGINES = ("kv_cache", "vllm")
LOGPROBS_FROM = ("trainer", "engine")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How a step samples its rollouts (`config.rollout`, but for its `vllm` block).

    Attributes:
      micro_batch_slots: rollout slots decoded at a time by kv_cache (KV cache size). None or 0
        means all R at once.
      batching: how kv_cache shares those decode slots among the R rollouts. continuous: a slot
        whose completion stops takes the next rollout at once, so the decode steps follow the
        tokens sampled (set micro_batch_slots below R for it to pay); static: chunks of
        micro_batch_slots, each decoded until its longest completion stops. The same completions
        up to float rounding.
      decode_window: the KV cache's block of completion slots, in tokens (0: automatic). Static
        batching: a decode step reads the blocks up to its own (its live positions rounded up to
        a window) instead of all P + M. Continuous: a step skips the blocks of the lanes' ring
        that no active lane has written into since it entered. Automatic: at least 128 tokens,
        at most 8 windows (one window, the whole cache, for M <= 128). The same completions up
        to float rounding (`sampling.window_ends`).
      lane_halvings: continuous batching: slot halvings once the queue is empty. The decode
        slots halve (at most this many times) whenever at most half are active; each halving is
        one more decode loop to compile.
      stop_check_every: kv_cache's decode steps per stop check. Its decode loop checks its
        stop condition (on a GPU: copied to the host and waited for) once per that many steps,
        and runs at most that many - 1 steps more, which change no output. The same completions.
      skip_dead_blocks: continuous batching skips the ring blocks no active lane wrote into;
        False reads every block, the dead ones masked, with none of the skipping's conds (a
        `lax.cond` per block and layer, with a queue or halved lanes: on a GPU each waits for
        its predicate on the host). The same completions up to float rounding.
      engine: kv_cache (the built-in sampler) or vllm (the vllm extra). vllm is `VLLMEngine`.
      greedy: decode greedily (argmax), log-probs under temperature 1. For checking one engine
        against another; needs grpo.temperature=1.
      logprobs_from: the behaviour policy of a vllm run: trainer or engine. "trainer" takes the
        trainer's log-probs of the sampled tokens (recomputed in one forward pass) as log pi_old;
        "engine" treats the samples as vLLM's and weights each token by the truncated importance
        ratio min(pi_trainer / pi_engine, tis_cap). The kv_cache engine is the trainer's policy.
      tis_cap: C, the truncation of the importance weights (vllm runs). The step's
        "rollout/is_weight_capped_fraction" counts the tokens whose ratio is above it.
    """

    micro_batch_slots: int | None = None
    batching: str = "continuous"
    decode_window: int = 0
    lane_halvings: int = LANE_HALVINGS
    stop_check_every: int = 1
    skip_dead_blocks: bool = True
    engine: str = "kv_cache"
    greedy: bool = False
    logprobs_from: str = "trainer"
    tis_cap: float = 2.0

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(
                f"engine must be one of {', '.join(ENGINES)}, got engine={self.engine!r}"
            )
        if self.batching not in BATCHING:
            raise ValueError(
                f"batching must be one of {', '.join(BATCHING)}, got batching={self.batching!r}"
            )
        if self.logprobs_from not in LOGPROBS_FROM:
            raise ValueError(
                f"logprobs_from must be one of {', '.join(LOGPROBS_FROM)}, got "
                f"logprobs_from={self.logprobs_from!r}"
            )
        for name, least, meaning in (
            ("decode_window", 0, " (0: automatic)"),
            ("lane_halvings", 0, ""),
            ("stop_check_every", 1, ""),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}{meaning}, got {name}={value!r}")
        for name in ("greedy", "skip_dead_blocks"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {name}={value!r}")
        if not float(self.tis_cap) >= 1:
            raise ValueError(f"tis_cap must be >= 1, got tis_cap={self.tis_cap!r}")


class Rollouts(NamedTuple):
    """The R sampled completions of one step, their sampling log-probs and rewards."""

    prompt_tokens: jax.Array  # [R, P] int32 each slot's prompt, left-padded
    prompt_lengths: jax.Array  # [R] int32
    tokens: jax.Array  # [R, M] int32 completion tokens (stop token included)
    lengths: jax.Array  # [R] int32 completion lengths
    logprobs: jax.Array  # [R, M] float32 log pi_old of each completion token, the trainer's
    rewards: jax.Array  # [R] float32
    correct: jax.Array  # [R] bool
    # [R, M] float32 the same log-probs under the engine that sampled the tokens: `logprobs`
    # itself for the built-in engine; vLLM's own, whose gap to the trainer's the update logs
    # (and corrects for with `rollout.logprobs_from="engine"`).
    engine_logprobs: jax.Array


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
    micro_batch_slots: int | None = None,
    batching: str = "continuous",
    decode_window: int = 0,
    lane_halvings: int = LANE_HALVINGS,
    stop_check_every: int = 1,
    skip_dead_blocks: bool = True,
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
      micro_batch_slots: decode the slots this many at a time (the KV cache then holds
        micro_batch_slots x (P + M) slots); None or 0: all R at once. Same completions either
        way, up to float rounding (see `gdro_jax.sampling.generate`).
      batching: continuous or static (`RolloutConfig.batching`).
      decode_window: the KV cache's decode window (`RolloutConfig.decode_window`).
      lane_halvings: continuous batching's halvings (`RolloutConfig.lane_halvings`).
      stop_check_every: decode steps per stop check (`RolloutConfig.stop_check_every`).
      skip_dead_blocks: continuous batching's per-block conds
        (`RolloutConfig.skip_dead_blocks`).

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
        micro_batch_slots=micro_batch_slots,
        batching=batching,
        decode_window=decode_window,
        lane_halvings=lane_halvings,
        stop_check_every=stop_check_every,
        skip_dead_blocks=skip_dead_blocks,
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
        engine_logprobs=result.logprobs,
    )


class RolloutEngine(Protocol):
    """What the trainer calls to sample a step's rollouts (`build_run(..., rollout_engine=)`).

    `generate` returns the `Rollouts` of the plan's R slots (rewards 0: the run's reward phase
    scores them) with `logprobs` = log pi_old of each completion token under the sampling
    temperature, which the clipped ratio divides by. `sync_weights` receives the trainer's
    parameters after every update (and before the first rollout, or after a resume), for an
    engine that keeps its own copy of the weights (an inference server); an engine that reads
    `params` at every `generate` call has nothing to do there.

    The built-in `KVCacheEngine` is fused into the trainer's jitted rollout phase; an engine
    passed to `build_run` is called outside jit, with device arrays, and its outputs are placed
    on the mesh's batch axes.
    """

    def generate(
        self,
        params: nnx.State,
        plan: Plan,
        prompt_tokens_NP: jax.Array,
        prompt_lengths_N: jax.Array,
        key: jax.Array,
    ) -> Rollouts:
        """Completions of the R slots `plan.prompt_of_slot` of the N right-padded prompts."""
        ...

    def sync_weights(self, params: nnx.State) -> None:
        """Takes the trainer's new parameters (the policy the next `generate` must sample)."""
        ...


class KVCacheEngine:
    """The built-in `RolloutEngine`: the jitted KV-cache sampler on the trainer's own parameters.

    Args:
      graphdef: the policy's static graph (`build_run`'s `run.program.graphdef`).
      max_new_tokens: M.
      temperature: sampling temperature.
      eos_ids: stop ids.
      micro_batch_slots: slots decoded at a time (`config.rollout.micro_batch_slots`); None or 0:
        all R at once.
      batching: continuous or static (`config.rollout.batching`).
      decode_window: the KV cache's decode window (`config.rollout.decode_window`).
      lane_halvings: continuous batching's halvings (`config.rollout.lane_halvings`).
      stop_check_every: decode steps per stop check (`config.rollout.stop_check_every`).
      skip_dead_blocks: continuous batching's per-block conds
        (`config.rollout.skip_dead_blocks`).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        *,
        max_new_tokens: int,
        temperature: float,
        eos_ids: tuple[int, ...],
        micro_batch_slots: int | None = None,
        batching: str = "continuous",
        decode_window: int = 0,
        lane_halvings: int = LANE_HALVINGS,
        stop_check_every: int = 1,
        skip_dead_blocks: bool = True,
    ):
        self.graphdef = graphdef
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.eos_ids = tuple(eos_ids)
        self.micro_batch_slots = micro_batch_slots
        self.batching = batching
        self.decode_window = decode_window
        self.lane_halvings = lane_halvings
        self.stop_check_every = stop_check_every
        self.skip_dead_blocks = skip_dead_blocks

    def generate(self, params, plan, prompt_tokens_NP, prompt_lengths_N, key) -> Rollouts:
        """`sample_rollouts` with this engine's settings (pure JAX: traceable inside jit)."""
        return sample_rollouts(
            self.graphdef,
            params,
            plan,
            prompt_tokens_NP,
            prompt_lengths_N,
            key,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            eos_ids=self.eos_ids,
            micro_batch_slots=self.micro_batch_slots,
            batching=self.batching,
            decode_window=self.decode_window,
            lane_halvings=self.lane_halvings,
            stop_check_every=self.stop_check_every,
            skip_dead_blocks=self.skip_dead_blocks,
        )

    def sync_weights(self, params: nnx.State) -> None:
        """Nothing to do: `generate` samples with the parameters it is called with."""
        del params


class WeightSync:
    """Calls `engine.sync_weights(params)` when `params` are not the ones it last sent."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self.sent: nnx.State | None = None

    def __call__(self, params: nnx.State) -> None:
        if params is not self.sent:
            self.engine.sync_weights(params)
            self.sent = params

    def after(self, update):
        """`update` (state, ...) -> (state, metrics), then a sync of the new parameters."""

        def update_then_sync(state, *args):
            state, metrics = update(state, *args)
            self(state.params)
            return state, metrics

        return update_then_sync
