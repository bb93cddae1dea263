"""Tunix's GRPO learner with the classifier and Prompt-GDRO inside (the `tunix` extra).

`pip install 'gdro-jax[tunix]'` installs the Tunix this adapter was built and tested against
(google-tunix 0.1.7, `TUNIX_VERSION`); Tunix's main branch has since renamed the classes it
subclasses.

- `GDROLearner`, a `tunix.rl.grpo.grpo_learner.GRPOLearner`. At each training batch it reads the
  prompts' ids from the batch's `prompt_id` field (Tunix repeats every field of the batch once
  per generation, aligned with the rollouts), multiplies Tunix's advantages by Prompt-GDRO's
  multipliers for those prompts (the `reweight` realisation), and feeds the classifier and every
  part the batch's rewards. Evaluation batches leave the controllers alone.
- `PromptSource`, an iterable of Tunix batches for a method that draws its prompts (MoPPS,
  Prompt-GDRO's `resample`): each batch is drawn from the controllers' state after the previous
  batch's rewards.
- The controllers' state is written beside each Tunix checkpoint
  (`<checkpoint_root_directory>/gdro_controllers/<step>.msgpack`) and restored with it, so a
  resumed run resumes its controllers.

What Tunix cannot express is refused when the learner is built: its `num_generations` is one
number for every prompt, so a rollout allocation (Rollout-GDRO, Knapsack-RL) has no way to reach
its sampler, and its learner generates once per batch, so DAPO's dynamic sampling (rounds until
N groups with a signal wait) cannot run inside it.

Underneath is `HostControllers`: the learner makes exactly the calls a PyTorch trainer would.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from gdro_jax.controllers import MultiAdversary
from gdro_jax.integrations._extras import check_expressible as check_expressible_by
from gdro_jax.integrations._extras import warn_if_untested
from gdro_jax.integrations._host import HostControllers

TUNIX_VERSION = "0.1.7"  # the google-tunix this adapter is tested against (the extra's pin)

try:
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
except ImportError as error:  # the extra is missing
    raise ImportError(
        "gdro_jax.integrations.tunix needs Tunix: pip install 'gdro-jax[tunix]' "
        f"(google-tunix=={TUNIX_VERSION}); importing it failed with: {error}"
    ) from error

warn_if_untested("gdro_jax.integrations.tunix", "google-tunix", TUNIX_VERSION, "learner")

PROMPT_ID = "prompt_id"  # the batch field that carries each prompt's id (0..D-1)
STATE_FOLDER = "gdro_controllers"  # beside Tunix's `actor/` under checkpoint_root_directory


def check_expressible(adversary: MultiAdversary, num_generations: int) -> None:
    """Raises one ValueError saying why, when Tunix's GRPO cannot realise a decision.

    Tunix draws `num_generations` rollouts for every prompt and generates once per batch:
    a rollout allocation (Rollout-GDRO, Knapsack-RL) and a group filter (DAPO's dynamic
    sampling) have nowhere to act.
    """
    check_expressible_by(
        adversary,
        num_generations,
        owner="Tunix",
        trainer="GRPO learner",
        samples="rollouts",
        filter_note=" (its DAPO learner's dynamic_sampling is not implemented)",
    )


class GDROLearner(grpo_learner.GRPOLearner):
    """Tunix's `GRPOLearner` with a method's controllers inside (see the module docstring).

    Args:
      rl_cluster, algo_config, reward_fns, metric_fns, data_shuffle_seed: as for Tunix's
        `GRPOLearner`. `metric_fns` see Tunix's own advantages, before the multipliers.
      controllers: the method's decisions, `controllers.multi_adversary(classifier,
        prompt_gdro(...), n_mean=num_generations)` (or with `sampler=mopps(...)`), or a
        `HostControllers` over them.
      seed: the controllers' key (`HostControllers`), when `controllers` is a MultiAdversary.
      success_threshold: a rollout whose summed reward is above this counts as correct.

    Every training batch must carry an int `prompt_id` field: the prompt's index `0..D-1` in the
    classifier's pool (`PromptSource` adds it). Each learner call to generate (one per batch
    unless Tunix's micro-batch sizes split it) is one step of the controllers.
    """

    def __init__(
        self,
        rl_cluster: rl_cluster_lib.RLCluster,
        algo_config: grpo_learner.GRPOConfig,
        reward_fns: Any,
        controllers: MultiAdversary | HostControllers,
        *,
        metric_fns: Sequence[Any] | None = None,
        data_shuffle_seed: int | None = None,
        seed: int = 0,
        success_threshold: float = 0.5,
    ):
        if isinstance(controllers, MultiAdversary):
            controllers = HostControllers(
                controllers, seed=seed, success_threshold=success_threshold
            )
        elif not isinstance(controllers, HostControllers):
            raise TypeError(
                "controllers must be a controllers.MultiAdversary or a HostControllers, got "
                f"{type(controllers).__name__}"
            )
        check_expressible(controllers.adversary, algo_config.num_generations)
        self._controllers = controllers
        self._rewards: np.ndarray | None = None
        super().__init__(
            rl_cluster=rl_cluster,
            algo_config=algo_config,
            reward_fns=reward_fns,
            metric_fns=metric_fns,
            data_shuffle_seed=data_shuffle_seed,
        )
        root = rl_cluster.cluster_config.training_config.checkpoint_root_directory
        self._state_dir = None if root is None else os.path.join(root, STATE_FOLDER)
        restored = rl_cluster.actor_trainer.train_steps
        if restored > 0:
            self._restore(restored)
        if self._state_dir is not None:
            self._save_with(rl_cluster.actor_trainer.checkpoint_manager)

    @property
    def controllers(self) -> HostControllers:
        """The controllers, whose state this learner updates (share it with a PromptSource)."""
        return self._controllers

    # -- checkpoints ---------------------------------------------------------------------------

    def _state_file(self, step: int) -> str:
        return os.path.join(self._state_dir, f"{step}.msgpack")

    def _restore(self, step: int) -> None:
        path = None if self._state_dir is None else self._state_file(step)
        if path is None or not os.path.exists(path):
            raise FileNotFoundError(
                f"Tunix restored its checkpoint of step {step}, but the controllers' state of "
                f"that step is not at {path}: it is written there beside each checkpoint a "
                "GDROLearner saves. Resume with the checkpoint folder the run wrote, or start "
                "a new one."
            )
        with open(path, "rb") as file:
            data = file.read()
        try:
            self._controllers.load_bytes(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def _save_with(self, manager: Any) -> None:
        """Writes the controllers' state each time Tunix's checkpoint manager saves a step."""
        save = manager.save

        def save_with_controllers(step: int, *args: Any, **kwargs: Any) -> bool:
            saved = save(step, *args, **kwargs)
            if saved:
                self._write_state(step, manager)
            return saved

        manager.save = save_with_controllers

    def _write_state(self, step: int, manager: Any) -> None:
        os.makedirs(self._state_dir, exist_ok=True)
        path = self._state_file(step)
        temporary = f"{path}.tmp"
        with open(temporary, "wb") as file:
            file.write(self._controllers.to_bytes())
        os.replace(temporary, path)  # a reader never sees half a state
        # Tunix keeps `max_to_keep` checkpoints: keep the states of those, and this one.
        orbax_manager = getattr(manager, "_checkpoint_manager", None)
        kept = set(orbax_manager.all_steps()) if orbax_manager is not None else None
        if not kept:
            return
        oldest = min(kept | {step})
        for name in os.listdir(self._state_dir):
            stem = name.removesuffix(".msgpack")
            if name.endswith(".msgpack") and stem.isdigit() and int(stem) < oldest:
                os.remove(os.path.join(self._state_dir, name))

    # -- one batch -----------------------------------------------------------------------------

    def _compute_rewards(self, prompts, completions, mode, step=None, **kwargs):
        rewards = super()._compute_rewards(prompts, completions, mode, step, **kwargs)
        self._rewards = np.asarray(rewards)
        return rewards

    def _generate_and_compute_advantage(
        self, training_input: Any, mode: rl_cluster_lib.Mode = rl_cluster_lib.Mode.TRAIN
    ) -> grpo_learner.TrainExample:
        if mode != rl_cluster_lib.Mode.TRAIN:
            return super()._generate_and_compute_advantage(training_input, mode)
        num_generations = self.algo_config.num_generations
        ids_of_rollouts = _prompt_ids(training_input, num_generations)
        ids = ids_of_rollouts[::num_generations]
        host = self._controllers
        if host.adversary.draws_prompts and host.batch is None:
            raise ValueError(
                "this method draws its own prompts (MoPPS or Prompt-GDRO's resample): give "
                "the learner's train() a PromptSource(learner.controllers, records, batch_size) "
                "instead of a dataset"
            )
        plan = host.plan(ids)  # the step's plan; a drawn batch must arrive whole and in order
        self._rewards = None
        example = super()._generate_and_compute_advantage(training_input, mode)
        if self._rewards is None or self._rewards.shape != ids_of_rollouts.shape:
            raise RuntimeError("Tunix's learner did not compute one reward per rollout")
        weights = host.multipliers(ids_of_rollouts)
        # One prompt id per reward, in Tunix's row order (each prompt's `num_generations` rows
        # in a row, the `prompt_id` field repeated with them); observe checks num_generations
        # (its n_mean) a prompt.
        host.observe(ids_of_rollouts, self._rewards)
        self.rl_cluster.buffer_metrics(
            {
                "gdro/multiplier_max": (float(weights.max()), np.max),
                "gdro/multiplier_min": (float(weights.min()), np.min),
                "gdro/bin_mean": (float(plan.bins.mean()), np.mean),
                "gdro/p_hat_mean": (float(plan.p_hat.mean()), np.mean),
            },
            mode=mode,
        )
        advantages = example.advantages * jnp.asarray(weights, example.advantages.dtype)
        return example.replace(advantages=advantages)

    def train(
        self,
        train_ds: Iterable[Any],
        eval_ds: Iterable[Any] | None = None,
        skip_jit: bool = False,
    ) -> None:
        """Tunix's training loop. A `PromptSource` given as `train_ds` skips, without drawing,
        the batches a resumed run has already trained on (Tunix fast-forwards past them)."""
        if isinstance(train_ds, PromptSource):
            if train_ds.controllers is not self._controllers:
                raise ValueError(
                    "the PromptSource draws from other controllers than this learner's: build "
                    "it with PromptSource(learner.controllers, ...)"
                )
            train_ds = train_ds.batches(skip=self._last_iter_step)
        super().train(train_ds, eval_ds, skip_jit)


def _prompt_ids(training_input: Mapping[str, Any], num_generations: int) -> np.ndarray:
    """The batch's `prompt_id` field, one per rollout, checked: ints, constant within each
    group of `num_generations` consecutive rollouts (Tunix's repeat)."""
    if PROMPT_ID not in training_input:
        raise ValueError(
            f"the training batch has no {PROMPT_ID!r} field (it has {sorted(training_input)}): "
            f"give every batch an int {PROMPT_ID!r} array, each prompt's index in the "
            "classifier's pool, or use PromptSource"
        )
    ids = np.asarray(training_input[PROMPT_ID])
    num = len(training_input["prompts"])
    if ids.shape != (num,) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"the batch's {PROMPT_ID!r} must be an int array with one id per prompt "
            f"({num} here), got {ids.dtype} {ids.shape}"
        )
    groups = ids.reshape(-1, num_generations)
    if (groups != groups[:, :1]).any():
        raise ValueError(
            f"the batch's {PROMPT_ID!r} differs within a group of {num_generations} "
            "generations: Tunix repeats each field per generation, so give one id per prompt"
        )
    return ids


class PromptSource:
    """Tunix batches drawn by the controllers: MoPPS's Thompson samples, or Prompt-GDRO's
    `resample` (bins from its distribution, then a prompt uniformly inside each).

    Args:
      controllers: the learner's (`learner.controllers`).
      records: the pool, `records[d]` a mapping with a `"prompts"` string and any other fields
        the reward functions take (`"answer"`); its length is the classifier's D.
      batch_size: N, the prompts per batch.
      num_batches: how many batches to give (None: until Tunix's `max_steps`).

    Each batch is a dict of numpy arrays, `"prompt_id"` included, drawn when Tunix asks for it,
    after the previous batch's rewards reached the controllers.
    """

    def __init__(
        self,
        controllers: HostControllers,
        records: Sequence[Mapping[str, Any]],
        batch_size: int,
        *,
        num_batches: int | None = None,
    ):
        if not isinstance(controllers, HostControllers):
            raise TypeError(
                "controllers must be the learner's HostControllers (learner.controllers), got "
                f"{type(controllers).__name__}"
            )
        if not controllers.adversary.draws_prompts:
            raise ValueError(
                "these controllers take their batches from the data (no prompt sampler, no "
                "resample realisation): give Tunix your dataset, with a 'prompt_id' field"
            )
        if len(records) != controllers.num_prompts:
            raise ValueError(
                f"records holds {len(records)} prompts; the classifier tracks "
                f"{controllers.num_prompts} (ids are indices into records)"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got batch_size={batch_size!r}")
        if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 0):
            raise ValueError(f"num_batches must be an int >= 0, got num_batches={num_batches!r}")
        keys = set(records[0]) if records else set()
        for index, record in enumerate(records):
            if "prompts" not in record:
                raise ValueError(f"records[{index}] has no 'prompts' field")
            if PROMPT_ID in record:
                raise ValueError(
                    f"records[{index}] has a {PROMPT_ID!r} field: the source adds it (the index)"
                )
            if set(record) != keys:
                raise ValueError(
                    f"records[{index}] has fields {sorted(record)}, records[0] {sorted(keys)}"
                )
        self.controllers = controllers
        self._records = records
        self._keys = sorted(keys)
        self._batch_size = batch_size
        self._num_batches = num_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self.batches()

    def batches(self, skip: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """The batches; the first `skip` are stand-ins of the right size, drawn from nothing
        (a resumed run's already-trained batches, which Tunix reads and discards)."""
        index = 0
        while self._num_batches is None or index < self._num_batches:
            if index < skip:
                ids = np.arange(self._batch_size, dtype=np.int32) % len(self._records)
            else:
                candidates = np.arange(self._batch_size, dtype=np.int32)
                ids = self.controllers.select_prompts(candidates)
            yield self.batch(ids)
            index += 1

    def batch(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The batch of the records `ids`: each field stacked, and `prompt_id`."""
        batch = {key: np.asarray([self._records[i][key] for i in ids]) for key in self._keys}
        batch[PROMPT_ID] = np.asarray(ids, np.int32)
        return batch
