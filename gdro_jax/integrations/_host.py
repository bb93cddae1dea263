"""The controllers behind numpy calls, one per decision per step, for trainers outside JAX.

A trainer in PyTorch (verl, TRL, OpenRLHF) makes a step's decisions in different places: its
sampler picks the batch, its rollout code draws `n` completions per prompt, its reward code scores
them and its advantage estimator weighs them. `HostControllers` answers each of those places
with one call that takes and returns numpy arrays:

    ids  = host.select_prompts(candidates)     # the batch (MoPPS and `resample` draw it)
    n    = host.allocate(ids)                  # rollouts per prompt (Rollout-GDRO, Knapsack-RL)
    w    = host.multipliers(ids_of_rollouts)   # Prompt-GDRO's advantage multipliers, by id
    host.observe(ids_of_rollouts, rewards)     # one id per reward: every state transition

Underneath, the step's first call runs the composed decisions' `plan` once, jitted, from the
state after the previous `observe` and the key `fold_in(key(seed), step)`; the other calls of the
step read that plan. `observe` groups the rewards by their prompt ids, checks each prompt's count
against what the step handed out, runs the jitted `update` and starts the next step. So a loop
of these calls makes exactly the decisions of `adversary.plan` and `adversary.update` called
directly with those keys (`tests/integrations/test_host.py`).

`HostControllers.for_method(name, ...)` builds any method of `controllers.METHODS` from its
config blocks, and refuses one the trainer cannot express. The state goes to and from bytes
(`to_bytes`, `load_bytes`, `from_bytes`) for a trainer's own checkpoints, with the settings it was
made with: a restore under other settings is refused, naming each field that differs.

Every misuse is refused before anything changes: a refused call leaves the state as it was.
"""

from __future__ import annotations

import inspect
import typing
import warnings
from collections.abc import Collection, Mapping
from typing import Any

import jax
import numpy as np
from jax.typing import ArrayLike

from gdro_jax import controllers
from gdro_jax.controllers import GDROState, MultiAdversary, Plan
from gdro_jax.integrations import _msgpack

FORMAT = "gdro_jax.host/2"  # what `to_bytes` writes first; `load_bytes` refuses anything else
# Bytes written before the settings were saved: they still load, their shapes checked, with a
# warning that the settings could not be compared.
UNCHECKED_FORMAT = "gdro_jax.host/1"

# What a trainer may be able to do that a method needs (`for_method(..., trainer_can=...)`).
# "per_prompt_rollouts": it draws each prompt's own number of rollouts (`allocate`'s counts), as
# a rollout allocation (Rollout-GDRO, Knapsack-RL, VIP) needs; verl's `rollout.n` and TRL's
# `num_generations` are one number. A group filter (DAPO's dynamic sampling, Pilot-Commit) is
# not an ability a trainer can grant: the host API makes one plan and one update a step and
# never holds a round's groups, so those methods are always refused here.
TRAINER_ABILITIES = ("per_prompt_rollouts",)

# decision -> the `MultiAdversary` field holding its part.
_FIELD_OF = {
    "prompt_sampler": "prompt_sampler",
    "rollout_allocation": "rollout_allocator",
    "prompt_adversary": "prompt_adversary",
    "group_filter": "group_filter",
}


