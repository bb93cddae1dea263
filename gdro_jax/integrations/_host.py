"""The controllers behind numpy calls, one per decision per step, for trainers outside JAX.

A trainer in PyTorch (verl, TRL, OpenRLHF) makes a step's decisions in different places: its
sampler picks the batch, its rollout code draws `n` completions per prompt, its reward code scores
them and its advantage estimator weighs them. `HostControllers` answers each of those places
with one call that takes and returns numpy arrays:

    ids  = host.select_prompts(candidates)     # the batch (MoPPS and `resample` draw it)
    n    = host.allocate(ids)                  # rollouts per prompt (Rollout-GDRO, Knapsack-RL)
    w    = host.multipliers(ids_of_rollouts)   # Prompt-GDRO's advantage multipliers, by id
    host.observe(ids, rewards)                 # the step's rewards: every state transition

Underneath, the step's first call runs the composed decisions' `plan` once, jitted, from the
state after the previous `observe` and the key `fold_in(key(seed), step)`; the other calls of the
step read that plan. `observe` runs the jitted `update` and starts the next step. So a loop of
these calls makes exactly the decisions of `adversary.plan` and `adversary.update` called
directly with those keys (`tests/integrations/test_host.py`).

The state goes to and from bytes (`to_bytes`, `from_bytes`), for a trainer's own checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import serialization
from jax.typing import ArrayLike

from gdro_jax.controllers import GDROState, MultiAdversary, Plan

FORMAT = "gdro_jax.host/1"  # what `to_bytes` writes first; `from_bytes` refuses anything else


class HostControllers:
    """A method's composed decisions (`controllers.multi_adversary`) as numpy calls.

    Args:
      adversary: the decisions, e.g. `multi_adversary(passk_classifier(D), prompt_gdro())`.
      seed: the key of step `t` is `jax.random.fold_in(jax.random.key(seed), t)`.
      success_threshold: a rollout counts as correct when its reward is above this (the
        classifier's pass@k and MoPPS's posteriors count correct rollouts). 0.5 suits rewards in
        {0, 1} and in {-1, 1}.

    A step's decisions are fixed by its first call: `select_prompts(candidates)` (the batch is
    drawn from the candidates' number when the method draws prompts, else it is the
    candidates), or `allocate(ids)`, `multipliers(ids)` or `plan(ids)` with the batch's ids.
    `observe(ids, rewards)` ends the step.
    """

    def __init__(self, adversary: MultiAdversary, *, seed: int = 0, success_threshold: float = 0.5):
        if not isinstance(adversary, MultiAdversary):
            raise TypeError(
                "adversary must be a controllers.MultiAdversary (from multi_adversary), "
                f"got {type(adversary).__name__}"
            )
        if adversary.group_filter is not None:
            raise ValueError(
                "a group filter (dynamic sampling) keeps groups of rollouts across rounds, which "
                "the host API never holds: run it in gdro_jax's own trainer"
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an int, got seed={seed!r}")
        if not np.isfinite(success_threshold):
            raise ValueError(
                f"success_threshold must be finite, got success_threshold={success_threshold!r}"
            )
        self._adversary = adversary
        self._success_threshold = float(success_threshold)
        self._seed = int(seed)
        self._state: GDROState = adversary.init()
        self._num_prompts = int(self._state.classifier.visits.shape[0])
        self._step = 0
        self._compile()
        self._host_plan: Plan | None = None  # the step's plan, as numpy arrays
        self._selected = False  # select_prompts already drew this step's batch

    def _compile(self) -> None:
        adversary, base_key = self._adversary, jax.random.key(self._seed)

        def plan(state: GDROState, prompt_ids: jax.Array, step: jax.Array) -> Plan:
            return adversary.plan(state, prompt_ids, jax.random.fold_in(base_key, step))

        self._plan_fn = jax.jit(plan)
        self._update_fn = jax.jit(adversary.update)

    # -- what a trainer reads ------------------------------------------------------------------

    @property
    def adversary(self) -> MultiAdversary:
        return self._adversary

    @property
    def step(self) -> int:
        """Steps observed so far (the next `observe` ends step `step`)."""
        return self._step

    @property
    def state(self) -> GDROState:
        """The controllers' state after the last `observe` (device arrays)."""
        return self._state

    @property
    def batch(self) -> np.ndarray | None:
        """This step's batch of prompt ids once a call made its plan; None before."""
        return None if self._host_plan is None else self._host_plan.prompt_ids.copy()

    @property
    def num_prompts(self) -> int:
        """D: the prompts the classifier tracks, ids `0..D-1`."""
        return self._num_prompts

    # -- one call per decision ----------------------------------------------------------------

    def select_prompts(self, candidates: ArrayLike) -> np.ndarray:
        """This step's batch: int32 `[N]` prompt ids.

        Args:
          candidates: int `[N]` ids. A method that draws its prompts (MoPPS, Prompt-GDRO's
            `resample`) draws N of the pool's and uses these only for their number; any other
            returns them (GRPO's batch is the data's).

        Raises:
          RuntimeError: when this step's batch was already selected and not yet observed.
        """
        if self._selected:
            raise RuntimeError(
                f"select_prompts was already called at step {self._step}: observe(...) that "
                "batch's rewards before selecting the next one"
            )
        plan = self.plan(candidates)
        self._selected = True
        return plan.prompt_ids.copy()

    def plan(self, prompt_ids: ArrayLike | None = None) -> Plan:
        """Every decision of this step as numpy arrays (a `controllers.Plan`): bins, p_hat,
        rollouts per prompt, multipliers, and the batch's ids.

        The first call of a step makes the plan from `prompt_ids` (the batch, or a drawing
        method's candidates); later calls of the step return it, and `prompt_ids`, if given,
        must be its batch.
        """
        if self._host_plan is None:
            if prompt_ids is None:
                raise ValueError(
                    f"step {self._step} has no plan yet: pass the batch's prompt_ids (or "
                    "select_prompts(candidates) first)"
                )
            ids = self._ids("prompt_ids", prompt_ids, check_range=not self._adversary.draws_prompts)
            plan = self._plan_fn(self._state, ids, np.int32(self._step))
            self._host_plan = jax.tree.map(np.asarray, jax.device_get(plan))
        elif prompt_ids is not None:
            self._check_batch("plan", prompt_ids)
        return self._host_plan

    def allocate(self, prompt_ids: ArrayLike) -> np.ndarray:
        """int32 `[N]` rollouts for each of the batch's prompts, in the batch's order; they sum
        to `N * n_mean` (`n_mean` each without a rollout allocation)."""
        self._check_batch("allocate", prompt_ids)
        return self._host_plan.num_rollouts.copy()

    def multipliers(self, prompt_ids: ArrayLike) -> np.ndarray:
        """float32 advantage multipliers of Prompt-GDRO's `reweight` realisation, one per id
        given (ones without it).

        The ids may be any of the batch's, in any order and repeated: one per rollout is how an
        advantage estimator asks (a prompt's multiplier depends only on its bin). The first call
        of a step takes them as the batch.
        """
        if self._host_plan is None:
            self._check_batch("multipliers", prompt_ids)  # the first call: these are the batch
        ids, plan = self._ids("prompt_ids", prompt_ids), self._host_plan
        batch_ids, weights = plan.prompt_ids, plan.advantage_weights
        order = np.argsort(batch_ids, kind="stable")
        sorted_ids = batch_ids[order]
        where = np.searchsorted(sorted_ids, ids)
        found = (where < sorted_ids.size) & (
            sorted_ids[np.minimum(where, sorted_ids.size - 1)] == ids
        )
        if not found.all():
            missing = ids[~found][:5].tolist()
            raise ValueError(
                f"multipliers: prompt ids {missing} are not in step {self._step}'s batch"
            )
        return weights[order[where]].astype(np.float32)

    def observe(
        self,
        prompt_ids: ArrayLike,
        rewards: ArrayLike,
        *,
        num_rollouts: ArrayLike | None = None,
        losses: ArrayLike | None = None,
    ) -> None:
        """The step's rewards: updates the classifier and every part, and starts the next step.

        Args:
          prompt_ids: int `[N]` the batch, in its order.
          rewards: float `[R]` one per rollout, the batch's prompts' groups one after another.
          num_rollouts: int `[N]` each prompt's group size; default the plan's allocation. Give
            it when the trainer drew other counts (a prompt whose rollouts all failed to run: 0).
          losses: float `[N]` the per-prompt loss signal the adversaries score bins with;
            default each group's failure rate, `1 - correct / rollouts`.
        """
        plan = self._check_batch("observe", prompt_ids)
        ids = plan.prompt_ids
        rewards = np.asarray(rewards, dtype=np.float64)
        if rewards.ndim != 1:
            raise ValueError(f"rewards must be 1-D, one per rollout, got shape {rewards.shape}")
        if not np.isfinite(rewards).all():
            raise ValueError("rewards must be finite")
        if num_rollouts is None:
            counts = plan.num_rollouts.astype(np.int64)
        else:
            counts = np.asarray(num_rollouts)
            if counts.shape != ids.shape or not np.issubdtype(counts.dtype, np.integer):
                raise ValueError(
                    f"num_rollouts must be int [{ids.size}], got {counts.dtype} {counts.shape}"
                )
            if (counts < 0).any():
                raise ValueError("num_rollouts must be >= 0")
        if int(counts.sum()) != rewards.size:
            raise ValueError(
                f"rewards has {rewards.size} entries; the groups' num_rollouts sum to "
                f"{int(counts.sum())}"
            )
        group = np.repeat(np.arange(ids.size), counts)
        correct = np.bincount(
            group, weights=rewards > self._success_threshold, minlength=ids.size
        ).astype(np.int32)
        valid = counts > 0
        if losses is None:
            signal = np.where(valid, 1.0 - correct / np.maximum(counts, 1), 0.0)
        else:
            signal = np.asarray(losses, dtype=np.float64)
            if signal.shape != ids.shape or not np.isfinite(signal).all():
                raise ValueError(f"losses must be finite float [{ids.size}], got {signal.shape}")
        # numpy arguments go to the device with the jitted call itself (no dispatch each).
        self._state = self._update_fn(
            self._state,
            plan._replace(num_rollouts=counts.astype(np.int32)),
            ids,
            num_correct=correct,
            losses=signal.astype(np.float32),
            valid=valid,
        )
        self._step += 1
        self._host_plan = None
        self._selected = False

    # -- bytes ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The state, the step and the seed as msgpack bytes (a step's plan is not kept: it is
        made again, identically, from them)."""
        payload = {
            "format": FORMAT,
            "seed": self._seed,
            "step": self._step,
            "state": serialization.to_state_dict(jax.device_get(self._state)),
        }
        return serialization.msgpack_serialize(payload)

    def load_bytes(self, data: bytes) -> None:
        """Replaces the state, step and seed with those `to_bytes` wrote (for this adversary).

        Raises:
          ValueError: naming what differs when the bytes are not such a state, or a state of
            other shapes (another dataset size, number of bins or parts).
        """
        try:
            payload = serialization.msgpack_restore(bytes(data))
        except Exception as error:  # msgpack's own errors name no field
            raise ValueError(f"not a gdro_jax controllers state: {error}") from None
        if not isinstance(payload, Mapping) or payload.get("format") != FORMAT:
            found = payload.get("format") if isinstance(payload, Mapping) else type(payload)
            raise ValueError(f"not a gdro_jax controllers state: format {found!r}, not {FORMAT!r}")
        abstract = jax.eval_shape(self._adversary.init)  # shapes and dtypes, no arrays
        _check_like(serialization.to_state_dict(abstract), payload["state"], "state")
        state = serialization.from_state_dict(abstract, payload["state"])
        self._state = jax.device_put(state)
        self._step = int(payload["step"])
        if int(payload["seed"]) != self._seed:
            self._seed = int(payload["seed"])
            self._compile()
        self._host_plan = None
        self._selected = False

    @classmethod
    def from_bytes(
        cls, adversary: MultiAdversary, data: bytes, *, success_threshold: float = 0.5
    ) -> HostControllers:
        """A `HostControllers` resumed from `to_bytes`'s output (its seed and step included)."""
        host = cls(adversary, success_threshold=success_threshold)
        host.load_bytes(data)
        return host

    # -- checks --------------------------------------------------------------------------------

    def _ids(self, name: str, value: ArrayLike, *, check_range: bool = True) -> np.ndarray:
        ids = np.asarray(value)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"{name} must be a non-empty 1-D integer array, got {ids.dtype} {ids.shape}"
            )
        if check_range and ((ids < 0).any() or (ids >= self._num_prompts).any()):
            bad = ids[(ids < 0) | (ids >= self._num_prompts)][:5].tolist()
            raise ValueError(
                f"{name} holds ids {bad} outside [0, {self._num_prompts}), the classifier's prompts"
            )
        return ids.astype(np.int32)

    def _check_batch(self, caller: str, prompt_ids: ArrayLike) -> Plan:
        """The step's plan (made from `prompt_ids` if none yet); they must be its batch."""
        ids = self._ids("prompt_ids", prompt_ids)
        if self._host_plan is None:
            if self._adversary.draws_prompts:
                raise ValueError(
                    f"{caller}: this method draws its own batch: call "
                    f"select_prompts(candidates) first at step {self._step}"
                )
            self.plan(ids)
        if not np.array_equal(ids, self._host_plan.prompt_ids):
            raise ValueError(
                f"{caller}: prompt_ids are not step {self._step}'s batch, in its order "
                f"(got {ids[:8].tolist()}..., the batch is "
                f"{self._host_plan.prompt_ids[:8].tolist()}...)"
            )
        return self._host_plan


def _check_like(template: Any, loaded: Any, path: str) -> None:
    """Raises a ValueError naming the first field where `loaded` differs from `template` in
    structure, shape or dtype."""
    if isinstance(template, Mapping):
        if not isinstance(loaded, Mapping) or set(template) != set(loaded):
            have = sorted(loaded) if isinstance(loaded, Mapping) else type(loaded).__name__
            raise ValueError(
                f"{path}: the saved state holds {have}, this adversary's {sorted(template)}"
            )
        for key in template:
            _check_like(template[key], loaded[key], f"{path}.{key}")
    elif template is None:
        if loaded is not None:
            raise ValueError(f"{path}: the saved state has a part this adversary does not")
    else:
        if loaded is None:
            raise ValueError(f"{path}: this adversary has a part the saved state does not")
        got = np.asarray(loaded)
        if tuple(template.shape) != got.shape or np.dtype(template.dtype) != got.dtype:
            raise ValueError(
                f"{path}: saved {got.dtype}{list(got.shape)}, this adversary's "
                f"{np.dtype(template.dtype)}{list(template.shape)}"
            )
