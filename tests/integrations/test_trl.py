"""TRL's GRPOTrainer with the controllers inside (`make test-trl`, the trl extra).

A tiny Qwen3 built here, random weights from a fixed seed, and a character-level tokenizer made
with `tokenizers`: no hub, CPU. The references are independent of the adapter: TRL's group
advantages recomputed in numpy from the rewards the reward function returned, and the
controllers' pure functions (`multi_adversary`'s `plan` and `update`, called directly) fed those
rewards by prompt id, counted in a Python loop.

Planted bugs each test was seen failing on: the multipliers not applied to TRL's advantages
(`test_three_steps...`: the trained advantages differ from the reference at step 2); the
completions' prompt ids given to `observe` rolled by one prompt (G rows) against their rewards
(`test_three_steps...`: the multipliers, so the trained advantages, differ at step 3); the draw
made where TRL's loader reads the sampler, as a plain sampler would (`test_the_drawn_batches...`
at TRL's defaults: the second `select_prompts` comes before the first `observe` and is refused;
with `num_iterations=2` the loader does not read that far ahead and the case passes); the
controllers' state not restored on resume (`test_a_run_stopped...`: the resumed run ends at step
2 of 4); each process observing only its own rows (`test_two_processes...`: `observe` refuses a
batch prompt with no rewards).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers
from gdro_jax.integrations import HostControllers

pytestmark = pytest.mark.trl
pytest.importorskip("trl", reason="the trl extra: make test-trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.trainer_callback import TrainerState  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from gdro_jax.integrations import trl as gdro_trl  # noqa: E402

# The prompts, indexed by prompt id.
PROMPTS = ["input string", "hello world", "my name", "hello there", "hello", "library"]
G = 4  # TRL's num_generations
B = 2  # prompts per generation batch
SPECIAL = ["<pad>", "<eos>", "<unk>"]
VOCAB = {token: i for i, token in enumerate(SPECIAL + list("abcdefghijklmnopqrstuvwxyz "))}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, made with `tokenizers` (nothing downloaded)."""
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_model() -> Qwen3ForCausalLM:
    """A two-layer Qwen3 of random weights (the same ones each call)."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=VOCAB["<pad>"],
        eos_token_id=VOCAB["<eos>"],
        bos_token_id=VOCAB["<eos>"],
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def grpo_config(output_dir, **overrides) -> GRPOConfig:
    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=B * G,
        num_generations=G,
        max_completion_length=6,
        learning_rate=1e-2,
        lr_scheduler_type="constant",  # a run cut at step 2 and one of 4 steps share the lr
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    return GRPOConfig(**{**settings, **overrides})


def pool_dataset(prompt_ids=None) -> Dataset:
    """The pool's rows (row d is prompt d), or the rows of `prompt_ids` in that order."""
    ids = list(range(len(PROMPTS)) if prompt_ids is None else prompt_ids)
    return Dataset.from_dict({"prompt": [PROMPTS[i] for i in ids], "prompt_id": ids})


class Recorder:
    """What TRL computed and what it trained on, generation by generation."""

    def __init__(self):
        self.prompt_ids = []  # per generation: [B * G] the prompt_id column the reward saw
        self.rewards = []  # per generation: [B * G] the reward function's values
        self.completions = []  # per generation: [B * G] token tuples, TRL's row order
        self.trl_advantages = []  # per generation: TRL's own, before the multipliers
        self.trained = []  # per micro-step: (prompt_id, completion tokens, advantage) rows
        self.reads = []  # (place, controllers' step) as TRL's loader reads the sampler

    def reward_fn(self, prompts, completions, completion_ids, prompt_id, **kwargs):
        """1 for a completion whose token ids sum to an even number, else 0: mixed within
        groups."""
        rewards = [float(sum(ids) % 2 == 0) for ids in completion_ids]
        self.prompt_ids.append(np.asarray(prompt_id))
        self.rewards.append(np.asarray(rewards))
        self.completions.append([tuple(ids) for ids in completion_ids])
        return rewards

    def attach(self, trainer, tokenizer):
        generate, compute_loss, sampler_of = (
            trainer._generate_and_score_completions,
            trainer._compute_loss,
            trainer._get_train_sampler,
        )
        prompt_of = {tuple(tokenizer(p)["input_ids"]): i for i, p in enumerate(PROMPTS)}

        def record_generation(inputs):
            output = generate(inputs)
            if trainer.model.training:
                self.trl_advantages.append(np.asarray(trainer._logs["advantages"])[-B * G :])
            return output

        def record_loss(model, inputs):
            rows = []
            for i in range(len(inputs["advantages"])):
                prompt = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
                completion = inputs["completion_ids"][i][inputs["completion_mask"][i].bool()]
                rows.append(
                    (
                        prompt_of[tuple(prompt)],
                        tuple(completion.tolist()),
                        float(inputs["advantages"][i]),
                    )
                )
            self.trained.append(rows)
            return compute_loss(model, inputs)

        def logged_sampler(dataset=None):
            return ReadLog(sampler_of(dataset), trainer, self.reads)

        trainer._generate_and_score_completions = record_generation
        trainer._compute_loss = record_loss
        trainer._get_train_sampler = logged_sampler