class HostControllers:
    """A method's composed decisions (`controllers.multi_adversary`) as numpy calls.

    Args:
      adversary: the decisions, e.g. `multi_adversary(passk_classifier(D), prompt_gdro())`, one
        part per decision. `HostControllers.for_method` builds one from a method's name.
      seed: the key of step `t` is `jax.random.fold_in(jax.random.key(seed), t)`.
      success_threshold: a rollout counts as correct when its reward is above this (the
        classifier's pass@k and MoPPS's posteriors count correct rollouts). 0.5 suits rewards in
        {0, 1} and in {-1, 1}.

    A step's decisions are fixed by its first call: `select_prompts(candidates)` (the batch is
    drawn from the candidates' number when the method draws prompts, else it is the
    candidates), or `allocate(ids)`, `multipliers(ids)` or `plan(ids)` with the batch's ids.
    `observe(ids_of_rollouts, rewards)` ends the step.
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
        for decision, field in _FIELD_OF.items():
            if isinstance(getattr(adversary, field), Mapping):
                raise ValueError(
                    f"the host API runs one part per decision; {decision} holds the alternatives "
                    f"{sorted(getattr(adversary, field))} (the simulator's): compose one part"
                )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an int, got seed={seed!r}")
        if isinstance(success_threshold, bool) or not np.isfinite(success_threshold):
            raise ValueError(
                f"success_threshold must be finite, got success_threshold={success_threshold!r}"
            )
        self._adversary = adversary
        self._success_threshold = float(success_threshold)
        self._seed = int(seed)
        self._state: GDROState = adversary.init()
        self._num_prompts = int(self._state.classifier.visits.shape[0])
        self._settings = _settings_of(adversary, self._num_prompts, self._success_threshold)
        self._step = 0
        self._compile()
        self._host_plan: Plan | None = None  # the step's plan, as numpy arrays
        self._selected = False  # select_prompts already drew this step's batch
        self._allocated = False  # allocate handed out this step's counts
        self._observed: int | None = None  # the step the last observe ended (None: none since)

    @classmethod
    def for_method(
        cls,
        method: str,
        *,
        num_prompts: int,
        trainer_can: Collection[str] = (),
        n_mean: int = 4,
        reward_values: tuple[float, float] = (0.0, 1.0),
        prompt_features: ArrayLike | None = None,
        seed: int = 0,
        success_threshold: float = 0.5,
        **blocks: Mapping[str, Any],
    ) -> HostControllers:
        """The controllers of `controllers.METHODS[method]`, built from its config blocks.

        Args:
          method: a name of `controllers.METHODS` ("grpo", "prompt_gdro", "gdro_both", ...).
          num_prompts: D, the prompts of the pool (ids `0..D-1`).
          trainer_can: what the trainer can do of `TRAINER_ABILITIES`: `{"per_prompt_rollouts"}`
            when it draws each prompt's own number of rollouts. A method that needs what the
            trainer cannot do is refused.
          n_mean: rollouts per prompt on average (`num_generations`, `rollout.n`).
          reward_values: the (wrong, correct) rewards (Rollout-GDRO's proxies scale with them).
          prompt_features: float `[D, F]` the prompts' features, for VIP; None: none.
          seed, success_threshold: as for `HostControllers`.
          **blocks: the config blocks, by name, as a run config holds them: `classifier=` (the
            `passk_classifier` fields: `k`, `edges`, `window`, ...) and one per part the method
            names (`prompt_gdro={"eta": 0.3}`, `rollout_gdro=...`), each a dict or an
            ml_collections ConfigDict of overrides; a field left out takes its factory's
            default, as a run config's does.

        Returns:
          A `HostControllers` whose settings (`settings`) hold the method's name and every field
          of its blocks, defaults included, so a restore under other settings is refused.

        Raises:
          ValueError: naming the method and what the trainer lacks when it cannot express the
            method; an unknown method (listing the known ones); a block the method does not
            have; a field its block does not have, or a value its factory refuses
            (`prompt_gdro.eta ...`).
        """
        record = controllers.get_method(method)
        for name, value in (("num_prompts", num_prompts), ("n_mean", n_mean)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
        abilities = _abilities(trainer_can)
        _check_expressible(record, abilities)
        known = ["classifier", *record.parts().values()]
        extra = sorted(set(blocks) - set(known))
        if extra:
            raise ValueError(f"method {method!r} has no block {extra[0]!r}: its blocks are {known}")
        classifier_block = _block("classifier", blocks.get("classifier"))
        bins_from = classifier_block.pop("bins_from", "prompt")
        if bins_from != "prompt":
            raise ValueError(
                'the host API bins each prompt by its own history (bins_from="prompt"); the '
                "released code's lagged bins need a fixed batch size: run them in gdro_jax's "
                f"trainer, got classifier.bins_from={bins_from!r}"
            )
        run_level = {
            "num_prompts": num_prompts,
            "n_mean": n_mean,
            "reward_values": tuple(reward_values),
            "prompt_features": prompt_features,
        }
        settings = {"method": method, "classifier.bins_from": bins_from}
        classifier = _build(
            "classifier",
            controllers.passk_classifier,
            classifier_block,
            {"num_prompts": num_prompts},
            settings,
        )
        run_level["num_bins"] = classifier.num_bins
        parts = {
            decision: _build(
                name,
                controllers.PARTS[decision][name],
                _block(name, blocks.get(name)),
                run_level,
                settings,
            )
            for decision, name in record.parts().items()
        }
        try:
            adversary = controllers.multi_adversary(
                classifier,
                parts.get("prompt_adversary"),
                parts.get("rollout_allocation"),
                sampler=parts.get("prompt_sampler"),
                n_mean=n_mean,
            )
        except ValueError as error:
            raise ValueError(f"method {method!r}: {error}") from None
        host = cls(adversary, seed=seed, success_threshold=success_threshold)
        host._settings.update(_plain(settings))
        return host

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

    @property
    def settings(self) -> dict[str, Any]:
        """What the controllers were made with, by field (`"classifier.k"`, `"prompt_gdro.eta"`,
        `"method"`, `"num_prompts"`, ...), as `to_bytes` saves it and a restore compares it.
        Read off the adversary's parts; `for_method` adds every field of its blocks."""
        return dict(self._settings)

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
        must be its batch. Reading `num_rollouts` here hands nothing out: a trainer that draws
        those counts takes them from `allocate`.
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
        to `N * n_mean` (`n_mean` each without a rollout allocation). From this call on,
        `observe` expects these counts; without it, `n_mean` for every prompt."""
        self._check_batch("allocate", prompt_ids)
        self._allocated = True
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
        rollout_losses: ArrayLike | None = None,
    ) -> None:
        """The step's rewards: updates the classifier and every part, and starts the next step.

        Each reward comes with the id of the prompt it answers, so the rows may arrive in any
        order: the rewards are grouped by id, never by position. Each prompt of the batch must
        have exactly the rollouts the step handed out: `allocate`'s count when it was called
        this step, else `n_mean` (the trainer's one number of rollouts per prompt).

        A prompt drawn twice into one batch (Prompt-GDRO's `resample` draws with replacement)
        has its rewards pooled, and its correct rollouts split between its places in the batch
        in proportion to their counts, so the result does not depend on the rows' order.

        Args:
          prompt_ids: int `[R]` the prompt id of each rollout, one per reward.
          rewards: float `[R]` one per rollout; a reward above `success_threshold` is correct.
          rollout_losses: float `[R]` a loss of each rollout, whose mean over a prompt's
            rollouts is the signal the adversaries score its bin with; default each prompt's
            failure rate, `1 - correct / rollouts`.

        Raises:
          ValueError: when the step has no batch yet or was already observed, an id was not
            selected this step, or a prompt's count of rewards is not the one handed out
            (naming the prompt id, the count seen and the count expected). The state is then
            left as it was.
        """
        plan = self._host_plan
        if plan is None:
            if self._observed is not None and self._observed == self._step - 1:
                raise ValueError(
                    f"observe: step {self._observed}'s rewards were already observed; observing "
                    "them again would count them twice. Start the next step with "
                    "select_prompts(candidates) (or allocate, multipliers or plan with its batch)"
                )
            raise ValueError(
                f"observe: step {self._step} has no batch yet: call select_prompts(candidates) "
                "(or allocate, multipliers or plan with the batch's ids) before its rewards"
            )
        rewards = np.asarray(rewards, dtype=np.float64)
        ids = np.asarray(prompt_ids)
        if (
            rewards.ndim != 1
            or ids.shape != rewards.shape
            or (ids.size and not np.issubdtype(ids.dtype, np.integer))
        ):
            raise ValueError(
                "observe takes one prompt id per reward (int [R] and float [R], R the rollouts), "
                f"got prompt_ids {ids.dtype} {ids.shape} and rewards {rewards.shape}: pass each "
                "rollout's prompt id (np.repeat(ids, counts) when the rows come grouped in the "
                "batch's order)"
            )
        if not np.isfinite(rewards).all():
            raise ValueError("observe: rewards must be finite")
        ids = ids.astype(np.int64)
        batch = plan.prompt_ids
        unique_U, place_N = np.unique(batch, return_inverse=True)
        place_N = place_N.reshape(-1)
        if self._allocated:
            expected_N, source = plan.num_rollouts.astype(np.int64), "what allocate handed out"
        else:
            n_mean = self._adversary.n_mean
            expected_N = np.full(batch.shape, n_mean, np.int64)
            source = f"n_mean={n_mean} a prompt, as allocate was not called this step"
        expected_U = np.zeros(unique_U.size, np.int64)
        np.add.at(expected_U, place_N, expected_N)
        slot_R = np.minimum(np.searchsorted(unique_U, ids), unique_U.size - 1)
        selected_R = unique_U[slot_R] == ids
        if not selected_R.all():
            stray = np.unique(ids[~selected_R])
            raise ValueError(
                f"observe: prompt ids {stray[:5].tolist()} were not selected at step "
                f"{self._step} (its batch: {batch[:8].tolist()}"
                f"{'...' if batch.size > 8 else ''})"
            )
        seen_U = np.bincount(slot_R, minlength=unique_U.size)
        wrong = np.flatnonzero(seen_U != expected_U)
        if wrong.size:
            counts = "; ".join(
                f"prompt id {unique_U[u]} has {seen_U[u]} rewards, expected {expected_U[u]}"
                for u in wrong[:5]
            )
            raise ValueError(f"observe at step {self._step}: {counts} ({source})")
        correct_U = np.bincount(
            slot_R, weights=rewards > self._success_threshold, minlength=unique_U.size
        ).astype(np.int64)
        correct_N = _split(correct_U, place_N, expected_N)
        valid = expected_N > 0
        if rollout_losses is None:
            signal = np.where(valid, 1.0 - correct_N / np.maximum(expected_N, 1), 0.0)
        else:
            losses_R = np.asarray(rollout_losses, dtype=np.float64)
            if losses_R.shape != rewards.shape or not np.isfinite(losses_R).all():
                raise ValueError(
                    f"observe: rollout_losses must be finite float [{rewards.size}], one per "
                    f"reward, got shape {losses_R.shape}"
                )
            mean_U = np.bincount(slot_R, weights=losses_R, minlength=unique_U.size)
            mean_U = mean_U / np.maximum(seen_U, 1)
            signal = np.where(valid, mean_U[place_N], 0.0)
        # numpy arguments go to the device with the jitted call itself (no dispatch each).
        self._state = self._update_fn(
            self._state,
            plan._replace(num_rollouts=expected_N.astype(np.int32)),
            batch,
            num_correct=correct_N.astype(np.int32),
            losses=signal.astype(np.float32),
            valid=valid,
        )
        self._observed = self._step
        self._step += 1
        self._host_plan = None
        self._selected = False
        self._allocated = False

    # -- bytes ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The state, the step, the seed and the settings as msgpack bytes (a step's plan is not
        kept: it is made again, identically, from them)."""
        payload = {
            "format": FORMAT,
            "seed": self._seed,
            "step": self._step,
            "settings": self._settings,
            "state": _msgpack.state_dict(jax.device_get(self._state)),
        }
        return _msgpack.dumps(payload)

    def load_bytes(self, data: bytes) -> None:
        """Replaces the state, step and seed with those `to_bytes` wrote (for this adversary).

        The saved settings are compared with these controllers' own, field by field where both
        record the field (an adversary composed by hand does not know its classifier's `k`;
        `for_method` records every field). Bytes written before settings were saved
        (`UNCHECKED_FORMAT`) still load, their shapes checked, with a warning.

        Raises:
          ValueError: naming every setting that differs (its saved value and this one's), or
            what differs when the bytes are not such a state, or a state of other shapes
            (another dataset size, number of bins or parts). The state is then left as it was.
        """
        try:
            payload = _msgpack.loads(bytes(data))
        except Exception as error:  # msgpack's own errors name no field
            raise ValueError(f"not a gdro_jax controllers state: {error}") from None
        found = payload.get("format") if isinstance(payload, Mapping) else type(payload)
        if found not in (FORMAT, UNCHECKED_FORMAT):
            raise ValueError(f"not a gdro_jax controllers state: format {found!r}, not {FORMAT!r}")
        if found == FORMAT:
            _check_settings(payload.get("settings"), self._settings)
        else:
            warnings.warn(
                f"these controllers' bytes ({UNCHECKED_FORMAT}) were written before the settings "
                "were saved: only the state's shapes could be checked, not the hyperparameters "
                "(classifier.k, prompt_gdro.eta, ...); save them again to record them",
                stacklevel=2,
            )
        abstract = jax.eval_shape(self._adversary.init)  # shapes and dtypes, no arrays
        _check_like(_msgpack.state_dict(abstract), payload["state"], "state")
        state = _msgpack.from_state_dict(abstract, payload["state"])
        self._state = jax.device_put(state)
        self._step = int(payload["step"])
        if int(payload["seed"]) != self._seed:
            self._seed = int(payload["seed"])
            self._compile()
        self._host_plan = None
        self._selected = False
        self._allocated = False
        self._observed = None

    @classmethod
    def from_bytes(
        cls, adversary: MultiAdversary, data: bytes, *, success_threshold: float = 0.5
    ) -> HostControllers:
        """A `HostControllers` resumed from `to_bytes`'s output (its seed and step included).
        Controllers made by `for_method` resume with `for_method(...)` then `load_bytes`, which
        compares every field of their blocks."""
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


def _split(correct_U: np.ndarray, place_N: np.ndarray, counts_N: np.ndarray) -> np.ndarray:
    """Each batch place's share of its prompt's correct rollouts, in proportion to its count.

    A prompt held at several places of the batch (`place_N` equal) has `correct_U` correct out
    of the places' summed counts; place `i` gets `floor(C * (S_i + n_i) / n) - floor(C * S_i /
    n)`, `S_i` the counts of the prompt's places before it. The shares sum to `C`, each lies in
    `[0, n_i]`, and a prompt held once gets all of `C`.
    """
    order = np.argsort(place_N, kind="stable")
    counts_sorted = counts_N[order]
    before = np.cumsum(counts_sorted) - counts_sorted  # counts of all earlier places
    first = np.searchsorted(place_N[order], place_N[order], side="left")
    before = before - before[first]  # ... of the same prompt only
    prior_N = np.empty_like(before)
    prior_N[order] = before
    total_N = np.zeros(correct_U.size, np.int64)
    np.add.at(total_N, place_N, counts_N)
    total_N, correct_N = np.maximum(total_N[place_N], 1), correct_U[place_N]
    return (correct_N * (prior_N + counts_N)) // total_N - (correct_N * prior_N) // total_N


# -- methods and settings ------------------------------------------------------------------------


def _abilities(trainer_can: Collection[str]) -> frozenset[str]:
    if isinstance(trainer_can, str):  # one name, not its letters
        trainer_can = (trainer_can,)
    abilities = frozenset(trainer_can)
    unknown = sorted(abilities - set(TRAINER_ABILITIES))
    if unknown:
        raise ValueError(
            f"trainer_can must hold names of {TRAINER_ABILITIES}, got trainer_can={unknown}"
        )
    return abilities


def _check_expressible(method: controllers.Method, abilities: frozenset[str]) -> None:
    """Raises one ValueError naming the method and each thing it needs that the trainer (or the
    host API) lacks."""
    lacking = []
    if method.rollout_allocation is not None and "per_prompt_rollouts" not in abilities:
        lacking.append(
            f"its rollout allocation ({method.rollout_allocation}) gives each prompt its own "
            "number of rollouts, and this trainer draws one number for every prompt "
            "(trainer_can lacks 'per_prompt_rollouts'; verl's rollout.n and TRL's "
            "num_generations are one number)"
        )
    if method.group_filter is not None:
        lacking.append(
            f"its group filter ({method.group_filter}) generates in rounds and keeps groups of "
            "rollouts across them, which the host API never holds (it makes one plan and one "
            "update a step)"
        )
    if lacking:
        runnable = [
            name
            for name, record in controllers.METHODS.items()
            if record.group_filter is None
            and (record.rollout_allocation is None or "per_prompt_rollouts" in abilities)
        ]
        raise ValueError(
            f"method {method.name!r} cannot run here: "
            + "; and ".join(lacking)
            + f". Methods this trainer can run: {runnable}; run the others in gdro_jax's own "
            "trainer (python -m experiments.train)"
        )


def _block(name: str, block: Mapping[str, Any] | None) -> dict[str, Any]:
    if block is None:
        return {}
    if hasattr(block, "to_dict"):  # an ml_collections ConfigDict
        block = block.to_dict()
    if not isinstance(block, Mapping):
        raise ValueError(
            f"the {name} block must be a dict or a ConfigDict of fields, got {type(block).__name__}"
        )
    return dict(block)


def _build(
    name: str,
    factory: Any,
    block: dict[str, Any],
    run_level: Mapping[str, Any],
    settings: dict[str, Any],
) -> Any:
    """`factory` called with the run-level arguments it takes and the block's fields; records
    every field of the block, defaults included, in `settings` as `name.field`."""
    parameters = inspect.signature(factory).parameters
    fields = [p for p in parameters if p not in controllers.RUN_LEVEL_ARGUMENTS]
    for key in block:
        if key in controllers.RUN_LEVEL_ARGUMENTS:
            raise ValueError(
                f"{name}.{key} is not a field of the {name} block: for_method sets it "
                f"(its {key}= argument, or what the classifier makes)"
            )
        if key not in fields:
            raise ValueError(f"{name} has no field {key!r}: its fields are {fields}")
    given = {k: v for k, v in run_level.items() if k in parameters}
    try:
        part = factory(**given, **block)
    except ValueError as error:
        raise ValueError(f"{name}.{error}") from None
    for field in fields:
        settings[f"{name}.{field}"] = block.get(field, parameters[field].default)
    if "reward_values" in given:  # the one run-level argument a block's values are read with
        settings["reward_values"] = given["reward_values"]
    return part


def _part_names() -> dict[type, str]:
    """The type each factory of `controllers.PARTS` returns -> its part's name."""
    return {
        typing.get_type_hints(factory)["return"]: name
        for parts in controllers.PARTS.values()
        for name, factory in parts.items()
    }


def _settings_of(
    adversary: MultiAdversary, num_prompts: int, success_threshold: float
) -> dict[str, Any]:
    """What can be read off a composed adversary: its parts (and so its method, when one of
    `controllers.METHODS` has exactly those parts), their plain fields, D, B and n_mean."""
    names = _part_names()
    parts = {}
    settings: dict[str, Any] = {
        "num_prompts": num_prompts,
        "num_bins": adversary.num_bins,
        "n_mean": adversary.n_mean,
        "success_threshold": success_threshold,
    }
    for decision, field in _FIELD_OF.items():
        part = getattr(adversary, field)
        name = None if part is None else names.get(type(part), type(part).__name__)
        settings[f"parts.{decision}"] = name
        if part is None:
            continue
        parts[decision] = name
        for key in part._fields:
            value = getattr(part, key)
            if not callable(value) and key not in controllers.RUN_LEVEL_ARGUMENTS:
                settings[f"{name}.{key}"] = value
    matching = [m.name for m in controllers.METHODS.values() if m.parts() == parts]
    settings["method"] = matching[0] if matching else None
    return _plain(settings)


def _plain(value: Any) -> Any:
    """`value` as msgpack writes and reads it back (tuples as lists, numpy scalars as Python's),
    so that a saved setting compares equal to the one it was saved from."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _check_settings(saved: Any, current: Mapping[str, Any]) -> None:
    """Raises one ValueError naming every field both record whose values differ."""
    if not isinstance(saved, Mapping):
        raise ValueError(f"not a gdro_jax controllers state: settings {type(saved).__name__}")
    differ = [
        f"{key}: saved {saved[key]!r}, here {current[key]!r}"
        for key in sorted(set(saved) & set(current))
        if saved[key] != current[key]
    ]
    if differ:
        raise ValueError(
            "the saved controllers were made with other settings than these ("
            + "; ".join(differ)
            + "): build them with the saved settings, or start a new state"
        )


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
