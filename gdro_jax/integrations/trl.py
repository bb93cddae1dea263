"""TRL's GRPOTrainer with the classifier and Prompt-GDRO or MoPPS inside (the `trl` extra).

`pip install 'gdro-jax[trl]'` installs the TRL this adapter was built and tested against (trl
1.16.0, `TRL_VERSION`): it overrides `GRPOTrainer`'s methods, private ones among them.

- `GDROTrainer`, a `trl.GRPOTrainer`. Where TRL scores a generation batch
  (`_generate_and_score_completions`) it reads each row's prompt id from the dataset's
  `prompt_id` column, multiplies TRL's advantages by Prompt-GDRO's multipliers for those prompts
  (the `reweight` realisation), and feeds the classifier and every part the rewards TRL computed
  (the reward functions' weighted sum, as TRL sums them), one prompt id per completion.
  Evaluation batches leave the controllers alone.
- `PlaceSampler`, its train sampler for a method that draws its prompts (MoPPS, Prompt-GDRO's
  `resample`): it yields places in the next batch, and the trainer fills each place with the
  drawn prompt's row when TRL generates for it.
- The controllers' state is written into each TRL checkpoint folder
  (`checkpoint-<step>/gdro_controllers.msgpack`) and restored by
  `train(resume_from_checkpoint=...)`, so a resumed run resumes its controllers.

TRL's data loader reads ahead of training: accelerate fetches the next batch before it hands out
the current one, and `dataloader_num_workers` fetch further. With `num_iterations=1` and
`steps_per_generation` equal to the gradient accumulation (TRL's defaults) the next generation's
rows are read before this generation's rewards exist, so a sampler that drew its prompts when
read would call `select_prompts` again before `observe`. `PlaceSampler` therefore yields places,
not prompts, and the draw is made in `_generate_and_score_completions`, after the previous
generation's rewards were observed, however far ahead the loader reads.

Several processes: TRL gathers every process's rewards before it normalises them, and so does
this trainer with the prompt ids; each process holds its own `HostControllers`, built with the
same settings and seed, fed the same gathered rewards, so all make the same decisions (the same
draw, the same multipliers). They are compared at each generation, and a difference is refused.

What TRL cannot express is refused when the trainer is built: its `num_generations` is one number
for every prompt, so a rollout allocation (Rollout-GDRO, Knapsack-RL) has no way to reach its
generation, and it generates once per batch, so DAPO's dynamic sampling cannot run inside it.

Underneath is `HostControllers`: the trainer makes exactly the calls the host API documents.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gdro_jax.controllers import MultiAdversary
from gdro_jax.integrations._extras import check_expressible as check_expressible_by
from gdro_jax.integrations._extras import warn_if_untested
from gdro_jax.integrations._host import HostControllers

TRL_VERSION = "1.16.0"  # the trl this adapter is tested against (the extra's pin)

try:
    import torch
    from accelerate.utils import gather_object
    from datasets import IterableDataset
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_callback import TrainerState
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer
except ImportError as error:  # the extra is missing
    raise ImportError(
        "gdro_jax.integrations.trl needs TRL: pip install 'gdro-jax[trl]' "
        f"(trl=={TRL_VERSION}); importing it failed with: {error}"
    ) from error

warn_if_untested("gdro_jax.integrations.trl", "trl", TRL_VERSION, "GRPOTrainer")

PROMPT_ID = "prompt_id"  # the dataset column that carries each row's prompt id (0..D-1)
STATE_FILE = "gdro_controllers.msgpack"  # in each checkpoint-<step> folder


def check_expressible(adversary: MultiAdversary, num_generations: int) -> None:
    """Raises one ValueError saying why, when TRL's GRPO cannot realise a decision.

    TRL draws `num_generations` completions for every prompt and generates once per batch: a
    rollout allocation (Rollout-GDRO, Knapsack-RL) and a group filter (DAPO's dynamic sampling)
    have nowhere to act. The controllers' `n_mean` must be TRL's `num_generations`.
    """
    check_expressible_by(
        adversary, num_generations, owner="TRL", trainer="GRPOTrainer", samples="completions"
    )


class PlaceSampler(torch.utils.data.Sampler[int]):
    """TRL's train sampler for controllers that draw their prompts (MoPPS, `resample`).

    It yields what TRL's `RepeatSampler` yields, with places for prompts: each generation batch
    is the places `0..num_places-1`, each repeated `num_generations` times, and the whole batch
    `repeat_count` times (`num_iterations * steps_per_generation`, TRL's reuse of a generation).
    Place `p` reads the dataset's row `p`; `GDROTrainer` replaces it, when TRL generates for the
    batch, with the row of the prompt the controllers drew for place `p`. So however far ahead
    TRL's loader reads, nothing is drawn before the rewards it depends on were observed.

    Args:
      num_places: B, the prompts of a generation batch (`generation_batch_size //
        num_generations`, over all processes).
      num_generations: TRL's `num_generations`, the completions of each prompt.
      repeat_count: how many times TRL reads each generation batch.
      batches_per_epoch: generation batches in an epoch (`len(dataset) // B`, as for TRL's own
        sampler, so that `num_train_epochs` means the same).
    """

    def __init__(
        self, num_places: int, num_generations: int, repeat_count: int, batches_per_epoch: int
    ):
        values = dict(
            num_places=num_places,
            num_generations=num_generations,
            repeat_count=repeat_count,
            batches_per_epoch=batches_per_epoch,
        )
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
        self.num_places = num_places
        self.num_generations = num_generations
        self.repeat_count = repeat_count
        self.batches_per_epoch = batches_per_epoch

    def __iter__(self) -> Iterator[int]:
        batch = np.repeat(np.arange(self.num_places), self.num_generations).tolist()
        for _ in range(self.batches_per_epoch * self.repeat_count):
            yield from batch

    def __len__(self) -> int:
        return self.batches_per_epoch * self.repeat_count * self.num_places * self.num_generations


class GDROTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with a method's controllers inside (see the module docstring).

    Args:
      model, reward_funcs, args, train_dataset, **kwargs: as for TRL's `GRPOTrainer`. The train
        dataset (a `datasets.Dataset`, or an `IterableDataset` for a method that takes its
        batches from the data) has an int `prompt_id` column: each row's prompt, `0..D-1` in the
        classifier's pool. For a method that draws its prompts, row `d` is prompt `d`
        (`prompt_id` equal to the row's index, D the dataset's length).
      controllers: the method's decisions, `controllers.multi_adversary(classifier,
        prompt_gdro(...), n_mean=num_generations)` (or with `sampler=mopps(...)`), or a
        `HostControllers` over them (`HostControllers.for_method(...)`).
      seed: the controllers' key when `controllers` is a MultiAdversary; None: `args.seed`.
      success_threshold: a completion whose reward (the reward functions' weighted sum) is
        above this counts as correct.

    Each generation batch (one per `steps_per_generation * num_iterations` micro-steps) is one
    step of the controllers. Its advantages are TRL's times Prompt-GDRO's multipliers, in every
    pass TRL makes over it. Each step adds `gdro/multiplier_max`, `gdro/multiplier_min`,
    `gdro/bin_mean` and `gdro/p_hat_mean` to TRL's logged metrics; TRL's completion log
    (`log_completions`) shows its own advantages, before the multipliers.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        *,
        controllers: MultiAdversary | HostControllers,
        seed: int | None = None,
        success_threshold: float = 0.5,
        **kwargs: Any,
    ):
        if not isinstance(controllers, (MultiAdversary, HostControllers)):
            raise TypeError(
                "controllers must be a controllers.MultiAdversary or a HostControllers, got "
                f"{type(controllers).__name__}"
            )
        if isinstance(controllers, HostControllers) and seed is not None:
            raise ValueError(
                f"seed={seed!r} is for controllers given as a MultiAdversary: a HostControllers "
                "has its own seed (HostControllers(..., seed=...))"
            )
        super().__init__(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs
        )
        if isinstance(controllers, MultiAdversary):
            controllers = HostControllers(
                controllers,
                seed=self.args.seed if seed is None else seed,
                success_threshold=success_threshold,
            )
        check_expressible(controllers.adversary, self.num_generations)
        self._controllers = controllers
        self._check_settings(self.train_dataset)
        self._rewards_per_func: torch.Tensor | None = None

    @property
    def controllers(self) -> HostControllers:
        """The controllers, whose state this trainer updates."""
        return self._controllers

    @property
    def _places_per_batch(self) -> int:
        return self.args.generation_batch_size // self.num_generations

    @property
    def _micro_steps_per_generation(self) -> int:
        return self.args.steps_per_generation * self.num_iterations

    def _check_settings(self, dataset: Any) -> None:
        """Refuses, before training, what the controllers cannot follow (each error names the
        setting and the fix)."""
        args, host = self.args, self._controllers
        if args.remove_unused_columns:
            raise ValueError(
                f"remove_unused_columns=True drops the dataset's {PROMPT_ID!r} column before it "
                "reaches the trainer: leave it False (GRPOConfig's default)"
            )
        if not isinstance(dataset, IterableDataset) and PROMPT_ID not in dataset.column_names:
            raise ValueError(
                f"the train dataset has no {PROMPT_ID!r} column (it has {dataset.column_names}): "
                f"add each row's prompt id, e.g. dataset.add_column({PROMPT_ID!r}, "
                "list(range(len(dataset))))"
            )
        if host.adversary.draws_prompts:
            if isinstance(dataset, IterableDataset):
                raise ValueError(
                    "this method draws its own prompts (MoPPS or Prompt-GDRO's resample) by row "
                    "index, and an IterableDataset has none: give a datasets.Dataset"
                )
            ids = np.asarray(dataset[PROMPT_ID])
            if len(dataset) != host.num_prompts or not np.array_equal(ids, np.arange(len(dataset))):
                raise ValueError(
                    f"this method draws prompt ids 0..{host.num_prompts - 1} and reads prompt d "
                    f"from row d: the train dataset must have {host.num_prompts} rows with "
                    f"{PROMPT_ID} equal to the row's index (it has {len(dataset)} rows, "
                    f"{PROMPT_ID} {ids[:8].tolist()}...)"
                )
            if self._places_per_batch > host.num_prompts:
                raise ValueError(
                    f"a generation batch holds {self._places_per_batch} prompts "
                    f"(generation_batch_size={args.generation_batch_size} // num_generations="
                    f"{self.num_generations}) and the pool {host.num_prompts}: give a smaller "
                    "generation_batch_size"
                )
        save_steps, every = args.save_steps, self._micro_steps_per_generation
        if args.save_strategy == "steps" and float(save_steps).is_integer():
            if int(save_steps) * args.gradient_accumulation_steps % every:
                multiple = every // np.gcd(every, args.gradient_accumulation_steps)
                raise ValueError(
                    f"save_steps={save_steps} would save inside a generation batch (one every "
                    f"{every} micro-steps: steps_per_generation={args.steps_per_generation} x "
                    f"num_iterations={self.num_iterations}), whose completions TRL does not "
                    "save, so a resumed run would generate it again and the controllers see "
                    f"its step twice: set save_steps to a multiple of {multiple}"
                )

    # -- the train sampler ------------------------------------------------------------------

    def _get_train_sampler(self, dataset: Any = None) -> torch.utils.data.Sampler:
        if not self._controllers.adversary.draws_prompts:
            return super()._get_train_sampler(dataset)  # TRL's RepeatSampler over the data
        dataset = self.train_dataset if dataset is None else dataset
        return PlaceSampler(
            num_places=self._places_per_batch,
            num_generations=self.num_generations,
            repeat_count=self._micro_steps_per_generation,
            batches_per_epoch=max(len(dataset) // self._places_per_batch, 1),
        )

    # -- one generation batch ---------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        self._rewards_per_func = rewards_per_func  # gathered over the processes, [B * G, F]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:  # evaluation: TRL's own, the controllers untouched
            return super()._generate_and_score_completions(inputs)
        host, G = self._controllers, self.num_generations
        self._check_processes_agree()
        local_ids = _prompt_ids(inputs)
        if host.adversary.draws_prompts:
            # The draw, now: the previous generation's rewards were observed (the yield-ahead
            # trap: TRL's loader has already read this batch's places, and maybe the next's).
            drawn = host.select_prompts(np.arange(self._places_per_batch, dtype=np.int32))
            inputs = self._fill_places(local_ids, drawn)
            local_ids = drawn[local_ids]
        all_ids = self._gather_ids(local_ids)
        groups = all_ids.reshape(-1, G)
        if (groups != groups[:, :1]).any():
            raise ValueError(
                f"a group of {G} consecutive completions holds several prompt ids "
                f"({groups[(groups != groups[:, :1]).any(axis=1)][0].tolist()}): TRL's sampler "
                "repeats each prompt num_generations times in a row; keep TRL's train sampler"
            )
        plan = host.plan(groups[:, 0])  # the batch (a drawn one must arrive whole, in order)
        self._rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        rewards = self._rewards(all_ids)
        weights = host.multipliers(local_ids)
        host.observe(all_ids, rewards)  # one prompt id per completion, all processes' rows
        advantages = output["advantages"]
        output["advantages"] = advantages * torch.as_tensor(
            weights, dtype=advantages.dtype, device=advantages.device
        )
        metrics = self._metrics["train"]
        metrics["gdro/multiplier_max"].append(float(plan.advantage_weights.max()))
        metrics["gdro/multiplier_min"].append(float(plan.advantage_weights.min()))
        metrics["gdro/bin_mean"].append(float(plan.bins.mean()))
        metrics["gdro/p_hat_mean"].append(float(plan.p_hat.mean()))
        return output

    def _fill_places(self, places: np.ndarray, drawn: np.ndarray) -> list[dict[str, Any]]:
        """This process's rows of the drawn batch: place `p`'s row is prompt `drawn[p]`'s."""
        expected = _process_slice(
            self._train_places(), self.accelerator.process_index, self.accelerator.num_processes
        )
        if not np.array_equal(places, expected):
            raise ValueError(
                f"the train loader gave the places {places[:8].tolist()}..., not "
                f"{expected[:8].tolist()}...: GDROTrainer's PlaceSampler must reach it unchanged "
                "(no other train sampler, no shuffling of its batches)"
            )
        return [dict(self.train_dataset[int(drawn[place])]) for place in places]

    def _train_places(self) -> np.ndarray:
        return np.repeat(np.arange(self._places_per_batch), self.num_generations)

    def _gather_ids(self, local_ids: np.ndarray) -> np.ndarray:
        """Every process's prompt ids, in the order TRL gathers the rewards (process order)."""
        if self.accelerator.num_processes == 1:
            return local_ids
        tensor = torch.as_tensor(local_ids, dtype=torch.int64, device=self.accelerator.device)
        return self.accelerator.gather(tensor).cpu().numpy()

    def _rewards(self, all_ids: np.ndarray) -> np.ndarray:
        """The completions' rewards as TRL sums them (each function's weight, None skipped)."""
        per_func = self._rewards_per_func
        if per_func is None or per_func.shape[0] != all_ids.size:
            raise RuntimeError("TRL's GRPOTrainer did not compute one reward per completion")
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        unscorable = torch.isnan(per_func).all(dim=1).cpu().numpy()
        if unscorable.any():
            row = int(np.flatnonzero(unscorable)[0])
            raise ValueError(
                f"completion {row} of the batch (prompt id {all_ids[row]}) has no reward: every "
                "reward function returned None for it. The controllers count each prompt's "
                "correct completions and cannot count this one: return a reward for every "
                "completion"
            )
        return (per_func * weights).nansum(dim=1).cpu().numpy().astype(np.float64)

    def _check_processes_agree(self) -> None:
        """With several processes, each one's controllers must be the same state (built with
        the same settings and seed, fed the same gathered rewards): compared by digest."""
        if self.accelerator.num_processes == 1:
            return
        digest = hashlib.sha256(self._controllers.to_bytes()).hexdigest()
        digests = gather_object([digest])
        if len(set(digests)) > 1:
            raise RuntimeError(
                f"the processes' controllers differ at step {self._controllers.step} (state "
                f"digests {[d[:8] for d in digests]}): build each process's controllers with "
                "the same settings and seed, and restore them from the same checkpoint"
            )

    # -- checkpoints -------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if not self.args.should_save:  # the other processes hold the same state
            return
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        path = os.path.join(self._get_output_dir(trial=trial), folder, STATE_FILE)
        temporary = f"{path}.tmp"
        with open(temporary, "wb") as file:
            file.write(self._controllers.to_bytes())
        os.replace(temporary, path)  # a reader never sees half a state

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """TRL's training loop. Resuming from a checkpoint (a folder, or True for the last one
        of `output_dir`) restores the controllers saved in it."""
        if resume_from_checkpoint is True:
            last = get_last_checkpoint(self.args.output_dir)
            resume_from_checkpoint = True if last is None else last  # None: Trainer's error
        if isinstance(resume_from_checkpoint, (str, os.PathLike)):
            self._restore(os.fspath(resume_from_checkpoint))
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    def _restore(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"the controllers' state is not at {path}: a GDROTrainer writes it into each "
                "checkpoint it saves. Resume from a checkpoint of such a run, or start a new one."
            )
        global_step = TrainerState.load_from_json(
            os.path.join(checkpoint, TRAINER_STATE_NAME)
        ).global_step
        micro = global_step * self.args.gradient_accumulation_steps
        every = self._micro_steps_per_generation
        if micro % every:
            raise ValueError(
                f"{checkpoint} was saved after {micro} micro-steps, inside a generation batch "
                f"(one every {every}: steps_per_generation x num_iterations): TRL would "
                "generate it again on resume and the controllers see its step twice. Resume "
                "from a checkpoint saved at the end of a generation batch."
            )
        with open(path, "rb") as file:
            data = file.read()
        try:
            self._controllers.load_bytes(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        if self._controllers.step != micro // every:
            raise ValueError(
                f"{path} holds the controllers after {self._controllers.step} steps, and the "
                f"checkpoint ends generation batch {micro // every}: it is not this run's state"
            )


def _prompt_ids(inputs: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """int64 `[rows]` the rows' `prompt_id`, checked."""
    if not inputs or PROMPT_ID not in inputs[0]:
        have = sorted(inputs[0]) if inputs else []
        raise ValueError(
            f"the training rows have no {PROMPT_ID!r} field (they have {have}): give the train "
            f"dataset an int {PROMPT_ID!r} column, each prompt's index in the classifier's pool"
        )
    ids = np.asarray([row.get(PROMPT_ID) for row in inputs])
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"the rows' {PROMPT_ID!r} must be ints, one per row, got {ids[:8].tolist()}..."
        )
    return ids.astype(np.int64)


def _process_slice(rows: np.ndarray, process_index: int, num_processes: int) -> np.ndarray:
    """This process's contiguous share of a generation batch's rows (how TRL splits them)."""
    size = rows.size // num_processes
    return rows[process_index * size : (process_index + 1) * size]