class ReadLog(torch.utils.data.Sampler):
    """A sampler's values as TRL's loader reads them, each with the controllers' step then."""

    def __init__(self, sampler, trainer, reads):
        self.sampler, self.trainer, self.reads = sampler, trainer, reads

    def __iter__(self):
        for value in self.sampler:
            self.reads.append((value, self.trainer.controllers.step))
            yield value

    def __len__(self):
        return len(self.sampler)


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """TRL's `scale_rewards="group"` advantages in numpy: (r - mean) / (sample std + 1e-4)."""
    groups = rewards.reshape(-1, G).astype(np.float64)
    mean = groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, ddof=1, keepdims=True)
    return ((groups - mean) / (std + 1e-4)).reshape(-1)


def reference_controllers(adversary, steps_ids, steps_rewards, *, seed=0, draws=False):
    """The pure functions fed the recorded rewards by prompt id: (batch ids, weights per step,
    state). A drawing method's batch is drawn by `plan` from B candidates."""
    state = adversary.init()
    batches, weights = [], []
    for step, (ids_of_rollouts, rewards) in enumerate(zip(steps_ids, steps_rewards, strict=True)):
        key = jax.random.fold_in(jax.random.key(seed), step)
        candidates = jnp.arange(B, dtype=jnp.int32) if draws else ids_of_rollouts[::G]
        plan = adversary.plan(state, candidates, key)
        ids = np.asarray(plan.prompt_ids)
        batches.append(ids)
        weights.append(np.asarray(plan.advantage_weights))
        correct = []
        for i in range(len(ids)):  # count each group's correct completions by hand
            correct.append(sum(1 for r in rewards[i * G : (i + 1) * G] if r > 0.5))
        failure = [1.0 - c / G for c in correct]
        state = adversary.update(
            state,
            plan._replace(num_rollouts=jnp.full((len(ids),), G, jnp.int32)),
            jnp.asarray(ids),
            num_correct=jnp.asarray(correct, jnp.int32),
            losses=jnp.asarray(failure, jnp.float32),
            valid=jnp.ones((len(ids),), bool),
        )
    return batches, weights, state


def assert_states_equal(got, want):
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path)
        )


def assert_trained_on_trl_times_multipliers(recorder, weights, micro_steps_per_generation):
    """Every trained row's advantage is TRL's own (the numpy reference, checked against TRL's
    log) times its prompt's multiplier, matched to its generation row by prompt and tokens."""
    for step, (ids, rewards) in enumerate(zip(recorder.prompt_ids, recorder.rewards, strict=True)):
        trl_own = group_advantages(rewards)
        # TRL's log holds float32 values of the same formula.
        np.testing.assert_allclose(recorder.trl_advantages[step], trl_own, rtol=1e-5, atol=1e-6)
        weight_of = dict(zip(ids[::G].tolist(), weights[step].tolist(), strict=True))
        row_of = {
            (pid, tokens): row
            for row, (pid, tokens) in enumerate(
                zip(ids.tolist(), recorder.completions[step], strict=True)
            )
        }
        first = step * micro_steps_per_generation
        for micro in recorder.trained[first : first + micro_steps_per_generation]:
            for pid, tokens, advantage in micro:
                expected = trl_own[row_of[pid, tokens]] * weight_of[pid]
                np.testing.assert_allclose(
                    advantage, expected, rtol=1e-5, atol=1e-6, err_msg=f"step {step + 1}"
                )


def prompt_gdro_adversary(realisation="reweight", num_prompts=None):
    classifier = controllers.passk_classifier(num_prompts or len(PROMPTS), k=2)
    prompt = controllers.prompt_gdro(realisation=realisation)
    return controllers.multi_adversary(classifier, prompt, n_mean=G)


def mopps_adversary():
    sampler = controllers.mopps(len(PROMPTS), candidates=2, target=0.5)
    return controllers.multi_adversary(
        controllers.passk_classifier(len(PROMPTS), k=2), sampler=sampler, n_mean=G
    )


