"""verl's PPO trainer with the classifier and Prompt-GDRO or MoPPS inside (the `verl` extra).

`pip install 'gdro-jax[verl]'` installs the verl this adapter was built and tested against (verl
0.9.1, `VERL_VERSION`, with the three modules its trainer imports and does not declare).

- `GDROAdvantage`, an advantage estimator registered in verl's registry (`register_adv_est`) under
  a name (`"gdro_grpo"`), so `algorithm.adv_estimator=gdro_grpo` selects it in verl's
  `compute_advantage`. It computes verl's own GRPO outcome advantages, multiplies each response's
  row by Prompt-GDRO's multiplier for its prompt (the `reweight` realisation), and feeds the
  classifier and every part the step's scores, one prompt id per response. This is the one place
  a step is observed.
- `GDROSampler`, a train sampler for a method that draws its prompts (MoPPS, Prompt-GDRO's
  `resample`): it yields each batch's dataset rows, drawn from the controllers' state after the
  previous step's rewards, and its `update(batch)` checks a finished step's batch against the
  draw (the curriculum samplers' protocol: `__iter__`, `__len__`, `update(batch)`).
- `GDRORayPPOTrainer`, verl's `RayPPOTrainer` (`trainer.use_v1=False`) checking its config against
  the controllers (`check_config`) and binding each step's `uid`s to prompt ids.

Each row's prompt id is its `extra_info["index"]`, the prompt's index in the pool (`0..D-1`),
which verl's data preparation scripts write and its dataset carries in every row. verl's
`compute_advantage` hands a registered estimator only the rows' `uid`s (a fresh uuid per prompt
per step) as `index`, not `extra_info`; so `GDROAdvantage.bind(batch)` records each uid's prompt
id where the trainer holds the batch with both, before generation (`GDRORayPPOTrainer` does it in
`_get_gen_batch`), and the estimator reads them back by uid.

Row order. verl's `balance_batch` (on by default) reorders the rows of a step, after the rollout
and before the advantages, to even the tokens of its data-parallel ranks, so a prompt's responses
no longer sit together in the batch's order. The estimator therefore reads each row's prompt id
from its own uid and gives `observe` one prompt id per row: the rewards are grouped by id, never
by position, and any order of the rows makes the same decisions.

Several ranks. verl computes the advantages on its single-controller driver over the whole step's
batch, every data-parallel rank's rows, before dispatching them to the ranks: one controllers
object sees every reward. A trainer that computed advantages inside each rank would need, in
every rank, an identical controllers object (same settings and seed) fed the rewards gathered
from all ranks: observed alone, a rank's shard splits prompts' groups (refused: a group holds
fewer than `rollout.n` responses), and ranks fed different rewards would draw different batches
and weigh with different multipliers.

verl 0.9.1 removed `AbstractCurriculumSampler`, its `data.sampler.class_path` setting and the
trainer's call of `sampler.update(batch)` after each step (verl pull request 6302). The sampler
reaches verl as `RayPPOTrainer(train_sampler=...)`; verl calls no hook of it after a step, and its
`update(batch)` is the protocol's check, which a dataset's `on_batch_end(batch)` (verl's remaining
end-of-step call) may make. `update` never observes: the estimator did, and a second observation
would count the rewards twice.

What verl cannot express is refused: `actor_rollout_ref.rollout.n` is one number for every prompt,
so a rollout allocation (Rollout-GDRO, Knapsack-RL, VIP) has no way to reach its rollout, and the
host API never holds a round's groups, so DAPO's dynamic sampling cannot run here.

Underneath is `HostControllers`: the estimator and the sampler make exactly the calls the host
API documents.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gdro_jax.integrations._extras import warn_if_untested
from gdro_jax.integrations._host import HostControllers

VERL_VERSION = "0.9.1"  # the verl this adapter is tested against (the extra's pin)

try:
    import torch
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
except ImportError as error:  # the extra is missing
    raise ImportError(
        "gdro_jax.integrations.verl needs verl: pip install 'gdro-jax[verl]' "
        f"(verl=={VERL_VERSION} and the modules its trainer imports); importing it failed "
        f"with: {error}"
    ) from error

warn_if_untested(
    "gdro_jax.integrations.verl", "verl", VERL_VERSION, "registry, data fields and trainer"
)

ESTIMATOR = "gdro_grpo"  # the name GDROAdvantage registers by default (algorithm.adv_estimator)
EXTRA_INFO = "extra_info"  # the non-tensor field whose "index" is each row's prompt id
INDEX = "index"
UID = "uid"  # verl's id of each prompt's group of responses in a step


def prompt_ids_of(batch: DataProto) -> np.ndarray:
    """int64 `[rows]` each row's prompt id, its `extra_info["index"]`, in the batch's order.

    Raises:
      ValueError: naming the field and the first row that lacks an int index.
    """
    _check_data_proto(batch, "prompt_ids_of")
    infos = batch.non_tensor_batch.get(EXTRA_INFO)
    if infos is None:
        raise ValueError(
            f"the batch has no {EXTRA_INFO!r} field (it has {sorted(batch.non_tensor_batch)}): "
            f"write each prompt's index in the pool into its row's {EXTRA_INFO}[{INDEX!r}], as "
            "verl's data preparation scripts do"
        )
    return _ids([info.get(INDEX) if isinstance(info, Mapping) else None for info in infos])


class GDROAdvantage:
    """Prompt-GDRO's multipliers on verl's GRPO advantages, registered in verl's registry.

    Args:
      controllers: the method's controllers (`HostControllers.for_method(name, ...,
        n_mean=rollout.n)` or `HostControllers(multi_adversary(...))`), whose `n_mean` is verl's
        `actor_rollout_ref.rollout.n`. A method that draws its prompts also needs a
        `GDROSampler` over the same controllers as the trainer's train sampler.
      name: the name registered with `verl.trainer.ppo.core_algos.register_adv_est`; the config
        selects it as `algorithm.adv_estimator`. A `GDROAdvantage` built later under the same
        name takes it over (verl's registry holds one estimator a name); a name held by another
        estimator is refused by verl.
      epsilon: added to each group's standard deviation, as in verl's GRPO.

    Each call is one step of the controllers: for a batch of rows with `uid`s bound by `bind`,
    it returns verl's GRPO advantages (and returns), each row times its prompt's multiplier, and
    observes each row's score (`token_level_rewards` summed over the response) with the row's
    prompt id. `algorithm.norm_adv_by_std_in_grpo` is read from the config verl passes.

    Raises:
      TypeError: when `controllers` is not a `HostControllers`.
      ValueError: for a rollout allocation (verl's `rollout.n` is one number for every prompt).
    """

    def __init__(
        self, controllers: HostControllers, *, name: str = ESTIMATOR, epsilon: float = 1e-6
    ):
        if not isinstance(controllers, HostControllers):
            raise TypeError(
                "controllers must be a HostControllers (HostControllers.for_method(...) or "
                f"HostControllers(multi_adversary(...))), got {type(controllers).__name__}"
            )
        if controllers.adversary.rollout_allocator is not None:
            name_of = type(controllers.adversary.rollout_allocator).__name__
            raise ValueError(
                f"a rollout allocation ({name_of}: Rollout-GDRO, Knapsack-RL or VIP) decides "
                "each prompt's number of responses, and verl's actor_rollout_ref.rollout.n is "
                "one number for every prompt: use the classifier with Prompt-GDRO or MoPPS here"
            )
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got name={name!r}")
        self._host = controllers
        self._name = name
        self._epsilon = float(epsilon)
        self._prompt_of_uid: dict[Any, Any] = {}  # filled by bind, emptied by each step
        self._observed_uids: frozenset = frozenset()  # the last step's uids
        registered = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if isinstance(registered, GDROAdvantage):
            del core_algos.ADV_ESTIMATOR_REGISTRY[name]  # the newer controllers take the name
        core_algos.register_adv_est(name)(self)

    @property
    def name(self) -> str:
        """The name in verl's registry (`algorithm.adv_estimator`)."""
        return self._name

    @property
    def controllers(self) -> HostControllers:
        """The controllers, whose state this estimator updates."""
        return self._host

    def bind(self, batch: DataProto) -> None:
        """Records each row's `uid` with its prompt id (`extra_info["index"]`) for the estimator.

        Call it where the trainer holds the step's batch with its uids, before the advantages
        (`GDRORayPPOTrainer._get_gen_batch` does). A row without an index is recorded as such
        and refused only if the estimator meets its uid, so validation batches pass through.
        """
        _check_data_proto(batch, "bind")
        uids = batch.non_tensor_batch.get(UID)
        if uids is None:
            raise ValueError(
                f"bind: the batch has no {UID!r} field yet (it has "
                f"{sorted(batch.non_tensor_batch)}): bind it after verl gives each prompt its "
                "uid, where RayPPOTrainer.fit calls _get_gen_batch"
            )
        infos = batch.non_tensor_batch.get(EXTRA_INFO)
        if infos is None:
            infos = [None] * len(uids)
        for uid, info in zip(uids, infos, strict=True):
            self._prompt_of_uid[uid] = info.get(INDEX) if isinstance(info, Mapping) else None

    def __call__(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The estimator verl calls (`compute_advantage`, `algorithm.adv_estimator=<name>`).

        Args:
          token_level_rewards: float `[rows, response_length]`, verl's rewards.
          response_mask: `[rows, response_length]` the responses' tokens.
          index: `[rows]` each row's `uid` (verl passes `non_tensor_batch["uid"]`).
          config: verl's `algorithm` config; `use_kl_in_reward` must be off.
          **kwargs: what else verl passes (`reward_baselines`), unused.

        Returns:
          (advantages, returns), each `[rows, response_length]`: verl's GRPO values times each
          row's multiplier.

        Raises:
          ValueError: naming the setting or field to fix, before the controllers change.
        """
        host = self._host
        if config is not None and config.get("use_kl_in_reward", False):
            raise ValueError(
                "algorithm.use_kl_in_reward=True puts the KL penalty into the rewards this "
                "estimator counts correct responses from: set algorithm.use_kl_in_reward=False "
                "(GRPO's KL term is actor_rollout_ref.actor.use_kl_loss=True)"
            )
        if index is None:
            raise ValueError(
                f"{self._name}: verl passed no uids (the batch has no {UID!r} field): compute "
                "the advantages of a batch that went through RayPPOTrainer.fit, which gives "
                "each prompt's responses their uid"
            )
        uids = np.asarray(index, dtype=object)
        rows = int(token_level_rewards.shape[0])
        if uids.shape != (rows,):
            raise ValueError(
                f"{self._name}: index must hold one uid per row ({rows}), got shape {uids.shape}"
            )
        ids_R = self._prompt_ids(uids)
        keys = np.asarray([str(uid) for uid in uids])
        _, first, sizes = np.unique(keys, return_index=True, return_counts=True)
        n = host.adversary.n_mean
        if (sizes != n).any():
            bad = int(np.flatnonzero(sizes != n)[0])
            raise ValueError(
                f"{self._name}: the group of prompt id {ids_R[first[bad]]} (uid "
                f"{uids[first[bad]]}) holds {sizes[bad]} responses, and the controllers expect "
                f"n_mean={n}: set actor_rollout_ref.rollout.n={n}, and give the estimator the "
                "whole step's batch, every rank's rows (a rank's shard splits groups)"
            )
        if host.batch is None:
            if host.adversary.draws_prompts:
                raise ValueError(
                    f"{self._name}: this method draws its prompts (MoPPS or Prompt-GDRO's "
                    "resample) and no batch was drawn at this step: give the trainer "
                    "train_sampler=GDROSampler(controllers, batch_size=data.train_batch_size)"
                )
            host.plan(np.sort(ids_R[first]))  # the batch: one entry per group, in id order
        norm_by_std = True if config is None else config.get("norm_adv_by_std_in_grpo", True)
        grpo = core_algos.get_adv_estimator_fn(core_algos.AdvantageEstimator.GRPO)
        advantages, returns = grpo(
            token_level_rewards=token_level_rewards,
            response_mask=response_mask,
            index=uids,
            epsilon=self._epsilon,
            norm_adv_by_std_in_grpo=norm_by_std,
            config=config,
        )
        weights = host.multipliers(ids_R)  # by each row's own prompt id: any row order
        scores = token_level_rewards.detach().sum(dim=-1).double().cpu().numpy()
        host.observe(ids_R, scores)  # one prompt id per response: grouped by id, not position
        self._observed_uids = frozenset(keys.tolist())
        self._prompt_of_uid.clear()
        weight = torch.as_tensor(weights, dtype=advantages.dtype, device=advantages.device)
        return advantages * weight[:, None], returns * weight[:, None]

    def _prompt_ids(self, uids: np.ndarray) -> np.ndarray:
        """int64 `[rows]` the bound prompt id of each row's uid."""
        keys = {str(uid) for uid in uids}
        unbound = [uid for uid in uids if uid not in self._prompt_of_uid]
        if unbound:
            if keys == self._observed_uids:
                raise ValueError(
                    f"{self._name}: these rows' rewards were already observed (step "
                    f"{self._host.step - 1}); observing them again would count them twice. The "
                    "estimator observes each step once: compute the advantages once a step"
                )
            raise ValueError(
                f"{self._name}: uid {unbound[0]!r} has no prompt id: bind(batch) each step's batch "
                "once it has its uids (GDRORayPPOTrainer does it in _get_gen_batch), with each "
                f"row's prompt id in {EXTRA_INFO}[{INDEX!r}]"
            )
        values = [self._prompt_of_uid[uid] for uid in uids]
        try:
            return _ids(values)
        except ValueError as error:
            raise ValueError(f"{self._name}: {error}") from None


class GDROSampler(torch.utils.data.Sampler[int]):
    """verl's train sampler for controllers that draw their prompts (MoPPS, `resample`).

    It yields `batch_size` dataset rows a batch: the prompts `select_prompts` draws, row `d` of
    the train dataset being prompt `d` (`extra_info["index"] == d`). Each batch is drawn when
    verl's data loader asks for its first row, so after the previous step's rewards were observed
    (by `GDROAdvantage`) as long as the loader does not read ahead: verl's
    `data.dataloader_num_workers` must be 0 (workers fetch batches ahead, and a batch asked for
    before the previous step was observed is refused).

    Args:
      controllers: the controllers that `GDROAdvantage` observes.
      batch_size: verl's `data.train_batch_size`, prompts a step.
      batches_per_epoch: steps of an epoch; default `num_prompts // batch_size`, as verl's
        loader counts an epoch of the dataset (`drop_last=True`).

    Raises:
      TypeError: when `controllers` is not a `HostControllers`.
      ValueError: for a method that takes its batches from the data (keep verl's sampler), or a
        batch size the pool cannot fill.
    """

    def __init__(
        self,
        controllers: HostControllers,
        batch_size: int,
        batches_per_epoch: int | None = None,
    ):
        if not isinstance(controllers, HostControllers):
            raise TypeError(
                f"controllers must be a HostControllers, got {type(controllers).__name__}"
            )
        if not controllers.adversary.draws_prompts:
            raise ValueError(
                "these controllers take their batches from the data (no MoPPS, no Prompt-GDRO "
                "resample): keep verl's own train sampler (data.shuffle); GDROSampler draws for "
                "methods that draw their prompts"
            )
        _check_count("batch_size", batch_size)
        if batch_size > controllers.num_prompts:
            raise ValueError(
                f"batch_size={batch_size} is more than the pool's {controllers.num_prompts} "
                "prompts: give a smaller data.train_batch_size"
            )
        if batches_per_epoch is None:
            batches_per_epoch = controllers.num_prompts // batch_size
        _check_count("batches_per_epoch", batches_per_epoch)
        self._host = controllers
        self.batch_size = int(batch_size)
        self.batches_per_epoch = int(batches_per_epoch)
        self._drawn: tuple[int, np.ndarray] | None = None  # (step, ids) of the last draw
        self._checked_step: int | None = None  # the last step update(batch) checked

    @property
    def controllers(self) -> HostControllers:
        return self._host

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.batches_per_epoch):
            yield from self._draw().tolist()  # drawn when the batch's first row is asked for

    def __len__(self) -> int:
        return self.batches_per_epoch * self.batch_size

    def _draw(self) -> np.ndarray:
        host = self._host
        if self._drawn is not None and host.step <= self._drawn[0]:
            raise RuntimeError(
                f"verl's data loader asked for the batch after step {self._drawn[0]} before that "
                "step's rewards were observed: set data.dataloader_num_workers=0 (workers read "
                "batches ahead) and algorithm.adv_estimator to the GDROAdvantage's name (it "
                "observes each step)"
            )
        drawn = host.select_prompts(np.arange(self.batch_size, dtype=np.int32))
        self._drawn = (host.step, drawn)
        return drawn

    def update(self, batch: DataProto) -> None:
        """Checks a finished step's batch against the draw (the protocol's end-of-step call).

        The rows may come in any order (`balance_batch`): they are compared by prompt id. It
        never observes: `GDROAdvantage` observed the step, once.

        Raises:
          RuntimeError: when no batch was drawn, the step was not observed (the estimator is not
            `algorithm.adv_estimator`), or this step was already checked.
          ValueError: when the rows' prompt ids (`extra_info["index"]`) are not the drawn
            batch's, `n_mean` responses each.
        """
        if self._drawn is None:
            raise RuntimeError("update: no batch was drawn yet; iterate the sampler first")
        step, drawn = self._drawn
        if self._checked_step == step:
            raise RuntimeError(f"update: step {step}'s batch was already checked")
        if self._host.step <= step:
            raise RuntimeError(
                f"update: step {step}'s rewards were not observed: the GDROAdvantage observes "
                "them where verl computes the advantages (algorithm.adv_estimator=its name); "
                "update never observes, which would count them twice"
            )
        ids = prompt_ids_of(batch)
        expected = np.sort(np.repeat(drawn, self._host.adversary.n_mean))
        if not np.array_equal(np.sort(ids), expected):
            raise ValueError(
                f"update: the batch's rows ({EXTRA_INFO}[{INDEX!r}]) are not step {step}'s drawn "
                f"prompts, {self._host.adversary.n_mean} responses each: drawn "
                f"{np.sort(drawn).tolist()}, rows' prompts {np.unique(ids).tolist()}"
            )
        self._checked_step = step


def check_config(
    config: Any, advantage: GDROAdvantage, train_sampler: torch.utils.data.Sampler | None = None
) -> None:
    """Refuses, before training, a verl config the controllers cannot follow.

    Args:
      config: verl's trainer config (`ppo_trainer.yaml`'s, as `main_ppo` builds it).
      advantage: the registered estimator.
      train_sampler: what the trainer is given as `train_sampler` (None: verl's own).

    Raises:
      ValueError: naming the first setting that differs and its value here.
    """
    if not isinstance(advantage, GDROAdvantage):
        raise TypeError(f"advantage must be a GDROAdvantage, got {type(advantage).__name__}")
    host = advantage.controllers
    n = host.adversary.n_mean
    wanted = [
        ("trainer.use_v1", False, "the adapter runs in RayPPOTrainer, verl's trainer with a "
         "train_sampler and a driver-side compute_advantage"),
        ("algorithm.adv_estimator", advantage.name, "the name GDROAdvantage registered"),
        ("algorithm.use_kl_in_reward", False, "the estimator counts correct responses from the "
         "rewards; GRPO's KL term is actor_rollout_ref.actor.use_kl_loss=True"),
        ("actor_rollout_ref.rollout.n", n, "the controllers' n_mean, responses a prompt"),
    ]  # fmt: skip
    if host.adversary.draws_prompts:
        if not isinstance(train_sampler, GDROSampler) or train_sampler.controllers is not host:
            raise ValueError(
                "this method draws its prompts (MoPPS or Prompt-GDRO's resample): give the "
                "trainer train_sampler=GDROSampler(advantage.controllers, batch_size=...), over "
                "the estimator's controllers"
            )
        batch_size = train_sampler.batch_size
        wanted += [
            ("data.dataloader_num_workers", 0, "workers read batches ahead of the rewards"),
            ("data.train_batch_size", batch_size, "the GDROSampler's batch_size"),
        ]
        gen_batch_size = _get(config, "data.gen_batch_size", None)
        if gen_batch_size not in (None, batch_size):
            raise ValueError(
                f"data.gen_batch_size={gen_batch_size}: leave it unset (or {batch_size}), so each "
                "step generates the GDROSampler's batch"
            )
    elif isinstance(train_sampler, GDROSampler):
        raise ValueError("GDROSampler draws prompts, and these controllers do not")
    for path, value, why in wanted:
        found = _get(config, path, "<unset>")
        if found != value:
            raise ValueError(f"{path}={found!r}: set {path}={value!r} ({why})")


class GDRORayPPOTrainer(RayPPOTrainer):
    """verl's `RayPPOTrainer` with the controllers inside (see the module docstring).

    Args:
      config, *args, **kwargs: as for `RayPPOTrainer` (`main_ppo_v0.TaskRunner` builds one).
      advantage: the registered `GDROAdvantage`.
      train_sampler: a `GDROSampler` over the same controllers for a method that draws its
        prompts; None: verl's own.

    The config is checked first (`check_config`); then, at each step, `_get_gen_batch` binds the
    batch's uids to their prompt ids before verl generates.
    """

    def __init__(
        self,
        config: Any,
        *args: Any,
        advantage: GDROAdvantage,
        train_sampler: torch.utils.data.Sampler | None = None,
        **kwargs: Any,
    ):
        check_config(config, advantage, train_sampler)
        self._gdro_advantage = advantage
        super().__init__(config, *args, train_sampler=train_sampler, **kwargs)

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        self._gdro_advantage.bind(batch)  # the uids exist from here; extra_info stays too
        return super()._get_gen_batch(batch)


def _check_data_proto(batch: Any, caller: str) -> None:
    if not isinstance(batch, DataProto):
        raise TypeError(f"{caller} takes verl's DataProto, got {type(batch).__name__}")


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")


def _ids(values: Any) -> np.ndarray:
    """int64 ids from each row's index, refusing a missing or non-integer one by row."""
    for row, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(
                f"row {row}'s {EXTRA_INFO}[{INDEX!r}] is {value!r}: each row needs its prompt's "
                f"int index in the pool, 0..D-1 ({EXTRA_INFO}={{{INDEX!r}: d, ...}} in the data)"
            )
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _get(config: Any, path: str, default: Any) -> Any:
    """`config`'s value at a dotted path (DictConfig, dict or attributes), or `default`."""
    node = config
    for key in path.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping) or hasattr(node, "get"):
            node = node.get(key, None)
        else:
            node = getattr(node, key, None)
    return default if node is None else node