def build_trainer(output_dir, adversary, dataset, seed=None, **overrides):
    tokenizer = build_tokenizer()
    recorder = Recorder()
    trainer = gdro_trl.GDROTrainer(
        model=build_model(),
        reward_funcs=recorder.reward_fn,
        args=grpo_config(output_dir, **overrides),
        train_dataset=dataset,
        processing_class=tokenizer,
        controllers=adversary,
        seed=seed,
    )
    recorder.attach(trainer, tokenizer)
    return trainer, recorder


@pytest.mark.parametrize("streamed", [False, True], ids=["Dataset", "IterableDataset"])
def test_three_steps_of_prompt_gdro_train_on_trls_advantages_times_the_multipliers(
    tmp_path, streamed
):
    """Prompt-GDRO's `reweight`: TRL's own sampler (or its stream of an IterableDataset) takes
    the batches from the data, in the dataset's order; they mix seen and unseen prompts, so the
    bins present differ and the multipliers move."""
    order = [0, 1, 0, 2, 1, 2]
    adversary = prompt_gdro_adversary(num_prompts=3)
    dataset = pool_dataset(order)
    dataset = dataset.to_iterable_dataset() if streamed else dataset
    trainer, recorder = build_trainer(
        tmp_path, adversary, dataset, max_steps=3, shuffle_dataset=False
    )
    trainer.train()

    assert len(recorder.rewards) == 3 and len(recorder.trained) == 3
    for step, ids in enumerate(recorder.prompt_ids):
        np.testing.assert_array_equal(ids, np.repeat(order[2 * step : 2 * step + 2], G))
    batches, weights, state = reference_controllers(
        adversary, recorder.prompt_ids, recorder.rewards, seed=0
    )
    assert not np.allclose(np.concatenate(weights), 1.0), "the test needs weights that move"
    assert_trained_on_trl_times_multipliers(recorder, weights, micro_steps_per_generation=1)
    assert trainer.controllers.step == 3
    assert_states_equal(trainer.controllers.state, state)
    logged = [entry["gdro/multiplier_max"] for entry in trainer.state.log_history[:-1]]
    np.testing.assert_allclose(logged, [w.max() for w in weights], rtol=1e-6)


@pytest.mark.parametrize(
    "reuse",
    [
        dict(),  # TRL's defaults: one micro-step a generation, the loader a generation ahead
        dict(  # each generation trained twice, in two slices: four micro-steps
            per_device_train_batch_size=B * G // 2,
            gradient_accumulation_steps=2,
            num_iterations=2,
        ),
    ],
    ids=["defaults", "num_iterations=2,steps_per_generation=2"],
)
def test_the_drawn_batches_follow_the_observed_rewards_however_far_trl_reads_ahead(tmp_path, reuse):
    """MoPPS draws each batch from its posterior. Each draw must come from the state after the
    previous generation's rewards, which TRL's loader has not seen when it reads ahead: with
    TRL's defaults it reads generation k + 1's places before generation k is scored (checked
    here, so the test holds the case the sampler must survive)."""
    adversary = mopps_adversary()
    micro_steps, max_steps = (4, 6) if reuse else (1, 3)  # 3 generations
    trainer, recorder = build_trainer(
        tmp_path, adversary, pool_dataset(), max_steps=max_steps, **reuse
    )
    trainer.train()

    assert trainer.controllers.step == 3 and len(recorder.rewards) == 3
    batches, weights, state = reference_controllers(
        adversary, recorder.prompt_ids, recorder.rewards, seed=0, draws=True
    )
    for step, (ids, batch) in enumerate(zip(recorder.prompt_ids, batches, strict=True)):
        np.testing.assert_array_equal(ids, np.repeat(batch, G), err_msg=f"step {step + 1}")
    assert len({tuple(b) for b in batches}) > 1, "the test needs draws that differ"
    assert_states_equal(trainer.controllers.state, state)
    assert_trained_on_trl_times_multipliers(recorder, weights, micro_steps)
    rows_per_generation = B * G * micro_steps
    read_ahead = [
        step
        for position, (_, step) in enumerate(recorder.reads)
        if position % rows_per_generation == 0 and step < position // rows_per_generation
    ]
    if not reuse:
        assert read_ahead, "TRL's loader no longer reads a generation ahead at its defaults"


def run_resample(output_dir, max_steps, resume=False, **overrides):
    trainer, recorder = build_trainer(
        output_dir,
        prompt_gdro_adversary("resample"),
        pool_dataset(),
        max_steps=max_steps,
        **overrides,
    )
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer, recorder


def test_a_run_stopped_after_step_2_and_resumed_equals_one_uninterrupted_run(tmp_path):
    """Prompt-GDRO's `resample` draws every batch from the controllers' state, so a resumed run
    that drew from a state not restored would train on other prompts."""
    whole, whole_record = run_resample(tmp_path / "whole", 4)
    saving = dict(save_strategy="steps", save_steps=1)
    first, first_record = run_resample(tmp_path / "resumed", 2, **saving)
    assert first.controllers.step == 2
    for step in (1, 2):
        assert (tmp_path / "resumed" / f"checkpoint-{step}" / gdro_trl.STATE_FILE).is_file()
    resumed, resumed_record = run_resample(tmp_path / "resumed", 4, resume=True, **saving)
    assert resumed.controllers.step == 4
    assert resumed.controllers.to_bytes() == whole.controllers.to_bytes()
    drawn = first_record.prompt_ids + resumed_record.prompt_ids
    for step, (a, b) in enumerate(zip(whole_record.prompt_ids, drawn, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step + 1}'s batch")
    for a, b in zip(
        whole_record.rewards, first_record.rewards + resumed_record.rewards, strict=True
    ):
        np.testing.assert_array_equal(a, b)
    for name, a in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], a, rtol=0, atol=0)


def test_a_resume_without_the_controllers_state_or_inside_a_generation_is_refused(tmp_path):
    adversary = prompt_gdro_adversary("resample")
    trainer, _ = build_trainer(
        tmp_path, adversary, pool_dataset(), max_steps=1, save_strategy="steps", save_steps=1
    )
    trainer.train()
    folder = tmp_path / "checkpoint-1"
    state = (folder / gdro_trl.STATE_FILE).read_bytes()
    (folder / gdro_trl.STATE_FILE).unlink()
    trainer, _ = build_trainer(tmp_path, adversary, pool_dataset(), max_steps=2)
    with pytest.raises(FileNotFoundError, match=r"not at .*checkpoint-1/gdro_controllers"):
        trainer.train(resume_from_checkpoint=True)
    # A checkpoint after micro-step 1 of a generation of two (num_iterations=2).
    (folder / gdro_trl.STATE_FILE).write_bytes(state)
    trainer, _ = build_trainer(tmp_path, adversary, pool_dataset(), max_steps=2, num_iterations=2)
    with pytest.raises(ValueError, match="inside a generation batch"):
        trainer.train(resume_from_checkpoint=str(folder))
    TrainerState(global_step=4).save_to_json(str(folder / "trainer_state.json"))
    with pytest.raises(
        ValueError, match="after 1 steps, and the checkpoint ends generation batch 2"
    ):
        trainer.train(resume_from_checkpoint=str(folder))


@pytest.mark.parametrize(
    "method, reason",
    [
        ("rollout_gdro", "TRL's GRPOConfig.num_generations is one number"),
        ("knapsack", "TRL's GRPOConfig.num_generations is one number"),
        ("dynamic_sampling", "generates once per batch"),
    ],
)
def test_what_trl_cannot_express_is_refused_with_its_reason(method, reason):
    classifier = controllers.passk_classifier(len(PROMPTS), k=2)
    parts = {
        "rollout_gdro": dict(rollout=controllers.rollout_gdro(n_mean=G)),
        "knapsack": dict(rollout=controllers.knapsack(len(PROMPTS), n_mean=G)),
        "dynamic_sampling": dict(
            group_filter=controllers.dynamic_sampling(2), num_prompts=2, n_mean=G
        ),
    }[method]
    adversary = controllers.multi_adversary(classifier, **parts)
    with pytest.raises(ValueError, match="cannot express this method") as error:
        gdro_trl.check_expressible(adversary, G)
    assert reason in str(error.value)


@pytest.mark.parametrize(
    "adversary, dataset, overrides, match",
    [
        ("reweight", "pool", dict(num_generations=2, per_device_train_batch_size=4),
         "n_mean=4 completions per prompt; TRL draws num_generations=2"),
        ("reweight", "no ids", {}, "no 'prompt_id' column"),
        ("reweight", "pool", dict(remove_unused_columns=True), "remove_unused_columns=True"),
        ("resample", "shuffled", {}, "prompt_id equal to the row's index"),
        ("resample", "pool", dict(num_iterations=2, save_strategy="steps", save_steps=3),
         "set save_steps to a multiple of 2"),
    ],
)  # fmt: skip
def test_settings_the_controllers_cannot_follow_are_named(
    tmp_path, adversary, dataset, overrides, match
):
    datasets = {
        "pool": pool_dataset(),
        "no ids": Dataset.from_dict({"prompt": PROMPTS}),
        "shuffled": pool_dataset([1, 0, 2, 3, 4, 5]),
    }
    with pytest.raises(ValueError, match=match):
        build_trainer(tmp_path, prompt_gdro_adversary(adversary), datasets[dataset], **overrides)


def test_an_unscored_completion_is_refused_before_the_controllers_change(tmp_path):
    host = HostControllers(prompt_gdro_adversary())
    trainer = gdro_trl.GDROTrainer(
        model=build_model(),
        reward_funcs=lambda completions, **kwargs: [None] * len(completions),
        args=grpo_config(tmp_path, max_steps=1),
        train_dataset=pool_dataset(),
        processing_class=build_tokenizer(),
        controllers=host,
    )
    before = host.to_bytes()
    with pytest.raises(ValueError, match="has no reward: every reward function returned None"):
        trainer.train()
    assert host.step == 0 and host.to_bytes() == before


def test_a_seed_beside_host_controllers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="a HostControllers has its own seed"):
        gdro_trl.GDROTrainer(
            model=build_model(),
            reward_funcs=Recorder().reward_fn,
            args=grpo_config(tmp_path),
            train_dataset=pool_dataset(),
            controllers=HostControllers(prompt_gdro_adversary(), seed=3),
            seed=3,
        )


def test_the_trl_example_of_the_docs_runs(tmp_path):
    """docs/integrations.md's TRL block (skipped by tests/test_docs.py, whose environment has no
    TRL), run as that test runs the others: a fresh interpreter in an empty folder."""
    from tests.test_docs import run_extra_block

    process = run_extra_block("docs/integrations.md", "trl", tmp_path)
    assert process.returncode == 0, process.stderr[-3000:]
    assert "p_hat" in process.stdout


def test_two_processes_hold_the_same_controllers_fed_the_gathered_rewards(tmp_path):
    """Two CPU processes (torchrun, gloo), MoPPS drawing: each process holds its own
    controllers and fills its own places of each drawn batch; both observe the rewards of both,
    gathered, so both end in the state of the pure functions fed every reward. Controllers made
    with another seed in one process are refused at the first generation."""
    import subprocess
    import sys

    from tests.test_docs import ROOT

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "tests.integrations.test_trl", str(tmp_path)]
    process = subprocess.run(
        command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr[-3000:]
    for rank in (0, 1):
        refusal = (tmp_path / f"refused{rank}.txt").read_text()
        assert "the processes' controllers differ at step 0" in refusal
    records = [np.load(tmp_path / f"rank{rank}.npz") for rank in (0, 1)]
    steps_ids = [np.concatenate([r["ids"][step] for r in records]) for step in range(3)]
    steps_rewards = [np.concatenate([r["rewards"][step] for r in records]) for step in range(3)]
    batches, _, state = reference_controllers(
        mopps_adversary(), steps_ids, steps_rewards, seed=0, draws=True
    )
    for step, batch in enumerate(batches):
        for rank in (0, 1):  # each process's place of the batch
            np.testing.assert_array_equal(records[rank]["ids"][step], np.repeat(batch[rank], G))
    saved = [(tmp_path / f"rank{rank}.msgpack").read_bytes() for rank in (0, 1)]
    assert saved[0] == saved[1]
    assert_states_equal(HostControllers.from_bytes(mopps_adversary(), saved[0]).state, state)


def _two_processes(output_dir: str) -> None:
    """One process of the test above (`python -m torch.distributed.run ... -m
    tests.integrations.test_trl <folder>`)."""
    rank = int(os.environ["RANK"])
    adversary = mopps_adversary()
    local = dict(per_device_train_batch_size=B * G // 2, max_steps=3)  # one place a process
    trainer, _ = build_trainer(f"{output_dir}/refused", adversary, pool_dataset(), rank, **local)
    try:
        trainer.train()
    except RuntimeError as error:
        with open(f"{output_dir}/refused{rank}.txt", "w") as file:
            file.write(str(error))
    trainer, recorder = build_trainer(f"{output_dir}/run", adversary, pool_dataset(), **local)
    trainer.train()
    assert trainer.accelerator.num_processes == 2
    records = dict(ids=np.stack(recorder.prompt_ids), rewards=np.stack(recorder.rewards))
    np.savez(f"{output_dir}/rank{rank}.npz", **records)
    with open(f"{output_dir}/rank{rank}.msgpack", "wb") as file:
        file.write(trainer.controllers.to_bytes())


if __name__ == "__main__":
    import sys

    _two_processes(sys.argv[1])
